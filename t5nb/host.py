"""`tune_host()`: the one call that changes this process, made first (the setup cell of every
notebook, the `t5nb` command, the benchmarks); importing t5nb changes nothing.

On every host it runs Python's cycle collector less often. By default a collection starts after
every 700 new container objects, and tracing and compiling JAX programs and building tf.data
pipelines make millions: the collector took 4.4 of a notebook kernel's 61 CPU s (02 on the CI
profile, 2-core AMD EPYC) and 1.0 s with `GC_THRESHOLDS`. Objects freed by reference counting,
most of them, go at once as before; only garbage in cycles waits for the next collection.

Where XLA:CPU runs the steps, it also keeps freed host memory in the process, so that XLA:CPU's
buffers are not page-faulted in afresh at every step. glibc gives large blocks (and per-thread
arenas) back to the kernel when they are freed. A T5.1.1-small train step on the CPU allocates
about 4 GB of temporary buffers, so each step took ~1M page faults, 2.7 s of kernel time (8.3 s
per step instead of 7.3 s; `docs/accelerators.md`). One arena, no mmap'd blocks and no trimming
keep that memory for reuse; the cost is that the process keeps its peak heap. The settings act
only on threads created afterwards, so call it before JAX runs anything (it starts its thread
pool then).

That helps only where XLA:CPU runs the steps. One arena slows XLA's compiler, which allocates from
many threads at once (a small course step compiled in 16.8 s against 13.7 s without it, 2-core
Xeon), and on an accelerator the steps' buffers live on the chip: there it leaves malloc alone.
"""
import ctypes
import gc
import glob
import importlib.util
import os
import platform
import sys
import warnings

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8  # glibc's mallopt parameters


def _jax_started() -> bool:
    """Whether JAX has created its backends (and with them its thread pools) in this process."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge  # only once JAX is imported: importing it here would start it

    return bool(getattr(xla_bridge, "_backends", None))


# The accelerators JAX runs on here, known before it starts: each by its device files and the
# modules of JAX's plugin for it (a device without the plugin leaves JAX on the CPU: a desktop's
# NVIDIA card beside a CPU-only jax, a host passing some other device through vfio).
ACCELERATORS = {
    "NVIDIA GPU": (("/dev/nvidia[0-9]*",), ("jax_cuda12_plugin", "jax_cuda13_plugin")),
    "TPU": (("/dev/accel[0-9]*", "/dev/vfio/[0-9]*"), ("libtpu",)),  # accel on v2-v4, vfio on v5e and later
}


def accelerator_host() -> bool:
    """Whether JAX will run on an accelerator here, known before JAX starts (nothing is imported):
    `JAX_PLATFORMS` names one, or (unset) one of `ACCELERATORS` has both a device file and JAX's
    plugin for it installed."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms:
        return platforms.split(",")[0] != "cpu"
    return any(any(glob.glob(pattern) for pattern in devices)
               and any(importlib.util.find_spec(module) for module in plugins)
               for devices, plugins in ACCELERATORS.values())


def keep_freed_memory() -> bool:
    """glibc's malloc set as above (one arena, no mmap'd blocks, no trimming), on any host;
    False where it does not apply (not Linux with glibc). A warning says when JAX already runs,
    as threads it started keep their own arenas."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    if _jax_started():
        warnings.warn("t5nb.tune_host() after JAX started: its threads keep their arenas, so train steps may "
                      "page-fault their buffers in afresh; call it first (restart the kernel)", stacklevel=3)
    mallopt = ctypes.CDLL("libc.so.6").mallopt
    # -1 wraps to SIZE_MAX: never trim the heap's top.
    return all(mallopt(param, value) == 1 for param, value in
               ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1)))


# (first generation, second, third): a collection of the first generation after this many new
# container objects, of the second after this many of the first, of all after this many of the second
GC_THRESHOLDS = (50_000, 20, 20)


def collect_cycles_less_often() -> None:
    """Python's cycle collector at `GC_THRESHOLDS`, not its default (700, 10, 10)."""
    gc.set_threshold(*GC_THRESHOLDS)


def tune_host() -> bool:
    """`collect_cycles_less_often()`, and `keep_freed_memory()` where XLA:CPU runs the steps; on an
    accelerator's host (see `accelerator_host`) malloc is left alone and this returns False."""
    collect_cycles_less_often()
    return not accelerator_host() and keep_freed_memory()

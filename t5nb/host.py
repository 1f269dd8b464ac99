"""Keep freed host memory in the process, so that XLA:CPU's buffers are not page-faulted in
afresh at every step.

glibc gives large blocks (and per-thread arenas) back to the kernel when they are freed. A
T5.1.1-small train step on the CPU allocates about 4 GB of temporary buffers, so each step
took ~1M page faults, 2.7 s of kernel time (8.3 s per step instead of 7.3 s). One arena,
no mmap'd blocks and no trimming keep that memory for reuse; the cost is that the process
keeps its peak heap. The settings act only on threads created afterwards, so this runs when
t5nb is imported, before JAX starts its thread pool. Set T5NB_KEEP_FREED_MEMORY=0 to opt out.
"""
import ctypes
import os
import platform
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8  # glibc's mallopt parameters


def keep_freed_host_memory() -> bool:
    """Tune glibc's malloc as above; False where it does not apply (not glibc, or opted out)."""
    if os.environ.get("T5NB_KEEP_FREED_MEMORY", "1") == "0":
        return False
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL("libc.so.6").mallopt
    # -1 wraps to SIZE_MAX: never trim the heap's top.
    return all(mallopt(param, value) == 1 for param, value in
               ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1)))

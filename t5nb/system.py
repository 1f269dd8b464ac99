"""What machine is this: Colab, Kaggle or local, its CPU, where its runs and compiled programs
are kept, package versions, devices, a timed matmul."""
import importlib.metadata
import json
import os
import pathlib
import platform
import re
import sys
import time

import jax
import jax.numpy as jnp
from jax._src import compilation_cache, lru_cache  # the persistent cache's own: see `WholeEntries`

from t5nb.files import write_atomically
from t5nb.paths import REPO_ROOT

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "seqio-nightly", "t5",
            "tfds-nightly", "tensorflow", "sentencepiece")


def in_colab() -> bool:
    return "google.colab" in sys.modules


def in_kaggle() -> bool:
    """A Kaggle notebook (its kernels set KAGGLE_KERNEL_RUN_TYPE: Interactive, or Batch when saved)."""
    return "KAGGLE_KERNEL_RUN_TYPE" in os.environ


KAGGLE_WORKING = "/kaggle/working"  # what Kaggle keeps as a notebook's output when you save a version


DRIVE = "/content/drive"  # where Colab mounts Google Drive


def runs_dir() -> pathlib.Path:
    """Where runs go: `$T5NB_RUNS_DIR`, else `runs/` beside the notebooks (`/content/runs` on
    Colab; on Kaggle `/kaggle/working/runs`, kept with the notebook's saved versions)."""
    default = ("/content/runs" if in_colab() else f"{KAGGLE_WORKING}/runs" if in_kaggle()
               else REPO_ROOT / "runs")
    return pathlib.Path(os.environ.get("T5NB_RUNS_DIR", default))


# JAX's persistent compilation cache as `keep_compiled_programs` sets it. A program that compiles
# in under CACHE_MIN_COMPILE_S is compiled again rather than kept: an eager op compiles in
# milliseconds, and loading costs a file read (the course's smallest kept programs, optimizer
# inits, compile in 0.04-0.4 s and load 10-20 times faster; bench/results/compile.json). Past
# CACHE_MAX_BYTES the least recently used entries go.
CACHE_MIN_COMPILE_S = 0.1
CACHE_MAX_BYTES = 4 << 30
# How often a process reads the folder's size again, beside its own writes, which it counts: what
# other processes write meanwhile can take the folder that far past CACHE_MAX_BYTES.
CACHE_SIZE_READ_S = 60
COLAB_COMPILED = "/content/compiled"  # the runtime's own disk


class WholeEntries(lru_cache.LRUCache):
    """JAX's LRU cache (size cap, file lock) whose entries are written whole or not at all, and
    replaced when written again. JAX writes an entry only after compiling its program, which it
    does only where the entry is missing or fails to load: one cut short by a kill is compiled
    again and replaced, where JAX's own cache keeps it and fails on it in every later process."""

    _bytes, _read_at = 0, -float("inf")  # the folder's size as last read, plus this process's writes since

    def _evict_if_needed(self, *, additional_size: int = 0) -> None:
        """JAX's eviction, where the folder would pass the size cap: JAX reads every entry's size
        and access time at every write, a file read per entry (with `make test`'s 2,300 entries,
        4% of its CPU went there); this reads the sizes once a CACHE_SIZE_READ_S and counts
        its own writes between. An entry that a process without this cache wrote into the folder
        (a plain `JAX_COMPILATION_CACHE_DIR`) has no access time: it is given the oldest, where
        JAX's eviction failed on it at every write. Without a size cap nothing is evicted."""
        if not self.eviction_enabled:
            return
        if time.monotonic() - self._read_at < CACHE_SIZE_READ_S and self._bytes + additional_size <= self.max_size:
            self._bytes += additional_size
            return
        with os.scandir(self.path) as folder:
            entries = {entry.name: entry for entry in folder}
        size = 0
        for name, entry in entries.items():
            if name.endswith(lru_cache._CACHE_SUFFIX):
                size += entry.stat().st_size
                atime = f"{name.removesuffix(lru_cache._CACHE_SUFFIX)}{lru_cache._ATIME_SUFFIX}"
                if atime not in entries:
                    (self.path / atime).write_bytes((0).to_bytes(8, "little"))
        if size + additional_size > self.max_size:
            super()._evict_if_needed(additional_size=additional_size)
            size = self.max_size - additional_size  # at most, after JAX's eviction
        self._bytes, self._read_at = size + additional_size, time.monotonic()

    def put(self, key: str, value: bytes) -> None:
        """The entry written whole; with a size cap (JAX's lock, access time and eviction only
        exist then), under the lock, with its access time, the oldest evicted first."""
        if not self.eviction_enabled:
            write_atomically(self.path / f"{key}{lru_cache._CACHE_SUFFIX}", value)
            return
        if len(value) > self.max_size:
            return super().put(key, value)  # JAX's warning, nothing written
        self.lock.acquire(timeout=self.lock_timeout_secs)
        try:
            self._evict_if_needed(additional_size=len(value))
            write_atomically(self.path / f"{key}{lru_cache._CACHE_SUFFIX}", value)
            (self.path / f"{key}{lru_cache._ATIME_SUFFIX}").write_bytes(time.time_ns().to_bytes(8, "little"))
        finally:
            self.lock.release()


def _whole_entries_cache(path: str) -> tuple[WholeEntries, str]:
    """What JAX's `compilation_cache.get_file_cache` returns, with `WholeEntries`."""
    return WholeEntries(path, max_size=jax.config.jax_compilation_cache_max_size), path


def keep_compiled_programs() -> pathlib.Path:
    """Keep the programs JAX compiles (JAX's persistent compilation cache, `WholeEntries`) in
    `<runs_dir()>/compiled`, so that a later kernel (the next notebook, a rerun, `t5nb train`)
    loads them instead of compiling them again: minutes of XLA's compiler on an accelerator's
    host; input pipelines are kept in its `pipelines/` (`t5nb.tasks.kept_pipelines`). On Colab
    both stay on the runtime's disk (`COLAB_COMPILED`), even where runs go to Google Drive: the
    cache locks and renames files, which a local disk does as it says (a network mount need
    not); so a new runtime compiles them once again. A folder set by `JAX_COMPILATION_CACHE_DIR`
    is kept; `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` overrides `CACHE_MIN_COMPILE_S`. JAX
    fixes the folder at its first compile after this call: called again with another folder,
    this says that the first stays in use until the process restarts. Returns the folder in use."""
    folder = pathlib.Path(os.environ.get("JAX_COMPILATION_CACHE_DIR")
                          or (COLAB_COMPILED if in_colab() else runs_dir() / "compiled"))
    in_use = getattr(compilation_cache._cache, "path", None)
    if in_use is not None and pathlib.Path(in_use) != folder:
        print(f"compiled programs stay in {in_use}, not {folder}, until the kernel restarts: "
              "JAX keeps the folder of its first compile")
        return pathlib.Path(in_use)
    compilation_cache.get_file_cache = _whole_entries_cache
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", CACHE_MIN_COMPILE_S)))
    return folder


def keep_runs_on_drive(folder: str = "t5nb/runs") -> str:
    """On Colab, mount Google Drive and send every run (checkpoints, logs, predictions) to
    `MyDrive/<folder>` through `T5NB_RUNS_DIR`, so that they outlive the runtime and every
    notebook finds notebook 02's pretraining there. Returns the folder; elsewhere, refuses."""
    if not in_colab():
        raise RuntimeError("keep_runs_on_drive is for Colab; elsewhere runs stay in T5NB_RUNS_DIR or runs/")
    from google.colab import drive  # exists on Colab only

    drive.mount(DRIVE)
    path = f"{DRIVE}/MyDrive/{folder}"
    os.makedirs(path, exist_ok=True)
    os.environ["T5NB_RUNS_DIR"] = path
    print(f"runs go to {path} (Google Drive)")
    return path


def versions() -> dict[str, str]:
    """Installed versions of the packages t5nb is built on."""
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


# What a CPU's model name says beside its maker and model: trademarks, "CPU", the core count, the clock
_CPU_NAME_NOISE = re.compile(r"\((R|TM)\)|\bCPU\b|\bProcessor\b|\b\d+-Core\b|@ *[\d.]+ *GHz", re.I)


def cpu_description(cpuinfo: str | None = None, cores: int | None = None) -> str:
    """This machine's CPU as the course's times are kept under it (docs/course_times.json), from
    /proc/cpuinfo (or `cpuinfo`) and the cores this process may run on (or `cores`): its first
    model name without trademarks, clock or core count, and on x86 whether it has AVX-512
    (the flag avx512f), e.g. "2 cores of an AMD EPYC with AVX-512"; without /proc/cpuinfo (macOS,
    Windows), what `platform` names."""
    if cpuinfo is None:
        path = pathlib.Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.is_file() else ""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    fields = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())  # the first processor's
    name = " ".join(_CPU_NAME_NOISE.sub(" ", fields.get("model name", "")).split())
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    avx512 = "" if "flags" not in fields else (" with" if "avx512f" in fields["flags"].split() else " without")
    return (f"{cores} core{'s' if cores != 1 else ''} of {'an' if name[0] in 'AEIOUaeiou' else 'a'} {name}"
            + (f"{avx512} AVX-512" if avx512 else ""))


def record_headline(**numbers) -> None:
    """Course bookkeeping, done by the library's calls, not by the notebooks: under `t5nb course`,
    which names the notebook it runs in `T5NB_NOTEBOOK`, merge `numbers` into that notebook's
    headline (`t5nb course` puts it into `runs/results.json`); anywhere else, nothing."""
    notebook = os.environ.get("T5NB_NOTEBOOK")
    if not notebook:
        return
    path = runs_dir() / "headlines" / f"{notebook}.json"
    recorded = json.loads(path.read_text()) if path.exists() else {}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps({**recorded, **numbers}, indent=2, default=float) + "\n")


def time_matmul(n: int, dtype=jnp.float32, repeats: int = 5) -> float:
    """Best-of-`repeats` achieved FLOP/s of a jitted [n, n] @ [n, n] on the default device."""
    x = jax.random.normal(jax.random.key(0), (n, n), dtype)
    matmul = jax.jit(lambda a: a @ a)
    matmul(x).block_until_ready()  # compile once, outside the timing
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(x).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def report(profile) -> None:
    """Print where we are: Colab or local, versions, devices and the profile in use."""
    where = "Google Colab" if in_colab() else "Kaggle" if in_kaggle() else "a local machine"
    print(f"Running on: {where} ({platform.platform()})")
    for name, version in versions().items():
        print(f"  {name:18s} {version}")
    devices = jax.devices()
    print(f"JAX backend: {jax.default_backend()}, {len(devices)} device(s): "
          f"{', '.join(sorted({d.device_kind for d in devices}))}")
    print(f"Profile: {profile.name} - {profile.description}")

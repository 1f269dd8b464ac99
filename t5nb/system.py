"""What machine is this: Colab, Kaggle or local, where its runs and compiled programs are kept,
package versions, devices, a timed matmul."""
import importlib.metadata
import os
import pathlib
import platform
import sys
import time

import jax
import jax.numpy as jnp

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


def keep_compiled_programs() -> pathlib.Path:
    """Keep every program JAX compiles in `<runs_dir()>/compiled` (JAX's persistent compilation
    cache), so that a later kernel (the next notebook, a rerun, `t5nb train`) loads it instead of
    compiling it again: minutes of XLA's compiler on an accelerator's host. A cache folder set
    by `JAX_COMPILATION_CACHE_DIR` is kept. Every program is kept, not only those over JAX's
    default of a second (`JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` overrides that). Call it
    before the first compile: JAX reads these settings once. Returns the folder."""
    folder = os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(runs_dir() / "compiled")
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", 0)))
    return pathlib.Path(folder)


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

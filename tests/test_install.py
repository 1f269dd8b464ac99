"""The installed environment: one provider per module, pip check, an import that changes nothing, a quiet
TensorFlow, host memory kept and the cycle collector tuned by `t5nb.tune_host()`."""
import importlib.metadata
import json
import os
import pathlib
import platform
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from t5nb import host
from local_server import jupyter_lab  # noqa: I001  (tests/local_server.py)


def test_exactly_one_distribution_provides_seqio_and_tfds():
    providers = importlib.metadata.packages_distributions()
    assert providers["seqio"] == ["seqio-nightly"]
    assert providers["tensorflow_datasets"] == ["tfds-nightly"]


def test_pip_check_passes():
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# An import that changes nothing: environment, file descriptors, the cycle collector's thresholds,
# modules that do (JAX sets environment variables when imported, TensorFlow more), and glibc's
# malloc, seen through `malloc_info`: a 64 MB block is mmap'd by default, and never after `tune_host()`.
IMPORT_T5NB = """
import ctypes, gc, json, os, sys, tempfile
before = dict(os.environ), sorted(os.listdir("/proc/self/fd")), gc.get_threshold()
import t5nb
{after_import}
after = dict(os.environ), sorted(os.listdir("/proc/self/fd")), gc.get_threshold()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.fopen.restype = ctypes.c_void_p, ctypes.c_void_p
libc.fopen.argtypes, libc.malloc_info.argtypes, libc.fclose.argtypes = [ctypes.c_char_p] * 2, [ctypes.c_int, ctypes.c_void_p], [ctypes.c_void_p]
def mmapped_blocks():
    with tempfile.NamedTemporaryFile() as report:
        stream = libc.fopen(report.name.encode(), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        return int(report.read().decode().split('<total type="mmap" count="')[1].split('"')[0])
count = mmapped_blocks()
block = libc.malloc(64 << 20)
mmapped = mmapped_blocks() > count
print(json.dumps({{"unchanged": before == after, "modules": sorted({{"jax", "tensorflow", "seqio"}} & set(sys.modules)),
                  "mmapped": mmapped, "gc": after[2]}}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_info is glibc's")
def test_importing_t5nb_changes_nothing_and_tune_host_is_the_one_call_that_does():
    def run(after_import="", **env):
        result = subprocess.run([sys.executable, "-c", IMPORT_T5NB.format(after_import=after_import)],
                                capture_output=True, text=True, env={**os.environ, **env})
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    assert run() == {"unchanged": True, "modules": [], "mmapped": True, "gc": [700, 10, 10]}
    assert run("t5nb.tune_host()", JAX_PLATFORMS="cpu") == {"unchanged": False, "modules": [], "mmapped": False,
                                                            "gc": list(host.GC_THRESHOLDS)}
    # where JAX runs on an accelerator, XLA:CPU runs no steps: malloc is left as it is, the collector is not
    for accelerator in ("cuda", "tpu"):
        assert run("assert not t5nb.tune_host()", JAX_PLATFORMS=accelerator) == {
            "unchanged": False, "modules": [], "mmapped": True, "gc": list(host.GC_THRESHOLDS)}


def test_an_accelerator_host_needs_both_the_device_and_jaxs_plugin_for_it(monkeypatch):
    def host_with(devices=(), modules=()):
        monkeypatch.setattr(host.glob, "glob", lambda pattern: [pattern] if pattern in devices else [])
        monkeypatch.setattr(host.importlib.util, "find_spec", lambda name: name if name in modules else None)
        return host.accelerator_host()

    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    assert not host_with()
    assert not host_with(devices={"/dev/nvidia[0-9]*"})  # a desktop's card beside a CPU-only jax
    assert not host_with(devices={"/dev/vfio/[0-9]*"}, modules={"jax_cuda12_plugin"})  # passthrough, no TPU
    assert not host_with(modules={"jax_cuda12_plugin", "libtpu"})  # plugins, no device
    assert host_with(devices={"/dev/nvidia[0-9]*"}, modules={"jax_cuda13_plugin"})
    assert host_with(devices={"/dev/vfio/[0-9]*"}, modules={"libtpu"})
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert not host_with(devices={"/dev/nvidia[0-9]*"}, modules={"jax_cuda12_plugin"})  # what it names wins


def test_tensorflow_is_quiet_and_hides_accelerators():
    code = (
        "import t5nb.tasks, seqio, t5, tensorflow_datasets, clu.metric_writers\n"
        "import tensorflow as tf\n"
        "print(tf.config.get_visible_devices('GPU'), tf.config.get_visible_devices('TPU'))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[] []"
    for noise in ("cudart_stub", "cuInit", "absl::InitializeLog", "TensorInfo.dtype"):
        assert noise not in result.stderr, result.stderr


# Page faults of the third run of a jitted function with a 256 MB temporary ([4096, 16384] f32),
# in 4 KB pages: transparent huge pages are switched off for the process (PR_SET_THP_DISABLE),
# as they would make the count depend on the kernel's free huge pages.
FAULTS_OF_A_REPEATED_STEP = """
import ctypes, resource
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)
import t5nb
{tune}
import jax, jax.numpy as jnp
x, w = jnp.ones((4096, 256)), jnp.ones((256, 16384)) / 256
step = jax.jit(lambda x, w: (jnp.tanh(x @ w) @ w.T).sum())
for _ in range(2):
    jax.block_until_ready(step(x, w))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
jax.block_until_ready(step(x, w))
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the malloc tuning is glibc's")
def test_tune_host_keeps_freed_host_memory_so_repeated_steps_do_not_fault_pages():
    cpu = {**os.environ, "JAX_PLATFORMS": "cpu"}  # XLA:CPU runs the steps, on any host

    def faults(tune: str):
        result = subprocess.run([sys.executable, "-c", FAULTS_OF_A_REPEATED_STEP.format(tune=tune)],
                                capture_output=True, text=True, env=cpu)
        assert result.returncode == 0, result.stderr
        return int(result.stdout.split()[-1])

    assert subprocess.run([sys.executable, "-c", "import sys, t5nb; sys.exit(not t5nb.tune_host())"],
                          env=cpu).returncode == 0
    kept, untuned = faults("assert t5nb.tune_host()"), faults("")  # glibc took all three settings
    print(f"page faults of a repeated step: {kept} with tune_host(), {untuned} without")
    if untuned < 1024:  # under 4 MB of the 256 MB temporary came back from the kernel
        pytest.skip(f"this host's allocator already keeps the freed temporary: a repeated step faulted "
                    f"{untuned} pages without t5nb's setting ({kept} with it), so the setting has "
                    f"nothing to show")
    assert kept * 10 < untuned


def test_make_lab_serves_the_course_in_jupyterlab_with_the_widgets_front_end(tmp_path):
    """`make lab` (the README's command) starts JupyterLab from .venv on localhost, behind a
    token, on the notebooks folder, with the widgets' front end (the progress bars, the ask
    widget) among its extensions."""
    root = pathlib.Path(__file__).resolve().parents[1]
    with jupyter_lab(tmp_path, {**os.environ, "HOME": str(tmp_path)}) as (url, token):
        def get(path, key=token):
            with urllib.request.urlopen(f"{url}{path}?token={key}", timeout=10) as response:
                return response.read().decode()

        names = sorted(item["name"] for item in json.loads(get("/api/contents"))["content"])
        notebooks = sorted(path.name for path in (root / "notebooks").glob("*.ipynb"))
        assert [name for name in names if name.endswith(".ipynb")] == notebooks
        page = get("/lab")  # its page config lists the front-end extensions it loads
        assert "JupyterLab" in page and '"name": "@jupyter-widgets/jupyterlab-manager"' in page
        with pytest.raises(urllib.error.HTTPError):
            get("/api/contents", key="wrong")

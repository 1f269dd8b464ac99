"""Refresh requirements/colab.txt or requirements/kaggle_tpu.txt: what a hosted runtime
preinstalls of t5nb's dependency tree, at the runtime's versions, with its source and date.

    python scripts/hosted_lists.py colab FREEZE DATE SOURCE
    python scripts/hosted_lists.py kaggle_tpu DATE SOURCE

Colab: FREEZE is pip-freeze.txt of github.com/googlecolab/backend-info (a path), DATE and SOURCE
its newest commit's date and hash. The list is the packages of requirements/base.lock that Colab
has, and everything they need, each pinned to Colab's version (`uv pip compile` with the freeze
as constraints, for the runtime's Python).
Kaggle's TPU image: Kaggle publishes no freeze. Its Dockerfile (github.com/Kaggle/docker-python,
tpu/) resolves tpu/requirements.in with `uv pip compile --upgrade` when the image is built; the
list is that resolution, of the lines t5nb's tree shares, for the image's Python, as of DATE
(the Dockerfile's newest commit, an ISO time) and SOURCE (its hash).
Read the diff, then run `make test`: it runs the course on the new lists.
"""
import pathlib
import subprocess
import sys
import tempfile
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import hosted_stacks  # noqa: E402  (tests/hosted_stacks.py: each runtime's Python and list)

# the lines of Kaggle's tpu/requirements.in (and tpu/config.txt's pins) that t5nb's tree shares
KAGGLE_TPU_IN = ["tensorflow-cpu==2.20.0", "tensorflow_datasets", "jax==0.7.2", "jaxlib==0.7.2", "flax", "optax",
                 "ipywidgets", "ipykernel", "matplotlib", "pandas", "pyarrow"]

HEADERS = {  # a paragraph each, wrapped into the list's comment lines
    "colab": """\
What a fresh Colab runtime preinstalls of the packages requirements/base.lock pins, and of what
those need, at Colab's versions: its CPU runtime (Python {python}) from pip-freeze.txt in
googlecolab/backend-info, commit {source} of {date}. GPU runtimes have the same and
jax-cuda12-plugin/jax-cuda12-pjrt at jax's version; TPU runtimes add libtpu, and have no
tensorflow, tensorflow-text or tensorboard (pip-freeze.gpu.txt, pip-freeze.tpu.txt). Colab's
tensorflow-datasets is replaced by tfds-nightly (scripts/hosted_setup.sh). tests/hosted_stacks.py
seeds a virtualenv with this list: the tests and `make test`'s rehearsal run t5nb on it. Refresh: python scripts/hosted_lists.py colab pip-freeze.txt DATE COMMIT
""",
    "kaggle_tpu": """\
What Kaggle's TPU notebook image (TPU v5e-8, Python {python}) preinstalls of t5nb's dependency
tree. Kaggle publishes no freeze of it: its Dockerfile (Kaggle/docker-python, tpu/, commit
{source}) resolves tpu/requirements.in with `uv pip compile --upgrade` when it builds the image,
pinning tensorflow-cpu and jax (libtpu forced after, left out here). This is that resolution of
the lines t5nb's tree shares ({lines}) as of {date}.
The image's other packages (torch, tunix, keras-nlp, transformers, ...) are left out. Kaggle's
GPU image (2 x T4, P100) is a Colab runtime plus Kaggle's packages: requirements/colab.txt
stands in for it. tests/hosted_stacks.py seeds a virtualenv with this list: the tests run t5nb on
it. Refresh: python scripts/hosted_lists.py kaggle_tpu DATE COMMIT
""",
}


def _comment(paragraph: str) -> str:
    return "".join(f"# {line}\n" for line in textwrap.wrap(" ".join(paragraph.split()), 96, break_on_hyphens=False))


def compile_list(runtime: str, *args: str) -> str:
    """The runtime's pinned packages, one `name==version` a line."""
    python = hosted_stacks.RUNTIMES[runtime][0]
    with tempfile.TemporaryDirectory() as folder:
        wanted, extra = pathlib.Path(folder) / "wanted.in", []
        if runtime == "colab":
            freeze, date, source = args
            preinstalled = hosted_stacks.pins(pathlib.Path(freeze))
            lock = hosted_stacks.pins(ROOT / "requirements" / "base.lock")
            wanted.write_text("\n".join(name for name in lock if name in preinstalled) + "\n")
            constraints = pathlib.Path(folder) / "freeze.txt"
            constraints.write_text("\n".join(f"{name}=={version}" for name, version in preinstalled.items()) + "\n")
            extra = ["--constraint", str(constraints)]
        else:
            date, source = args
            wanted.write_text("\n".join(KAGGLE_TPU_IN) + "\n")
            extra = ["--exclude-newer", date]
        result = subprocess.run([sys.executable, "-m", "uv", "pip", "compile", "-q", "--no-header", "--no-annotate",
                                 "--python-version", python, *extra, str(wanted)],
                                capture_output=True, text=True, check=True)
    pinned = result.stdout.splitlines()
    if runtime == "colab":  # what a package declares and Colab lacks stays out: Colab's own state
        pinned = [line for line in pinned if hosted_stacks.normalised(line.split("==")[0]) in preinstalled]
    header = HEADERS[runtime].format(python=python, date=date, source=source, lines=", ".join(KAGGLE_TPU_IN))
    return _comment(header) + "\n".join(pinned) + "\n"


if __name__ == "__main__":
    runtime = sys.argv[1]
    (ROOT / hosted_stacks.RUNTIMES[runtime][1]).write_text(compile_list(runtime, *sys.argv[2:]))

"""A hosted runtime's own stack in a virtualenv, as a learner's notebook meets it: the runtime's
Python, the packages it preinstalls (its list in requirements/), then scripts/hosted_setup.sh as
the setup cell runs it. The tests and `make test`'s rehearsal run t5nb on it.

    python tests/hosted_stacks.py RUNTIME DIR     # builds DIR (with pytest and nbval); prints its python

Exit status 3, with the reason, where this machine lacks the runtime's Python.
"""
import glob
import os
import pathlib
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

# a hosted runtime -> its Python and the list of what it preinstalls (each file's header: its
# source, its date and how to refresh it)
RUNTIMES = {"colab": ("3.13", "requirements/colab.txt"), "kaggle_tpu": ("3.12", "requirements/kaggle_tpu.txt")}
# what runs the tests and notebooks in it, from requirements/test.lock (no runtime has them)
TEST_TOOLS = ("pytest", "pluggy", "iniconfig", "nbval", "coverage", "pytest-xdist", "execnet")


class MissingPython(Exception):
    """This machine has no interpreter of the runtime's Python version."""


def interpreter(version: str) -> str:
    """A working `python<version>`: on PATH, or among pyenv's versions (whose shims refuse a
    version that is installed but not selected)."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = [shutil.which(f"python{version}"), *sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"))]
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "--version"], capture_output=True).returncode == 0:
            return candidate
    raise MissingPython(f"no Python {version} here (on PATH or in {root}/versions)")


def environment(venv: pathlib.Path) -> dict:
    """The environment a command in `venv` runs in, its `python` and `pip` first on PATH. No bytecode
    compiled at install: Python compiles what a run imports, a small part of the packages, once
    (a runtime does not set PYTHONDONTWRITEBYTECODE)."""
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "PIP_NO_COMPILE": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def seed(runtime: str, venv: pathlib.Path) -> str:
    """A fresh virtualenv of the runtime's Python holding what the runtime preinstalls: its python.
    Seeded by uv (15 s where pip took 104: it fetches and unpacks in parallel; a second stack reuses
    the first's files); the setup script then uses pip, as on the runtime."""
    version, listed = RUNTIMES[runtime]
    subprocess.run([interpreter(version), "-m", "venv", "--clear", venv], check=True)
    python = str(venv / "bin" / "python")
    _uv_install(python, venv, "-r", ROOT / listed)
    return python


def set_up(python: str) -> str:
    """scripts/hosted_setup.sh run by the runtime's Python, as every notebook's setup cell runs it: what it printed."""
    venv = pathlib.Path(python).parents[1]
    result = subprocess.run(["bash", ROOT / "scripts" / "hosted_setup.sh"], capture_output=True, text=True,
                            env=environment(venv))
    if result.returncode:
        raise RuntimeError(f"scripts/hosted_setup.sh failed on {venv}:\n{result.stdout}{result.stderr}")
    return result.stdout


def normalised(name: str) -> str:
    """A distribution's name as pip compares names (`tensorflow_cpu` is `tensorflow-cpu`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: pathlib.Path) -> dict:
    """{normalised name: version} of a requirements file's `name==version` lines."""
    return _pinned(path.read_text())


def installed(python: str) -> dict:
    """{normalised name: version} of what `python`'s virtualenv holds (`pip freeze`)."""
    frozen = subprocess.run([python, "-m", "pip", "freeze"], capture_output=True, text=True, check=True,
                            env=environment(pathlib.Path(python).parents[1])).stdout
    return _pinned(frozen)


def _pinned(text: str) -> dict:
    return {normalised(name): version for name, version in (
        line.strip().split("==") for line in text.splitlines() if "==" in line and not line.startswith("#"))}


def add_test_tools(python: str) -> None:
    """pytest and nbval at test.lock's versions, beside the runtime's packages (none of which they change)."""
    lock = pins(ROOT / "requirements" / "test.lock")
    _uv_install(python, pathlib.Path(python).parents[1], *(f"{name}=={lock[name]}" for name in TEST_TOOLS))


def pip_sources(env: dict) -> list:
    """uv's options for the package sources pip's settings in `env` name (a mirror, a folder of
    wheels), which uv does not read: an option for each whitespace-separated entry, as the Makefile
    passes PIP_FIND_LINKS."""
    options = {"PIP_INDEX_URL": "--index-url", "PIP_EXTRA_INDEX_URL": "--extra-index-url",
               "PIP_FIND_LINKS": "--find-links"}
    return [arg for variable, option in options.items() for entry in env.get(variable, "").split()
            for arg in (option, entry)]


def _uv_install(python: str, venv: pathlib.Path, *requirements) -> None:
    env = environment(venv)
    subprocess.run([sys.executable, "-m", "uv", "pip", "install", "-q", "--python", python, "--no-deps",
                    *pip_sources(env), *requirements], check=True, env=env)


def build(runtime: str, venv: pathlib.Path) -> str:
    """The runtime's stack after its setup cell, with the test tools: its python."""
    python = seed(runtime, venv)
    set_up(python)
    add_test_tools(python)
    return python


if __name__ == "__main__":
    try:
        print(build(sys.argv[1], pathlib.Path(sys.argv[2]).resolve()))
    except MissingPython as missing:
        print(f"{sys.argv[1]}: {missing}", file=sys.stderr)
        sys.exit(3)

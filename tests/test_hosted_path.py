"""The hosted path (Colab, Kaggle): one repository URL (pyproject.toml) behind every badge and
setup cell, and scripts/hosted_setup.sh run over the packages each runtime preinstalls."""
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import hosted_stacks  # tests/hosted_stacks.py

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("sync_notebooks", ROOT / "scripts" / "sync_notebooks.py")
sync_notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sync_notebooks)
REPO, BRANCH = sync_notebooks.repository()


def test_badges_and_setup_cells_are_what_sync_notebooks_writes(tmp_path):
    for name in ("notebooks", "README.md", "pyproject.toml"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, tmp_path / name)
    changed = [p.relative_to(tmp_path).as_posix() for p in sync_notebooks.sync(tmp_path)]
    assert changed == [], f"run `python scripts/sync_notebooks.py`: it would rewrite {changed}"
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):  # what was compared, spelled out
        first, setup = json.loads(path.read_text())["cells"][:2]
        assert first["source"][0] == sync_notebooks.badge(path.name) + "\n"
        assert setup["source"] == sync_notebooks.setup_cell(path.stem)


def test_no_file_names_another_repository_for_the_project():
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.splitlines()
    name = REPO.split("/")[1]
    wrong = []
    for file in files:
        try:
            text = (ROOT / file).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        colab = re.findall(r"(?:colab\.research\.google\.com/github|kaggle\.com/kernels/welcome\?src="
                           r"https://github\.com)/([^/\s]+/[^/\s]+)/blob/([^/\s]+)/", text)
        github = re.findall(rf"github\.com/([\w.-]+/(?:{re.escape(name)}|t5nb))\b", text)
        wrong += [f"{file}: {hit}" for hit in colab if hit != (REPO, BRANCH)]
        wrong += [f"{file}: {hit}" for hit in github if hit != REPO]
    assert not wrong, f"pyproject.toml names {REPO} ({BRANCH}); these name another:\n" + "\n".join(wrong)


def stack(runtime: str, venv: pathlib.Path) -> str:
    """The runtime's preinstalled stack in `venv` (`hosted_stacks.seed`): its python. Where this
    machine lacks the runtime's Python the test is skipped, saying so, and fails under CI."""
    try:
        return hosted_stacks.seed(runtime, venv)
    except hosted_stacks.MissingPython as missing:
        if os.environ.get("CI"):
            pytest.fail(f"{runtime}: {missing}; CI runs t5nb on each hosted runtime's Python")
        pytest.skip(f"{runtime}: {missing}")


# on the runtime's flax and ipywidgets: the parameters split on a 4 x 2 mesh, the ask widget displayed
ON_EACH_STACK = ["tests/test_mesh.py::test_the_trainer_splits_the_parameters_over_a_4_x_2_mesh",
                 "tests/test_widgets.py::test_ask_widget_is_saved_with_its_last_answer_as_text"]


@pytest.mark.needs_tensorflow  # each runtime's TensorFlow, installed from the package registry
@pytest.mark.parametrize("runtime", hosted_stacks.RUNTIMES)
def test_hosted_setup_keeps_the_runtime_and_t5nb_runs_on_it(tmp_path, runtime):
    """A fresh virtualenv of the runtime's Python seeded with its list stands in for it (Colab's
    CPU runtime, Python 3.13; Kaggle's TPU image, Python 3.12, whose tensorflow-cpu has no
    tensorflow-text): after the setup script, the runtime's jax, flax, TensorFlow and the rest are
    as they were; the parameters split over a mesh and the ask widget displays on its flax and
    ipywidgets. On Kaggle's, a scanned model on 8 simulated devices (the `rehearsal` profile, its
    tasks read from the stand-ins) trains, decodes and resumes; on Colab's, `make test`'s rehearsal
    runs the whole course (tests/hosted_stacks.py builds its stack)."""
    python = stack(runtime, tmp_path / runtime)
    env = {**hosted_stacks.environment(tmp_path / runtime), "T5NB_RUNS_DIR": str(tmp_path / "runs")}
    env.pop("T5NB_PROFILE", None)  # `make test` sets ci: here t5nb detects the profile

    def run(*command, cwd=tmp_path, **changes) -> str:
        result = subprocess.run(command, capture_output=True, text=True, env={**env, **changes}, cwd=cwd)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    probe = "import jax, jaxlib; print(jax.__version__, jaxlib.__version__, jax.default_backend())"
    hosted_jax = run(python, "-c", probe)
    hosted = hosted_stacks.installed(python)

    hosted_stacks.set_up(python)
    assert run(python, "-c", probe) == hosted_jax
    after = hosted_stacks.installed(python)
    kept = {n for n in hosted if n not in ("protobuf", "tensorflow-datasets")}
    assert {n: after.get(n) for n in kept} == {n: hosted[n] for n in kept}  # jax, flax, numpy, tensorflow, ...
    lock = hosted_stacks.pins(ROOT / "requirements" / "base.lock")
    assert "tensorflow-datasets" not in after and after["tfds-nightly"] == lock["tfds-nightly"]
    tensorflow = hosted.get("tensorflow") or hosted["tensorflow-cpu"]
    assert after["tensorflow-text"].split(".")[:2] == tensorflow.split(".")[:2]  # built against that TensorFlow
    assert ("tensorflow" in after) == ("tensorflow" in hosted)  # a tensorflow-cpu is not doubled
    unmet = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True, env=env).stdout
    provided = {"tensorflow"} if "tensorflow-cpu" in after else set()  # the same module, another name
    unmet = [line for line in unmet.splitlines() if line.startswith("t5nb ")
             and not any(f"requires {name}, which is not installed" in line for name in provided)]
    assert not unmet, unmet  # pyproject.toml's lower bounds admit the runtime's versions
    out = run(python, "-c", "import t5nb; print(t5nb.get_profile().name)")
    assert out.split() == ["cpu"]

    hosted_stacks.set_up(python)  # every notebook's setup cell runs it again
    assert hosted_stacks.installed(python) == after

    hosted_stacks.add_test_tools(python)
    out = run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ON_EACH_STACK, cwd=ROOT)
    assert f"{len(ON_EACH_STACK)} passed" in out, out
    if runtime == "kaggle_tpu":
        standins = tmp_path / "standins"
        subprocess.run([sys.executable, ROOT / "tests" / "standins.py", standins], check=True, capture_output=True)
        out = run(python, ROOT / "tests" / "smoke_run.py", "rehearsal", T5NB_STANDINS=str(standins),
                  XLA_FLAGS="--xla_force_host_platform_device_count=8")
        assert out.splitlines()[-2] == "scanned layers True devices 8", out
        assert out.split()[-4:-2] == ["4", "8"], out


def test_uv_seeds_a_stack_from_pips_package_sources():
    """A mirror and a folder of wheels that pip's settings name reach uv, which reads none of them:
    each whitespace-separated entry an option of its own."""
    env = {"PIP_INDEX_URL": "https://mirror.example/simple", "PIP_EXTRA_INDEX_URL": "https://extra.example/simple",
           "PIP_FIND_LINKS": "/wheels  https://example.com/torch_cpu.html\n/more", "PIP_NO_COMPILE": "1"}
    assert hosted_stacks.pip_sources(env) == [
        "--index-url", "https://mirror.example/simple", "--extra-index-url", "https://extra.example/simple",
        "--find-links", "/wheels", "--find-links", "https://example.com/torch_cpu.html", "--find-links", "/more"]
    assert hosted_stacks.pip_sources({"PIP_NO_COMPILE": "1"}) == []


def test_every_lower_bound_is_the_oldest_version_the_tests_run():
    """pyproject.toml's lower bounds admit nothing untested: each dependency's is its oldest
    version on the stacks the tests run t5nb on, each hosted runtime's (its own version, else the
    lock's, which the setup script installs) and the lock's; a package only an extra needs, its lock's."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.version import Version

    norm, pins = hosted_stacks.normalised, hosted_stacks.pins
    lock = pins(ROOT / "requirements" / "base.lock")
    stacks = [lock, *({**lock, **pins(ROOT / listed)} for _, listed in hosted_stacks.RUNTIMES.values())]
    for runtime in stacks:
        runtime.setdefault("tensorflow", runtime.get("tensorflow-cpu"))  # Kaggle's TPU image: the same module
    extras = {**pins(ROOT / "requirements" / "test.lock"), **pins(ROOT / "requirements" / "lab.lock"), **lock}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dependencies = {norm(Requirement(line).name) for line in project["dependencies"]}
    wrong = []
    for line in [*project["dependencies"], *(line for group in project["optional-dependencies"].values() for line in group)]:
        requirement = Requirement(line)
        bound = next((Version(spec.version) for spec in requirement.specifier if spec.operator in (">=", "==")), None)
        name = norm(requirement.name)  # jax[cuda12]: jax, a dependency
        runs = ([Version(stack[name]) for stack in stacks] if name in dependencies
                else [Version(extras[name].split("+")[0])])
        if bound != min(runs):
            wrong.append(f"{line}: the oldest version the tests run is {min(runs)}")
    assert not wrong, wrong


def test_on_kaggle_runs_go_to_its_working_folder(monkeypatch):
    from t5nb import system, workflow

    monkeypatch.delenv("T5NB_RUNS_DIR", raising=False)
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    assert system.in_kaggle() and workflow.runs_dir() == pathlib.Path("/kaggle/working/runs")
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE")
    assert not system.in_kaggle() and workflow.runs_dir() == ROOT / "runs"


def test_keep_runs_on_drive_mounts_drive_and_points_every_run_there(tmp_path, monkeypatch):
    import types

    from t5nb import get_profile, system, workflow

    mounted = []
    colab = types.ModuleType("google.colab")
    colab.drive = types.SimpleNamespace(mount=mounted.append)
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setattr(system, "DRIVE", str(tmp_path / "drive"))
    monkeypatch.delenv("T5NB_RUNS_DIR", raising=False)
    path = system.keep_runs_on_drive()
    assert mounted == [str(tmp_path / "drive")] and path == f"{tmp_path}/drive/MyDrive/t5nb/runs"
    assert workflow.runs_dir() == pathlib.Path(path) and pathlib.Path(path).is_dir()
    assert workflow.pretraining_dir(get_profile("cpu")) == pathlib.Path(path) / "cpu" / "pretraining"

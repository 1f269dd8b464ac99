"""`t5nb train` in processes of its own (forked from fork_server.py), for the tests that kill,
resume and run it on several processes (test_run_folder.py): the small course recipe, its
uninterrupted run (`straight_run`) and the helpers that start and compare runs."""
import atexit
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
from filelock import FileLock

from t5nb import checkpoints, restore
from t5nb.paths import REPO_ROOT
from local_server import free_port  # noqa: I001  (tests/local_server.py)

COURSE = REPO_ROOT / "recipes" / "course" / "pretraining.toml"
FORK_SERVER = pathlib.Path(__file__).with_name("fork_server.py")
SMALL = ["model.preset=t5.1.1-tiny", "data.batch_size=8", "data.inputs_length=64", "data.targets_length=16",
         "run.steps=12", "run.checkpoint_every=4", "run.eval_every=4", "run.log_every=4"]


class _ForkServer:
    """fork_server.py, started once per test process: `run` asks it for a child."""

    def __init__(self, env: dict):
        self.process = subprocess.Popen([sys.executable, str(FORK_SERVER)], env=env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        assert "ready" in json.loads(self.process.stdout.readline()), "the fork server did not start"
        atexit.register(self.process.kill)

    def run(self, argv: list[str], env: dict, output: pathlib.Path) -> "Forked":
        self.process.stdin.write(json.dumps({"argv": argv, "env": env, "output": str(output)}) + "\n")
        self.process.stdin.flush()
        return Forked(json.loads(self.process.stdout.readline())["pid"], output)


class Forked:
    """A child of the fork server, with the part of subprocess.Popen's interface the tests use."""

    def __init__(self, pid: int, output: pathlib.Path):
        self.pid, self.output, self.returncode = pid, output, None
        self.status = output.with_name(output.name + ".status")

    def poll(self) -> int | None:
        if self.returncode is None and self.status.exists():
            self.returncode = int(self.status.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.time() + timeout
        while self.poll() is None:
            if deadline is not None and time.time() > deadline:
                raise subprocess.TimeoutExpired(f"process {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        self.wait(timeout)
        return self.output.read_text(errors="replace"), None

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_servers: dict[str, _ForkServer] = {}


def start(tmp_path, model_dir, name, *extra, devices=1, delay=0.0, kill_at=None, changes=()) -> Forked:
    """`t5nb train` of the small course recipe (with `changes`) into `model_dir`, in a process of
    its own (forked from fork_server.py, which has imported it); with `kill_at`, it waits at that
    point (kill_points) once `tmp_path/<name>.reached` exists."""
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(tmp_path.parent / "jax_cache")
    if cache not in _servers:  # JAX reads its cache's folder when imported, so one server per folder
        _servers[cache] = _ForkServer({**os.environ, "JAX_COMPILATION_CACHE_DIR": cache})
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": cache, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "T5NB_TEST_BATCHES_OUT": str(tmp_path / f"{name}.batches"), "T5NB_TEST_BATCH_DELAY": str(delay),
           **({"T5NB_TEST_KILL_AT": kill_at, "T5NB_TEST_KILL_MARKER": str(tmp_path / f"{name}.reached")}
              if kill_at else {})}
    settings = [value for assignment in [*SMALL, *changes, f"run.model_dir={model_dir}"] for value in ("--set", assignment)]
    return _servers[cache].run(["train", str(COURSE), *settings, *map(str, extra)], env, tmp_path / f"{name}.output")


def finish(process):
    output = process.communicate(timeout=600)[0]
    assert process.returncode == 0, output[-3000:]
    return output


def two_processes(tmp_path, model_dir, name, delay=0.0):
    port = free_port()
    return [start(tmp_path, model_dir, f"{name}{i}", "--coordinator", f"localhost:{port}", "--num-processes", 2,
                  "--process-id", i, delay=delay) for i in (0, 1)]


def final_params(model_dir) -> dict:
    model, step = restore.load_model(model_dir)
    assert step == 12
    return checkpoints.flatten(checkpoints.params_of(model))


def batches(tmp_path, name) -> list[str]:
    return [line.split()[1] for line in (tmp_path / f"{name}.batches").read_text().splitlines()]


def wait_for_checkpoint(process, model_dir, step):
    deadline = time.time() + 300
    while not (model_dir / "checkpoints" / str(step)).exists():  # orbax renames a step's folder when complete
        assert process.poll() is None and time.time() < deadline, "no checkpoint at step 4 before the run ended"
        time.sleep(0.05)


def straight_run(tmp_path_factory):
    """The uninterrupted run on one process with 2 devices: (parameters, run directory). It runs
    once per pytest run: the first xdist worker to ask runs it, into the run's shared temporary
    folder, while the others wait for it."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # one pytest run's workers share the parent
    tmp_path = shared / "straight"
    with FileLock(shared / "straight.lock"):
        if not (tmp_path / "finished").exists():
            shutil.rmtree(tmp_path, ignore_errors=True)
            tmp_path.mkdir()
            finish(start(tmp_path, tmp_path / "run", "straight", devices=2))
            (tmp_path / "finished").touch()
    return final_params(tmp_path / "run"), tmp_path / "run"


def assert_same_params(expected: dict, got: dict):
    assert expected.keys() == got.keys()
    for name in expected:
        assert np.array_equal(expected[name], got[name]), name

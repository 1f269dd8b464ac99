"""Servers the tests start on this machine: a free port on localhost, and JupyterLab through
`make lab` (the README's command), behind a token of its own, stopped with everything it started."""
import contextlib
import json
import os
import pathlib
import secrets
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
START_S = 120  # JupyterLab's start, every port tried included
PORTS = 3  # ports tried: another process may take a free port before JupyterLab binds it


def free_port() -> int:
    """A port free when asked, which another process may take before the caller binds it."""
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def stat(path: pathlib.Path) -> list:
    """The fields of /proc/<pid>/stat after the process's name: state, ppid, ..., its start time at 19."""
    return path.read_text().rsplit(")", 1)[1].split()


def descendants(pid: int) -> dict:
    """{pid: start time} of every process below `pid`, from /proc: a kernel JupyterLab starts
    leads a process group of its own (setsid), outside its server's."""
    children = {}
    for path in pathlib.Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # a process that exited while read
            fields = stat(path)
            children.setdefault(int(fields[1]), []).append((int(path.parent.name), fields[19]))
    found, parents = {}, [pid]
    while parents:
        for child, started in children.get(parents.pop(), ()):
            found[child] = started
            parents.append(child)
    return found


def alive(pid: int, started: str) -> bool:
    """Whether process `pid`, started at `started`, runs (not a zombie, not a later process given
    the same pid)."""
    try:
        fields = stat(pathlib.Path(f"/proc/{pid}/stat"))
    except OSError:
        return False
    return fields[19] == started and fields[0] != "Z"


def kill_left(processes: dict) -> None:
    """SIGKILL to each of `processes` ({pid: start time}) still running; waits until they have
    ended, up to a minute."""
    left = {pid: started for pid, started in processes.items() if alive(pid, started)}
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while any(alive(pid, started) for pid, started in left.items()) and time.monotonic() < deadline:
        time.sleep(0.05)


def wait_unreaped(server: subprocess.Popen, timeout: float) -> None:
    """Waits until `server` has exited, up to `timeout` s, leaving it for Popen to reap: until then
    its pid and process group id stay its own (a zombie's), never another process's."""
    deadline = time.monotonic() + timeout
    while (os.waitid(os.P_PID, server.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
           and time.monotonic() < deadline):
        time.sleep(0.05)


def stop(server: subprocess.Popen) -> None:
    """SIGTERM to the process group of `server` (make's and JupyterLab's: JupyterLab shuts its
    kernels down, each kernel its TensorBoard); once it has exited, or after a minute, SIGKILL to
    the group and to every process that was below it when this began (the kernels, in process groups
    of their own, and their TensorBoards), whichever are left; then Popen reaps it. A server Popen
    has already reaped (`serving` polls it) is left alone: its pid may be another process's now."""
    if server.returncode is not None:
        return
    started = descendants(server.pid)
    os.killpg(server.pid, signal.SIGTERM)
    try:
        wait_unreaped(server, timeout=60)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        kill_left(started)
        server.wait()


def accepts(url: str, token: str, timeout: float) -> bool:
    """Whether the server at `url` answers and accepts `token` (JupyterLab refuses another
    server's with 403)."""
    try:
        with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=timeout):
            return True
    except OSError:
        return False


def listening(server: subprocess.Popen, port: int, runtime: pathlib.Path) -> bool:
    """Whether JupyterLab's runtime file in `runtime` (written once it listens) names `port` and a
    pid below `server` (make's process)."""
    below = descendants(server.pid)
    for path in runtime.glob("jpserver-*.json"):
        with contextlib.suppress(OSError, ValueError):  # a file being written
            info = json.loads(path.read_text())
            if info["port"] == port and info["pid"] in below:
                return True
    return False


def serving(server: subprocess.Popen, port: int, token: str, runtime: pathlib.Path, log: pathlib.Path,
            deadline: float) -> bool:
    """Waits until JupyterLab below `server` (make's process) serves on `port` as its own: it is
    `listening` there and accepts `token`, which another server refuses (403). False if it exited
    on finding the port taken; fails, with its log, if it exited otherwise or did not serve by
    `deadline`."""
    while True:
        if server.poll() is not None:
            text = log.read_text()
            if f"port {port} is already in use" in text:
                return False
            pytest.fail(f"JupyterLab exited ({server.returncode}):\n{text[-3000:]}")
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"JupyterLab did not serve within {START_S} s:\n{log.read_text()[-3000:]}")
        if listening(server, port, runtime) and accepts(f"http://localhost:{port}", token, min(5.0, left)):
            return True
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


@contextlib.contextmanager
def jupyter_lab(tmp_path: pathlib.Path, env: dict, root: pathlib.Path = ROOT / "notebooks"):
    """`make lab` on `root` and a free port, behind a token of its own: JupyterLab's app reachable
    from the page (to run all cells and read the notebook's model), every cell kept in the page (no
    windowing), no autosave over the notebooks, its settings, workspace, runtime files and log
    under tmp_path. Yields its base URL and token once it serves (`serving`), on another port
    where one was taken first, up to PORTS; on leaving, `stop`."""
    settings = tmp_path / "settings" / "@jupyterlab"
    for plugin, values in (("notebook-extension/tracker", {"windowingMode": "none"}),
                           ("docmanager-extension/plugin", {"autosave": False}),  # the notebooks stay as committed
                           ("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False})):
        (settings / plugin).parent.mkdir(parents=True, exist_ok=True)
        (settings / f"{plugin}.jupyterlab-settings").write_text(json.dumps(values))
    args = (f"--LabApp.expose_app_in_browser=True --LabApp.user_settings_dir={settings.parent} "
            f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}")
    deadline, taken = time.monotonic() + START_S, []
    while len(taken) < PORTS:
        port, token = free_port(), secrets.token_hex(16)
        runtime, log = tmp_path / f"runtime-{port}", tmp_path / f"lab-{port}.log"
        with open(log, "wb") as out:
            server = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_PORT={port}", f"LAB_ROOT={root}",
                                       f"LAB_ARGS={args}"], cwd=ROOT,
                                      env={**env, "JUPYTER_TOKEN": token, "JUPYTER_RUNTIME_DIR": str(runtime)},
                                      stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if serving(server, port, token, runtime, log, deadline):
                yield f"http://localhost:{port}", token
                return
        finally:
            stop(server)
        taken.append(port)
    pytest.fail(f"JupyterLab found each of its ports taken before it bound it: {taken}")

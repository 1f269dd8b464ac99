"""Servers the tests start on this machine: a free port on localhost, and JupyterLab through
`make lab` (the README's command), stopped with everything it started."""
import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOKEN = "course"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def jupyter_lab(tmp_path: pathlib.Path, env: dict, root: pathlib.Path = ROOT / "notebooks"):
    """`make lab` on `root` and a free port, behind TOKEN: JupyterLab's app reachable from the page
    (to run all cells and read the notebook's model), every cell kept in the page (no windowing),
    no autosave over the notebooks, its settings, workspace and runtime files under tmp_path.
    Yields its base URL once it answers; on leaving, SIGTERM to the process group (make's and
    JupyterLab's: JupyterLab shuts its kernels down, each kernel its TensorBoard), and whatever is
    left after a minute is killed."""
    settings = tmp_path / "settings" / "@jupyterlab"
    for plugin, values in (("notebook-extension/tracker", {"windowingMode": "none"}),
                           ("docmanager-extension/plugin", {"autosave": False}),  # the notebooks stay as committed
                           ("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False})):
        (settings / plugin).parent.mkdir(parents=True, exist_ok=True)
        (settings / f"{plugin}.jupyterlab-settings").write_text(json.dumps(values))
    port = free_port()
    args = (f"--LabApp.expose_app_in_browser=True --LabApp.user_settings_dir={settings.parent} "
            f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}")
    log = tmp_path / "lab.log"
    server = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_PORT={port}", f"LAB_ROOT={root}",
                               f"LAB_ARGS={args}"], cwd=ROOT,
                              env={**env, "JUPYTER_TOKEN": TOKEN, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")},
                              stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://localhost:{port}"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=10).read()
                break
            except OSError:
                assert server.poll() is None, log.read_text()[-3000:]
                time.sleep(0.5)
        else:
            pytest.fail("JupyterLab did not answer within 2 minutes")
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)

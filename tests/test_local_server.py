"""tests/local_server.py: JupyterLab servers started at once each serve behind a token of their
own and answer only their own checks; a stopped server leaves none of its processes running."""
import concurrent.futures
import contextlib
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

import local_server  # noqa: I001  (tests/local_server.py)

# a server's stand-in: it starts a process in a process group of its own (setsid), as JupyterLab starts a kernel,
# and prints its pid
STAND_IN = """import subprocess, sys, time
kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(kernel.pid, flush=True)
time.sleep(600)"""


def test_two_servers_started_at_once_never_answer_each_others_checks(tmp_path, monkeypatch):
    """Both are handed the same free port, as when another test's server takes the port one was
    handed before JupyterLab binds it: one serves there, the other finds it taken and serves on
    another; each accepts its own token and refuses the other's."""
    free_port = local_server.free_port
    port = free_port()
    handed = [port, port]
    monkeypatch.setattr(local_server, "free_port", lambda: handed.pop() if handed else free_port())
    env = {**os.environ, "HOME": str(tmp_path)}
    with contextlib.ExitStack() as first, contextlib.ExitStack() as second:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            starts = [pool.submit(stack.enter_context, local_server.jupyter_lab(tmp_path / name, env))
                      for stack, name in ((first, "first"), (second, "second"))]
        servers = [start.result() for start in starts]
        urls, held = [url for url, _ in servers], f"http://localhost:{port}"
        assert held in urls and len(set(urls)) == 2  # one on the port both were handed, the other on another
        moved = "second" if urls[0] == held else "first"
        assert f"port {port} is already in use" in (tmp_path / moved / f"lab-{port}.log").read_text()
        for (url, token), (_, other) in zip(servers, reversed(servers)):
            assert local_server.accepts(url, token, timeout=10)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{url}/api/status?token={other}", timeout=10)
            assert refused.value.code == 403


def test_a_server_that_exits_fails_its_start_with_its_log(tmp_path):
    """JupyterLab that exits while starting (its root folder missing) fails the start with its log,
    which stopping what is left of it does not replace."""
    env = {**os.environ, "HOME": str(tmp_path)}
    with (pytest.raises(pytest.fail.Exception, match="JupyterLab exited") as failed,
          local_server.jupyter_lab(tmp_path, env, root=tmp_path / "missing")):
        pass
    assert str(tmp_path / "missing") in str(failed.value)


def test_stop_ends_what_the_server_started_in_a_process_group_of_its_own(tmp_path, monkeypatch):
    """`stop` ends a server and the process it started in a process group of its own, out of reach of
    the server's process group, and signals that group only while Popen has not reaped the server
    (its pid is its own), then reaps it."""
    server = subprocess.Popen([sys.executable, "-c", STAND_IN], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    with server.stdout:
        kernel = int(server.stdout.readline())
    started = local_server.descendants(server.pid)[kernel]
    killpg, reaped = os.killpg, []

    def recorded(group, number):
        reaped.append(server.returncode is not None)
        killpg(group, number)

    monkeypatch.setattr(os, "killpg", recorded)
    local_server.stop(server)
    assert not local_server.alive(kernel, started)
    assert reaped == [False, False] and server.returncode is not None


def test_stop_leaves_a_server_popen_has_reaped_alone(monkeypatch):
    """A server that has exited and been reaped (`serving` polls it) may have its pid given to another
    process since: `stop` signals no process or process group of that pid and looks for nothing below it."""
    server = subprocess.Popen([sys.executable, "-c", ""], start_new_session=True)
    server.wait()
    calls = []
    for module, name in ((os, "kill"), (os, "killpg"), (local_server, "descendants")):  # descendants: none
        monkeypatch.setattr(module, name, lambda *args, name=name: calls.append((name, args)) or {})
    local_server.stop(server)
    assert calls == []

"""A process that has imported what `t5nb train` imports and forks a child for each run it is
asked for: the kill-and-resume tests (command_runs.py) start about 40 runs, each of which would
otherwise spend ~11 of its ~23 s importing TensorFlow, seqio, t5 and JAX (2-core AMD EPYC).
Nothing else is done before the fork: JAX has no backend yet (XLA_FLAGS, the device count, is
each child's own) and TensorFlow no runtime.

Protocol, a JSON line each way: on stdin `{"argv", "env", "output"}`; the child runs
train_command.py with `argv` and `env`, its stdout and stderr going to `output`; the reply is
`{"pid"}`. Once the child has ended and been reaped, `<output>.status` holds its returncode as
subprocess gives it (negative: killed by that signal)."""
import json
import os
import runpy
import select
import sys
import traceback

from jax._src import xla_bridge

import kill_points  # noqa: F401  (with t5nb.train and t5nb.checkpoints)
import slow_batches  # noqa: F401
from t5nb import cli, evaluate, recipe, restore, tasks, train  # noqa: F401  (TensorFlow, seqio, t5)

COMMAND = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_command.py")


def _child(request) -> None:
    """Become the run: its environment and output, then train_command.py; never returns."""
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        output = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        os.close(devnull)
        sys.argv = [COMMAND, *request["argv"]]
        runpy.run_path(COMMAND, run_name="__main__")  # ends with os._exit
    except SystemExit as stop:
        sys.stdout.flush()
        os._exit(stop.code if isinstance(stop.code, int) else 1)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(1)


def _reap(outputs: dict) -> None:
    """Write the status of every child that has ended."""
    while outputs:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        path = outputs.pop(pid) + ".status"
        with open(path + ".tmp", "w") as file:
            file.write(str(code))
        os.rename(path + ".tmp", path)


def serve() -> None:
    assert not xla_bridge._backends, "JAX started before the fork: the children could not choose their devices"
    outputs, pending = {}, b""
    print(json.dumps({"ready": os.getpid()}), flush=True)
    while True:
        readable, _, _ = select.select([0], [], [], 0.02)
        _reap(outputs)
        if not readable:
            continue
        data = os.read(0, 1 << 16)
        if not data:  # the test process has gone
            return
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _child(request)
            outputs[pid] = request["output"]
            print(json.dumps({"pid": pid}), flush=True)


if __name__ == "__main__":
    serve()

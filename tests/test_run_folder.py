"""A run folder's start and its one trainer (`t5nb.checkpoints.runs`): unit tests, then runs of
`t5nb train` killed while saving and on several processes (helpers: command_runs.py)."""
import errno
import os
import signal
import socket
import time

import pytest

from t5nb import checkpoints
from t5nb.checkpoints import runs

from command_runs import (assert_same_params, final_params, finish, start, straight_run, two_processes,  # noqa: I001
                          wait_for_checkpoint)


def test_an_unfinished_step_is_never_a_step_and_is_removed_with_a_notice(tmp_path):
    unfinished = tmp_path / "checkpoints" / "22.orbax-checkpoint-tmp-1234"
    (unfinished / "state").mkdir(parents=True)
    with pytest.warns(UserWarning, match=r"22\.orbax-checkpoint-tmp-1234: removed, an unfinished checkpoint"):
        assert runs.resume_step(tmp_path) is None  # a fresh start: from the initial checkpoint
    assert not unfinished.exists()
    assert runs.resume_step(tmp_path / "elsewhere") is None


def test_where_the_filesystem_cannot_lock_a_live_holder_refuses_and_a_dead_one_is_taken_over(tmp_path, monkeypatch):
    def no_locks(*_):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(runs.fcntl, "flock", no_locks)
    host = socket.gethostname()
    (tmp_path / ".lock").write_text(f"{host} process {os.getppid()} since 2026-11-24 10:00:00\n")  # alive: pytest's parent
    with pytest.raises(runs.RunInUse, match=rf"is in use: {host} process {os.getppid()} since"):
        with runs.holding(tmp_path):
            pass
    dead = 2**22 + 1  # above the kernel's largest process id
    (tmp_path / ".lock").write_text(f"{host} process {dead} since 2026-11-24 10:00:00\n")
    with runs.holding(tmp_path):
        assert (tmp_path / ".lock").read_text().startswith(f"{host} process {os.getpid()} since")
        with runs.holding(tmp_path):  # the same process again: re-entrant
            pass


# -- runs of the command -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    return straight_run(tmp_path_factory)


def test_a_fine_tune_killed_during_its_first_save_starts_again_from_its_checkpoint_and_holds_its_folder(tmp_path, straight):
    """The rerun finds no finished step, only orbax's temporary folder: it removes that, saying
    so, and fine-tunes from run.init_checkpoint again (never from random weights). A second run
    started on the folder while the first is saving is refused at once, touching nothing; once
    the first is killed, its lock is gone with it."""
    tune = [f"run.init_checkpoint={straight[1]}", "optimizer.learning_rate=0.01"]
    finish(start(tmp_path, tmp_path / "tuned", "tuned", changes=tune))
    model_dir = tmp_path / "killed"
    process = start(tmp_path, model_dir, "killed", save_delay=30, changes=tune)
    deadline = time.time() + 300
    while not list((model_dir / "checkpoints").glob("4.orbax-checkpoint-tmp*")):
        assert process.poll() is None and time.time() < deadline, "no save of step 4 began before the run ended"
        time.sleep(0.05)
    recipe_written = (model_dir / "recipe.toml").stat().st_mtime_ns
    second = start(tmp_path, model_dir, "second", changes=tune)  # while the first is still saving
    refusal = second.communicate(timeout=120)[0]
    assert second.returncode == 1 and f"{model_dir.resolve()} is in use: " in refusal, refusal[-3000:]
    assert f"process {process.pid} since" in refusal and "Traceback" not in refusal
    assert list((model_dir / "checkpoints").glob("4.orbax-checkpoint-tmp*"))  # the first's save left alone
    assert (model_dir / "recipe.toml").stat().st_mtime_ns == recipe_written
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert checkpoints.checkpoint_steps(model_dir) == []  # killed before its first step was finished
    output = finish(start(tmp_path, model_dir, "resumed", changes=tune))
    assert "4.orbax-checkpoint-tmp" in output and "removed, an unfinished checkpoint" in output
    assert_same_params(final_params(tmp_path / "tuned"), final_params(model_dir))


def test_two_processes_resume_after_one_is_killed(tmp_path, straight):
    model_dir = tmp_path / "run"
    processes = two_processes(tmp_path, model_dir, "killed", delay=0.3)
    wait_for_checkpoint(processes[0], model_dir, 4)
    processes[1].send_signal(signal.SIGKILL)  # one host fails; the scheduler then stops the job
    processes[1].wait()
    processes[0].send_signal(signal.SIGKILL)
    processes[0].wait()
    for process in two_processes(tmp_path, model_dir, "resumed"):  # and starts it again
        finish(process)
    assert_same_params(straight[0], final_params(model_dir))

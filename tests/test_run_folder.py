"""A run folder's start and its one trainer (`t5nb.checkpoints.runs`): unit tests, then runs of
`t5nb train` in processes of their own: the kill matrix, and runs on several processes (helpers:
command_runs.py, kill_points.py)."""
import errno
import os
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

from t5nb import checkpoints
from t5nb.checkpoints import runs
from t5nb.evaluate import results_table

from command_runs import (assert_same_params, batches, final_params, finish, start, straight_run,  # noqa: I001
                          two_processes, wait_for_checkpoint)


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


# Where the kill matrix stops a run, in the order one run meets them (kill_points.py): each
# stopped run is started again with the same command, which is stopped at the next point.
KILL_POINTS = (
    ("recipe.toml", signal.SIGKILL),   # half of the recipe written, before anything else
    ("config.json", signal.SIGKILL),   # half of the run's config written
    ("save", signal.SIGKILL),          # during the run's first save: no finished step yet
    ("after a save", signal.SIGKILL),  # step 4 saved, before the log of step 8
    ("save", signal.SIGKILL),          # during a later save (step 8), step 4 on disk
    ("validation", signal.SIGKILL),    # the validation of step 8 computed, not yet written
    ("validation", signal.SIGTERM),    # from step 4 again: stops after step 8, saving it
)
KINDS = {  # what the run does, and on how many devices; the fine-tunes learn closed-book QA (a
    # fresh process builds its pipeline in 2 s, where span corruption's takes 6 s)
    "pretraining": ([], 2),
    "fine-tune": (["data.task=facts_qa", "optimizer.learning_rate=0.01"], 1),
    "lora": (["data.task=facts_qa", "model.lora_rank=2", "optimizer.learning_rate=0.01"], 1),
}


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_killed_at_every_point_ends_as_an_uninterrupted_one(tmp_path, straight, kind):
    """The kill matrix: a pretraining (on 2 devices), a full fine-tune and a LoRA fine-tune (both
    from the pretraining run's checkpoint) are SIGKILLed at each of KILL_POINTS in turn, then
    stopped by SIGTERM, each time started again with the same command; the last start finishes,
    its parameters equal the uninterrupted run's bit for bit and its training curve is the
    uninterrupted one, without a gap. Beside that: a run killed during its first save starts
    again from its init_checkpoint (never random weights), removing orbax's unfinished folder
    with a notice; while one is parked there, a second `t5nb train` on the folder is refused at
    once, naming the holder, and touches nothing; the holder's kill frees the folder. SIGTERM
    saves the step it stops at and says so."""
    changes, devices = KINDS[kind]
    if kind == "pretraining":
        expected, expected_dir = straight
    else:
        changes = [f"run.init_checkpoint={straight[1]}", *changes]
        expected_dir = tmp_path / "straight"
        finish(start(tmp_path, expected_dir, "straight", changes=changes))
        expected = final_params(expected_dir)
    model_dir, outputs = tmp_path / "run", []
    for number, (point, stop) in enumerate(KILL_POINTS):
        name = f"killed{number}"
        process = start(tmp_path, model_dir, name, devices=devices, kill_at=point, changes=changes)
        deadline = time.time() + 300
        while not (tmp_path / f"{name}.reached").exists():
            if process.poll() is not None or time.time() > deadline:
                process.kill()
                pytest.fail(f"{kind} never reached {point!r}: {process.communicate()[0][-3000:]}")
            time.sleep(0.01)
        steps = checkpoints.checkpoint_steps(model_dir)
        if point == "save" and not steps and kind == "fine-tune":
            second = start(tmp_path, model_dir, "second", changes=changes)
            refusal = second.communicate(timeout=120)[0]
            assert second.returncode == 1 and f"{model_dir.resolve()} is in use: " in refusal, refusal[-3000:]
            assert f"process {process.pid} since" in refusal and "Traceback" not in refusal
            assert checkpoints.checkpoint_steps(model_dir) == []
        process.send_signal(stop)
        if stop == signal.SIGTERM:
            (tmp_path / f"{name}.reached.go").touch()
        outputs.append(process.communicate(timeout=300)[0])
        if stop == signal.SIGTERM:
            assert process.returncode == 128 + signal.SIGTERM, outputs[-1][-3000:]
            assert "stopped by SIGTERM at step 8; checkpoint step 8 saved" in outputs[-1], outputs[-1][-3000:]
            assert checkpoints.checkpoint_steps(model_dir) == [4, 8]
        if point == "save":
            assert list((model_dir / "checkpoints").glob("*.orbax-checkpoint-tmp*")), "not killed during a save"
            assert steps == ([] if number == 2 else [4])
    outputs.append(finish(start(tmp_path, model_dir, "resumed", devices=devices, changes=changes)))
    for number, (point, _) in enumerate(KILL_POINTS):
        if point == "save":  # the next start removes what the killed save left, saying so
            assert "removed, an unfinished checkpoint" in outputs[number + 1], outputs[number + 1][-3000:]
    assert f"{model_dir}: step 12" in outputs[-1]
    assert_same_params(expected, final_params(model_dir))
    curves = [results_table(run, kinds=("train",), csv=False) for run in (expected_dir, model_dir)]
    assert list(curves[1].index) == list(curves[0].index) == [4, 8, 12]  # no gap; a step logged again keeps its newest
    for column in ("train/loss", "train/accuracy", "train/learning_rate"):
        np.testing.assert_array_equal(curves[1][column], curves[0][column], err_msg=column)
    if kind == "lora":
        assert any(np.any(expected[name]) for name in expected if name.endswith("lora_b"))  # the adapters trained


def _mount_small_filesystem(path, megabytes: int) -> str | None:
    """A tmpfs of `megabytes` at `path`: None when mounted, else why not."""
    path.mkdir()
    try:
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(path)],
                                capture_output=True, text=True)
    except OSError as error:  # no mount command
        return str(error)
    return None if result.returncode == 0 else " ".join((result.stderr or f"mount exited {result.returncode}").split())


def test_a_full_disk_during_a_save_is_said_in_one_line_and_the_same_command_resumes(tmp_path, straight):
    """On a 6 MB filesystem where this machine lets the test mount one (a tiny checkpoint is 3.6
    MB), otherwise with every write of a checkpoint after the first failing with ENOSPC: the run
    stops with one error line that names the step, the folder, the space needed and free, and
    the step kept, no traceback; once there is room, the same command resumes from that step
    and ends as an uninterrupted run."""
    folder = tmp_path / "disk"
    why_not = _mount_small_filesystem(folder, 6)
    disk = "ENOSPC" if why_not else "small filesystem"
    try:
        model_dir = folder / "run"
        process = start(tmp_path, model_dir, "full", devices=2, kill_at="no space" if why_not else None)
        output = process.communicate(timeout=600)[0]
        errors = [line for line in output.splitlines() if "error" in line.lower()]
        assert process.returncode == 1 and len(errors) == 1 and "Traceback" not in output, output[-3000:]
        assert errors[0].startswith("t5nb train: error: checkpoint step 8 could not be written to "
                                    f"{model_dir.resolve() / 'checkpoints'}: "), errors[0]
        assert "No space left on device" in errors[0] and "MB free" in errors[0] and "needs about" in errors[0]
        assert errors[0].endswith("Step 4 is kept there: run the same command again, once there is room, to resume "
                                  "from it.")
        assert checkpoints.checkpoint_steps(model_dir) == [4]
        if disk == "small filesystem":
            subprocess.run(["mount", "-o", "remount,size=64m", str(folder)], check=True)  # room made
        output = finish(start(tmp_path, model_dir, "resumed", devices=2))
        assert "removed, an unfinished checkpoint" in output
        assert_same_params(straight[0], final_params(model_dir))
    finally:
        if disk == "small filesystem":
            subprocess.run(["umount", "-l", str(folder)], check=False)


def test_two_processes_through_the_command_equal_one(tmp_path, straight):
    model_dir = tmp_path / "run"
    outputs = [finish(process) for process in two_processes(tmp_path, model_dir, "process")]
    assert f"{model_dir}: step 12" in outputs[0] and f"{model_dir}: step 12" not in outputs[1]  # one reporter
    assert_same_params(straight[0], final_params(model_dir))
    # each process read its own half of every global batch
    halves = [batches(tmp_path, f"process{i}") for i in (0, 1)]
    assert len(halves[0]) == len(halves[1]) == 12 and all(a != b for a, b in zip(*halves))
    assert sorted(p.name for p in (model_dir / "checkpoints" / "12" / "pipeline").iterdir()
                  if p.name.startswith("process")) == ["process_0", "process_1"]


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

"""A run folder's start and its one trainer (`t5nb.checkpoints.runs`), without training: the
real runs through the command are in test_recipe.py."""
import errno
import os
import socket

import pytest

from t5nb.checkpoints import runs


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

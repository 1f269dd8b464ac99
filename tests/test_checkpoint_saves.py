"""A checkpoint save that fails (`t5nb.checkpoints.runs.RunCheckpoints`): `SaveFailed` says so,
and nothing else is said, however the save's other writes end."""
import asyncio
import errno
import gc
import logging
import os

import flax
import jax.numpy as jnp
import pytest
from orbax.checkpoint._src.serialization import serialization

from t5nb.checkpoints import runs


@flax.struct.dataclass
class State:
    step: jnp.ndarray
    params: dict


@pytest.mark.parametrize("turns", range(8))
def test_a_full_disk_is_said_once_however_late_the_other_writes_of_the_save_fail(tmp_path, monkeypatch, caplog, turns):
    """orbax writes each array in a task of a loop of its own; the first write fails with ENOSPC
    at once, the others after `turns` turns of that loop: before, as and after the save sees
    the first failure. Every write ends (failed or cancelled) before `SaveFailed` is raised, and
    asyncio logs nothing (orbax 0.12.8 closed its loop with them: 'Task exception was never
    retrieved', a traceback and a tensorstore spec for each, once collected)."""
    writes, ended = [], []

    async def full(rslices, spec, **_):
        writes.append(spec)
        try:
            for _ in range(turns if len(writes) > 1 else 0):
                await asyncio.sleep(0)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        finally:
            ended.append(spec)

    monkeypatch.setattr(serialization, "async_serialize_from_host", full)
    monkeypatch.setattr(logging.getLogger("absl"), "disabled", True)  # as in `t5nb train`: SaveFailed says it
    state = State(jnp.array(10), {f"w{index}": jnp.full((4,), index, jnp.float32) for index in range(8)})
    checkpoints = runs.RunCheckpoints(tmp_path / "checkpoints")
    with pytest.raises(runs.SaveFailed, match=r"checkpoint step 10 could not be written to .*No space left on device"):
        checkpoints.save(state)
        checkpoints.wait()
    assert len(writes) == 9 and len(ended) == len(writes)  # the step and the 8 parameters
    checkpoints.manager.close()
    del checkpoints
    gc.collect()  # where a task left unfinished or unretrieved is logged
    assert [record.getMessage() for record in caplog.records if record.name == "asyncio"] == []


def test_a_failed_saves_teardown_never_hides_its_error(monkeypatch):
    """Where asyncio cannot copy its tasks (another thread changed its set of eager tasks, Python
    3.12+), the teardown asks again, and where it never can, the save's own error is raised."""
    calls = []

    def all_tasks(*_):
        calls.append(1)
        raise RuntimeError("Set changed size during iteration")

    async def failing():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(asyncio, "all_tasks", all_tasks)
    with pytest.raises(OSError, match="No space left on device"):
        asyncio.new_event_loop().run_until_complete(runs._ending_its_tasks(failing()))
    assert len(calls) == 100


def test_where_a_loop_runs_orbax_runs_the_coroutine_as_it_would(monkeypatch):
    """In a running loop (a notebook's), the wrapper hands orbax's `run_sync` the coroutine itself;
    without one, wrapped so that a failure ends the loop's other tasks first."""
    handed = []
    run = runs._in_a_loop_of_its_own(lambda coro: handed.append(coro) or coro.close())

    async def work():
        return 1

    async def in_a_loop():
        coro = work()
        run(coro)
        return coro

    assert handed == [asyncio.run(in_a_loop())]
    coro = work()
    run(coro)
    assert handed[-1] is not coro and handed[-1].cr_code is runs._ending_its_tasks.__code__
    coro.close()

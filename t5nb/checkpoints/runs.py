"""A training run's folder on disk: what it holds and its orbax checkpoints.

    <model_dir>/config.json        the model and train config (`run_config`)
    <model_dir>/recipe.toml        the resolved recipe (`t5nb.recipe`), when a recipe made the run
    <model_dir>/checkpoints/<step>/ orbax steps (`RunCheckpoints`)
    <model_dir>/.lock              who trains it now (`holding`)
    <model_dir>/train, training_eval/<task>, inference_eval/<task>   TensorBoard events

What a path names (`model_dir_kind`, `checkpoint_kind`: a run, a Hugging Face directory or a
T5X checkpoint) and its model configuration are read here without loading any weights; the
models themselves load in `t5nb.restore`. Where a run starts (`resume_step`) is decided here
only, and one process at a time trains a folder (`holding`).

Each step's folder `checkpoints/<step>/` holds three orbax items:
- `state`: the `TrainState` (parameters, optimizer state, step), sharded as on the mesh;
- `data`: the data iterator's `state()` (JSON: settings and batches consumed);
- `pipeline`: the input pipeline's own checkpoint, one folder per process, for iterators that
  can write one (`BatchIterator.save_pipeline`): resuming from it costs no replay.

Orbax writes a step into a temporary folder and renames it when complete, so a process killed
mid-save leaves the previous steps intact. `restore_latest` falls back to the previous step,
with a warning naming both, when the newest cannot be read. A save that fails ends all its
writes first (`_ending_its_tasks`), so that its `SaveFailed` is all it says.
"""
import asyncio
import contextlib
import dataclasses
import fcntl
import functools
import json
import math
import os
import pathlib
import shutil
import socket
import tempfile
import time
import warnings

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import future
from orbax.checkpoint._src import asyncio_utils

from t5nb.checkpoints.hf import HF_DIR, hf_weights_file, read_hf_config
from t5nb.config import T5Config

RUN_DIR = "a training run's directory holds config.json and checkpoints/<step>/"
UNFINISHED = ".orbax-checkpoint-tmp"  # orbax writes a step under <step><this> and renames it when complete


async def _ending_its_tasks(coro):
    """Awaits `coro`; where it fails, first cancels and awaits the other tasks of its loop, as
    asyncio.run does. orbax 0.12.8 closes its loop with them running, and asyncio logs each write
    of a failed save that fails after ('Task exception was never retrieved', with its traceback
    and a tensorstore spec of several KB) once it is collected."""
    try:
        return await coro
    except BaseException:
        rest = _other_tasks()
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)
        raise


def _other_tasks(tries: int = 100) -> set:
    """The running loop's tasks but the current one. Python 3.12+ copies its set of eager tasks,
    which every thread's loops share, without a lock, so another thread's change makes the copy
    raise RuntimeError: it is asked again, and after `tries` none are returned (the save's own
    error, not this one, is what the caller raises)."""
    for _ in range(tries):
        try:
            return asyncio.all_tasks() - {asyncio.current_task()}
        except RuntimeError:
            continue
    return set()


def _in_a_loop_of_its_own(run_sync):
    """orbax's `run_sync`, through `_ending_its_tasks` where the calling thread runs no loop (each
    thread that writes a save, `future.CommitFuture`): there it runs the coroutine in a new loop,
    all of whose tasks are the coroutine's. Where a loop runs (a notebook's), unchanged."""
    @functools.wraps(run_sync)
    def run(coro):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return run_sync(_ending_its_tasks(coro))
        return run_sync(coro)

    return run


asyncio_utils.run_sync = _in_a_loop_of_its_own(asyncio_utils.run_sync)  # orbax (0.12.4, 0.12.8) reads it at each call


def _process_folder(directory) -> epath.Path:
    return epath.Path(directory) / f"process_{jax.process_index()}"


def _capture(iterator) -> dict:
    """The iterator's `save_pipeline` files, read now (the iterator moves on)."""
    with tempfile.TemporaryDirectory() as scratch:
        iterator.save_pipeline(scratch)
        return {path.name: path.read_bytes() for path in pathlib.Path(scratch).iterdir()}


def _write(directory, files: dict) -> None:
    folder = _process_folder(directory)
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (folder / name).write_bytes(content)


class PipelineHandler(ocp.AsyncCheckpointHandler):
    """Saves an iterator's input pipeline: captured at the call, written with the rest of the step."""

    async def async_save(self, directory: epath.Path, args: "PipelineSave"):
        files = _capture(args.iterator)

        async def write():
            _write(directory, files)

        return [future.CommitFutureAwaitingContractedSignals(write(), name="pipeline_save")]

    def save(self, directory: epath.Path, args: "PipelineSave"):
        _write(directory, _capture(args.iterator))

    def restore(self, directory: epath.Path, args: "PipelineRestore"):
        """Positions `args.iterator` from this process's files and the saved data state."""
        args.iterator.restore_pipeline(_process_folder(directory), args.data_state)
        return args.iterator


@ocp.args.register_with_handler(PipelineHandler, for_save=True)
@dataclasses.dataclass
class PipelineSave(ocp.args.CheckpointArgs):
    iterator: object


@ocp.args.register_with_handler(PipelineHandler, for_restore=True)
@dataclasses.dataclass
class PipelineRestore(ocp.args.CheckpointArgs):
    iterator: object
    data_state: dict


def _checkpoint_bytes(model_dir, state) -> int:
    """What one checkpoint of this run takes: its newest on disk, all files counted (the input
    pipeline's too), or before there is one, the bytes of `state` (arrays or their shapes)."""
    steps = checkpoint_steps(model_dir)
    if steps:
        return sum(path.stat().st_size for path in (pathlib.Path(model_dir) / "checkpoints" / str(steps[-1])).rglob("*")
                   if path.is_file())
    return sum(math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(state))


class SaveFailed(OSError):
    """A checkpoint could not be written (a full disk, mostly): which step, where, the space it
    needs and has, the last step kept, and that the same command resumes from it."""


class RunCheckpoints:
    """The orbax checkpoints of one run; keeps the last `keep`. A save that fails, now or while
    it completes in the background, raises `SaveFailed` (the cause chained to it)."""

    def __init__(self, directory, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep_checkpoints must be at least 1, got {keep}")
        self.directory = pathlib.Path(directory).resolve()
        self.manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))
        self._in_flight = None  # (step, bytes) of the save that may still be writing

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, state, batches=None) -> None:
        """Save `state` and the position of `batches` (an iterator with `state()`, if any)."""
        items = {"state": ocp.args.StandardSave(state),
                 "data": ocp.args.JsonSave(batches.state() if hasattr(batches, "state") else {})}
        if hasattr(batches, "save_pipeline"):
            items["pipeline"] = PipelineSave(batches)
        self.wait()  # the save before (orbax waits for it anyway): its failure is its own
        self._in_flight = (int(jax.device_get(state.step)), _checkpoint_bytes(self.directory.parent, state))
        try:
            self.manager.save(self._in_flight[0], args=ocp.args.Composite(**items))
        except Exception as error:  # whatever orbax or the filesystem raise: this step is not saved
            raise self._failed(error) from error

    def restore(self, abstract, step: int | None = None, batches=None):
        """The state of `step` (default: latest), laid out as `abstract`
        (`Trainer.abstract_checkpoint()`); positions `batches` where that step left it."""
        step = self.latest_step() if step is None else step
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore()))
        data_state = restored["data"]
        if hasattr(batches, "restore_pipeline") and (self.directory / str(step) / "pipeline").is_dir():
            self.manager.restore(step, args=ocp.args.Composite(pipeline=PipelineRestore(batches, data_state)))
        elif hasattr(batches, "set_state"):
            batches.set_state(data_state)
        return restored["state"]

    def restore_latest(self, abstract, batches=None):
        """`restore` the newest step that reads back; None when there is none. A step that
        fails (a truncated or missing file) is skipped with a warning naming it and the next."""
        steps = self.all_steps()[::-1]
        for index, step in enumerate(steps):
            try:
                return self.restore(abstract, step, batches)
            except Exception as error:  # any failure to read a checkpoint: try the one before
                fallback = f"resuming from step {steps[index + 1]}" if index + 1 < len(steps) else "no older checkpoint"
                warnings.warn(f"checkpoint step {step} in {self.directory} cannot be read "
                              f"({type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}); "
                              f"{fallback}", stacklevel=2)
                if index + 1 == len(steps):
                    raise
        return None

    def wait(self) -> None:
        """Until the save in flight is on disk."""
        if self._in_flight is None:
            return
        try:
            self.manager.wait_until_finished()
        except Exception as error:
            raise self._failed(error) from error
        self._in_flight = None

    def _failed(self, error: Exception) -> SaveFailed:
        step, size = self._in_flight
        self._in_flight = None
        free = shutil.disk_usage(self.directory).free
        kept = checkpoint_steps(self.directory.parent)
        reason = " ".join(str(error).split())
        return SaveFailed(
            f"checkpoint step {step} could not be written to {self.directory}: {reason[:300] or type(error).__name__} "
            f"(it needs about {size / 2**20:,.1f} MB; {free / 2**20:,.1f} MB free"
            f"{', not enough space' if free < size else ''}). "
            + (f"Step {kept[-1]} is kept there: run the same command again, once there is room, to resume from it."
               if kept else "No step of this run is kept: the same command starts it again, once there is room."))


def resume_step(model_dir) -> int | None:
    """Where the run in `model_dir` starts: the newest finished checkpoint step, to resume from,
    or None for a fresh start (from its initial checkpoint, or random). The one answer that
    `t5nb.train` and everything that starts a run use. An unfinished step (orbax's temporary
    folder, left by a process killed while saving) is never a step: it is removed, each with a
    one-line warning naming it."""
    folder = pathlib.Path(model_dir) / "checkpoints"
    if not folder.is_dir():
        return None
    for unfinished in sorted(folder.glob(f"*{UNFINISHED}*")) if jax.process_index() == 0 else ():
        warnings.warn(f"{unfinished}: removed, an unfinished checkpoint (the process writing it was "
                      "stopped); the run goes on from its last finished step", stacklevel=2)
        shutil.rmtree(unfinished, ignore_errors=True)
    steps = checkpoint_steps(model_dir)
    return steps[-1] if steps else None


def warn_if_short_of_space(model_dir, abstract_state, keep: int) -> None:
    """Warn, before the first step, when the filesystem of `model_dir` cannot hold `keep` + 1
    checkpoints (orbax writes the next one before it removes the oldest; each as big as the
    run's newest on disk, or the bytes of `abstract_state`), naming both figures and the two
    ways out."""
    size = _checkpoint_bytes(model_dir, abstract_state)
    free, needed = shutil.disk_usage(model_dir).free, (keep + 1) * size
    if free < needed:
        warnings.warn(f"{model_dir}: {free / 2**20:,.0f} MB free, but this run's checkpoints need about "
                      f"{needed / 2**20:,.0f} MB ({keep} kept of {size / 2**20:,.0f} MB each, and the next one "
                      "while it is written); keep fewer (run.keep_checkpoints) or train into a run.model_dir "
                      "with more space", stacklevel=3)


class RunInUse(ValueError):
    """The run folder is being trained by another process: names the folder, the holder and since when."""


_HELD = set()  # run folders this process holds


@contextlib.contextmanager
def holding(model_dir):
    """This process as the one trainer of `model_dir` for the block. Another process (or job)
    is refused at once with `RunInUse`, naming the folder, the holder (host, process id) and
    since when. The lock is the operating system's (`flock` on `<model_dir>/.lock`), so it dies
    with its process: a killed run never blocks the next. Where the filesystem cannot lock, a
    holder on this host that is no longer running is taken over. Re-entrant within a process;
    in a job of several processes, process 0 holds it for the job."""
    folder = pathlib.Path(model_dir).resolve()
    if folder in _HELD or jax.process_index() > 0:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+") as lock:
        lock.seek(0)
        holder = lock.read().strip()
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunInUse(f"{folder} is in use: {holder or 'another process'} is training it; wait for it to "
                           "end or stop it, or train into another run.model_dir") from None
        except OSError:  # no locks on this filesystem (some network or FUSE mounts): look at the holder
            host, _, pid = holder.partition(" process ")
            pid = pid.split()[0] if pid.split() else ""
            if host == socket.gethostname() and pid.isdigit() and _running(int(pid)):
                raise RunInUse(f"{folder} is in use: {holder} is training it") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{socket.gethostname()} process {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        lock.flush()
        _HELD.add(folder)
        try:
            yield
        finally:
            _HELD.discard(folder)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: running
        pass
    return True


# -- reading a run folder ----------------------------------------------------------------------
def run_config(model_dir) -> tuple[T5Config, dict]:
    """The model config and train config dict a training run wrote to `<model_dir>/config.json`."""
    path = pathlib.Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; {RUN_DIR}")
    try:
        saved = json.loads(path.read_text())
        return T5Config.from_json(saved["model"]), saved["train"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a training run's config ({type(error).__name__}: {error})") from None


def checkpoint_steps(model_dir) -> list[int]:
    """Finished steps of the orbax checkpoints of a training run, in order (empty for a Hugging
    Face directory), read from the folder's names without opening a checkpoint manager."""
    return sorted(ocp.path.step.checkpoint_steps(pathlib.Path(model_dir) / "checkpoints"))


def model_dir_kind(model_dir) -> str:
    """"run" (a training run with checkpoints) or "hf" (a Hugging Face directory); anything
    else is refused, naming what the directory holds."""
    model_dir = pathlib.Path(model_dir)
    if not model_dir.is_dir():
        problem = "not a directory" if model_dir.exists() else "no such directory"
        raise FileNotFoundError(f"{model_dir}: {problem}; {RUN_DIR}, {HF_DIR}")
    if checkpoint_steps(model_dir):
        return "run"
    names = sorted(path.name for path in model_dir.iterdir())
    if "config.json" in names and hf_weights_file(names):
        return "hf"
    if {"checkpoints", "train"} & set(names):  # what `t5nb.train.train` writes
        raise FileNotFoundError(f"{model_dir}: a training run without checkpoints (checkpoints/<step>/); "
                                "train with checkpoint_every > 0")
    raise FileNotFoundError(f"{model_dir}: not a model directory ({RUN_DIR}, {HF_DIR}); "
                            f"found {', '.join(names) or 'nothing'}")


def require_steps(model_dir, steps) -> list[int]:
    """The run's checkpoint steps; refuses `steps` it does not have, listing those it has."""
    available = checkpoint_steps(model_dir)
    missing = sorted(set(steps) - set(available))
    if missing:
        raise ValueError(f"{model_dir}: no checkpoint of step {', '.join(map(str, missing))}; "
                         f"its steps: {', '.join(map(str, available))}")
    return available


def checkpoint_kind(path) -> str:
    """"hf", "t5x" or "run": what `init_checkpoint` names (anything else is refused, saying what it holds)."""
    path = os.fspath(path)
    if path.startswith("hf://"):
        return "hf"
    if is_t5x_checkpoint(path):
        return "t5x"
    return model_dir_kind(path)


def is_t5x_checkpoint(path) -> bool:
    """Whether `path` names a T5X checkpoint: on GCS, a directory holding `checkpoint`, or a file."""
    path = os.fspath(path)
    return path.startswith("gs://") or (pathlib.Path(path) / "checkpoint").is_file() or pathlib.Path(path).is_file()


def checkpoint_config(path) -> T5Config:
    """The model configuration a run or Hugging Face checkpoint carries (T5X's carry none)."""
    return read_hf_config(path) if checkpoint_kind(path) == "hf" else run_config(path)[0]

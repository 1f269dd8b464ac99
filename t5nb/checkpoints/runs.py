"""Checkpoints of a training run: the train state, the data position and the input pipeline.

Each step's folder `checkpoints/<step>/` holds three orbax items:
- `state`: the `TrainState` (parameters, optimizer state, step), sharded as on the mesh;
- `data`: the data iterator's `state()` (JSON: settings and batches consumed);
- `pipeline`: the input pipeline's own checkpoint, one folder per process, for iterators that
  can write one (`BatchIterator.save_pipeline`): resuming from it costs no replay.

Orbax writes a step into a temporary folder and renames it when complete, so a process killed
mid-save leaves the previous steps intact. `restore_latest` falls back to the previous step,
with a warning naming both, when the newest cannot be read.
"""
import dataclasses
import pathlib
import tempfile
import warnings

import jax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import future


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


class RunCheckpoints:
    """The orbax checkpoints of one run; keeps the last `keep`."""

    def __init__(self, directory, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep_checkpoints must be at least 1, got {keep}")
        self.directory = pathlib.Path(directory).resolve()
        self.manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

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
        self.manager.save(int(jax.device_get(state.step)), args=ocp.args.Composite(**items))

    def restore(self, abstract, step: int | None = None, batches=None):
        """The state of `step` (default: latest), laid out as `abstract`
        (`Trainer.abstract_state()`); positions `batches` where that step left it."""
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
        self.manager.wait_until_finished()


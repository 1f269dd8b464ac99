"""The training loop: `train()` runs a `Trainer`'s step and the periodic actions `MetricsLog`,
`Validation` and `Saving`, resuming from a run's checkpoints and stopping cleanly on a signal;
`run_recipe` trains as a recipe says (`t5nb train` and the course's workflow both call it)."""
import dataclasses
import functools
import json
import math
import pathlib
import signal
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from t5nb import _tensorflow  # noqa: F401, I001  (first: TensorFlow for tf.data only, accelerators hidden)
from clu import metric_writers
from tqdm.auto import tqdm
from tqdm.notebook import tqdm as notebook_tqdm

from t5nb.checkpoints import RunCheckpoints, holding, resume_step, warn_if_short_of_space
from t5nb.config import EXECUTION_FIELDS, T5Config
from t5nb.event_logs import logged_steps
from t5nb.files import write_atomically
from t5nb.profiles import chip_of
from t5nb.system import time_matmul
from t5nb import adapters, evaluate, tasks
from t5nb.recipe import Recipe, RecipeError, data_task, feature_lengths, load_recipe, make_trainer
from t5nb.restore import initial_params
from t5nb.trainer import Trainer, TrainConfig, TrainState, finalize, teacher_forced


VALIDATION = "validation/"  # the prefix of evaluation metrics in `on_log`
DECODED = "decoded/"  # the prefix of `decoded_eval`'s task metrics among them


def validation_scalars(metrics: dict) -> dict:
    """An evaluation's metrics as `train()` hands them to `on_log`: `validation/<name>`."""
    return {f"{VALIDATION}{name}": value for name, value in metrics.items()}


def _utilisation(trainer: Trainer) -> tuple[str, float | None]:
    """What a run's step FLOP/s are divided by, and its name: on a chip of profiles.CHIPS, the
    mesh's dense peak from the data sheet in the dtype the model computes in (`mfu`), or None
    where the data sheet has no peak for that dtype (`Chip.peak_format`: no utilisation is
    logged, the run trains on); elsewhere (a CPU), this machine's float32 matmul rate, measured
    (`matmul_rate_fraction`)."""
    chip, chips = chip_of(trainer.mesh.devices.flat[0]), trainer.mesh.devices.size
    if chip is None:
        return "matmul_rate_fraction", _matmul_rate() * chips
    if chip.peak_format(trainer.model_config.dtype) is None:
        return "mfu", None
    return "mfu", chip.peak(trainer.model_config.dtype) * chips


@functools.cache
def _matmul_rate() -> float:
    """This machine's float32 matmul rate, measured once in a process (its runs share it)."""
    return time_matmul(1024)


@dataclasses.dataclass
class TrainResult:
    state: TrainState
    history: list  # one dict of metrics per log point
    train_eval: list  # (step, metrics) per evaluation
    model_dir: pathlib.Path


def record_config(model_dir: pathlib.Path, trainer: Trainer, resuming: bool) -> None:
    """Write the run's `config.json` when it starts; on resume, compare it with the requested one:
    another model or optimizer (the checkpoints' shapes) is refused, naming the fields; other
    training settings, and how the model runs (`config.EXECUTION_FIELDS`: dtype, scanned layers,
    rematerialisation), may change, as in T5X, with a warning. The record is never replaced."""
    requested = json.loads(json.dumps(
        {"model": trainer.model_config.to_json(), "train": dataclasses.asdict(trainer.train_config)}))
    path = model_dir / "config.json"
    if not (resuming and path.exists()):
        if jax.process_index() == 0:  # one writer in a run of several processes
            write_atomically(path, json.dumps(requested, indent=2))
        return
    saved = json.loads(path.read_text())
    # a field added since the run began ran as its default
    defaults = json.loads(json.dumps({"model": T5Config().to_json(), "train": dataclasses.asdict(TrainConfig())}))

    def changes(part):
        old, new = {**defaults[part], **saved.get(part, {})}, requested[part]
        return {k: (old.get(k), new.get(k)) for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)}

    model_changes, train_changes = changes("model"), changes("train")
    train_changes.update({k: v for k, v in model_changes.items() if k in EXECUTION_FIELDS})
    model_changes = {k: v for k, v in model_changes.items() if k not in EXECUTION_FIELDS}
    if refused := {**model_changes, **{k: v for k, v in train_changes.items() if k == "optimizer"}}:
        raise ValueError(f"{model_dir} holds checkpoints of another model or optimizer; refusing to resume it with "
                         + ", ".join(f"{k}={new!r} (saved: {old!r})" for k, (old, new) in refused.items())
                         + ". Use a new model_dir, or the saved configuration (t5nb.checkpoints.run_config).")
    if train_changes:
        warnings.warn(f"resuming {model_dir} with changed training settings "
                      + ", ".join(f"{k}={new!r} (was {old!r})" for k, (old, new) in train_changes.items())
                      + f"; {path} keeps the original", stacklevel=3)


@jax.jit
def all_finite(tree) -> jax.Array:
    """Whether every floating-point number in `tree` is finite: one reduction on the device."""
    return jnp.all(jnp.asarray([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
                                if jnp.issubdtype(x.dtype, jnp.floating)]))


class StopRequested:
    """SIGINT (Ctrl-C, a notebook's interrupt) and SIGTERM (Colab, preemptible VMs) during
    training: noted, so the loop saves a checkpoint at the end of the step, then stops. A
    second Ctrl-C interrupts at once. Only in the main thread, where Python runs handlers."""

    def __init__(self):
        self.signal = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM):
                self._previous[number] = signal.signal(number, self._note)
        return self

    def _note(self, number, frame):
        if self.signal == signal.SIGINT and number == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = number
        tqdm.write(f"{signal.Signals(number).name}: stopping after this step (checkpoint first); "
                   "Ctrl-C again to stop at once")

    def __exit__(self, *exc):
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def raise_stop(self, step: int, saved: int | None):
        where = f"checkpoint step {saved} saved" if saved is not None else "no checkpoints in this run"
        message = f"stopped by {signal.Signals(self.signal).name} at step {step}; {where}"
        if self.signal == signal.SIGTERM:
            print(message, flush=True)
            raise SystemExit(128 + signal.SIGTERM)
        raise KeyboardInterrupt(message)


def _check_positive(**values) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive number of steps, got {value!r}")


class MetricsLog:
    """Logging, at log points only: the steps' metric sums wait on the device (no host sync per
    step), then are fetched at once and averaged, with throughput and MFU, checked to be finite,
    written to TensorBoard and the history, shown on the progress bar and handed to `on_log`."""

    def __init__(self, trainer: Trainer, writer, bar, on_log, history: list, where):
        self.trainer, self.writer, self.bar, self.on_log, self.history, self.where = (
            trainer, writer, bar, on_log, history, where)
        self.pending, self.tick, self.flops, self.peak = [], None, None, None

    def add(self, sums: dict) -> None:
        """One step's sums. The throughput clock starts after the first step (which compiled)."""
        if self.tick is None:
            self.tick = time.perf_counter()
        self.pending.append(sums)

    def __call__(self, step: int) -> None:
        sums = jax.device_get(self.pending)
        elapsed = time.perf_counter() - self.tick
        total = {k: np.sum([s[k] for s in sums]) for k in ("loss", "z_loss", "correct", "weight", "sequences")}
        metrics = finalize({**total, **{k: sums[-1][k] for k in ("grad_norm", "learning_rate")}})
        if not all(math.isfinite(metrics[k]) for k in ("loss", "grad_norm")):
            raise FloatingPointError(f"loss became {metrics['loss']} (grad norm {metrics['grad_norm']}) "
                                     f"between steps {step - len(sums)} and {step}; stopped, {self.where()}")
        if self.flops is None:
            self.flops, (self.utilisation, self.peak) = self.trainer.step_flops(), _utilisation(self.trainer)
        metrics["seqs_per_s"] = float(total["sequences"]) / elapsed
        metrics["target_tokens_per_s"] = float(total["weight"]) / elapsed
        if self.flops and self.peak:
            metrics[self.utilisation] = self.flops * len(sums) / elapsed / self.peak
        metrics["compile_s"] = self.trainer.compile_seconds
        self.writer.write_scalars(step, metrics)
        self.history.append({"step": step, **metrics})
        self.bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc=f"{metrics['accuracy']:.3f}")
        if self.on_log is not None:
            self.on_log(step, metrics)
        self.pending, self.tick = [], time.perf_counter()


class Validation:
    """Validation: teacher forced on `eval_batches()`, and `decoded_eval(model)`'s task metrics
    as `decoded/<name>`; written to TensorBoard, kept in `records`, handed to `on_log`."""

    def __init__(self, trainer: Trainer, eval_batches, decoded_eval, writer, on_log, records: list):
        self.trainer, self.eval_batches, self.decoded_eval = trainer, eval_batches, decoded_eval
        self.writer, self.on_log, self.records = writer, on_log, records

    def __call__(self, step: int, params: dict) -> None:
        metrics = {} if self.eval_batches is None else teacher_forced(self.trainer, params, self.eval_batches())
        if self.decoded_eval is not None:
            decoded = self.decoded_eval(self.trainer.model(params))
            metrics.update({f"{DECODED}{name}": value for name, value in decoded.items()})
        self.writer.write_scalars(step, metrics)
        self.records.append((step, metrics))
        if self.on_log is not None:
            self.on_log(step, validation_scalars(metrics))


class Saving:
    """Checkpointing: the state and the data position, only if the state is finite; the last
    good step is what error messages point to."""

    def __init__(self, trainer: Trainer, checkpoints: RunCheckpoints | None, batches, last_good: int | None):
        self.trainer, self.checkpoints, self.batches, self.last_good = trainer, checkpoints, batches, last_good

    def __call__(self, step: int, state: TrainState) -> None:
        """Checkpoint `state`, the state after `step` (the loop's count: no device sync for it)."""
        if not all_finite((state.params, state.opt_state)):
            raise FloatingPointError(f"the parameters or optimizer state at step {step} are not finite; "
                                     f"not saved, stopped, {self.where()}")
        self.checkpoints.save(self.trainer.checkpoint_state(state), self.batches)
        self.last_good = step

    def where(self) -> str:
        if self.last_good is None:
            return "no checkpoint was written"
        return f"last good checkpoint: step {self.last_good} in {self.checkpoints.directory}"


def _replay(model_dir: pathlib.Path, task_name: str, step: int, on_log) -> tuple[list, list]:
    """A resumed run's curve up to `step`, as logged: (history, validations), each point redrawn
    through `on_log` in step order as if this run had made it."""
    history = [{"step": s, **metrics} for s, metrics in logged_steps(model_dir / "train", upto=step)]
    validations = logged_steps(model_dir / "training_eval" / task_name, upto=step)
    logged = [(entry["step"], entry) for entry in history] + [(s, validation_scalars(m)) for s, m in validations]
    for logged_step, metrics in sorted(logged, key=lambda entry: entry[0]) if on_log is not None else ():
        on_log(logged_step, metrics)
    return history, validations


def progress_bar(**options):
    """tqdm's bar; in a notebook, tqdm's widget, whose saved output (a saved notebook, `t5nb
    course`'s log) keeps the state it was first shown in, "0%", unless its display is updated:
    this one's becomes its last line as text when it closes (`SavedAsItEnded`).

    Its rate is the steps over the time since it started (tqdm's `smoothing=0`): JAX returns a
    step as soon as it is dispatched and the loop waits only at log points, so tqdm's default,
    a moving average of the time between updates, showed 2 to 5 times the true rate."""
    options = {"smoothing": 0, **options}
    if options.get("disable") or not issubclass(tqdm, notebook_tqdm):
        return tqdm(**options)
    return SavedAsItEnded(**options)


class SavedAsItEnded(notebook_tqdm):
    """tqdm's notebook bar whose display becomes its last line as text when it closes, so it is
    saved as it ended. A subclass, not a closure on the bar: a bar in a reference cycle is freed
    by the garbage collector, which clears the widget's weak reference to it before the bar
    closes, and the widget's view then fails to read it (ReferenceError)."""

    def __init__(self, **options):
        from IPython.display import display  # only in a notebook

        super().__init__(**options, display=False)
        self.shown = display(self.container, display_id=True)

    def close(self):
        super().close()
        shown, self.shown = getattr(self, "shown", None), None  # closed once; or before it was shown
        if shown is not None:
            shown.update({"text/plain": str(self)}, raw=True)


def train(trainer: Trainer, batches, num_steps: int, model_dir, *, eval_batches=None, decoded_eval=None,
          eval_every: int = 0, checkpoint_every: int = 0, keep_checkpoints: int = 3, log_every: int = 50, state=None,
          task_name: str = "train_eval", on_log=None, progress: bool = True) -> TrainResult:
    """Train until the global step reaches `num_steps`, resuming from `model_dir` if it holds checkpoints.

    `num_steps` counts from the start of the run that wrote step 0: to fine-tune a checkpoint
    trained for N steps by another K, pass N + K (as T5X's TRAIN_STEPS). `batches` yields numpy
    batches; if it has `state()`/`set_state()` (and `save_pipeline()`/`restore_pipeline()`, as
    `BatchIterator` has) its position is checkpointed and restored, so a resumed run sees exactly
    the batches an uninterrupted one would.

    The loop runs the step and three periodic actions: `MetricsLog` every `log_every` steps (and
    before each checkpoint), `Validation` every `eval_every` steps (teacher forced on
    `eval_batches()`, an iterable of batches, and `decoded_eval(model)`, task metrics of decoded
    answers such as `evaluate.decoded_sample`'s, logged as `decoded/<name>` beside the loss in
    `training_eval/<task_name>`), and `Saving` every `checkpoint_every` steps; each also at the
    last step. `on_log(step, metrics)` gets the logged metrics (the live plot), and each
    validation's as `validation/<name>`. Ctrl-C or SIGTERM saves a checkpoint at the end of the
    current step, then stops; a non-finite state is never saved.
    """
    _check_positive(num_steps=num_steps, log_every=log_every)
    for name, value in (("checkpoint_every", checkpoint_every), ("eval_every", eval_every)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a number of steps (0: never), got {value!r}")
    if hasattr(batches, "task"):
        tasks.check_vocabulary(trainer.model_config.vocab_size, batches.task)
    model_dir = pathlib.Path(model_dir)
    with holding(model_dir):  # one trainer per run folder
        model_dir.mkdir(parents=True, exist_ok=True)
        resuming = checkpoint_every > 0 and resume_step(model_dir) is not None
        checkpoints = RunCheckpoints(model_dir / "checkpoints", keep_checkpoints) if checkpoint_every else None
        if checkpoints is not None:
            warn_if_short_of_space(model_dir, trainer.abstract_checkpoint(), keep_checkpoints)
        record_config(model_dir, trainer, resuming)
        if resuming:
            state = trainer.from_checkpoint(checkpoints.restore_latest(trainer.abstract_checkpoint(), batches))
        elif state is None:
            state = trainer.init_state()
        step = int(jax.device_get(state.step))
        history, validations = _replay(model_dir, task_name, step, on_log) if resuming else ([], [])
        writer, eval_writer = (metric_writers.create_default_writer(str(model_dir / folder),
                                                                    just_logging=jax.process_index() > 0)
                               for folder in ("train", f"training_eval/{task_name}"))
        bar = progress_bar(total=num_steps, initial=step, desc=f"train {model_dir.name}",
                           unit="step",  # the run's folder: a notebook's several bars told apart
                           disable=not progress or step >= num_steps)  # a finished run (loading it): no bar
        save = Saving(trainer, checkpoints, batches, step if resuming else None)
        log = MetricsLog(trainer, writer, bar, on_log, history, save.where)
        validate = (Validation(trainer, eval_batches, decoded_eval, eval_writer, on_log, validations)
                    if eval_every and (eval_batches is not None or decoded_eval is not None) else None)
        try:
            with StopRequested() as stop:
                while step < num_steps and stop.signal is None:
                    state, sums = trainer.train_step(state, trainer.shard_batch(next(batches)))
                    step += 1
                    log.add(sums)
                    bar.update(1)
                    last = step == num_steps
                    saving = checkpoints is not None and (step % checkpoint_every == 0 or last)
                    if step % log_every == 0 or saving or last:
                        log(step)
                    if validate is not None and (step % eval_every == 0 or last):
                        validate(step, state.params)
                    if checkpoints is not None and (saving or stop.signal is not None):  # a signal may come
                        if log.pending:  # while logging or validating: this step is still saved
                            log(step)
                        save(step, state)
                if stop.signal is not None:
                    if log.pending:
                        log(step)
                    stop.raise_stop(step, save.last_good)
        finally:  # an error or an interrupt still completes the checkpoint in flight
            bar.close()
            if checkpoints is not None:
                checkpoints.wait()
            writer.flush()
            eval_writer.flush()
        return TrainResult(state=state, history=history, train_eval=validations, model_dir=model_dir)


# -- a run from a recipe ----------------------------------------------------------------------
def recipe_validation(recipe: Recipe) -> dict:
    """`train()`'s validation settings: every `run.eval_every` steps, the loss on the first
    `run.eval_batches` batches of the task's validation split (none if it has no such split,
    or less than a batch) and the task's metrics on `run.decoded_sample` examples decoded."""
    task = tasks.get_task(recipe.data.task)
    if not recipe.run.eval_every or "validation" not in task.splits:
        return {}
    settings = dict(eval_every=recipe.run.eval_every)
    lengths = feature_lengths(recipe)
    if recipe.run.decoded_sample and any(sub.metric_fns for sub in getattr(task, "tasks", [task])):
        settings["decoded_eval"] = evaluate.decoded_sample(task, lengths, recipe.run.decoded_sample)
    batches = tasks.validation_batches(task, lengths, recipe.data.batch_size, recipe.run.eval_batches)
    if batches:
        settings["eval_batches"] = lambda: batches
    else:
        warnings.warn(f"task {task.name!r}: its validation split holds less than one batch of "
                      f"{recipe.data.batch_size} examples, so this run has no validation loss curve", stacklevel=3)
    return settings


def refuse_to_resume_elsewhere(recipe: Recipe, saved: Recipe, model_dir: pathlib.Path) -> None:
    """A RecipeError when `recipe` would resume the run `saved` (its `recipe.toml`) on another
    adapter base, or on a data file whose content changed since (their SHA-256 differ)."""
    if adapters.has_adapters(recipe.model_config()) and saved.run.init_checkpoint != recipe.run.init_checkpoint:
        raise RecipeError(f"{model_dir} trained adapters on {saved.run.init_checkpoint}; refusing to resume them on "
                          f"{recipe.run.init_checkpoint} (run.init_checkpoint)")
    for key, path in recipe.data.files().items():
        then, now = getattr(saved.data, f"{key}_sha256"), getattr(recipe.data, f"{key}_sha256")
        if then is not None and then != now:
            raise RecipeError(f"{model_dir} trained on {getattr(saved.data, key)} with other content (sha256 "
                              f"{then[:12]}...) than data.{key} {path} holds now ({now[:12]}...); refusing to "
                              "resume on changed data: restore the file, or train into another run.model_dir")


def run_recipe(recipe: Recipe, *, on_log=None, progress: bool = True, trainer: Trainer | None = None):
    """Train as `recipe` says, resuming its run directory where its checkpoints end; write the
    resolved recipe there as `recipe.toml`. `trainer` (one the recipe's model and optimizer
    describe) saves compiling again. Returns (trainer, TrainResult)."""
    if jax.process_count() > 1 and recipe.run.decoded_sample:
        raise RecipeError(f"{recipe.source}: run.decoded_sample works in one process; set it to 0 and score "
                          "the checkpoints with `t5nb eval`")
    model_dir = pathlib.Path(recipe.run.model_dir)
    with holding(model_dir):  # before anything is read or written there
        recipe = recipe.resolved()
        config = recipe.model_config()
        if trainer is None:
            trainer = make_trainer(recipe)
        elif (trainer.model_config, trainer.train_config) != (config, recipe.optimizer):
            raise ValueError("the trainer given differs from the recipe's model or optimizer")
        resuming = recipe.run.checkpoint_every > 0 and resume_step(model_dir) is not None
        if resuming and (model_dir / "recipe.toml").is_file():
            refuse_to_resume_elsewhere(recipe, load_recipe(model_dir / "recipe.toml"), model_dir)
        params = None  # a resumed run's checkpoints hold what it trained; its frozen base is read again
        if recipe.run.init_checkpoint and not (resuming and not adapters.has_adapters(config)):
            params = initial_params(recipe.run.init_checkpoint, config, trainer.mesh)
        data = recipe.data
        data_task(data)  # registered from its files, if it names them
        if jax.process_index() == 0:
            tasks.warn_if_cut(data.task, "train", feature_lengths(recipe),
                              {"inputs": "data.inputs_length", "targets": "data.targets_length"})
        batches = tasks.BatchIterator(data.task, feature_lengths(recipe), data.batch_size, pack=data.pack, seed=data.seed)
        if jax.process_index() == 0:
            model_dir.mkdir(parents=True, exist_ok=True)
            write_atomically(model_dir / "recipe.toml", recipe.to_toml())
        result = train(trainer, batches, recipe.run.steps, model_dir,
                       state=None if params is None else trainer.init_state(params),
                       checkpoint_every=recipe.run.checkpoint_every, keep_checkpoints=recipe.run.keep_checkpoints,
                       log_every=recipe.run.log_every, task_name=batches.task.name, on_log=on_log,
                       progress=progress and jax.process_index() == 0, **recipe_validation(recipe))
    return trainer, result

"""The course's workflow in a few calls: pretrain, fine-tune, reuse an earlier notebook's run.

Every notebook runs alone: `pretrained_params` restores the pretraining run that
`02_pretraining` leaves under `runs/`, or runs that pretraining first if it is absent.
"""
import json
import os
import pathlib
import warnings

import jax

from t5nb import evaluate, tasks
from t5nb.checkpoints import params_of
from t5nb.config import T5Config, get_config
from t5nb.profiles import Profile, compute_dtype
from t5nb.system import in_colab
from t5nb.model import Transformer
from t5nb.paths import REPO_ROOT
from t5nb.train import Trainer, TrainConfig, TrainResult, teacher_forced, train


def runs_dir() -> pathlib.Path:
    """Where runs go: `$T5NB_RUNS_DIR`, else `runs/` beside the notebooks (`/content/runs` on Colab)."""
    default = "/content/runs" if in_colab() else REPO_ROOT / "runs"
    return pathlib.Path(os.environ.get("T5NB_RUNS_DIR", default))


def record_headline(**numbers) -> None:
    """Course bookkeeping, done by the calls below, not by the notebooks: under `t5nb course`,
    which names the notebook it runs in `T5NB_NOTEBOOK`, merge `numbers` into that notebook's
    headline (`t5nb course` puts it into `runs/results.json`); anywhere else, nothing."""
    notebook = os.environ.get("T5NB_NOTEBOOK")
    if not notebook:
        return
    path = runs_dir() / "headlines" / f"{notebook}.json"
    recorded = json.loads(path.read_text()) if path.exists() else {}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**recorded, **numbers}, indent=2, default=float) + "\n")


def model_config(profile: Profile, task=None, **changes) -> T5Config:
    """The profile's preset sized for the vocabulary of `task` (default: the profile's
    vocabulary), computing in this chip's `compute_dtype`, with any field changes."""
    vocabulary = tasks.get_vocabulary(profile.vocabulary)
    vocab_size = 32128 if profile.vocabulary == "t5" else vocabulary.vocab_size  # T5 pads 32100 to 32128
    if task is not None:
        task_vocabulary = tasks.get_task(task).output_features["targets"].vocabulary
        if task_vocabulary != vocabulary:
            vocab_size = task_vocabulary.vocab_size
    return get_config(profile.model, vocab_size=vocab_size, **{"dtype": compute_dtype(), **changes})


def feature_lengths(profile: Profile) -> dict:
    """Pretraining feature lengths."""
    return {"inputs": profile.inputs_length, "targets": profile.targets_length}


def finetune_lengths(profile: Profile) -> dict:
    """Fine-tuning and evaluation feature lengths."""
    return {"inputs": profile.finetune_inputs_length, "targets": profile.finetune_targets_length}


def pretraining_dir(profile: Profile) -> pathlib.Path:
    return runs_dir() / profile.name / "pretraining"


def finetune_dir(profile: Profile, task, name: str = "") -> pathlib.Path:
    """The run directory of `finetune(profile, task, ..., name=name)`."""
    return runs_dir() / profile.name / f"finetune_{tasks.get_task(task).name}{'_' + name if name else ''}"


def pretraining_batches(profile: Profile) -> tasks.BatchIterator:
    """The pretraining data stream from its start: `pretrain` trains on exactly these batches."""
    return tasks.BatchIterator(profile.pretrain_task, feature_lengths(profile), profile.batch_size)


def pretraining_trainer(profile: Profile, mesh=None) -> Trainer:
    """T5.1.1 pretraining: no dropout, Adafactor with T5X's rsqrt decay (1e-2 for 10k steps)."""
    return Trainer(model_config(profile, dropout_rate=0.0), TrainConfig(warmup_steps=10_000), mesh)


def validation(profile: Profile, task, lengths: dict, decoded: bool = False) -> dict:
    """`train()`'s validation settings: every `profile.eval_every` steps, the loss on a fixed
    sample of the task's validation split (none if it has no such split, or less than a batch)
    and, if `decoded` and the task has metrics, those metrics on `profile.decoded_sample` of
    its examples answered greedily."""
    task = tasks.get_task(task)
    if "validation" not in task.splits:
        return {}
    settings = dict(eval_every=profile.eval_every)
    if decoded and any(sub.metric_fns for sub in getattr(task, "tasks", [task])):
        settings["decoded_eval"] = evaluate.decoded_sample(task, lengths, profile.decoded_sample)
    batches = tasks.validation_batches(task, lengths, profile.batch_size, profile.eval_batches)
    if batches:
        settings["eval_batches"] = lambda: batches
    else:
        warnings.warn(f"task {task.name!r}: its validation split holds less than one batch of "
                      f"{profile.batch_size} examples, so this run has no validation loss curve", stacklevel=3)
    return settings


def pretrain(profile: Profile, num_steps: int | None = None, trainer: Trainer | None = None, on_log=None,
             progress: bool = True):
    """Span-corruption pretraining into `pretraining_dir`, resuming where its checkpoints end.

    `num_steps` (default: the profile's) is the global step to reach, so calling again with
    a larger number continues the same run. Returns (trainer, TrainResult).
    """
    trainer = trainer or pretraining_trainer(profile)
    num_steps = num_steps or profile.pretrain_steps
    batches = pretraining_batches(profile)
    result = train(trainer, batches, num_steps, pretraining_dir(profile),
                   checkpoint_every=max(1, profile.pretrain_steps // 4), log_every=25,
                   task_name=profile.pretrain_task, on_log=on_log, progress=progress,
                   **validation(profile, profile.pretrain_task, feature_lengths(profile)))
    last = result.history[-1]
    record_headline(pretraining={"steps": last["step"], "final_loss": last["loss"], "final_accuracy": last["accuracy"]})
    return trainer, result


def pretrained_model(profile: Profile, progress: bool = True) -> Transformer:
    """The model of the profile's finished pretraining run, pretraining first if needed."""
    trainer, result = pretrain(profile, progress=progress)
    return trainer.model(result.state.params)


def _fine_tuning_trainer(profile: Profile, task, init, learning_rate: float, mesh) -> tuple[Trainer, dict | None]:
    """A trainer for `init`'s configuration (or the profile's preset for the task's vocabulary)
    without dropout, in this chip's `compute_dtype`, and `init`'s parameters."""
    if init is None:
        return Trainer(model_config(profile, task, dropout_rate=0.0), TrainConfig(learning_rate=learning_rate), mesh), None
    if not isinstance(init, Transformer):
        raise TypeError(f"init must be a model, as pretrained_model, checkpoints.load_hf, checkpoints.load_t5x "
                        f"and evaluate.load_model return it, or None for random initialisation; got {type(init).__name__}")
    config = init.config.replace(dropout_rate=0.0, dtype=compute_dtype())
    return Trainer(config, TrainConfig(learning_rate=learning_rate), mesh), params_of(init)


def finetune(profile: Profile, task, init: Transformer | None, num_steps: int | None = None, name: str = "",
             learning_rate: float = 1e-3, checkpoint_every: int | None = None, mesh=None, on_log=None,
             progress: bool = True):
    """Fine-tune `init` (a model from any loader; None: random initialisation) on `task`, T5X
    style: Adafactor at a constant learning rate 1e-3, no dropout. The run keeps its final
    state (and one every `checkpoint_every` steps), so `t5nb eval` and `t5nb infer` take its
    directory, and calling again resumes it. Returns (trainer, TrainResult)."""
    trainer, params = _fine_tuning_trainer(profile, task, init, learning_rate, mesh)
    num_steps = num_steps or profile.finetune_steps
    batches = tasks.BatchIterator(task, finetune_lengths(profile), profile.batch_size)
    model_dir = finetune_dir(profile, task, name)
    result = train(trainer, batches, num_steps, model_dir, state=trainer.init_state(params), log_every=25,
                   checkpoint_every=checkpoint_every or num_steps, task_name=batches.task.name,
                   on_log=on_log, progress=progress, **validation(profile, task, finetune_lengths(profile), decoded=True))
    return trainer, result


def finetune_and_evaluate(profile: Profile, task, init: Transformer | None, name: str, on_log=None,
                          num_steps: int | None = None, split: str = "validation"):
    """Fine-tune (see `finetune`), then decode `split` and score it with the task's own metrics
    (`evaluate.infer_eval`). Returns (trainer, TrainResult, metrics)."""
    splits = tasks.get_task(task).splits
    if split not in splits:  # before training, not after
        raise ValueError(f"task {tasks.get_task(task).name!r} has no split {split!r} to evaluate on; "
                         f"its splits: {', '.join(splits)}")
    trainer, result = finetune(profile, task, init, num_steps=num_steps, name=name, on_log=on_log)
    step = int(jax.device_get(result.state.step))
    metrics = evaluate.infer_eval(trainer.model(result.state.params), task, result.model_dir, step=step,
                                  feature_lengths=finetune_lengths(profile), batch_size=64, split=split,
                                  max_examples=profile.eval_examples)
    record_headline(**{name: {**metrics, "final_loss": result.history[-1]["loss"],
                              "examples": len(evaluate.read_predictions(result.model_dir, task, step))}})
    return trainer, result, metrics


def teacher_forced_and_decoded(profile: Profile, task, trainer: Trainer, result: TrainResult) -> tuple[dict, dict]:
    """T5X's two evaluations of a run's final state on `task`'s validation split: teacher-forced
    loss and token accuracy (`train.teacher_forced`, T5X's train_eval) over all full batches, and the
    task's metrics on decoded answers (`evaluate.infer_eval`)."""
    lengths = finetune_lengths(profile)
    validation_split = tasks.BatchIterator(task, lengths, profile.batch_size, split="validation", shuffle=False,
                                           num_epochs=1)
    forced = teacher_forced(trainer, result.state.params, validation_split)
    decoded = evaluate.infer_eval(trainer.model(result.state.params), task, result.model_dir,
                                  step=int(jax.device_get(result.state.step)), feature_lengths=lengths, batch_size=64,
                                  max_examples=profile.eval_examples)
    record_headline(teacher_forced=forced, decoded=decoded)
    return forced, decoded


__all__ = ["TrainResult", "feature_lengths", "finetune", "finetune_and_evaluate", "finetune_dir", "finetune_lengths",
           "model_config", "pretrain", "pretrained_model", "pretraining_batches", "pretraining_dir", "pretraining_trainer",
           "record_headline", "runs_dir", "teacher_forced_and_decoded", "validation"]

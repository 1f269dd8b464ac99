"""The course's workflow in a few calls: pretrain, fine-tune, reuse an earlier notebook's run.

Every notebook runs alone: `pretrained_params` restores the pretraining run that
`02_pretraining` leaves under `runs/`, or runs that pretraining first if it is absent.
"""
import json
import os
import pathlib

import jax

from t5nb import evaluate, tasks
from t5nb.config import T5Config, get_config
from t5nb.profiles import Profile
from t5nb.system import in_colab
from t5nb.train import Trainer, TrainConfig, TrainResult, train

REPO = pathlib.Path(__file__).resolve().parent.parent


def runs_dir() -> pathlib.Path:
    """Where runs go: `$T5NB_RUNS_DIR`, else `runs/` beside the notebooks (`/content/runs` on Colab)."""
    default = "/content/runs" if in_colab() else REPO / "runs"
    return pathlib.Path(os.environ.get("T5NB_RUNS_DIR", default))


def record_headline(notebook: str, **numbers) -> None:
    """Save a notebook's headline numbers; `t5nb course` puts them into `runs/results.json`."""
    path = runs_dir() / "headlines" / f"{notebook}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(numbers, indent=2, default=float) + "\n")


def model_config(profile: Profile, **changes) -> T5Config:
    """The profile's preset with its vocabulary's size (and any field changes)."""
    vocab_size = tasks.get_vocabulary(profile.vocabulary).vocab_size
    if profile.vocabulary == "t5":
        vocab_size = 32128  # the official model pads 32100 to a multiple of 128
    return get_config(profile.model, vocab_size=vocab_size, **changes)


def feature_lengths(profile: Profile) -> dict:
    """Pretraining feature lengths."""
    return {"inputs": profile.inputs_length, "targets": profile.targets_length}


def finetune_lengths(profile: Profile) -> dict:
    """Fine-tuning and evaluation feature lengths."""
    return {"inputs": profile.finetune_inputs_length, "targets": profile.finetune_targets_length}


def pretraining_dir(profile: Profile) -> pathlib.Path:
    return runs_dir() / profile.name / "pretraining"


def pretraining_trainer(profile: Profile, mesh=None) -> Trainer:
    """T5.1.1 pretraining: no dropout, Adafactor with T5X's rsqrt decay (1e-2 for 10k steps)."""
    return Trainer(model_config(profile, dropout_rate=0.0), TrainConfig(warmup_steps=10_000), mesh)


def pretrain(profile: Profile, num_steps: int | None = None, trainer: Trainer | None = None, on_log=None,
             progress: bool = True):
    """Span-corruption pretraining into `pretraining_dir`, resuming where its checkpoints end.

    `num_steps` (default: the profile's) is the global step to reach, so calling again with
    a larger number continues the same run. Returns (trainer, TrainResult).
    """
    trainer = trainer or pretraining_trainer(profile)
    num_steps = num_steps or profile.pretrain_steps
    batches = tasks.BatchIterator(profile.pretrain_task, feature_lengths(profile), profile.batch_size)
    result = train(trainer, batches, num_steps, pretraining_dir(profile),
                   checkpoint_every=max(1, profile.pretrain_steps // 4), log_every=25,
                   task_name=profile.pretrain_task, on_log=on_log, progress=progress)
    return trainer, result


def pretrained_params(profile: Profile, progress: bool = True) -> dict:
    """The parameters of the profile's finished pretraining run, pretraining first if needed."""
    trainer, result = pretrain(profile, progress=progress)
    return result.state.params


def finetune(profile: Profile, task: str, params: dict | None, num_steps: int | None = None, name: str = "",
             learning_rate: float = 1e-3, checkpoint_every: int = 0, mesh=None, on_log=None, progress: bool = True):
    """Fine-tune on `task` from `params` (None: from random initialisation), T5X style:
    Adafactor at a constant learning rate 1e-3. Returns (trainer, TrainResult)."""
    trainer = Trainer(model_config(profile, dropout_rate=0.0), TrainConfig(learning_rate=learning_rate), mesh)
    state = trainer.init_state(params)
    batches = tasks.BatchIterator(task, finetune_lengths(profile), profile.batch_size)
    model_dir = runs_dir() / profile.name / f"finetune_{task}{'_' + name if name else ''}"
    result = train(trainer, batches, num_steps or profile.finetune_steps, model_dir, state=state, log_every=25,
                   checkpoint_every=checkpoint_every, task_name=task, on_log=on_log, progress=progress)
    return trainer, result


def finetune_and_evaluate(profile: Profile, task: str, params: dict | None, name: str, on_log=None,
                          num_steps: int | None = None):
    """Fine-tune (see `finetune`), then decode the validation split and score it with the task's
    own metrics (`evaluate.infer_eval`). Returns (trainer, TrainResult, metrics)."""
    trainer, result = finetune(profile, task, params, num_steps=num_steps, name=name, on_log=on_log)
    metrics = evaluate.infer_eval(trainer.model(result.state.params), task, result.model_dir,
                                  step=int(jax.device_get(result.state.step)), feature_lengths=finetune_lengths(profile),
                                  batch_size=64, max_examples=profile.eval_examples)
    return trainer, result, metrics


__all__ = ["TrainResult", "feature_lengths", "finetune", "finetune_and_evaluate", "finetune_lengths",
           "model_config", "pretrain", "pretrained_params", "pretraining_dir", "pretraining_trainer",
           "record_headline", "runs_dir"]

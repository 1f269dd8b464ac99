"""The course's workflow in a few calls: pretrain, fine-tune, reuse an earlier notebook's run.

Each run is a recipe (`t5nb.recipe`) made from the profile, run by the function `t5nb train`
runs, which writes it into the run directory: `t5nb train runs/<profile>/<run>/recipe.toml`
repeats the run outside the notebook. Every notebook runs alone: `pretrained_checkpoint`
returns the pretraining run that `02_pretraining` leaves under `runs/` or, where there is none,
the profile's published checkpoint (or, for a profile without one, 02's pretraining run first).
"""
import os
import pathlib

import jax
import numpy as np

from t5nb import adapters, evaluate, tasks
from t5nb.adapters import FINE_TUNING_METHODS
from t5nb.checkpoints import abstract_params, checkpoint_steps, is_t5x_checkpoint
from t5nb.config import get_config
from t5nb.profiles import PROFILES, Profile, course_minutes, said_minutes
from t5nb.recipe import Data, Recipe, Run, make_trainer
from t5nb.system import record_headline, runs_dir
from t5nb.train import TrainResult, run_recipe
from t5nb.trainer import Trainer, TrainConfig, teacher_forced


def feature_lengths(profile: Profile) -> dict:
    """Pretraining feature lengths."""
    return {"inputs": profile.inputs_length, "targets": profile.targets_length}


def finetune_lengths(profile: Profile) -> dict:
    """Fine-tuning and evaluation feature lengths."""
    return {"inputs": profile.finetune_inputs_length, "targets": profile.finetune_targets_length}


def pretraining_dir(profile: Profile, name: str = "") -> pathlib.Path:
    """The run directory of `pretraining_recipe(profile, name=name)`."""
    return runs_dir() / profile.name / f"pretraining{'_' + name if name else ''}"


def finetune_dir(profile: Profile, task, name: str = "") -> pathlib.Path:
    """The run directory of `finetune(profile, task, ..., name=name)`."""
    return runs_dir() / profile.name / f"finetune_{tasks.get_task(task).name}{'_' + name if name else ''}"


def pretraining_batches(profile: Profile) -> tasks.BatchIterator:
    """The pretraining data stream from its start: `pretrain` trains on exactly these batches."""
    return tasks.BatchIterator(profile.pretrain_task, feature_lengths(profile), profile.batch_size)


# Questions 04 and 05 put to the QA model, by the profile's vocabulary: about a held-out person
# of the facts world, or trivia for a model of real data.
EXAMPLE_QUESTIONS = {
    "facts": ["Where was Ada Klimberg born?", "In what year was Ada Klimberg born?",
              "Which company does Ada Klimberg work for?"],
    "t5": ["Who wrote the novel Moby-Dick?", "What is the capital of Australia?", "In which year did the Berlin Wall fall?"]}


def pretraining_recipe(profile: Profile, num_steps: int | None = None, *, task: str | None = None,
                       model: dict | None = None, name: str = "") -> Recipe:
    """T5.1.1 span-corruption pretraining (the profile's task, model and its execution, batch
    and lengths): no dropout, Adafactor with T5X's rsqrt decay (1e-2 for 10k steps), four
    checkpoints, into `pretraining_dir`. A variant (06's) trains on another `task`, changes `model` (a preset
    and/or T5Config fields) and goes to `pretraining_dir(profile, name)`."""
    steps = num_steps or profile.pretrain_steps
    return Recipe(model={"preset": profile.model, "dropout_rate": 0.0, **(profile.execution or {}), **(model or {})},
                  data=Data(task or profile.pretrain_task, profile.inputs_length, profile.targets_length,
                            profile.batch_size),
                  optimizer=TrainConfig(warmup_steps=10_000),
                  run=Run(str(pretraining_dir(profile, name)), steps,
                          checkpoint_every=max(1, profile.pretrain_steps // 4), log_every=25,
                          eval_every=profile.eval_every, eval_batches=profile.eval_batches),
                  source=f"workflow.pretraining_recipe({profile.name!r}{', name=' + repr(name) if name else ''})")


def pretraining_trainer(profile: Profile) -> Trainer:
    """The trainer of `pretraining_recipe(profile)`: its model and optimizer, compiled once."""
    return make_trainer(pretraining_recipe(profile))


def pretrain(profile: Profile, num_steps: int | None = None, trainer: Trainer | None = None, on_log=None,
             progress: bool = True):
    """Run `pretraining_recipe(profile)`, resuming where its checkpoints end.

    `num_steps` (default: the profile's) is the global step to reach, so calling again with
    a larger number continues the same run. Returns (trainer, TrainResult).
    """
    trainer, result = run_recipe(pretraining_recipe(profile, num_steps), trainer=trainer, on_log=on_log,
                                 progress=progress)
    last = result.history[-1]
    record_headline(pretraining={"steps": last["step"], "final_loss": last["loss"], "final_accuracy": last["accuracy"]})
    return trainer, result


def pretraining_finished(profile: Profile) -> bool:
    """Whether notebook 02's pretraining run (`pretraining_dir`) has reached its last step."""
    directory = pretraining_dir(profile)
    steps = checkpoint_steps(directory) if directory.is_dir() else []
    return bool(steps) and steps[-1] >= profile.pretrain_steps


def pretrained_checkpoint(profile: Profile, progress: bool = True):
    """What 03-05 fine-tune as "pretrained": notebook 02's finished run (its directory); where
    there is none (Colab and Kaggle give each notebook a runtime of its own, which starts with
    no runs), the profile's published T5.1.1 checkpoint, the one T5X's fine-tuning guide starts
    from, instead of pretraining again; a profile without one (the facts world's vocabulary,
    which no published model knows) runs 02's pretraining first. Says which, unless it is 02's
    run (`instead_of_pretraining`)."""
    if pretraining_finished(profile):
        return pretraining_dir(profile)
    print(instead_of_pretraining(profile))
    if profile.official_checkpoint:
        return profile.official_checkpoint
    pretrain(profile, progress=progress)
    return pretraining_dir(profile)


def instead_of_pretraining(profile: Profile) -> str | None:
    """What `pretrained_checkpoint` does where notebook 02's run is not finished, and for how
    long, said to a learner; None where it is."""
    if pretraining_finished(profile):
        return None
    directory = pretraining_dir(profile)
    steps = checkpoint_steps(directory) if directory.is_dir() else []
    where = f"at step {steps[-1]:,} of {profile.pretrain_steps:,} in" if steps else "not in"
    if profile.official_checkpoint:
        shapes = abstract_params(get_config(profile.model))
        parameters = sum(shape.size for shape in shapes.values())
        return (f"Notebook 02's pretraining run is {where} {directory}, so this notebook fine-tunes the published "
                f"{profile.model} ({profile.official_checkpoint}: {parameters / 1e6:.0f}M parameters, "
                f"{parameters * 4 / 1e9:.2f} GB to download) where it would fine-tune 02's model, as T5X's fine-tuning "
                f"guide starts from it. To fine-tune your own pretraining, run notebook 02 to its end first in the same "
                f"runtime, or with KEEP_RUNS_ON_DRIVE = True in both (Colab).")
    minutes = course_minutes(profile.name)
    how_long = f" ({said_minutes(minutes[0]['02_pretraining'])} from the start: {minutes[1]})" if minutes else ""
    return (f"Notebook 02's pretraining run is {where} {directory}: this notebook runs it first, to step "
            f"{profile.pretrain_steps:,} as notebook 02 does{how_long}, then its own lesson. Running notebook 02 "
            f"first, with the same runs folder, saves that time.")


def finetune_recipe(profile: Profile, task, init, num_steps: int | None = None, name: str = "",
                    learning_rate: float = 1e-3, checkpoint_every: int | None = None,
                    adapter: dict | None = None) -> Recipe:
    """Fine-tuning `init` (a checkpoint: a run or Hugging Face directory, `hf://<org>/<repo>`
    or a T5X checkpoint of the profile's preset; None: random initialisation) on `task`, T5X
    style, the model run as the profile says (`execution`): Adafactor at a constant learning
    rate 1e-3, no dropout; validation loss and the task's metrics on a decoded sample every
    `profile.eval_every` steps; the final state kept (and one every `checkpoint_every` steps),
    into `finetune_dir(profile, task, name)`.
    `adapter` (model fields such as `{"lora_rank": 8}`, see `t5nb.adapters`) trains adapters on
    the frozen `init` instead, with Adafactor's steps not scaled by the parameters' size."""
    if init is not None and not isinstance(init, (str, os.PathLike)):
        raise TypeError(f"init must be a checkpoint's path (a run or Hugging Face directory, hf://<org>/<repo>, "
                        f"a T5X checkpoint), as pretrained_checkpoint returns it, or None for random "
                        f"initialisation; got {type(init).__name__}")
    init = None if init is None else os.fspath(init)
    own_config = init is not None and not is_t5x_checkpoint(init)
    steps = num_steps or profile.finetune_steps
    task = tasks.get_task(task).name
    lengths = finetune_lengths(profile)
    model = {"dropout_rate": 0.0} if own_config else {"preset": profile.model, "dropout_rate": 0.0}
    return Recipe(model={**model, **(profile.execution or {}), **(adapter or {})},
                  data=Data(task, lengths["inputs"], lengths["targets"], profile.batch_size),
                  optimizer=TrainConfig(learning_rate=learning_rate, parameter_scale=not adapter),
                  run=Run(str(finetune_dir(profile, task, name)), steps, init_checkpoint=init,
                          checkpoint_every=checkpoint_every or steps, log_every=25, eval_every=profile.eval_every,
                          eval_batches=profile.eval_batches, decoded_sample=profile.decoded_sample),
                  source=f"workflow.finetune_recipe({profile.name!r}, {task!r}, name={name!r})")


def finetune(profile: Profile, task, init, num_steps: int | None = None, name: str = "",
             learning_rate: float = 1e-3, checkpoint_every: int | None = None, on_log=None, progress: bool = True,
             adapter: dict | None = None):
    """Run `finetune_recipe` (see there). The run directory is one `t5nb eval` and `t5nb infer`
    take, and calling again resumes it. Returns (trainer, TrainResult)."""
    recipe = finetune_recipe(profile, task, init, num_steps, name, learning_rate, checkpoint_every, adapter)
    return run_recipe(recipe, on_log=on_log, progress=progress)


def finetune_and_evaluate(profile: Profile, task, init, name: str, on_log=None, num_steps: int | None = None,
                          split: str = "validation", record: bool = True, **finetune_args):
    """Fine-tune (see `finetune`, which takes `finetune_args`), then decode `split` and score it
    with the task's own metrics (`evaluate.infer_eval`); `record`: as the notebook's headline
    `name`. Returns (trainer, TrainResult, metrics)."""
    splits = tasks.get_task(task).splits
    if split not in splits:  # before training, not after
        raise ValueError(f"task {tasks.get_task(task).name!r} has no split {split!r} to evaluate on; "
                         f"its splits: {', '.join(splits)}")
    trainer, result = finetune(profile, task, init, num_steps=num_steps, name=name, on_log=on_log, **finetune_args)
    step = int(jax.device_get(result.state.step))
    metrics = evaluate.infer_eval(trainer.model(result.state.params), task, result.model_dir, step=step,
                                  feature_lengths=finetune_lengths(profile), batch_size=64, split=split,
                                  max_examples=profile.eval_examples)
    if record:
        record_headline(**{name: {**metrics, "final_loss": result.history[-1]["loss"],
                                  "examples": evaluated_examples(result, task)}})
    return trainer, result, metrics


# The published checkpoints 03 and 04 fine-tune beside the course's own pretraining: run name ->
# the profile's field that names it
PUBLISHED = {"t5_1_1_small": "official_checkpoint", "t5x_t5_1_1_small": "t5x_checkpoint"}


def published_checkpoints(profile: Profile, pretrained, names=tuple(PUBLISHED)) -> dict:
    """{run name: checkpoint} of the published checkpoints `names` that the profile has, but
    the one `pretrained` is (`pretrained_checkpoint`'s stand-in for 02's run, fine-tuned already)."""
    checkpoints = {name: getattr(profile, PUBLISHED[name]) for name in names}
    return {name: checkpoint for name, checkpoint in checkpoints.items()
            if checkpoint is not None and checkpoint != os.fspath(pretrained)}


def finetune_published(profile: Profile, task, pretrained, names=tuple(PUBLISHED)) -> dict:
    """`finetune_and_evaluate` from each of `published_checkpoints`, printing its metrics, and
    saying of each other of `names` why it is not fine-tuned here: {run name: metrics}."""
    runs = published_checkpoints(profile, pretrained, names)
    for name in names:
        if getattr(profile, PUBLISHED[name]) is None:
            print(f"{name}: the {profile.name} profile's vocabulary has no published checkpoint, so nothing is "
                  f"fine-tuned here; with T5's (profile `accelerator`) this fine-tunes "
                  f"{getattr(PROFILES['accelerator'], PUBLISHED[name])} as above and prints its held-out metrics")
        elif name not in runs:
            print(f"{name}: fine-tuned above as the pretrained model, since notebook 02's run is not here")
    metrics = {}
    for name, checkpoint in runs.items():
        metrics[name] = finetune_and_evaluate(profile, task, checkpoint, name=name)[2]
        print(f"fine-tuned from {checkpoint}: {metrics[name]}")
    return metrics


def evaluated_examples(result, task) -> int:
    """How many examples `finetune_and_evaluate` decoded and scored for the run `result`."""
    return len(evaluate.read_predictions(result.model_dir, task, int(result.state.step)))


def sample_efficiency(profile: Profile, init) -> dict:
    """The profile's fine-tuning task learned from its first N training examples, for each N of
    `profile.transfer_sizes` (`profile.transfer_steps` steps each), from `init` and from random
    initialisation, each scored on the whole validation split with the task's first metric:
    `{"metric": name, "runs": {N: {"pretrained": score, "scratch": score}}, "examples": how many
    each score is on, "steps": each run's, "chance": a uniform guess's score (None: the task has
    none)}`, recorded as the notebook's `transfer` headline."""
    runs, metric = {}, None
    for size in profile.transfer_sizes:
        subset = tasks.first_examples(profile.finetune_task, size)
        for name, start in (("pretrained", init), ("scratch", None)):
            _, result, metrics = finetune_and_evaluate(profile, subset, start, name=name,
                                                       num_steps=profile.transfer_steps, record=False)
            metric = metric or next(iter(metrics))
            runs.setdefault(size, {})[name] = metrics[metric]
    curve = {"metric": metric, "runs": runs, "examples": evaluated_examples(result, subset),
             "steps": profile.transfer_steps, "chance": tasks.uniform_guess_accuracy(profile.finetune_task)}
    record_headline(transfer=curve)
    return curve


def compare_fine_tuning(profile: Profile, init) -> dict:
    """Full fine-tuning, LoRA and prompt tuning (`FINE_TUNING_METHODS`) of `init` on the profile's
    fine-tuning task, the same steps each; per method: parameters trained, checkpoint (train
    state) size, step time, the compiled train step's memory and the task's metrics, recorded as
    the notebook's `fine_tuning_methods` headline. "full" is the run `finetune_and_evaluate(...,
    name="pretrained")` makes, resumed if it exists."""
    table = {}
    for method, (adapter, learning_rate) in FINE_TUNING_METHODS.items():
        trainer, result, metrics = finetune_and_evaluate(
            profile, profile.finetune_task, init, name="pretrained" if method == "full" else method, record=False,
            adapter=adapter, learning_rate=learning_rate)
        state = result.model_dir / "checkpoints" / str(int(jax.device_get(result.state.step))) / "state"
        batch = next(tasks.BatchIterator(profile.finetune_task, finetune_lengths(profile), profile.batch_size))
        table[method] = {
            "trained_parameters": adapters.count(result.state.params),
            "checkpoint_mb": sum(path.stat().st_size for path in state.rglob("*") if path.is_file()) / 2**20,
            "step_ms": 1000 * float(np.median([profile.batch_size / h["seqs_per_s"] for h in result.history])),
            "step_memory_mb": trainer.train_step_memory(batch) / 2**20,
            **metrics}
    record_headline(fine_tuning_methods=table)
    return table


def teacher_forced_and_decoded(profile: Profile, task, trainer: Trainer, result: TrainResult) -> tuple[dict, dict]:
    """T5X's two evaluations of a run's final state on `task`'s validation split: teacher-forced
    loss and token accuracy (`trainer.teacher_forced`, T5X's train_eval) over all full batches, and the
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


__all__ = ["EXAMPLE_QUESTIONS", "FINE_TUNING_METHODS", "PUBLISHED", "TrainResult", "compare_fine_tuning",
           "feature_lengths", "finetune", "finetune_and_evaluate", "finetune_dir", "finetune_lengths",
           "finetune_published", "finetune_recipe", "instead_of_pretraining", "pretrain", "pretrained_checkpoint",
           "pretraining_batches", "pretraining_dir", "pretraining_finished", "pretraining_recipe", "pretraining_trainer",
           "published_checkpoints", "record_headline", "runs_dir", "sample_efficiency", "teacher_forced_and_decoded"]

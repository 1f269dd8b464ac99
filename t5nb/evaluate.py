"""Inference evaluation, the results table, and evaluating or running saved checkpoints.

- `infer_eval`: decode a task's split, apply its postprocessor and its own `metric_fns`, log
  the metrics to TensorBoard under `<model_dir>/inference_eval/<task>` and write predictions
  (input, target, prediction, score) to `<model_dir>/inference_eval/<task>-<step>.jsonl`.
  A mixture is evaluated task by task; its own metrics are their means (`mixture_metrics`).
- `read_predictions`: those predictions back, as a pandas DataFrame.
- `decoded_sample`: the task's metrics on a fixed sample of a split, as a function of the model,
  for `train()` to track while fine-tuning (nothing written: `train()` logs them).
- `results_table`: the metrics by checkpoint step read back from the TensorBoard logs, as a
  pandas DataFrame and `results.csv` (T5's `parse_tb`).
- `evaluate_checkpoints` / `infer_file`: T5X's `eval.py` and `infer.py`, for a training run's
  directory (orbax checkpoints) or a Hugging Face directory (`save_hf`), loaded by `t5nb.restore`.

A directory that is neither, a step it does not have, a task whose vocabulary does not fit the
model or a bad input file is refused before any model is loaded, naming what was found.
"""
import json
import pathlib

import jax
import numpy as np
import pandas as pd
from t5nb import _tensorflow  # noqa: F401, I001  (first: TensorFlow for tf.data only, accelerators hidden)
import seqio
from clu import metric_writers

from t5nb.checkpoints import checkpoint_config, checkpoint_steps, model_dir_kind, require_steps
from t5nb.decode import Predictor
from t5nb.files import write_atomically
from t5nb.event_logs import logged_steps
from t5nb.tasks import as_text, check_vocabulary, get_task, warn_if_cut
from t5nb.restore import load_model
from t5nb.tasks.custom import TaskDataError, read_rows, require_text

LOG_KINDS = ("inference_eval", "training_eval")
INPUT_FIELDS = ("input", "inputs", "question")


def check_split(task, split: str) -> None:
    """Refuse a split the task does not have, naming those it has."""
    task = get_task(task)
    if split not in task.splits:
        raise ValueError(f"task {task.name!r} has no split {split!r}; its splits: {', '.join(task.splits)}")


# what raises each length of an evaluation, for the warning when examples are cut
EVAL_LENGTHS = {"inputs": "feature_lengths['inputs'] (`t5nb eval --inputs-length`)",
                "targets": "feature_lengths['targets'] (`t5nb eval --targets-length`)"}


def task_examples(task, feature_lengths: dict, split: str = "validation",
                  max_examples: int | None = None) -> list | dict:
    """The task's preprocessed examples of `split`, in order (numpy; tokens trimmed to the lengths);
    for a mixture, a dict task name -> the examples of each of its tasks (`max_examples` each)."""
    task = get_task(task)
    if isinstance(task, seqio.Mixture):
        return {sub.name: task_examples(sub, feature_lengths, split, max_examples) for sub in task.tasks}
    check_split(task, split)
    if max_examples is not None and not (isinstance(max_examples, int) and max_examples > 0):
        raise ValueError(f"max_examples must be a positive whole number (or None: all), got {max_examples!r}")
    dataset = task.get_dataset(feature_lengths, split=split, shuffle=False, num_epochs=1)
    if max_examples is not None:
        dataset = dataset.take(max_examples)
    examples = list(dataset.as_numpy_iterator())
    if not examples:
        raise ValueError(f"task {task.name!r}: split {split!r} has no examples")
    return examples


def _require_by_task(mixture, **values) -> None:
    """Refuse any of `values` that is not a dict with one entry per task of `mixture`."""
    names = [sub.name for sub in mixture.tasks]
    for what, value in values.items():
        if not (isinstance(value, dict) and sorted(value) == names):
            got = f"keys {', '.join(map(str, value))}" if isinstance(value, dict) else f"a {type(value).__name__}"
            raise ValueError(f"for mixture {mixture.name!r}, {what} must be a dict task name -> its {what} for "
                             f"each of its tasks ({', '.join(names)}), as task_examples gives the examples; got {got}")


def mixture_metrics(metrics_by_task: dict) -> dict:
    """A mixture's metrics from its tasks': each task's as `<task>/<metric>`, and the mixture's own
    `<metric>`, the mean over the tasks that report it (so `metrics["em"]` reads alike for a task
    and a mixture)."""
    values = {}
    for metrics in metrics_by_task.values():
        for name, value in metrics.items():
            values.setdefault(name, []).append(value)
    return ({f"{task}/{name}": value for task, metrics in metrics_by_task.items() for name, value in metrics.items()}
            | {name: float(np.mean(each)) for name, each in values.items()})


def compute_metrics(task, examples: list | dict, predictions: list[str] | dict,
                    scores=None) -> tuple[list | dict, list | dict, dict]:
    """As seqio's Evaluator: postprocess targets and predictions with the task's postprocessor,
    then apply its metric functions. Returns (targets, predictions, metrics).

    For a mixture, `examples`, `predictions` and `scores` are dicts task name -> those of each of
    its tasks (as `task_examples` gives the examples), each scored by its own task; targets and
    predictions come back as such dicts, and the metrics as `mixture_metrics` names them."""
    task = get_task(task)
    if isinstance(task, seqio.Mixture):
        _require_by_task(task, examples=examples, predictions=predictions,
                         **({} if scores is None else {"scores": scores}))
        results = {sub.name: compute_metrics(sub, examples[sub.name], predictions[sub.name],
                                             None if scores is None else scores[sub.name]) for sub in task.tasks}
        targets, predictions, metrics = ({name: result[part] for name, result in results.items()} for part in range(3))
        return targets, predictions, mixture_metrics(metrics)
    targets = [task.postprocess_fn(as_text(ex["targets_pretokenized"]), example=ex, is_target=True) for ex in examples]
    predictions = [task.postprocess_fn(p, example=ex, is_target=False) for p, ex in zip(predictions, examples)]
    metrics = {}
    for metric_fn in task.predict_metric_fns:
        metrics.update(metric_fn(targets, predictions))
    for metric_fn in task.score_metric_fns if scores is not None else ():
        metrics.update(metric_fn(targets, list(scores)))
    return targets, predictions, {name: float(getattr(value, "value", value)) for name, value in metrics.items()}


def _log_scalars(model_dir, name: str, step: int, scalars: dict) -> None:
    """TensorBoard scalars at `step` in `<model_dir>/inference_eval/<name>` (process 0 writes)."""
    writer = metric_writers.create_default_writer(str(pathlib.Path(model_dir) / "inference_eval" / name),
                                                  just_logging=jax.process_index() > 0, asynchronous=False)
    writer.write_scalars(step, scalars)
    writer.close()


def _predict(predictor: Predictor, examples: list) -> tuple[list[str], np.ndarray]:
    """Decoded texts and sequence scores for preprocessed examples (their `inputs` tokens)."""
    inputs = np.zeros((len(examples), predictor.input_length), np.int32)
    for row, example in enumerate(examples):
        inputs[row, : len(example["inputs"])] = example["inputs"]
    sequences, scores = predictor.generate(inputs)
    return predictor.detokenize(sequences), scores


def _decode_and_score(task, predictor: Predictor, examples: list, model_dir, step: int, targets_cut: int) -> dict:
    """`infer_eval` of one task: decode, score, write the predictions JSONL, log the metrics,
    with `targets_cut_percent` beside them when some targets were cut (it caps exact match)."""
    texts, scores = _predict(predictor, examples)
    targets, predictions, metrics = compute_metrics(task, examples, texts, scores)
    if targets_cut:
        metrics["targets_cut_percent"] = 100 * targets_cut / len(examples)
    if jax.process_index() == 0:
        out = pathlib.Path(model_dir) / "inference_eval"
        out.mkdir(parents=True, exist_ok=True)
        write_atomically(out / f"{task.name}-{step}.jsonl", "".join(
            json.dumps({"input": as_text(example["inputs_pretokenized"]), "target": as_text(target),
                        "prediction": as_text(prediction), "score": float(seq_score)}) + "\n"
            for example, target, prediction, seq_score in zip(examples, targets, predictions, scores)))
    _log_scalars(model_dir, task.name, step, metrics)
    return metrics


def decoded_sample(task, feature_lengths: dict, num_examples: int, *, split: str = "validation",
                   batch_size: int = 64):
    """`metrics(model)`: the task's metrics on greedy answers to the first `num_examples` of
    `split` (a mixture: of each of its tasks, named as `mixture_metrics` names them). The
    sample is read once; each call decodes it again and writes nothing. `train()` calls it at
    every validation (`decoded_eval`) so fine-tuning shows its real metric as it trains."""
    task = get_task(task)
    examples = task_examples(task, feature_lengths, split, num_examples)

    def metrics(model) -> dict:
        predictor = Predictor(model, task, input_length=feature_lengths["inputs"], batch_size=batch_size,
                              max_decode_length=feature_lengths["targets"])
        if not isinstance(task, seqio.Mixture):
            return compute_metrics(task, examples, *_predict(predictor, examples))[2]
        decoded = {name: _predict(predictor, sub_examples) for name, sub_examples in examples.items()}
        return compute_metrics(task, examples, {name: texts for name, (texts, _) in decoded.items()},
                               {name: scores for name, (_, scores) in decoded.items()})[2]

    return metrics


def read_predictions(model_dir, task, step: int) -> pd.DataFrame:
    """The predictions `infer_eval` wrote for `task` at `step` (input, target, prediction, score);
    for a mixture, each of its tasks', named in a `task` column."""
    task = get_task(task)
    frames = []
    for sub in task.tasks if isinstance(task, seqio.Mixture) else [task]:
        path = pathlib.Path(model_dir) / "inference_eval" / f"{sub.name}-{step}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no predictions of {sub.name!r} at step {step} (infer_eval writes them)")
        frames.append(pd.read_json(path, lines=True).assign(task=sub.name))
    return pd.concat(frames, ignore_index=True)


def infer_eval(model, task, model_dir, *, step: int, feature_lengths: dict, batch_size: int = 8,
               split: str = "validation", max_examples: int | None = None, method: str = "greedy",
               mesh=None, **options) -> dict:
    """Decode `split` of `task`, score it with the task's metrics, log them at `step`, write the
    predictions JSONL; return the metrics. `options` go to the decoding `method`.

    A mixture: each of its tasks so (`max_examples` each, its own JSONL and TensorBoard folder);
    the metrics as `mixture_metrics` names them, whose means are also logged under
    `inference_eval/<mixture>`."""
    task = get_task(task)
    if not {"inputs", "targets"} <= set(feature_lengths):
        raise ValueError(f"feature_lengths={feature_lengths!r} needs an 'inputs' and a 'targets' length")
    evaluations = [  # every task's settings and split checked before any decoding
        (sub, Predictor(model, sub, input_length=feature_lengths["inputs"], batch_size=batch_size,
                        max_decode_length=feature_lengths["targets"], method=method, mesh=mesh, **options),
         task_examples(sub, feature_lengths, split, max_examples))
        for sub in (task.tasks if isinstance(task, seqio.Mixture) else [task])]
    metrics = {sub.name: _decode_and_score(sub, predictor, examples, model_dir, step, warn_if_cut(
                   sub, split, feature_lengths, EVAL_LENGTHS, max_examples).get("targets", 0))
               for sub, predictor, examples in evaluations}
    if not isinstance(task, seqio.Mixture):
        return metrics[task.name]
    metrics = mixture_metrics(metrics)
    _log_scalars(model_dir, task.name, step, {name: v for name, v in metrics.items() if "/" not in name})
    return metrics


# -- the results table ------------------------------------------------------------------------
def results_table(model_dir, kinds=LOG_KINDS, csv: bool = True) -> pd.DataFrame:
    """Metrics by step (rows) and `<kind>/<task>/<metric>` (columns; `train/<metric>` for the
    training curves, `kinds=("train",)`) from the TensorBoard logs under `<model_dir>/<kind>`;
    also written to `<model_dir>/results.csv`. A step logged twice (a run resumed from a
    checkpoint before it) takes its newest value."""
    model_dir = pathlib.Path(model_dir)
    values = {}
    for kind in kinds:
        for directory in sorted({events.parent for events in (model_dir / kind).glob("**/events.out.tfevents.*")}):
            prefix = directory.relative_to(model_dir).as_posix()
            for step, scalars in logged_steps(directory):
                values.setdefault(step, {}).update({f"{prefix}/{tag}": value for tag, value in scalars.items()})
    table = pd.DataFrame.from_dict(values, orient="index").sort_index().sort_index(axis=1)
    table.index.name = "step"
    if csv:
        write_atomically(model_dir / "results.csv", table.to_csv())
    return table


def evaluate_checkpoints(model_dir, tasks, *, steps=None, output_dir=None, split: str = "validation",
                         **infer_eval_args) -> pd.DataFrame:
    """T5X's eval.py: `infer_eval` every task at each checkpoint `steps` (default: all; a
    Hugging Face directory: once), without training; the results table of `output_dir`."""
    output_dir = output_dir or model_dir
    tasks = [tasks] if isinstance(tasks, (str, seqio.DatasetProviderBase)) else tasks
    vocab_size = checkpoint_config(model_dir).vocab_size
    for task in tasks:
        check_vocabulary(vocab_size, task)
        check_split(task, split)
    if model_dir_kind(model_dir) == "run":
        require_steps(model_dir, steps or [])
    for step in steps or checkpoint_steps(model_dir) or [None]:
        model, step = load_model(model_dir, step, infer_eval_args.get("mesh"))
        for task in tasks:
            infer_eval(model, task, output_dir, step=step, split=split, **infer_eval_args)
    return results_table(output_dir)


def read_inputs(path) -> list[str]:
    """Inputs from a text file (one per non-blank line) or JSONL (field `input`, `inputs` or
    `question`, whichever the first row has); a bad line is a `TaskDataError` naming it."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: {'not a file' if path.exists() else 'no such input file'}")
    file_format = "jsonl" if path.suffix.lower() == ".jsonl" else "text"
    rows = list(read_rows(path, file_format))
    if not rows:
        raise ValueError(f"{path}: no inputs (the file is empty or blank)")
    if file_format == "text":
        return [text for _, text in rows]
    first_line, first = rows[0]
    field = next((f for f in INPUT_FIELDS if f in first), None)
    if field is None:
        raise TaskDataError(path, first_line, f"no input field {', '.join(map(repr, INPUT_FIELDS))} "
                                              f"(the row has {sorted(first)})")
    for number, row in rows:
        if field not in row:
            raise TaskDataError(path, number, f"missing field (the row has {sorted(row)})", field)
        require_text(path, number, field, row[field])
    return [row[field] for _, row in rows]


def infer_file(model, task, inputs, output_path, **predictor_args) -> list[dict]:
    """T5X's infer.py: predictions for every input, written as JSONL (input, prediction,
    score). `inputs`: a file (see `read_inputs`) or the texts; `predictor_args` go to `Predictor`."""
    predictor = Predictor(model, task, **predictor_args)
    texts = inputs if isinstance(inputs, list) else read_inputs(inputs)
    if pathlib.Path(output_path).is_dir():
        raise IsADirectoryError(f"{output_path}: a directory; the output is a file (JSONL)")
    sequences, scores = predictor.generate(predictor.inputs(texts))
    rows = [{"input": text, "prediction": as_text(prediction), "score": float(seq_score)}
            for text, prediction, seq_score in zip(texts, predictor.postprocess(sequences), scores)]
    if jax.process_index() == 0:
        pathlib.Path(output_path).parent.mkdir(parents=True, exist_ok=True)
        write_atomically(output_path, "".join(json.dumps(row) + "\n" for row in rows))
    return rows

"""Your own task in one call, from TSV, CSV, JSONL or plain-text files; and `describe(task)`.

    register_task("capitals", "capitals.tsv", fields={"inputs": "country", "targets": "capital"},
                  prefix="capital of: ", split_ratio=0.9, metric="squad")

Files are read and checked when the task is registered, so a bad row is reported at once,
naming the file, the line and the field.
"""
import csv
import json
import pathlib
import random

import numpy as np
import seqio
import tensorflow as tf

from t5nb.tasks.batching import is_pretraining
from t5nb.tasks.recipes import add_task, get_task

FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".txt": "text"}
FEATURES = ("inputs", "targets", "answers")


class TaskDataError(ValueError):
    """A bad row in a data file (a task's, or inputs to predict for); the message names the
    file, line and field."""

    def __init__(self, path, line: int, problem: str, field: str | None = None):
        where = f"{path}, line {line}" + (f", field {field!r}" if field else "")
        super().__init__(f"{where}: {problem}")


def _decoded_lines(path: pathlib.Path):
    """(line number, text) for every line of `path`, checking that it is UTF-8."""
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            yield number, raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise TaskDataError(path, number, f"invalid UTF-8 (byte {error.start} of the line)") from None


def read_rows(path: pathlib.Path, file_format: str):
    """(line number, row) pairs of the non-blank lines: dicts for JSONL and headed TSV/CSV,
    strings for text; a line that is not UTF-8 or not a row is a `TaskDataError`."""
    lines = [(n, text) for n, text in _decoded_lines(path) if text.strip()]
    if file_format == "text":
        yield from lines
        return
    if file_format == "jsonl":
        for number, text in lines:
            try:
                row = json.loads(text)
            except json.JSONDecodeError as error:
                raise TaskDataError(path, number, f"malformed row, not JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise TaskDataError(path, number, f"malformed row, a JSON {type(row).__name__} and not an object")
            yield number, row
        return
    delimiter = "\t" if file_format == "tsv" else ","
    if not lines:
        raise TaskDataError(path, 1, "no header row")
    header_number, header = lines[0]
    columns = next(csv.reader([header], delimiter=delimiter))
    for number, text in lines[1:]:
        try:
            cells = next(csv.reader([text], delimiter=delimiter, strict=True))
        except csv.Error as error:
            raise TaskDataError(path, number, f"malformed row ({error})") from None
        if len(cells) != len(columns):
            raise TaskDataError(path, number, f"malformed row: {len(cells)} fields, the header (line "
                                              f"{header_number}) has {len(columns)}")
        yield number, dict(zip(columns, cells))


def _json_kind(value) -> str:
    """A JSON value that is not text, as a message names it: null, true, a number (42), an object."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    return "an object" if isinstance(value, dict) else f"a {type(value).__name__}"


def require_text(path, line: int, field: str, value, several: bool = False):
    """`value` if it is text (with `several`, a list of texts too); else a `TaskDataError`."""
    for item in value if several and isinstance(value, list) else [value]:
        if not isinstance(item, str):
            inside = " in the list" if item is not value else ""
            raise TaskDataError(path, line, f"{_json_kind(item)}{inside}, not text", field)
    return value


def read_examples(path, fields: dict | None = None, file_format: str | None = None) -> list[dict]:
    """Examples `{"inputs", "targets", "answers"}` (or `{"targets"}` for text) from one file.

    `fields` maps `inputs`, `targets` and optionally `answers` (a list of accepted answers,
    JSONL only) to column names or JSON keys.
    """
    path = pathlib.Path(path)
    file_format = file_format or FORMATS.get(path.suffix.lower())
    if file_format not in FORMATS.values():
        raise ValueError(f"{path}: unknown format {file_format!r}; use one of {sorted(FORMATS.values())}")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: {'not a file' if path.exists() else 'no such file'}")
    if file_format != "text" and (not fields or "targets" not in fields or not set(fields) <= set(FEATURES)):
        raise ValueError(f"{path}: fields={fields!r} must map 'targets' (and 'inputs', 'answers') to the "
                         f"file's column names or JSON keys")
    examples = []
    for number, row in read_rows(path, file_format):
        if file_format == "text":
            examples.append({"targets": row.strip()})
            continue
        example = {}
        for feature, key in fields.items():
            if key not in row:
                raise TaskDataError(path, number, f"missing field (the row has {sorted(row)})", key)
            example[feature] = require_text(path, number, key, row[key], several=feature != "inputs")
        accepted = example["targets"] if isinstance(example["targets"], list) else [example["targets"]]
        example["targets"] = accepted[0] if accepted else ""  # several answers: the first is the target
        if not example["targets"].strip():
            raise TaskDataError(path, number, "empty target", fields["targets"])
        if "inputs" in example:  # supervised: every accepted answer, target first, goes to the metric
            answers = example.get("answers", [])
            answers = answers if isinstance(answers, list) else [answers]
            example["answers"] = list(dict.fromkeys([*accepted, *answers]))
        examples.append(example)
    return examples


def _split(examples: list, split_ratio: float, seed: int) -> dict:
    """A deterministic shuffle, then the first `split_ratio` for train, the rest validation."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    cut = round(len(examples) * split_ratio)
    return {"train": [examples[i] for i in order[:cut]], "validation": [examples[i] for i in order[cut:]]}


def in_memory_source(examples_by_split: dict) -> seqio.FunctionDataSource:
    """A seqio source over examples already in memory, one list per split."""

    def dataset_fn(split, shuffle_files, seed=None):
        examples = examples_by_split[split]
        columns = {key: [example[key] for example in examples] for key in examples[0]}
        if "answers" in columns:
            columns["answers"] = tf.ragged.constant(columns["answers"])
        return tf.data.Dataset.from_tensor_slices(columns)

    return seqio.FunctionDataSource(
        dataset_fn, splits=list(examples_by_split),
        num_input_examples={split: len(examples) for split, examples in examples_by_split.items()},
    )


def register_task(name: str, files, *, fields: dict | None = None, file_format: str | None = None,
                  prefix: str = "", objective: str | None = None, split_ratio: float | None = None,
                  metric: str | None = None, vocabulary: str = "facts", seed: int = 0) -> seqio.Task:
    """Register a seqio task from data files in one call.

    files: one path, or `{split: path}`; with one path, `split_ratio` (e.g. 0.9) carves a
        deterministic validation split out of it.
    fields: feature -> column or key, e.g. `{"inputs": "question", "targets": "answer"}`; a
        JSON list as target means several answers, the first one the target;
        not used for plain text, which becomes a span-corruption task, one example a line.
    objective: `supervised` or `span_corruption` (default: span corruption for text only).
    metric: `squad` (EM/F1, every answer in `answers`), `accuracy`, `bleu` or None.
    vocabulary: `facts`, `byte`, `t5` or a SentencePiece model path.
    """
    if split_ratio is not None and not (isinstance(split_ratio, (int, float)) and 0 < split_ratio < 1):
        raise ValueError(f"task {name!r}: split_ratio={split_ratio!r} must be between 0 and 1 (exclusive), "
                         "the share of examples kept for training")
    paths = files if isinstance(files, dict) else {"train": files}
    formats = {pathlib.Path(p).suffix.lower() for p in paths.values()}
    is_text = (file_format or FORMATS.get(formats.pop() if len(formats) == 1 else "")) == "text"
    objective = objective or ("span_corruption" if is_text else "supervised")
    if not is_text and not fields:
        raise ValueError(f"task {name!r}: pass fields={{'inputs': ..., 'targets': ...}} for {sorted(paths.values())}")
    examples = {split: read_examples(path, fields, file_format) for split, path in paths.items()}
    if split_ratio is not None:
        if len(examples) != 1:
            raise ValueError(f"task {name!r}: give either split files or split_ratio, not both")
        examples = _split(examples["train"], split_ratio, seed)
    for split, rows in examples.items():
        if not rows:
            raise ValueError(f"task {name!r}: split {split!r} has no examples ({paths.get(split, paths['train'])})")
    return add_task(name, in_memory_source(examples), objective=objective, vocabulary=vocabulary,
                    prefix=prefix, metric=metric)


def token_lengths(task, split: str = "train", feature_lengths: dict | None = None,
                  max_examples: int = 10_000) -> dict:
    """Untrimmed token length of each feature of (at most `max_examples`) preprocessed examples."""
    task = get_task(task)
    # Span corruption needs its lengths to cut the text, so it never truncates; others untrimmed.
    lengths_to_apply = feature_lengths if is_pretraining(task) else None
    dataset = task.get_dataset(lengths_to_apply, split=split, shuffle=False, trim_output_features=False)
    lengths = {feature: [] for feature in task.output_features}
    for example in dataset.take(max_examples).as_numpy_iterator():
        for feature in lengths:
            if feature in example:
                lengths[feature].append(len(example[feature]))
    return {feature: np.array(values) for feature, values in lengths.items() if values}


def describe(task, split: str = "train", feature_lengths: dict | None = None,
             max_examples: int = 10_000) -> dict:
    """Example count, token-length percentiles and the fraction that `feature_lengths` would
    truncate, per feature, measured on (at most `max_examples`) preprocessed examples."""
    task = get_task(task)
    feature_lengths = feature_lengths or {"inputs": 512, "targets": 114}
    lengths = token_lengths(task, split, feature_lengths, max_examples)
    report = {"task": task.name, "split": split,
              "examples": len(lengths["targets"]),
              "source_examples": task.num_input_examples(split)}
    for feature, values in lengths.items():
        report[feature] = {
            **{f"p{q}": int(np.percentile(values, q)) for q in (50, 90, 99)},
            "max": int(values.max()),
            "truncated": float(np.mean(values > feature_lengths[feature])),
        }
    return report

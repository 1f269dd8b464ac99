"""Your own task in one call, from TSV, CSV, JSON, JSONL or plain-text files; and `describe(task)`.

    register_task("capitals", "capitals.tsv", fields={"inputs": "country", "targets": "capital"},
                  prefix="capital of: ", split_ratio=0.9, metric="squad")

Files are read and checked when the task is registered, so a bad row is reported at once,
naming the file, the row (its line; in a JSON array file, its item) and the field.
"""
import csv
import hashlib
import io
import json
import pathlib
import random
import re
import warnings

import numpy as np
import seqio
import tensorflow as tf

from t5nb.tasks import kept_pipelines
from t5nb.tasks.batching import is_pretraining
from t5nb.tasks.pieces import add_task, get_task

FORMATS = {".tsv": "tsv", ".csv": "csv", ".json": "json", ".jsonl": "jsonl", ".txt": "text"}
FEATURES = ("inputs", "targets", "answers")
LINE_BREAK = re.compile(r"\r\n|\r|\n")


class TaskDataError(ValueError):
    """A bad row in a data file (a task's, or inputs to predict for); the message names the
    file, the row and the field. `row`: a line number, or where else the row is (`"item 3"`:
    index 3 of a JSON array)."""

    def __init__(self, path, row: int | str, problem: str, field: str | None = None):
        where = f"{path}, {row if isinstance(row, str) else f'line {row}'}" + (f", field {field!r}" if field else "")
        super().__init__(f"{where}: {problem}")


def _decoded_text(path: pathlib.Path) -> str:
    """The text of `path`; a file that is not UTF-8 is a `TaskDataError` naming the line and byte."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        lines_before = LINE_BREAK.split(raw[: error.start].decode("utf-8"))
        raise TaskDataError(path, len(lines_before),
                            f"invalid UTF-8 (byte {len(lines_before[-1].encode())} of the line)") from None


def _json_kind(value) -> str:
    """A JSON value that is not text, as a message names it: null, true, a number (42), an object."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return "a string"
    return "an object" if isinstance(value, dict) else f"a {type(value).__name__}"


def _object_row(path, row, value) -> tuple:
    """(row, value) if `value` is a JSON object; else a `TaskDataError`."""
    if not isinstance(value, dict):
        raise TaskDataError(path, row, f"malformed row, {_json_kind(value)} and not an object")
    return row, value


def _json_array_rows(path: pathlib.Path):
    """("item N", object) for each object of a JSON file holding an array of objects."""
    try:
        items = json.loads(_decoded_text(path))
    except json.JSONDecodeError as error:
        raise TaskDataError(path, error.lineno, f"malformed JSON ({error.msg}, column {error.colno})") from None
    if not isinstance(items, list):
        keys = f" with keys {sorted(items)}" if isinstance(items, dict) else ""
        raise ValueError(f"{path}: not a JSON array of objects, one per example (it holds {_json_kind(items)}{keys})")
    for index, item in enumerate(items):
        yield _object_row(path, f"item {index}", item)


def _table_rows(path: pathlib.Path, delimiter: str):
    """(first line, dict) for each row of a headed CSV/TSV under the csv module's quoting rules
    (a quoted field may span lines); a row of blank cells is skipped."""
    # newline="" as csv asks: line breaks inside quoted fields stay as they are
    reader = csv.reader(io.StringIO(_decoded_text(path), newline=""), delimiter=delimiter, strict=True)
    rows, line = [], 1
    try:
        for cells in reader:
            if any(cell.strip() for cell in cells):
                rows.append((line, cells))
            line = reader.line_num + 1
    except csv.Error as error:
        raise TaskDataError(path, line, f"malformed row ({error})") from None
    if not rows:
        raise TaskDataError(path, 1, "no header row")
    (header_line, columns), *body = rows
    for line, cells in body:
        if len(cells) != len(columns):
            raise TaskDataError(path, line, f"malformed row: {len(cells)} fields, the header (line {header_line}) "
                                            f"has {len(columns)}")
        yield line, dict(zip(columns, cells))


def read_rows(path: pathlib.Path, file_format: str):
    """(row, value) pairs of the non-blank rows, `row` as `TaskDataError` takes it: dicts for
    JSON, JSONL and headed TSV/CSV, strings for text; a file that is not UTF-8 or a malformed
    row is a `TaskDataError`."""
    if file_format == "json":
        yield from _json_array_rows(path)
        return
    if file_format in ("csv", "tsv"):
        yield from _table_rows(path, "\t" if file_format == "tsv" else ",")
        return
    lines = [(number, text) for number, text in enumerate(LINE_BREAK.split(_decoded_text(path)), start=1)
             if text.strip()]
    if file_format == "text":
        yield from lines
        return
    for number, text in lines:
        try:
            row = json.loads(text)
        except json.JSONDecodeError as error:
            raise TaskDataError(path, number, f"malformed row, not JSON ({error.msg})") from None
        yield _object_row(path, number, row)


def _cell_answers(cell: str):
    """A CSV/TSV cell holding a JSON list of strings (`["Paris", "paris, france"]`) as that
    list; any other cell as it is."""
    if cell.lstrip().startswith("["):
        try:
            value = json.loads(cell)
        except json.JSONDecodeError:
            return cell
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return value
    return cell


def require_text(path, row: int | str, field: str, value, several: bool = False):
    """`value` if it is text (with `several`, a list of texts too); else a `TaskDataError`."""
    for item in value if several and isinstance(value, list) else [value]:
        if not isinstance(item, str):
            inside = " in the list" if item is not value else ""
            raise TaskDataError(path, row, f"{_json_kind(item)}{inside}, not text", field)
    return value


def read_examples(path, fields: dict | None = None, file_format: str | None = None) -> list[dict]:
    """Examples `{"inputs", "targets", "answers"}` (or `{"targets"}` for text) from one file.

    `fields` maps `inputs`, `targets` and optionally `answers` to column names or JSON keys;
    `targets` and `answers` may hold several accepted answers (see `register_task`).
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
            several = feature != "inputs"
            value = _cell_answers(row[key]) if several and file_format in ("csv", "tsv") else row[key]
            example[feature] = require_text(path, number, key, value, several=several)
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
    """A seqio source over examples already in memory, one list per split; its `examples_digest`
    tells whether two sources hold the same examples (a data file changed under a run), and
    `examples_bytes` how large they are as JSON."""

    def dataset_fn(split, shuffle_files, seed=None):
        examples = examples_by_split[split]
        columns = {key: [example[key] for example in examples] for key in examples[0]}
        if "answers" in columns:
            columns["answers"] = tf.ragged.constant(columns["answers"])
        return tf.data.Dataset.from_tensor_slices(columns)

    source = seqio.FunctionDataSource(
        dataset_fn, splits=list(examples_by_split),
        num_input_examples={split: len(examples) for split, examples in examples_by_split.items()},
    )
    as_json = json.dumps(examples_by_split, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8")
    source.examples_digest = hashlib.sha256(as_json).hexdigest()[:16]
    source.examples_bytes = len(as_json)
    return source


def register_task(name: str, files, *, fields: dict | None = None, file_format: str | None = None,
                  prefix: str = "", objective: str | None = None, split_ratio: float | None = None,
                  metric: str | None = None, vocabulary: str = "facts", seed: int = 0) -> seqio.Task:
    """Register a seqio task from data files in one call.

    files: one path, or `{split: path}`; with one path, `split_ratio` (e.g. 0.9) carves a
        deterministic validation split out of it.
    fields: feature -> column or key, e.g. `{"inputs": "question", "targets": "answer"}`;
        not used for plain text, which becomes a span-corruption task, one example a line.
        Several accepted answers: a list of strings as the `targets` (or `answers`) value in
        JSONL and JSON, or a CSV/TSV cell holding a JSON list of strings, e.g.
        `["Paris", "paris, france"]`. The first is the target; the `squad` metric counts a
        prediction right if it matches any of them (or of `answers`).
    file_format: `tsv`, `csv`, `json` (an array of objects), `jsonl` or `text`; default: from
        the file name's suffix.
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
        raise ValueError(f"task {name!r}: {', '.join(map(str, paths.values()))} needs fields: the column or "
                         "JSON key of 'inputs' and of 'targets'")
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
    """Untrimmed token length of each feature of (at most `max_examples`) preprocessed examples;
    kept beside the pipelines (`kept_pipelines.kept_arrays`)."""
    task = get_task(task)
    # Span corruption needs its lengths to cut the text, so it never truncates; others untrimmed.
    lengths_to_apply = feature_lengths if is_pretraining(task) else None

    def measure():
        dataset = task.get_dataset(lengths_to_apply, split=split, shuffle=False, trim_output_features=False)
        lengths = {feature: [] for feature in task.output_features}
        for example in dataset.take(max_examples).as_numpy_iterator():
            for feature in lengths:
                if feature in example:
                    lengths[feature].append(len(example[feature]))
        return [{feature: np.array(values) for feature, values in lengths.items() if values}]

    settings = dict(feature_lengths=lengths_to_apply, max_examples=max_examples)
    return kept_pipelines.kept_arrays(task, {"split": split, "token_lengths": settings}, measure)[0]


def warn_if_cut(task, split: str, feature_lengths: dict, raise_with: dict, max_examples: int | None = 1000) -> dict:
    """Warn once, naming the task and split, when any of the first `max_examples` examples (all:
    None) of `split` has a feature longer than its length in `feature_lengths`, which batching
    and decoding cut: how many of how many, the longest, and the option that raises it
    (`raise_with`: feature -> e.g. "data.inputs_length"). Returns {feature: examples cut}.
    Span corruption cuts its text by design: nothing is counted for a pretraining task."""
    task = get_task(task)
    if is_pretraining(task):
        return {}
    tasks = task.tasks if isinstance(task, seqio.Mixture) else [task]
    cut = {}
    for sub in tasks:
        lengths = token_lengths(sub, split, None, max_examples or 2**62)
        for feature, values in lengths.items():
            if feature not in feature_lengths or not (values > feature_lengths[feature]).any():
                continue
            count = int((values > feature_lengths[feature]).sum())
            cut[feature] = cut.get(feature, 0) + count
            warnings.warn(f"task {sub.name!r}, split {split!r}: {count} of the {'first ' if max_examples else ''}"
                          f"{len(values)} examples have {feature} longer than {feature_lengths[feature]} tokens (the "
                          f"longest has {values.max()}, with EOS) and are cut to it; {raise_with[feature]} raises "
                          "the length", stacklevel=2)
    return cut


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

"""Custom tasks from TSV, CSV, JSON, JSONL and text files; every bad input names file, row, field."""
import csv
import json
import re

import numpy as np
import pytest

import t5nb.tasks as tasks
from t5nb.tasks import TaskDataError, TaskNameError, read_examples, register_task

LENGTHS = {"inputs": 32, "targets": 8}
QA_FIELDS = {"inputs": "question", "targets": "answer"}


def _write(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def test_tsv_task_with_split_ratio_prefix_and_metric(tmp_path):
    rows = "".join(f"what is {i} plus one?\t{i + 1}\n" for i in range(40))
    path = _write(tmp_path, "sums.tsv", "question\tanswer\n" + rows)
    task = register_task("custom_sums", path, fields=QA_FIELDS, prefix="sum: ", split_ratio=0.75, metric="squad",
                         vocabulary="byte")
    assert task.num_input_examples("train") == 30 and task.num_input_examples("validation") == 10
    shown = tasks.preview("custom_sums", LENGTHS, split="validation")
    assert shown.preprocessed["inputs"] == "sum: " + shown.raw["inputs"]
    batch = next(tasks.BatchIterator("custom_sums", LENGTHS, 5))
    assert batch["encoder_input_tokens"].shape == (5, 32) and "encoder_segment_ids" not in batch
    report = tasks.describe("custom_sums", "train", {"inputs": 20, "targets": 8})
    assert report["examples"] == 30 and report["targets"]["max"] <= 3
    assert report["inputs"]["p50"] == 26 and report["inputs"]["truncated"] == 1.0  # "sum: what is NN plus one?" + EOS


def test_examples_longer_than_their_length_are_counted_once_in_a_warning(tmp_path, recwarn):
    rows = "".join(f"{'a long question ' * 5 if i % 4 == 0 else 'short?'}\t{i}\n" for i in range(20))
    register_task("custom_long", _write(tmp_path, "long.tsv", "q\ta\n" + rows), fields={"inputs": "q", "targets": "a"},
                  vocabulary="byte")
    options = {"inputs": "data.inputs_length", "targets": "data.targets_length"}
    with pytest.warns(UserWarning) as caught:
        cut = tasks.warn_if_cut("custom_long", "train", {"inputs": 32, "targets": 8}, options, max_examples=None)
    assert cut == {"inputs": 5} and len(caught) == 1  # rows 0, 4, ..., 16: 80 bytes + EOS
    assert str(caught[0].message) == ("task 'custom_long', split 'train': 5 of the 20 examples have inputs longer than "
                                      "32 tokens (the longest has 81, with EOS) and are cut to it; data.inputs_length "
                                      "raises the length")
    recwarn.clear()
    assert tasks.warn_if_cut("custom_long", "train", {"inputs": 81, "targets": 8}, options) == {}
    assert tasks.warn_if_cut(tasks.SPAN_CORRUPTION, "train", {"inputs": 8, "targets": 4}, options) == {}
    assert not recwarn.list


def test_csv_split_files_and_jsonl_aliases(tmp_path):
    train = _write(tmp_path, "train.csv", 'q,a\n"Paris, France?",yes\nRome?,no\n')
    validation = _write(tmp_path, "validation.csv", "q,a\nOslo?,yes\n")
    task = register_task("custom_csv", {"train": train, "validation": validation}, fields={"inputs": "q", "targets": "a"},
                         metric="accuracy")
    assert task.num_input_examples("train") == 2 and tasks.preview(task).raw["inputs"] == "Paris, France?"
    rows = '{"question": "Capital of Italy?", "answer": ["Rome", "Roma"]}\n'
    path = _write(tmp_path, "qa.jsonl", rows)
    task = register_task("custom_jsonl", path, fields={"inputs": "question", "targets": "answer", "answers": "answer"})
    assert tasks.preview(task).raw["answers"] == ["Rome", "Roma"]


def test_text_file_becomes_span_corruption(tmp_path):
    path = _write(tmp_path, "book.txt", "".join(f"line {i} of a small book about t5.\n" for i in range(200)))
    register_task("custom_book", path, vocabulary="facts")
    batch = next(tasks.BatchIterator("custom_book", {"inputs": 64, "targets": 16}, 2))
    assert batch["encoder_segment_ids"].shape == (2, 64) and np.all(batch["encoder_input_tokens"][:, 0] > 0)


@pytest.mark.parametrize("name, content, fields, message", [
    ("bad.tsv", "question\tanswer\nhow?\tthis\tthat\n", QA_FIELDS,
     r"bad.tsv, line 2: malformed row: 3 fields, the header \(line 1\) has 2"),
    ("bad.csv", 'question,answer\n"unclosed,quote\n', QA_FIELDS, r"bad.csv, line 2: malformed row"),
    ("bad.jsonl", '{"question": "a", "answer": "b"}\n{"question": \n', QA_FIELDS, r"bad.jsonl, line 2: malformed row, not JSON"),
    ("missing.jsonl", '{"question": "a", "answer": "b"}\n{"question": "c"}\n', QA_FIELDS,
     r"missing.jsonl, line 2, field 'answer': missing field \(the row has \['question'\]\)"),
    ("missing.tsv", "question\treply\nhow?\tso\n", QA_FIELDS, r"missing.tsv, line 2, field 'answer': missing field"),
    ("empty.tsv", "question\tanswer\nfine?\tyes\nempty?\t \n", QA_FIELDS, r"empty.tsv, line 3, field 'answer': empty target"),
    ("latin1.tsv", "question\tanswer\nok?\tyes\n".encode() + b"caf\xe9?\tyes\n", QA_FIELDS,
     r"latin1.tsv, line 3: invalid UTF-8 \(byte 3 of the line\)"),
    ("latin1.json", '[{"question": "ok?",\r\n  "answer": "caf'.encode() + b'\xe9"}]', QA_FIELDS,
     r"latin1.json, line 2: invalid UTF-8 \(byte 16 of the line\)"),
    ("multiline.csv", 'question,answer\n"Which city,\nin France?",Paris\nRome?,\n', QA_FIELDS,
     r"multiline.csv, line 4, field 'answer': empty target"),
    ("missing.json", '[{"question": "a", "answer": "b"},\n {"question": "c"}]', QA_FIELDS,
     r"missing.json, item 1, field 'answer': missing field \(the row has \['question'\]\)"),
    ("number.json", '[{"question": "a", "answer": ["b", 7]}]', QA_FIELDS,
     r"number.json, item 0, field 'answer': a number \(7\) in the list, not text"),
    ("strings.json", '["a", "b"]', QA_FIELDS, r"strings.json, item 0: malformed row, a string and not an object"),
    ("bad.json", '[{"question": "a", "answer": "b"},\n {"question": }]', QA_FIELDS,
     r"bad.json, line 2: malformed JSON \(Expecting value, column 15\)"),
])
def test_bad_input_names_file_line_and_field(tmp_path, name, content, fields, message):
    path = _write(tmp_path, name, content)
    with pytest.raises(TaskDataError, match=message):
        register_task("custom_bad", path, fields=fields)


def test_json_file_that_is_not_an_array_of_objects_is_refused(tmp_path):
    path = _write(tmp_path, "squad.json", '{"version": "1.1", "data": []}')
    with pytest.raises(ValueError, match=r"squad.json: not a JSON array of objects, one per example "
                                         r"\(it holds an object with keys \['data', 'version'\]\)"):
        register_task("custom_not_array", path, fields=QA_FIELDS)


def test_csv_quoted_field_may_span_lines(tmp_path):
    content = 'question,answer\r\n"Which city,\r\nnamed ""the capital""?",Paris\r\n\r\n"Rome?",Rome\r\n'
    examples = read_examples(_write(tmp_path, "multiline.csv", content), QA_FIELDS)
    assert [example["inputs"] for example in examples] == ['Which city,\r\nnamed "the capital"?', "Rome?"]
    assert [example["targets"] for example in examples] == ["Paris", "Rome"]


def test_duplicate_registration_is_an_error(tmp_path):
    path = _write(tmp_path, "once.tsv", "question\tanswer\na?\tb\n")
    register_task("custom_once", path, fields=QA_FIELDS)
    with pytest.raises(TaskNameError, match="a task or mixture called 'custom_once' is already registered"):
        register_task("custom_once", path, fields=QA_FIELDS)


def test_unknown_task_or_mixture_name_suggests_close_ones():
    with pytest.raises(TaskNameError, match=re.escape("no task or mixture called 'facts_q' is registered; did you mean 'facts_qa'")):
        tasks.BatchIterator("facts_q", LENGTHS, 2)
    with pytest.raises(TaskNameError, match="no task or mixture called 'nothing_like_it' is registered$"):
        tasks.describe("nothing_like_it")


NQ_OPEN_DEV = tasks.shared_data_dir() / "nq_open" / "NQ-open.dev.jsonl"


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _write_json_array(path, rows):
    path.write_text(json.dumps(rows, indent=1))


def _write_csv_with_json_list_cells(path, rows):
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({key: json.dumps(value) if isinstance(value, list) else value for key, value in row.items()}
                         for row in rows)


MULTI_ANSWER_FORMS = {  # id: (file name, writer, fields)
    "jsonl-list-target": ("nq.jsonl", _write_jsonl, QA_FIELDS),
    "jsonl-answers-field": ("nq.jsonl", _write_jsonl, {**QA_FIELDS, "answers": "answer"}),
    "json-array": ("nq.json", _write_json_array, QA_FIELDS),
    "csv-json-list-cell": ("nq.csv", _write_csv_with_json_list_cells, QA_FIELDS),
}


@pytest.mark.skipif(not NQ_OPEN_DEV.exists(), reason=f"{NQ_OPEN_DEV} absent (set T5NB_DATA_DIR)")
@pytest.mark.parametrize("form", MULTI_ANSWER_FORMS)
def test_every_answer_of_a_multi_answer_target_reaches_the_metric(tmp_path, form):
    """Real NQ-open rows, `"answer": [...]`, as JSONL, a JSON array or CSV: predicting any one
    accepted answer of each row scores EM and F1 100."""
    from t5nb.evaluate import compute_metrics, task_examples

    rows = [json.loads(line) for line in NQ_OPEN_DEV.read_text().splitlines()]
    rows = [row for row in rows if len(row["answer"]) > 1][:50]
    name, write, fields = MULTI_ANSWER_FORMS[form]
    write(tmp_path / name, rows)
    task = register_task(f"custom_multi_answer_{form.replace('-', '_')}", tmp_path / name, fields=fields,
                         metric="squad", vocabulary="byte")
    examples = task_examples(task, {"inputs": 128, "targets": 32}, split="train")
    assert [[a.decode() for a in ex["answers"]] for ex in examples] == [row["answer"] for row in rows]
    for k in range(max(len(row["answer"]) for row in rows)):
        predictions = [row["answer"][min(k, len(row["answer"]) - 1)] for row in rows]
        _, _, metrics = compute_metrics(task, examples, predictions)
        assert metrics == {"em": 100, "f1": 100}, f"answer {k}"
    _, _, metrics = compute_metrics(task, examples, ["no such answer"] * len(rows))
    assert metrics["em"] == 0

"""`t5nb train`, `eval` and `infer` on tasks of the user's own: data files in a recipe,
described on the command line (`--task-file` and its options) or registered by a module
(`--task-module`)."""
import csv
import hashlib
import json
import sys

import pytest
from flax import nnx

import t5nb.tasks as tasks
from t5nb import checkpoints, cli
from t5nb.config import get_config
from t5nb.decode import task_prefix
from t5nb.model import Transformer
from t5nb.paths import REPO_ROOT
from t5nb.recipe import load_recipe

FILE_RECIPE = REPO_ROOT / "recipes" / "finetune_file.toml"

LENGTHS = ["--inputs-length", "32", "--targets-length", "8"]
ROWS = [{"question": "Where was Ada Lovelace born?", "answer": ["London", "London, England"]},
        {"question": "When was Alan Turing born?", "answer": "1912"},
        {"question": "Who wrote Hamlet?", "answer": ["Shakespeare", "William Shakespeare"]}]
MODULE = '''import pathlib
from t5nb.tasks import register_task

register_task("{name}", {{"validation": pathlib.Path(__file__).with_suffix(".json")}},
              fields={{"inputs": "question", "targets": "answer"}}, metric="accuracy")
'''


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny model of the facts vocabulary, saved as a Hugging Face directory."""
    config = get_config("t5.1.1-tiny", vocab_size=tasks.get_vocabulary("facts").vocab_size)
    directory = tmp_path_factory.mktemp("hf")
    checkpoints.save_hf(Transformer(config, rngs=nnx.Rngs(0)), directory)
    return directory


def test_eval_runs_a_task_defined_on_the_command_line(hf_dir, tmp_path, capsys):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    assert cli.main(["eval", str(hf_dir), "--task", tasks.QA, "--task", "cli_file_qa", "--task-file", str(path),
                     "--task-fields", "inputs=question,targets=answer", "--task-metric", "squad",
                     "--task-prefix", "question: ", "--max-examples", "3", *LENGTHS]) == 0
    table = capsys.readouterr().out
    for column in ("inference_eval/cli_file_qa/em", "inference_eval/cli_file_qa/f1", "inference_eval/facts_qa/em"):
        assert column in table
    task = tasks.get_task("cli_file_qa")
    assert task.splits == ("validation",) and task.num_input_examples("validation") == 3  # the file is --split
    predictions = [json.loads(line) for line in (hf_dir / "inference_eval" / "cli_file_qa-0.jsonl").open()]
    assert [row["input"] for row in predictions] == [f"question: {row['question']}" for row in ROWS]
    assert [row["target"] for row in predictions] == [row["answer"] if isinstance(row["answer"], list)
                                                      else [row["answer"]] for row in ROWS]


@pytest.mark.parametrize("given_as", ["file", "dotted-name"])
def test_task_module_registers_tasks_before_the_command_runs(hf_dir, tmp_path, capsys, monkeypatch, given_as):
    name = f"cli_module_qa_{given_as.replace('-', '_')}"
    module = tmp_path / f"{name}_tasks.py"
    module.write_text(MODULE.format(name=name))
    module.with_suffix(".json").write_text(json.dumps(ROWS, indent=1))  # its data: a JSON array file
    monkeypatch.chdir(tmp_path)  # where a dotted name is found
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert cli.main(["eval", str(hf_dir), "--task", name, *LENGTHS,
                     "--task-module", str(module) if given_as == "file" else module.stem]) == 0
    assert f"inference_eval/{name}/accuracy" in capsys.readouterr().out


@pytest.mark.parametrize("options, status, words", [
    (["--task-metric", "squad", "--task-prefix", "q: "], 2, ["--task-metric, --task-prefix: only with --task-file"]),
    (["--task-file", "qa.jsonl", "--task-fields", "inputs"], 2, ["argument --task-fields: must be FEATURE=COLUMN",
                                                                  "got 'inputs'"]),
    (["--task-file", "qa.jsonl", "--task-fields", "inputs=question,targets=reply"], 1,
     ["qa.jsonl, line 1, field 'reply': missing field (the row has ['answer', 'question'])"]),
    (["--task-file", "qa.jsonl"], 1, ["qa.jsonl needs fields", "'inputs'", "'targets'"]),
    (["--task-file", "qa.jsonl", "--task-fields", "inputs=question,targets=answer", "--task-metric", "em"], 1,
     ["unknown metric 'em'", "'squad'"]),
    (["--task-module", "no_such_tasks_module"], 1, ["--task-module no_such_tasks_module: no module named"]),
    (["--task-module", "absent.py"], 1, ["--task-module absent.py: no such file"]),
])
def test_a_mistake_in_the_task_options_is_one_line(tmp_path, capsys, monkeypatch, options, status, words):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("T5NB_DEBUG", raising=False)
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    assert cli.main(["eval", str(tmp_path), "--task", "cli_bad_task", *options]) == status
    stderr = capsys.readouterr().err
    assert len(stderr.splitlines()) == 1 and stderr.startswith("t5nb eval: error: "), stderr
    assert all(word in stderr for word in words), stderr


def test_the_file_recipe_reads_its_example_with_every_accepted_answer():
    recipe = load_recipe(FILE_RECIPE).with_overrides(["run.init_checkpoint=none", "model.preset=t5.1.1-small"])
    assert recipe.resolved().model_config().vocab_size == 32128  # the official vocabulary, padded
    task = tasks.get_task(recipe.data.task)
    rows = list(csv.DictReader((REPO_ROOT / recipe.data.train_file).open()))
    assert task.num_input_examples("train") + task.num_input_examples("validation") == len(rows) == 40
    examples = {example["inputs_pretokenized"].decode(): example
                for split in ("train", "validation")
                for example in task.get_dataset(None, split=split, shuffle=False).as_numpy_iterator()}
    hamlet = examples["question: Who wrote Hamlet?"]
    assert hamlet["targets_pretokenized"].decode() == "William Shakespeare"
    assert [answer.decode() for answer in hamlet["answers"]] == ["William Shakespeare", "Shakespeare"]


def test_a_recipe_fine_tunes_on_data_files_then_evaluates_and_answers(tmp_path, capsys, monkeypatch):
    """The shipped recipe through `t5nb`, at the `ci` sizes: train on a CSV (several accepted
    answers in a cell), validate on a JSONL (a list of answers), resume, eval, infer; a run
    whose file changed refuses to resume, naming it."""
    monkeypatch.delenv("T5NB_DEBUG", raising=False)
    train_file, validation_file = tmp_path / "train.csv", tmp_path / "validation.jsonl"
    rows = list(csv.DictReader((REPO_ROOT / "examples" / "trivia_qa.csv").open()))
    train_file.write_text((REPO_ROOT / "examples" / "trivia_qa.csv").read_text())
    validation_file.write_text("".join(json.dumps({"question": row["question"], "answer": [row["answer"]],
                                                   "aliases": json.loads(row["aliases"])}) + "\n" for row in rows[:4]))
    run = tmp_path / "run"
    changes = [f"data.train_file={train_file}", f"data.validation_file={validation_file}", "data.split_ratio=none",
               f"run.model_dir={run}", "run.init_checkpoint=none", "model.preset=t5.1.1-tiny", "data.vocabulary=byte",
               "data.inputs_length=64", "data.targets_length=32", "data.batch_size=4", "run.checkpoint_every=2",
               "run.eval_every=2", "run.decoded_sample=4", "run.log_every=1"]
    train = ["train", str(FILE_RECIPE), *(word for change in changes for word in ("--set", change))]
    assert cli.main([*train, "--set", "run.steps=2"]) == 0
    recorded = load_recipe(run / "recipe.toml").data
    assert recorded.train_file_sha256 == hashlib.sha256(train_file.read_bytes()).hexdigest()
    assert recorded.validation_file_sha256 == hashlib.sha256(validation_file.read_bytes()).hexdigest()
    assert cli.main([*train, "--set", "run.steps=4"]) == 0
    assert checkpoints.checkpoint_steps(run) == [2, 4]
    capsys.readouterr()

    tasks.remove_task("my_qa")  # as in a new process: eval and infer register it from the run's recipe
    lengths = ["--inputs-length", "64", "--targets-length", "32"]
    assert cli.main(["eval", str(run), "--task", "my_qa", "--step", "4", *lengths]) == 0
    assert "inference_eval/my_qa/em" in capsys.readouterr().out
    predictions = [json.loads(line) for line in (run / "inference_eval" / "my_qa-4.jsonl").open()]
    assert [row["target"] for row in predictions] == [[row["answer"], *json.loads(row["aliases"])] for row in rows[:4]]
    questions, answers = tmp_path / "questions.txt", tmp_path / "answers.jsonl"
    questions.write_text("Who wrote Hamlet?\nWhat is the capital of Peru?\n")
    assert cli.main(["infer", str(run), "--task", "my_qa", "--input", str(questions), "--output", str(answers),
                     *lengths]) == 0
    assert [json.loads(line)["input"] for line in answers.open()] == questions.read_text().splitlines()
    assert task_prefix("my_qa") == "question: "  # the recipe's prefix, applied to those inputs

    with train_file.open("a") as file:
        file.write('What is the capital of Chile?,Santiago,[]\n')
    assert cli.main([*train, "--set", "run.steps=6"]) == 1
    error = capsys.readouterr().err
    assert error.startswith("t5nb train: error: ") and len(error.splitlines()) == 1, error
    assert f"data.train_file {train_file}" in error and "refusing to resume on changed data" in error, error
    assert checkpoints.checkpoint_steps(run) == [2, 4]

"""`t5nb eval` and `t5nb infer` on tasks of the user's own: described on the command line
(`--task-file` and its options) or registered by a module (`--task-module`)."""
import json
import sys

import pytest
from flax import nnx

import t5nb.tasks as tasks
from t5nb import checkpoints, cli
from t5nb.config import get_config
from t5nb.model import Transformer

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

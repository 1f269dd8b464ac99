"""Inference evaluation: the metric path vs t5.evaluation.metrics on NQ-open, a run's checkpoints
evaluated and run on a file from the command line, predictions JSONL, TensorBoard, results table."""
import json
import os
import pathlib

import jax
import numpy as np
import pytest
import seqio
import t5.evaluation.metrics
from clu import metric_writers

import t5nb.tasks as tasks
from t5nb import cli, decode, evaluate, restore
from t5nb.config import get_config
from t5nb.checkpoints import RunCheckpoints
from t5nb.train import record_config
from t5nb.trainer import TrainConfig, Trainer

DATA_DIR = os.environ.get("T5NB_DATA_DIR")
LENGTHS = {"inputs": 32, "targets": 8}


def perturb(answer: str, row: int) -> str:
    """Exact, partly right, or wrong predictions, by row."""
    return [answer, f"the {answer} of it", answer.split()[0] + " x", "nothing at all"][row % 4]


@pytest.mark.skipif(not DATA_DIR, reason="T5NB_DATA_DIR is not set: needs nq_open/NQ-open.dev.jsonl")
def test_metric_path_on_nq_open_dev_equals_t5_squad():
    path = pathlib.Path(DATA_DIR) / "nq_open" / "NQ-open.dev.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    name = "nq_open_dev_metric_test"
    if name not in seqio.TaskRegistry.names():
        tasks.register_nq_open_jsonl(name, path, vocabulary="byte")
    examples = evaluate.task_examples(name, {"inputs": 64, "targets": 16})
    assert len(examples) == len(rows) == 3610
    assert examples[5]["inputs_pretokenized"].decode() == "trivia question: " + rows[5]["question"]
    predictions = [perturb(row["answer"][0], i) for i, row in enumerate(rows)]
    targets, processed, metrics = evaluate.compute_metrics(name, examples, predictions)
    expected = t5.evaluation.metrics.squad([row["answer"] for row in rows], predictions)
    assert targets == [row["answer"] for row in rows] and processed == predictions
    assert metrics == pytest.approx(expected, abs=1e-9)
    assert 25 < metrics["em"] < 50 and metrics["em"] < metrics["f1"] < 75


def test_results_table_reads_the_tensorboard_logs(tmp_path):
    for kind, task, step, scalars in (("inference_eval", "qa", 100, {"em": 10.0, "f1": 20.5}),
                                      ("inference_eval", "qa", 200, {"em": 30.0, "f1": 40.25}),
                                      ("training_eval", "qa", 200, {"loss": 1.5})):
        writer = metric_writers.create_default_writer(str(tmp_path / kind / task), asynchronous=False)
        writer.write_scalars(step, scalars)
        writer.close()
    table = evaluate.results_table(tmp_path)
    assert table.index.tolist() == [100, 200]
    assert table.loc[200].to_dict() == {"inference_eval/qa/em": 30.0, "inference_eval/qa/f1": 40.25,
                                        "training_eval/qa/loss": 1.5}
    assert table.loc[100, "inference_eval/qa/f1"] == 20.5 and np.isnan(table.loc[100, "training_eval/qa/loss"])
    assert (tmp_path / "results.csv").read_text().splitlines()[0] == (
        "step,inference_eval/qa/em,inference_eval/qa/f1,training_eval/qa/loss")


def test_a_log_cut_short_by_a_killed_writer_reads_up_to_the_cut(tmp_path):
    from t5nb.event_logs import logged_steps

    writer = metric_writers.create_default_writer(str(tmp_path), asynchronous=False)
    for step in (1, 2, 3):
        writer.write_scalars(step, {"loss": float(step)})
    writer.close()
    (events,) = tmp_path.glob("events.out.tfevents.*")
    events.write_bytes(events.read_bytes()[:-5])  # the last record loses its end
    assert logged_steps(tmp_path) == [(1, {"loss": 1.0}), (2, {"loss": 2.0})]
    assert logged_steps(tmp_path, upto=1) == [(1, {"loss": 1.0})]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory as `train` leaves it, with checkpoints of two parameter sets at steps 1, 2
    (training itself is test_train's business)."""
    model_dir = tmp_path_factory.mktemp("run")
    config = get_config("t5.1.1-tiny", vocab_size=tasks.get_vocabulary("facts").vocab_size)
    trainer = Trainer(config, TrainConfig(learning_rate=1e-2))
    state = trainer.init_state()
    record_config(model_dir, trainer, resuming=False)
    checkpoints = RunCheckpoints(model_dir / "checkpoints")
    for step in (1, 2):
        params = jax.tree.map(lambda x: x * (1 + step / 4), state.params)
        checkpoints.save(state.replace(step=state.step + step, params=params), {})
    checkpoints.wait()
    return model_dir


def test_eval_command_evaluates_every_checkpoint(run_dir, capsys):
    assert cli.main(["eval", str(run_dir), "--task", tasks.QA, "--max-examples", "12", "--inputs-length", "32",
                     "--targets-length", "8"]) == 0
    assert "inference_eval/facts_qa/em" in capsys.readouterr().out
    table = evaluate.results_table(run_dir, kinds=("inference_eval",))
    assert table.index.tolist() == [1, 2]
    for step in (1, 2):
        rows = [json.loads(line) for line in (run_dir / "inference_eval" / f"facts_qa-{step}.jsonl").open()]
        assert len(rows) == 12 and set(rows[0]) == {"input", "target", "prediction", "score"}
        assert rows[0]["input"].startswith("trivia question: ") and isinstance(rows[0]["target"], list)
        assert all(row["score"] < 0 for row in rows)
        expected = t5.evaluation.metrics.squad([r["target"] for r in rows], [r["prediction"] for r in rows])
        assert table.loc[step, "inference_eval/facts_qa/em"] == pytest.approx(expected["em"])
        assert table.loc[step, "inference_eval/facts_qa/f1"] == pytest.approx(expected["f1"])
    assert (run_dir / "results.csv").exists()


def test_infer_command_matches_eval_predictions_and_scores(run_dir, tmp_path):
    eval_rows = [json.loads(line) for line in (run_dir / "inference_eval" / "facts_qa-2.jsonl").open()][:3]
    questions = [row["input"].removeprefix("trivia question: ") for row in eval_rows]
    (tmp_path / "questions.txt").write_text("\n".join(questions) + "\n")
    out = tmp_path / "predictions.jsonl"
    assert cli.main(["infer", str(run_dir), "--task", tasks.QA, "--input", str(tmp_path / "questions.txt"),
                     "--output", str(out), "--inputs-length", "32", "--targets-length", "8"]) == 0
    rows = [json.loads(line) for line in out.open()]
    assert [r["input"] for r in rows] == questions
    assert [r["prediction"] for r in rows] == [r["prediction"] for r in eval_rows]
    np.testing.assert_allclose([r["score"] for r in rows], [r["score"] for r in eval_rows], rtol=1e-5)

    model, step = restore.load_model(run_dir)
    assert step == 2
    predictor = decode.Predictor(model, tasks.QA, input_length=32, max_decode_length=8)
    assert predictor(questions[0]) == rows[0]["prediction"]
    assert predictor("trivia question: " + questions[1]) == rows[1]["prediction"]  # no second prefix

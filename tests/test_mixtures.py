"""A mixture wherever a task goes: preview, task_examples, compute_metrics, infer_eval and
Predictor, on `facts_qa` mixed with a small QA task of the same prefix and vocabulary."""
import json

import numpy as np
import pytest
import seqio
import t5.evaluation.metrics
from flax import nnx

import t5nb.tasks as tasks
from t5nb import decode, evaluate
from t5nb.config import get_config
from t5nb.model import Transformer
from t5nb.tasks.pieces import add_mixture
from t5nb.tasks.world import QA_PREFIX

LENGTHS = {"inputs": 32, "targets": 8}
PREDICTOR = dict(input_length=32, max_decode_length=8, batch_size=4)  # the shapes infer_eval compiles
CAPITALS = "mixtures_test_capitals"  # sorts after facts_qa, as the mixture lists its tasks
OTHER_PREFIX = "mixtures_test_other_prefix"
MIXTURE = "mixtures_test_qa"
ROWS = [("What is the capital of France?", "Paris"), ("What is the capital of Japan?", "Tokyo"),
        ("What is the capital of Peru?", "Lima")]


def register_capitals(name, path, prefix):
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in ROWS))
    tasks.register_task(name, {"train": path, "validation": path}, fields={"inputs": "question", "targets": "answer"},
                        prefix=prefix, metric="squad")


@pytest.fixture(scope="module", autouse=True)
def registered(tmp_path_factory):
    """The capitals task (facts_qa's prefix), one with another prefix, and their mixtures."""
    folder = tmp_path_factory.mktemp("capitals")
    register_capitals(CAPITALS, folder / "capitals.jsonl", QA_PREFIX)
    register_capitals(OTHER_PREFIX, folder / "other.jsonl", "capital question: ")
    mixtures = {MIXTURE: [tasks.QA, CAPITALS], "mixtures_test_prefixes": [tasks.QA, OTHER_PREFIX],
                "mixtures_test_vocabularies": [tasks.QA, tasks.QA + "_byte"]}
    for name, members in mixtures.items():
        add_mixture(name, members, default_rate=1.0)
    yield
    for name in mixtures:
        seqio.MixtureRegistry.remove(name)
    for name in (CAPITALS, OTHER_PREFIX):
        seqio.TaskRegistry.remove(name)


@pytest.fixture(scope="module")
def model():
    return Transformer(get_config("t5.1.1-tiny", vocab_size=tasks.get_vocabulary("facts").vocab_size),
                       rngs=nnx.Rngs(0))


def test_preview_shows_each_task():
    shown = tasks.preview(MIXTURE, LENGTHS, split="validation")
    assert list(shown) == [tasks.QA, CAPITALS]
    assert shown[tasks.QA] == tasks.preview(tasks.QA, LENGTHS, split="validation")
    assert shown[CAPITALS].raw["inputs"] == ROWS[0][0]
    assert shown[CAPITALS].preprocessed == {"inputs": QA_PREFIX + ROWS[0][0], "targets": ROWS[0][1]}
    assert str(shown) == f"[{tasks.QA}]\n{shown[tasks.QA]}\n\n[{CAPITALS}]\n{shown[CAPITALS]}"


def test_compute_metrics_per_task_and_their_mean():
    examples = evaluate.task_examples(MIXTURE, LENGTHS, max_examples=5)
    assert {name: len(each) for name, each in examples.items()} == {tasks.QA: 5, CAPITALS: 3}
    answers = {name: [ex["targets_pretokenized"].decode() for ex in each] for name, each in examples.items()}
    targets, predictions, metrics = evaluate.compute_metrics(MIXTURE, examples, answers)
    assert targets[CAPITALS] == [[answer] for _, answer in ROWS] and predictions == answers
    assert metrics == {f"{name}{metric}": 100.0 for name in ("", f"{tasks.QA}/", f"{CAPITALS}/") for metric in ("em", "f1")}

    one_wrong = {**answers, CAPITALS: ["Paris", "Tokyo", "Quito"]}
    metrics = evaluate.compute_metrics(MIXTURE, examples, one_wrong)[2]
    alone = evaluate.compute_metrics(CAPITALS, examples[CAPITALS], one_wrong[CAPITALS])[2]
    assert metrics[f"{CAPITALS}/em"] == alone["em"] == pytest.approx(200 / 3)
    assert metrics["em"] == pytest.approx((100 + 200 / 3) / 2) and metrics[f"{tasks.QA}/em"] == 100
    flat = answers[tasks.QA] + answers[CAPITALS]
    with pytest.raises(ValueError, match=rf"predictions must be a dict task name .*\({tasks.QA}, {CAPITALS}\).*a list"):
        evaluate.compute_metrics(MIXTURE, examples, flat)


def test_mean_is_over_the_tasks_that_report_the_metric():
    metrics = evaluate.mixture_metrics({"a": {"em": 10.0, "f1": 20.0}, "b": {"em": 30.0, "accuracy": 50.0}})
    assert metrics == {"a/em": 10.0, "a/f1": 20.0, "b/em": 30.0, "b/accuracy": 50.0,
                       "em": 20.0, "f1": 20.0, "accuracy": 50.0}


def test_infer_eval_writes_and_scores_each_task(model, tmp_path):
    metrics = evaluate.infer_eval(model, MIXTURE, tmp_path, step=3, feature_lengths=LENGTHS, batch_size=4,
                                  max_examples=4)
    table = evaluate.results_table(tmp_path, kinds=("inference_eval",), csv=False)
    for name, count in ((tasks.QA, 4), (CAPITALS, 3)):
        rows = [json.loads(line) for line in (tmp_path / "inference_eval" / f"{name}-3.jsonl").open()]
        assert len(rows) == count and all(row["input"].startswith(QA_PREFIX) for row in rows)
        expected = t5.evaluation.metrics.squad([r["target"] for r in rows], [r["prediction"] for r in rows])
        for metric in ("em", "f1"):
            assert metrics[f"{name}/{metric}"] == pytest.approx(expected[metric])
            assert table.loc[3, f"inference_eval/{name}/{metric}"] == pytest.approx(expected[metric])
    for metric in ("em", "f1"):
        mean = (metrics[f"{tasks.QA}/{metric}"] + metrics[f"{CAPITALS}/{metric}"]) / 2
        assert metrics[metric] == pytest.approx(mean)
        assert table.loc[3, f"inference_eval/{MIXTURE}/{metric}"] == pytest.approx(mean)
    assert len(metrics) == 6
    sample = evaluate.decoded_sample(MIXTURE, LENGTHS, 4, batch_size=4)  # what fine-tuning tracks: the same
    assert sample(model) == metrics and sample(model) == metrics  # sample read once, decoded at each call


def test_infer_eval_warns_of_cut_targets_and_flags_them_beside_the_score(model, tmp_path):
    lengths = {"inputs": 12, "targets": 1}  # every answer is one piece and EOS; some questions are 13 or 14
    untrimmed = tasks.token_lengths(tasks.QA, "validation", None, 8)
    cut = int((untrimmed["inputs"] > 12).sum())
    assert 0 < cut < 8 and (untrimmed["targets"] == 2).all()
    with pytest.warns(UserWarning) as caught:
        metrics = evaluate.infer_eval(model, tasks.QA, tmp_path, step=1, feature_lengths=lengths, batch_size=4,
                                      max_examples=8)
    said = sorted(str(w.message) for w in caught if "are cut to it" in str(w.message))
    assert said == [f"task '{tasks.QA}', split 'validation': {cut} of the first 8 examples have inputs longer than 12 "
                    f"tokens (the longest has {untrimmed['inputs'].max()}, with EOS) and are cut to it; "
                    "feature_lengths['inputs'] (`t5nb eval --inputs-length`) raises the length",
                    f"task '{tasks.QA}', split 'validation': 8 of the first 8 examples have targets longer than 1 "
                    "tokens (the longest has 2, with EOS) and are cut to it; feature_lengths['targets'] "
                    "(`t5nb eval --targets-length`) raises the length"]
    assert metrics["targets_cut_percent"] == 100.0  # no answer can be matched exactly
    table = evaluate.results_table(tmp_path, kinds=("inference_eval",), csv=False)
    assert table.loc[1, f"inference_eval/{tasks.QA}/targets_cut_percent"] == 100.0


def test_predictor_applies_the_shared_prefix(model):
    predictor = decode.Predictor(model, MIXTURE, **PREDICTOR)
    assert predictor.prefix == QA_PREFIX
    example = evaluate.task_examples(CAPITALS, LENGTHS, max_examples=1)[0]
    tokens = predictor.inputs([ROWS[0][0]])[0]
    np.testing.assert_array_equal(tokens[: len(example["inputs"])], example["inputs"])
    assert predictor(ROWS[0][0]) == decode.Predictor(model, CAPITALS, **PREDICTOR)(QA_PREFIX + ROWS[0][0])


def test_mixture_of_different_prefixes_or_vocabularies_is_refused_by_predictor_only(model, tmp_path):
    with pytest.raises(ValueError, match=(r"mixtures_test_prefixes' differ in input prefix \(facts_qa: 'trivia "
                                          rf"question: ', {OTHER_PREFIX}: 'capital question: '\)")):
        decode.Predictor(model, "mixtures_test_prefixes", **PREDICTOR)
    with pytest.raises(ValueError, match=r"differ in inputs vocabulary \(facts_qa: SentencePiece facts_spm.model "
                                         r"\(\d+ ids\), facts_qa_byte: byte \(259 ids\)\)"):
        decode.Predictor(model, "mixtures_test_vocabularies", **PREDICTOR)
    metrics = evaluate.infer_eval(model, "mixtures_test_prefixes", tmp_path, step=1, feature_lengths=LENGTHS,
                                  batch_size=4, max_examples=2)  # each task decodes with its own prefix
    assert {f"{OTHER_PREFIX}/em", "em"} <= set(metrics)
    rows = [json.loads(line) for line in (tmp_path / "inference_eval" / f"{OTHER_PREFIX}-1.jsonl").open()]
    assert rows[0]["input"] == "capital question: " + ROWS[0][0]

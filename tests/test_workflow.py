"""The course's fine-tuning calls: a checkpoint of any kind goes straight in, the model takes the task's
vocabulary, every run directory left behind is evaluable, a missing split is found before training."""
import json
import math

import numpy as np
import pytest
import seqio
from flax import nnx

import t5nb
import t5nb.tasks as tasks
from t5nb import checkpoints, cli, evaluate, restore, workflow
from t5nb.config import get_config
from t5nb.model import Transformer
from t5nb.recipe import load_recipe

PROFILE = t5nb.get_profile("ci")
T5X_TINY = tasks.shared_data_dir() / "t5x" / "test_t5_tiny.checkpoint_0"
OFFICIAL_VOCABULARY = tasks.shared_data_dir() / "vocab" / "cc_all.32000.sentencepiece.model"
needs_t5_vocabulary = pytest.mark.skipif(not OFFICIAL_VOCABULARY.exists(),
                                         reason=f"{OFFICIAL_VOCABULARY} absent (set T5NB_DATA_DIR)")


@pytest.fixture(autouse=True)
def runs_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("T5NB_RUNS_DIR", str(tmp_path / "runs"))


def sums_task(tmp_path, vocabulary: str, split_ratio: float | None = 0.5) -> str:
    """A small supervised task ("what is i plus one?") in `vocabulary`, registered once per name."""
    name = f"workflow_sums_{vocabulary}{'' if split_ratio else '_train_only'}"
    if name in seqio.TaskRegistry.names():
        return name
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"question": f"what is {i} plus one?", "answer": str(i + 1)}) + "\n"
                            for i in range(32)))
    tasks.register_task(name, path, fields={"inputs": "question", "targets": "answer"}, split_ratio=split_ratio,
                        metric="squad", vocabulary=vocabulary)
    return name


@pytest.mark.parametrize("profile", ["ci", "cpu"])  # the cpu profile's mini model gave NaN before
@pytest.mark.parametrize("vocabulary", ["byte", pytest.param("t5", marks=needs_t5_vocabulary)])
def test_a_task_in_another_vocabulary_fine_tunes_a_model_of_that_vocabulary(tmp_path, vocabulary, profile):
    profile = t5nb.get_profile(profile)
    task = sums_task(tmp_path, vocabulary)
    if profile.batch_size > 16:  # 16 validation rows: less than one batch, no loss curve; decoded, they still score
        with pytest.warns(UserWarning, match=r"less than one batch of 32 examples, so this run has no validation loss"):
            trainer, result = workflow.finetune(profile, task, None, num_steps=3, progress=False)
        assert [(step, sorted(metrics)) for step, metrics in result.train_eval] == [(3, ["decoded/em", "decoded/f1"])]
    else:
        trainer, result = workflow.finetune(profile, task, None, num_steps=3, progress=False)
    ids = tasks.get_task(task).output_features["targets"].vocabulary.vocab_size
    assert trainer.model_config.vocab_size == (32128 if vocabulary == "t5" else ids)  # T5's table pads 32100 ids
    assert trainer.model_config.vocab_size != workflow.pretraining_recipe(profile).model_config().vocab_size
    assert all(math.isfinite(entry["loss"]) for entry in result.history)


def checkpoint_of(kind: str, tmp_path):
    """(a checkpoint of `kind`, as `finetune` takes it: a path; its model; a task it fits)."""
    if kind == "t5x":
        if not (T5X_TINY.exists() and OFFICIAL_VOCABULARY.exists()):
            pytest.skip(f"{T5X_TINY} or {OFFICIAL_VOCABULARY} absent (set T5NB_DATA_DIR)")
        return T5X_TINY, checkpoints.load_t5x(T5X_TINY, get_config("t5.1.1-tiny")), sums_task(tmp_path, "t5")
    if kind == "hf":
        config = get_config("t5.1.1-tiny", vocab_size=tasks.get_vocabulary("facts").vocab_size)
        checkpoints.save_hf(Transformer(config, rngs=nnx.Rngs(0)), tmp_path / "hf")
        return tmp_path / "hf", checkpoints.load_hf(tmp_path / "hf"), tasks.QA
    _, run = workflow.finetune(PROFILE, tasks.QA, None, num_steps=2, name="first", progress=False)
    model, step = restore.load_model(run.model_dir)
    assert step == 2
    return run.model_dir, model, tasks.QA


@pytest.mark.parametrize("kind", ["t5x", "hf", "own"])
def test_every_checkpoint_kind_fine_tunes_evaluates_and_exports_as_it_is(tmp_path, kind, capsys):
    path, model, task = checkpoint_of(kind, tmp_path)
    trainer, result, metrics = workflow.finetune_and_evaluate(PROFILE, task, path, name=kind, num_steps=2)
    assert trainer.model_config == model.config.replace(dropout_rate=0.0)
    assert {"em", "f1"} <= set(metrics)
    # it started from the checkpoint's parameters: a run of 0 steps would end where it began
    recipe = load_recipe(result.model_dir / "recipe.toml")
    assert recipe.run.init_checkpoint == str(path)
    tuned = trainer.model(result.state.params)
    checkpoints.save_hf(tuned, tmp_path / "exported")
    exported = checkpoints.flatten(checkpoints.params_of(checkpoints.load_hf(tmp_path / "exported")))
    for name, value in checkpoints.flatten(checkpoints.params_of(tuned)).items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)
    # the run directory it leaves is one `t5nb eval` takes
    assert cli.main(["eval", str(result.model_dir), "--task", task, "--max-examples", "4",
                     "--inputs-length", "32", "--targets-length", "8"]) == 0
    assert "inference_eval" in capsys.readouterr().out


def test_an_evaluation_split_the_task_lacks_is_refused_before_training(tmp_path):
    task = sums_task(tmp_path, "byte", split_ratio=None)
    with pytest.raises(ValueError, match=rf"task '{task}' has no split 'validation' to evaluate on; its splits: train"):
        workflow.finetune_and_evaluate(PROFILE, task, None, name="never")
    assert not (workflow.runs_dir() / PROFILE.name).exists()


def test_parameters_in_another_form_are_refused_with_what_to_pass():
    config = get_config("t5.1.1-tiny", vocab_size=64)
    params = checkpoints.params_of(Transformer(config, rngs=nnx.Rngs(0)))
    with pytest.raises(TypeError, match="init must be a checkpoint's path .* as pretrained_checkpoint returns it"):
        workflow.finetune(PROFILE, tasks.QA, params, num_steps=1)
    with pytest.raises(TypeError, match=r"params is a flat dict of paths .*checkpoints.unflatten"):
        checkpoints.model_from_params(config, checkpoints.flatten(params))
    checkpoints.model_from_params(config, params)  # the one form


def test_pretraining_and_fine_tuning_log_validation_curves():
    profile = t5nb.get_profile("ci")
    lengths = workflow.feature_lengths(profile)
    sample, again = (tasks.validation_batches(profile.pretrain_task, lengths, profile.batch_size, 2) for _ in "12")
    assert len(sample) == 2 and all(np.array_equal(a[k], b[k]) for a, b in zip(sample, again) for k in a)
    drawn = []
    _, pretraining = workflow.pretrain(profile, on_log=lambda step, metrics: drawn.append((step, set(metrics))),
                                       progress=False)
    trainer, fine_tuning = workflow.finetune(profile, profile.finetune_task, None, progress=False)
    for result, task, num_steps in ((pretraining, profile.pretrain_task, profile.pretrain_steps),
                                    (fine_tuning, profile.finetune_task, profile.finetune_steps)):
        steps = list(range(profile.eval_every, num_steps + 1, profile.eval_every))
        assert len(steps) >= 2 and [step for step, _ in result.train_eval] == steps
        assert all(math.isfinite(metrics["loss"]) for _, metrics in result.train_eval)
        logged = evaluate.results_table(result.model_dir, kinds=("training_eval",), csv=False)
        assert logged.index.tolist() == steps and f"training_eval/{task}/loss" in logged
    assert [step for step, names in drawn if "validation/loss" in names] == [10, 20]  # the live plot's curve
    # fine-tuning also tracks the task's own metric on a decoded sample, as infer_eval scores it
    assert all("decoded/accuracy" in metrics for _, metrics in fine_tuning.train_eval)
    assert not any("decoded/accuracy" in metrics for _, metrics in pretraining.train_eval)
    lengths = workflow.finetune_lengths(profile)
    final = evaluate.infer_eval(trainer.model(fine_tuning.state.params), profile.finetune_task, fine_tuning.model_dir,
                                step=profile.finetune_steps, feature_lengths=lengths, max_examples=profile.decoded_sample)
    assert fine_tuning.train_eval[-1][1]["decoded/accuracy"] == final["accuracy"]


def test_the_workflow_records_each_notebooks_headline_under_t5nb_course_only(monkeypatch):
    profile = t5nb.get_profile("ci")
    headline = workflow.runs_dir() / "headlines" / "04_closed_book_qa.json"
    monkeypatch.delenv("T5NB_NOTEBOOK", raising=False)
    workflow.finetune_and_evaluate(profile, profile.qa_task, None, name="scratch", num_steps=2)
    assert not headline.exists()  # a notebook run by hand records nothing
    monkeypatch.setenv("T5NB_NOTEBOOK", "04_closed_book_qa")  # as `t5nb course` sets it
    _, result, metrics = workflow.finetune_and_evaluate(profile, profile.qa_task, None, name="scratch", num_steps=2)
    recorded = json.loads(headline.read_text())["scratch"]
    assert recorded == {**metrics, "final_loss": result.history[-1]["loss"], "examples": profile.eval_examples}


def test_the_sample_efficiency_curve_and_the_fine_tuning_methods_are_recorded(monkeypatch):
    profile = t5nb.get_profile("ci")
    monkeypatch.setenv("T5NB_NOTEBOOK", "03_finetuning")
    _, base = workflow.finetune(profile, tasks.QA, None, num_steps=2, name="base", progress=False)
    curve = workflow.sample_efficiency(profile, base.model_dir)
    assert curve["metric"] == "accuracy" and list(curve["runs"]) == profile.transfer_sizes
    assert all(set(scores) == {"pretrained", "scratch"} for scores in curve["runs"].values())
    validation = sum(1 for _ in tasks.get_task(profile.finetune_task).source.get_dataset(split="validation"))
    assert curve["examples"] == min(validation, profile.eval_examples or validation)
    for size in profile.transfer_sizes:  # each run trained on exactly its first N examples
        task = tasks.get_task(tasks.first_examples(profile.finetune_task, size))
        assert sum(1 for _ in task.source.get_dataset(split="train")) == size
    table = workflow.compare_fine_tuning(profile, base.model_dir)
    assert list(table) == ["full", "lora", "prompt"]
    trained = {method: row["trained_parameters"] for method, row in table.items()}
    config = workflow.finetune_recipe(profile, profile.finetune_task, base.model_dir).model_config()
    assert trained["full"] == sum(np.size(v) for v in checkpoints.flatten(checkpoints.abstract_params(config)).values())
    assert trained["prompt"] == 20 * config.emb_dim < trained["lora"] < trained["full"]
    assert table["prompt"]["checkpoint_mb"] < table["full"]["checkpoint_mb"]
    assert all(row["step_ms"] > 0 and row["step_memory_mb"] > 0 and "accuracy" in row for row in table.values())
    recorded = json.loads((workflow.runs_dir() / "headlines" / "03_finetuning.json").read_text())
    assert recorded["transfer"] == json.loads(json.dumps(curve)) and recorded["fine_tuning_methods"] == table


def test_pretrained_checkpoint_says_first_when_it_must_pretrain(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("T5NB_RUNS_DIR", str(tmp_path))
    monkeypatch.setattr(workflow, "pretrain", lambda profile, progress=True: None)  # the run itself: elsewhere
    profile = t5nb.get_profile("ci")
    assert workflow.pretrained_checkpoint(profile) == workflow.pretraining_dir(profile)
    said = capsys.readouterr().out
    assert f"Notebook 02's pretraining run is not in {workflow.pretraining_dir(profile)}: this notebook runs it first" in said
    (workflow.pretraining_dir(profile) / "checkpoints" / str(profile.pretrain_steps // 2)).mkdir(parents=True)
    workflow.pretrained_checkpoint(profile)
    assert f"is at step {profile.pretrain_steps // 2:,} of {profile.pretrain_steps:,} in" in capsys.readouterr().out
    (workflow.pretraining_dir(profile) / "checkpoints" / str(profile.pretrain_steps)).mkdir()
    assert workflow.pretrained_checkpoint(profile) == workflow.pretraining_dir(profile)
    assert capsys.readouterr().out == ""  # finished: nothing to say


def test_a_profile_without_published_checkpoints_fine_tunes_none_and_says_what_the_cell_does_with_them(capsys):
    assert workflow.finetune_published(t5nb.get_profile("ci"), tasks.SLOT_FILLING, "runs/ci/pretraining") == {}
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed] == list(workflow.PUBLISHED)
    assert "so nothing is fine-tuned here" in printed[0] and "fine-tunes hf://google/t5-v1_1-small as above" in printed[0]
    assert "fine-tunes gs://t5-data/pretrained_models/t5x/t5_1_1_small/checkpoint_1000000 as above" in printed[1]


def test_without_02s_run_a_profile_with_a_published_checkpoint_fine_tunes_it_and_pretrains_nothing(
        tmp_path, monkeypatch, capsys):
    """As Colab and Kaggle open a notebook, in a runtime of its own: no run of notebook 02, so the
    published T5.1.1-small stands in for it (not fine-tuned a second time), said with its size."""
    monkeypatch.setenv("T5NB_RUNS_DIR", str(tmp_path))

    def pretrain(profile, progress=True):
        raise AssertionError("pretrained again")

    monkeypatch.setattr(workflow, "pretrain", pretrain)
    profile = t5nb.get_profile("accelerator")
    assert workflow.pretrained_checkpoint(profile) == "hf://google/t5-v1_1-small"
    said = capsys.readouterr().out
    assert (f"Notebook 02's pretraining run is not in {workflow.pretraining_dir(profile)}, so this notebook fine-tunes "
            "the published t5.1.1-small (hf://google/t5-v1_1-small: 77M parameters, 0.31 GB to download)") in said
    assert list(workflow.published_checkpoints(profile, "hf://google/t5-v1_1-small")) == ["t5x_t5_1_1_small"]
    assert workflow.published_checkpoints(profile, "hf://google/t5-v1_1-small", ("t5_1_1_small",)) == {}
    (workflow.pretraining_dir(profile) / "checkpoints" / str(profile.pretrain_steps)).mkdir(parents=True)
    assert workflow.pretrained_checkpoint(profile) == workflow.pretraining_dir(profile)
    assert list(workflow.published_checkpoints(profile, workflow.pretraining_dir(profile))) == [
        "t5_1_1_small", "t5x_t5_1_1_small"]

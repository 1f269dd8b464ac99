"""Recipes and `t5nb train`: reading and checking a recipe, --set, the shipped recipes, resume
after SIGKILL through the command (LoRA too), and two processes through the command equal to
one (the runs' helpers: command_runs.py)."""
import dataclasses
import tomllib

import numpy as np
import pytest
import seqio

import t5nb
from t5nb import cli, workflow
from t5nb.paths import REPO_ROOT
from t5nb.recipe import Recipe, RecipeError, load_recipe, make_trainer

from command_runs import (COURSE, assert_same_params, batches, final_params, finish, kill_and_resume, start,  # noqa: I001
                          straight_run, two_processes)

RECIPES = REPO_ROOT / "recipes"


def table(recipe: Recipe) -> dict:
    return recipe.to_dict()


def test_a_recipe_reads_back_from_what_it_writes():
    recipe = load_recipe(COURSE).resolved()
    again = Recipe.from_dict(tomllib.loads(recipe.to_toml()))
    assert table(again) == table(recipe)
    assert again.model_config() == recipe.model_config()
    assert "preset" not in recipe.model and recipe.model["vocab_size"] == t5nb.tasks.get_vocabulary("facts").vocab_size
    assert recipe.optimizer.learning_rate is None and 'learning_rate = "rsqrt_decay"' in recipe.to_toml()


def test_set_changes_keys_and_reads_toml_values():
    recipe = load_recipe(COURSE).with_overrides(
        ["run.steps=7", "optimizer.learning_rate=1e-3", "model.remat_policy=full", "model.scan_layers=true",
         "data.task=facts_qa", 'run.init_checkpoint="runs/x"', "data.pack=false"])
    assert (recipe.run.steps, recipe.optimizer.learning_rate, recipe.data.task, recipe.data.pack) == (7, 1e-3, "facts_qa", False)
    config = recipe.model_config()
    assert (config.remat_policy, config.scan_layers) == ("full", True)
    assert recipe.run.init_checkpoint == "runs/x"
    assert recipe.with_overrides(["run.init_checkpoint=none"]).run.init_checkpoint is None
    assert recipe.with_overrides(["optimizer.learning_rate=rsqrt_decay"]).optimizer.learning_rate is None
    # none puts any key back to its default: this chip's dtype, the default cadence
    resolved = load_recipe(COURSE).resolved()
    assert resolved.with_overrides(["model.dtype=none", "model.preset=t5.1.1-mini"]).model_config() == \
        resolved.model_config()
    assert recipe.with_overrides(["run.eval_every=none"]).run.eval_every == 0
    with pytest.raises(RecipeError, match=r"--set 'run.stepz=none': \[run\] has no key 'stepz'"):
        recipe.with_overrides(["run.stepz=none"])
    # a resolved recipe spells out the model: a preset beside it would change nothing, so it is refused
    with pytest.raises(RecipeError, match=r"\[model\] gives every field, so its preset would change nothing"):
        resolved.with_overrides(["model.preset=t5.1.1-small"])


@pytest.mark.parametrize("assignment, message", [
    ("run.stepz=3", r"\[run\] has no key 'stepz'; its keys: model_dir, steps, init_checkpoint, checkpoint_every"),
    ("model.hidden=3", r"\[model\] has no key 'hidden'; its keys: preset, vocab_size, emb_dim"),
    ("training.steps=3", r"no section \[training\] in a recipe; its sections: model, data, optimizer, run, mesh"),
    ("run.steps=many", r"\[run\] steps must be a whole number, got 'many'"),
    ("run.steps=true", r"\[run\] steps must be a whole number, got True"),
    ("model.dtype=float99", r"\[model\] dtype must be a dtype name such as float32 or bfloat16, got 'float99'"),
    ("model.preset=t5-huge", r"\[model\] preset 't5-huge' is not one of t5-11b, t5-3b"),
    ("optimizer.optimizer=sgd", r"\[optimizer\]: TrainConfig.optimizer must be 'adafactor' or 'adamw', got 'sgd'"),
    ("steps=3", r"--set 'steps=3': expected SECTION.KEY=VALUE, e.g. run.steps=2000"),
])
def test_a_wrong_key_or_value_is_refused_naming_it(assignment, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe(COURSE).with_overrides([assignment])


def test_a_recipe_file_is_checked_when_read(tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_text('[data]\ntask = "facts_qa"\ninputs_length = 32\n')
    with pytest.raises(RecipeError, match=rf"{path}: \[data\] needs targets_length, batch_size"):
        load_recipe(path)
    path.write_text("[run\n")
    with pytest.raises(RecipeError, match=rf"{path}: not TOML"):
        load_recipe(path)
    with pytest.raises(FileNotFoundError, match="no such recipe file"):
        load_recipe(tmp_path / "absent.toml")
    recipe = load_recipe(COURSE).with_overrides([])
    with pytest.raises(RecipeError, match=r"\[model\] needs a preset .* or a run.init_checkpoint"):
        dataclasses.replace(recipe, model={"dropout_rate": 0.0}).model_config()


def test_the_shipped_course_recipes_are_what_the_workflow_runs(monkeypatch):
    monkeypatch.setenv("T5NB_RUNS_DIR", "runs")
    cpu = t5nb.get_profile("cpu")
    made = {"pretraining": workflow.pretraining_recipe(cpu),
            "closed_book_qa": workflow.finetune_recipe(cpu, cpu.qa_task, workflow.pretraining_dir(cpu), name="pretrained")}
    for name, recipe in made.items():
        assert table(load_recipe(RECIPES / "course" / f"{name}.toml")) == table(recipe), name


@pytest.mark.parametrize("path", sorted((RECIPES / "t5x").glob("*.toml")), ids=lambda p: p.stem)
def test_the_t5x_standard_recipes_resolve_to_their_models(path):
    recipe = load_recipe(path)
    config = recipe.model_config()
    assert config.vocab_size == 32128 and config.mlp_activations == ("gelu", "linear")
    assert recipe.data.task in seqio.TaskRegistry.names() | seqio.MixtureRegistry.names()
    trainer = make_trainer(recipe)  # abstract: builds shapes and shardings, allocates nothing
    assert trainer.model_config == config


def test_dry_run_prints_the_resolved_recipe(capsys):
    assert cli.main(["train", str(COURSE), "--dry-run", "--set", "run.steps=5"]) == 0
    printed = Recipe.from_dict(tomllib.loads(capsys.readouterr().out))
    assert table(printed) == table(load_recipe(COURSE).with_overrides(["run.steps=5"]).resolved())


def test_multi_host_flags_go_together(capsys):
    assert cli.main(["train", str(COURSE), "--coordinator", "localhost:1234"]) == 1
    assert "--coordinator, --num-processes and --process-id go together" in capsys.readouterr().err


# -- runs of the command -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    return straight_run(tmp_path_factory)


def test_the_command_resumes_after_sigkill_bit_exactly(tmp_path, straight):
    model_dir = tmp_path / "run"
    output = kill_and_resume(tmp_path, model_dir, devices=2)
    assert f"{model_dir}: step 12" in output
    assert_same_params(straight[0], final_params(model_dir))
    assert (model_dir / "recipe.toml").read_text() == (straight[1] / "recipe.toml").read_text().replace(
        str(straight[1]), str(model_dir))


def test_a_lora_run_resumes_after_sigkill_bit_exactly(tmp_path, straight):
    """LoRA on the straight run's model: its checkpoints hold the adapters, its base is read again."""
    lora = [f"run.init_checkpoint={straight[1]}", "model.lora_rank=2", "optimizer.learning_rate=0.01"]
    finish(start(tmp_path, tmp_path / "lora", "lora", changes=lora))
    kill_and_resume(tmp_path, tmp_path / "resumed", changes=lora)
    expected, got = final_params(tmp_path / "lora"), final_params(tmp_path / "resumed")
    assert_same_params(expected, got)
    assert any(np.any(expected[name]) for name in expected if name.endswith("lora_b"))  # the adapters trained


def test_two_processes_through_the_command_equal_one(tmp_path, straight):
    model_dir = tmp_path / "run"
    outputs = [finish(process) for process in two_processes(tmp_path, model_dir, "process")]
    assert f"{model_dir}: step 12" in outputs[0] and f"{model_dir}: step 12" not in outputs[1]  # one reporter
    assert_same_params(straight[0], final_params(model_dir))
    # each process read its own half of every global batch
    halves = [batches(tmp_path, f"process{i}") for i in (0, 1)]
    assert len(halves[0]) == len(halves[1]) == 12 and all(a != b for a, b in zip(*halves))
    assert sorted(p.name for p in (model_dir / "checkpoints" / "12" / "pipeline").iterdir()
                  if p.name.startswith("process")) == ["process_0", "process_1"]



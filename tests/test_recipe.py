"""Recipes and `t5nb train`: reading and checking a recipe, --set, the shipped recipes (runs of
the command, killed or on several processes: test_run_folder.py)."""
import dataclasses
import tomllib

import pytest
import seqio

import t5nb
import t5nb.tasks as tasks
from t5nb import cli, workflow
from t5nb.paths import REPO_ROOT
from t5nb.recipe import Recipe, RecipeError, load_recipe, make_trainer
from t5nb.train import run_recipe

from command_runs import COURSE  # noqa: I001

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


def test_training_says_once_how_many_examples_its_lengths_cut(tmp_path):
    recipe = load_recipe(RECIPES / "course" / "closed_book_qa.toml").with_overrides(
        ["run.init_checkpoint=none", "model.preset=t5.1.1-tiny", "model.vocab_size=1124", f"run.model_dir={tmp_path}",
         "run.steps=1", "run.checkpoint_every=0", "run.eval_every=0", "data.batch_size=2", "data.inputs_length=12"])
    lengths = tasks.token_lengths("facts_qa", "train", None, 1000)["inputs"]
    cut = int((lengths > 12).sum())
    assert 0 < cut < len(lengths)
    with pytest.warns(UserWarning) as caught:
        run_recipe(recipe, progress=False)
    said = [str(w.message) for w in caught if "are cut to it" in str(w.message)]
    assert said == [f"task 'facts_qa', split 'train': {cut} of the first {len(lengths)} examples have inputs longer than "
                    f"12 tokens (the longest has {lengths.max()}, with EOS) and are cut to it; data.inputs_length raises "
                    "the length"]


def test_dry_run_prints_the_resolved_recipe(capsys):
    assert cli.main(["train", str(COURSE), "--dry-run", "--set", "run.steps=5"]) == 0
    printed = Recipe.from_dict(tomllib.loads(capsys.readouterr().out))
    assert table(printed) == table(load_recipe(COURSE).with_overrides(["run.steps=5"]).resolved())


def test_multi_host_flags_go_together(capsys):
    assert cli.main(["train", str(COURSE), "--coordinator", "localhost:1234"]) == 1
    assert "--coordinator, --num-processes and --process-id go together" in capsys.readouterr().err


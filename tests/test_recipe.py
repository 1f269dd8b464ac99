"""Recipes and `t5nb train`: reading and checking a recipe, --set, the shipped recipes, resume
after SIGKILL through the command, and two processes through the command equal to one."""
import dataclasses
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import tomllib

import numpy as np
import pytest
import seqio

import t5nb
from t5nb import checkpoints, cli, restore, workflow
from t5nb.paths import REPO_ROOT
from t5nb.recipe import Recipe, RecipeError, load_recipe, make_trainer

RECIPES = REPO_ROOT / "recipes"
COURSE = RECIPES / "course" / "pretraining.toml"
COMMAND = pathlib.Path(__file__).with_name("train_command.py")
# the course's pretraining recipe at the size of the ci profile, checkpointing every 4 steps
SMALL = ["model.preset=t5.1.1-tiny", "data.batch_size=8", "data.inputs_length=64", "data.targets_length=16",
         "run.steps=12", "run.checkpoint_every=4", "run.eval_every=4", "run.log_every=4"]


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
def start(tmp_path, model_dir, name, *extra, devices=1, delay=0.0, save_delay=0.0, changes=()):
    """`t5nb train` of the small course recipe (with `changes`) into `model_dir`, in its own process."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "JAX_COMPILATION_CACHE_DIR": str(tmp_path.parent / "jax_cache"),
           "T5NB_TEST_BATCHES_OUT": str(tmp_path / f"{name}.batches"), "T5NB_TEST_BATCH_DELAY": str(delay),
           "T5NB_TEST_SAVE_DELAY": str(save_delay)}
    settings = [value for assignment in [*SMALL, *changes, f"run.model_dir={model_dir}"] for value in ("--set", assignment)]
    return subprocess.Popen([sys.executable, str(COMMAND), "train", str(COURSE), *settings, *map(str, extra)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(process):
    output = process.communicate(timeout=600)[0]
    assert process.returncode == 0, output[-3000:]
    return output


def two_processes(tmp_path, model_dir, name, delay=0.0):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    return [start(tmp_path, model_dir, f"{name}{i}", "--coordinator", f"localhost:{port}", "--num-processes", 2,
                  "--process-id", i, delay=delay) for i in (0, 1)]


def final_params(model_dir) -> dict:
    model, step = restore.load_model(model_dir)
    assert step == 12
    return checkpoints.flatten(checkpoints.params_of(model))


def batches(tmp_path, name) -> list[str]:
    return [line.split()[1] for line in (tmp_path / f"{name}.batches").read_text().splitlines()]


def wait_for_checkpoint(process, model_dir, step):
    deadline = time.time() + 300
    while not (model_dir / "checkpoints" / str(step)).exists():  # orbax renames a step's folder when complete
        assert process.poll() is None and time.time() < deadline, "no checkpoint at step 4 before the run ended"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run on one process with 2 devices: (parameters, run directory)."""
    tmp_path = tmp_path_factory.mktemp("straight")
    finish(start(tmp_path, tmp_path / "run", "straight", devices=2))
    return final_params(tmp_path / "run"), tmp_path / "run"


def assert_same_params(expected: dict, got: dict):
    assert expected.keys() == got.keys()
    for name in expected:
        assert np.array_equal(expected[name], got[name]), name


def kill_and_resume(tmp_path, model_dir, devices=1, changes=()) -> str:
    """Start the run, SIGKILL it once its step 4 is saved, start it again; the second's output."""
    process = start(tmp_path, model_dir, "killed", devices=devices, delay=0.3, changes=changes)
    wait_for_checkpoint(process, model_dir, 4)
    process.send_signal(signal.SIGKILL)
    process.wait()
    resumed_from = max(int(p.name) for p in (model_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert 4 <= resumed_from < 12
    return finish(start(tmp_path, model_dir, "resumed", devices=devices, changes=changes))


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


def test_a_fine_tune_killed_during_its_first_save_starts_again_from_its_checkpoint_and_holds_its_folder(tmp_path, straight):
    """The rerun finds no finished step, only orbax's temporary folder: it removes that, saying
    so, and fine-tunes from run.init_checkpoint again (never from random weights). A second run
    started on the folder while the first is saving is refused at once, touching nothing; once
    the first is killed, its lock is gone with it."""
    tune = [f"run.init_checkpoint={straight[1]}", "optimizer.learning_rate=0.01"]
    finish(start(tmp_path, tmp_path / "tuned", "tuned", changes=tune))
    model_dir = tmp_path / "killed"
    process = start(tmp_path, model_dir, "killed", save_delay=30, changes=tune)
    deadline = time.time() + 300
    while not list((model_dir / "checkpoints").glob("4.orbax-checkpoint-tmp*")):
        assert process.poll() is None and time.time() < deadline, "no save of step 4 began before the run ended"
        time.sleep(0.05)
    recipe_written = (model_dir / "recipe.toml").stat().st_mtime_ns
    second = start(tmp_path, model_dir, "second", changes=tune)  # while the first is still saving
    refusal = second.communicate(timeout=120)[0]
    assert second.returncode == 1 and f"{model_dir.resolve()} is in use: " in refusal, refusal[-3000:]
    assert f"process {process.pid} since" in refusal and "Traceback" not in refusal
    assert list((model_dir / "checkpoints").glob("4.orbax-checkpoint-tmp*"))  # the first's save left alone
    assert (model_dir / "recipe.toml").stat().st_mtime_ns == recipe_written
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert checkpoints.checkpoint_steps(model_dir) == []  # killed before its first step was finished
    output = finish(start(tmp_path, model_dir, "resumed", changes=tune))
    assert "4.orbax-checkpoint-tmp" in output and "removed, an unfinished checkpoint" in output
    assert_same_params(final_params(tmp_path / "tuned"), final_params(model_dir))


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


def test_two_processes_resume_after_one_is_killed(tmp_path, straight):
    model_dir = tmp_path / "run"
    processes = two_processes(tmp_path, model_dir, "killed", delay=0.3)
    wait_for_checkpoint(processes[0], model_dir, 4)
    processes[1].send_signal(signal.SIGKILL)  # one host fails; the scheduler then stops the job
    processes[1].wait()
    processes[0].send_signal(signal.SIGKILL)
    processes[0].wait()
    for process in two_processes(tmp_path, model_dir, "resumed"):  # and starts it again
        finish(process)
    assert_same_params(straight[0], final_params(model_dir))

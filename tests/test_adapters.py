"""LoRA and prompt tuning (t5nb.adapters): an adapted model starts as its base, LoRA folds into
the kernels, only adapters train, and their runs keep only them."""
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t5nb import adapters, checkpoints, restore, tasks
from t5nb.config import LORA_TARGETS, get_config
from t5nb.model import Transformer, shift_right
from t5nb.recipe import load_recipe
from t5nb.train import run_recipe
from t5nb.paths import REPO_ROOT

FACTS = tasks.get_vocabulary("facts").vocab_size
BASE = get_config("t5.1.1-tiny", vocab_size=FACTS, dropout_rate=0.0)
MINI = get_config("t5.1.1-mini", vocab_size=FACTS, dropout_rate=0.0)  # adapter runs: big enough that
# orbax's fixed files are not most of a checkpoint


def logits(model, seed=0):
    rng = np.random.default_rng(seed)
    inputs = jnp.asarray(rng.integers(3, 300, (2, 12)), jnp.int32).at[1, 9:].set(0)
    targets = jnp.asarray(rng.integers(3, 300, (2, 5)), jnp.int32)
    return model(inputs, shift_right(targets), targets)


def base_params():
    return checkpoints.params_of(Transformer(BASE, rngs=nnx.Rngs(1)))


def adapted(params, config):
    return checkpoints.model_from_params(config, adapters.add_adapters(params, config))


def test_lora_with_zero_b_computes_exactly_what_the_base_does():
    params = base_params()
    config = BASE.replace(lora_rank=4, lora_targets=LORA_TARGETS[:4] + ("wi_0", "wi_1", "wo"))
    model = adapted(params, config)
    paths = checkpoints.flatten(checkpoints.params_of(model))
    assert sum(path.endswith("lora_b") for path in paths) == 2 * (4 + 3) + 2 * (4 + 4 + 3)  # every target, every layer
    assert not any(np.any(value) for path, value in paths.items() if path.endswith("lora_b"))
    np.testing.assert_array_equal(logits(model), logits(checkpoints.model_from_params(BASE, params)))


def test_a_merged_lora_model_computes_what_the_unmerged_one_does():
    config = BASE.replace(lora_rank=2, lora_alpha=4.0, lora_targets=("query", "value", "wo"))
    params = adapters.add_adapters(base_params(), config)
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map_with_path(  # B no longer zero: the adapted model differs from its base
        lambda path, x: jnp.asarray(rng.normal(0, 0.5, x.shape), jnp.float32) if path[-1].key == "lora_b" else x, params)
    model = checkpoints.model_from_params(config, params)
    merged = adapters.merged_model(model)
    assert merged.config == BASE.replace(lora_alpha=4.0, lora_targets=("query", "value", "wo"))
    assert not any("lora" in path for path in checkpoints.flatten(checkpoints.params_of(merged)))
    unmerged = logits(model)
    assert float(jnp.max(jnp.abs(unmerged - logits(checkpoints.model_from_params(BASE, base_params()))))) > 1e-3
    np.testing.assert_allclose(logits(merged), unmerged, atol=1e-5)


def test_a_merged_lora_model_exports_to_hugging_face(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = BASE.replace(lora_rank=2)
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x + 0.3 if path[-1].key == "lora_b" else x, adapters.add_adapters(base_params(), config))
    model = checkpoints.model_from_params(config, params)
    with pytest.raises(checkpoints.CheckpointError, match="fold the model's LoRA into its kernels first"):
        checkpoints.save_hf(model, tmp_path / "unmerged")
    checkpoints.save_hf(adapters.merged_model(model), tmp_path / "hf")
    hf = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
    rng = np.random.default_rng(0)
    inputs, targets = rng.integers(3, 300, (2, 12)), rng.integers(3, 300, (2, 5))
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(inputs), decoder_input_ids=torch.tensor(np.asarray(shift_right(targets)))).logits
    ours = model(jnp.asarray(inputs, jnp.int32), shift_right(jnp.asarray(targets, jnp.int32)), jnp.asarray(targets))
    np.testing.assert_allclose(theirs.numpy(), np.asarray(ours), atol=1e-4)


def test_the_prompt_starts_as_embeddings_of_frequent_tokens_and_the_encoder_output_grows_by_it():
    params = base_params()
    config = BASE.replace(prompt_length=5)
    model = adapted(params, config)
    prompt = np.asarray(model.encoder.prompt[...])
    embedding = np.asarray(params["token_embedder"]["embedding"])
    rows = [int(np.flatnonzero(np.all(embedding == row, axis=1))[0]) for row in prompt]
    assert len(set(rows)) == 5 and all(3 <= row < 3 + adapters.PROMPT_INIT_TOKENS for row in rows)
    tokens = jnp.asarray([[5, 6, 7, 0]], jnp.int32)
    assert model.encode(tokens).shape == (1, 5 + 4, BASE.emb_dim)
    assert logits(model).shape == logits(checkpoints.model_from_params(BASE, params)).shape
    with pytest.raises(checkpoints.CheckpointError, match="soft prompt has no Hugging Face T5 form"):
        checkpoints.save_hf(model, "/nonexistent")


# -- adapter runs ---------------------------------------------------------------------------------
RECIPE = REPO_ROOT / "recipes" / "course" / "closed_book_qa.toml"


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A base model (Hugging Face form) and a short full fine-tuning of it, for its checkpoint's size."""
    tmp = tmp_path_factory.mktemp("adapters")
    checkpoints.save_hf(Transformer(MINI, rngs=nnx.Rngs(1)), tmp / "hf")
    recipe = load_recipe(RECIPE).with_overrides(
        [f"run.init_checkpoint={tmp / 'hf'}", f"run.model_dir={tmp / 'full'}", "data.batch_size=8", "run.steps=4",
         "run.checkpoint_every=4", "run.eval_every=0"])
    run_recipe(recipe, progress=False)
    return tmp, recipe


def state_bytes(model_dir, step) -> int:
    return sum(path.stat().st_size for path in (pathlib.Path(model_dir) / "checkpoints" / str(step) / "state").rglob("*")
               if path.is_file())


@pytest.mark.parametrize("kind, changes", [("lora", ["model.lora_rank=2", 'model.lora_targets=["query", "value", "wo"]']),
                                           ("prompt", ["model.prompt_length=4"])])
def test_an_adapter_run_trains_only_its_adapters_and_keeps_only_them(base_run, kind, changes):
    tmp, full = base_run
    recipe = full.with_overrides(changes + [f"run.model_dir={tmp / kind}", "optimizer.learning_rate=0.05"])
    trainer, result = run_recipe(recipe, progress=False)
    config = trainer.model_config
    base = checkpoints.flatten(checkpoints.params_of(checkpoints.load_hf(tmp / "hf")))
    trained = checkpoints.flatten(result.state.params)
    assert trained and all(path.rsplit("/", 1)[1] in adapters.ADAPTERS for path in trained)
    # every frozen parameter is bit-identical to the base, and the adapters moved
    final = checkpoints.flatten(checkpoints.params_of(trainer.model(result.state.params)))
    assert final.keys() == base.keys() | trained.keys()
    for path, value in base.items():
        assert np.array_equal(final[path], value), path
    start = checkpoints.flatten(adapters.split(config, adapters.add_adapters(checkpoints.params_of(
        checkpoints.load_hf(tmp / "hf")), config))[0])
    assert any(not np.array_equal(trained[path], start[path]) for path in trained)
    # optimizer state exists only for the trained parameters
    named = [path for path, _ in jax.tree_util.tree_leaves_with_path(result.state.opt_state)
             if any(isinstance(key, jax.tree_util.DictKey) for key in path)]
    assert named and all([k.key for k in path if isinstance(k, jax.tree_util.DictKey)][-1] in adapters.ADAPTERS
                         for path in named)
    assert adapters.count(result.state.opt_state) < 3 * adapters.count(result.state.params) + 100
    # the run directory loads as the adapted model: its adapters on the base its recipe names
    model, step = restore.load_model(result.model_dir)
    assert step == 4 and model.config == config
    np.testing.assert_array_equal(logits(model), logits(trainer.model(result.state.params)))
    if kind == "prompt":  # its checkpoint: under 1% of the full fine-tuning's
        assert state_bytes(result.model_dir, 4) < 0.01 * state_bytes(tmp / "full", 4)


def test_lora_targets_are_checked_against_the_model():
    with pytest.raises(ValueError, match=r"this model has no kernel wi \(its MLP's are wi_0, wi_1, wo\)"):
        BASE.replace(lora_rank=4, lora_targets=("query", "wi"))
    with pytest.raises(ValueError, match="lora_targets must name kernels among query, key, value, out"):
        BASE.replace(lora_targets=("q",))
    assert get_config("t5-tiny").replace(lora_rank=2, lora_targets=("wi",)).lora_targets == ("wi",)


def test_an_adapter_run_resumes_only_on_its_own_base(base_run, tmp_path):
    tmp, full = base_run
    lora = full.with_overrides(["model.lora_rank=2", f"run.model_dir={tmp_path / 'lora'}", "run.steps=2",
                                "run.checkpoint_every=2"])
    run_recipe(lora, progress=False)
    other = lora.with_overrides([f"run.init_checkpoint={tmp / 'full'}", "run.steps=4"])
    with pytest.raises(ValueError, match=rf"trained adapters on {tmp / 'hf'}; refusing to resume them on {tmp / 'full'}"):
        run_recipe(other, progress=False)


def test_an_adapter_run_from_random_weights_resumes(tmp_path):
    """No base checkpoint: the frozen weights are the seed's initialisation, made again on resume
    (outside the compiled step: never from its tracers)."""
    recipe = load_recipe(RECIPE).with_overrides(
        ["model.preset=t5.1.1-tiny", "model.prompt_length=2", "run.init_checkpoint=none", "data.batch_size=8",
         "run.steps=2", "run.checkpoint_every=2", "run.eval_every=0", f"run.model_dir={tmp_path / 'run'}"])
    _, first = run_recipe(recipe, progress=False)
    trainer, resumed = run_recipe(recipe.with_overrides(["run.steps=4"]), progress=False)
    assert int(resumed.state.step) == 4 and checkpoints.flatten(resumed.state.params).keys() == {"encoder/prompt"}
    base = adapters.split(trainer.model_config, trainer.init_params())[1]
    for path, value in checkpoints.flatten(trainer.frozen).items():
        assert np.array_equal(value, checkpoints.flatten(base)[path]), path

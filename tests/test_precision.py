"""The compute dtype each chip gets (`profiles.compute_dtype`), with mocked devices."""
import types

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from t5nb import workflow
from t5nb.model import Transformer
from t5nb.profiles import PROFILES, compute_dtype
from t5nb.checkpoints import params_of, save_hf

Device = types.SimpleNamespace  # what compute_dtype reads of a jax.Device
CHIPS = {  # a chip as JAX reports it -> the dtype it should compute in
    "tpu v5e": (Device(platform="tpu", device_kind="TPU v5 lite"), jnp.bfloat16),
    "T4 (sm_75)": (Device(platform="gpu", device_kind="Tesla T4", compute_capability="7.5"), jnp.float32),
    "A100 (sm_80)": (Device(platform="gpu", device_kind="NVIDIA A100", compute_capability="8.0"), jnp.bfloat16),
    "cpu": (Device(platform="cpu", device_kind="cpu"), jnp.float32),
}


@pytest.mark.parametrize("chip", CHIPS)
def test_each_chip_computes_in_its_dtype(monkeypatch, chip):
    device, dtype = CHIPS[chip]
    assert compute_dtype(device) == dtype
    monkeypatch.setattr(jax, "devices", lambda *backend: [device])
    assert compute_dtype() == dtype
    assert workflow.pretraining_recipe(PROFILES["cpu"]).model_config().dtype == dtype


def test_fine_tuning_a_checkpoint_takes_the_chips_dtype_and_keeps_float32_parameters(monkeypatch, tmp_path):
    profile = PROFILES["ci"]
    save_hf(Transformer(workflow.pretraining_recipe(profile).model_config(), rngs=nnx.Rngs(0)), tmp_path / "hf")  # float32 on this CPU
    monkeypatch.setattr(jax, "devices", lambda *backend: [CHIPS["tpu v5e"][0]])
    config = workflow.finetune_recipe(profile, profile.qa_task, tmp_path / "hf").model_config()
    assert config.dtype == jnp.bfloat16
    params = params_of(Transformer(config, rngs=nnx.Rngs(0)))
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}

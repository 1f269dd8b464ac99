"""Checkpoints in and out: parity with Hugging Face transformers, T5X msgpack and zarr layouts."""
import json
import os
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import tensorstore as ts
from flax import nnx, serialization

from t5nb import checkpoints
from t5nb.config import get_config
from t5nb.model import Transformer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DATA_DIR = pathlib.Path(os.environ.get("T5NB_DATA_DIR")
                        or pathlib.Path(__file__).resolve().parents[2] / "shared" / "data")
TOLERANCE = 1e-4
VOCAB = 96

# Hugging Face configs of the two layouts; the T5 1.0 one also has more decoder than encoder
# layers and few buckets, so that logarithmic buckets are used within 12 tokens.
HF_T5_1_0 = dict(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=3,
                 num_heads=2, feed_forward_proj="relu", tie_word_embeddings=True,
                 relative_attention_num_buckets=8, relative_attention_max_distance=16)
HF_T5_1_1 = dict(vocab_size=VOCAB, d_model=8, d_kv=3, d_ff=16, num_layers=2, num_heads=4,
                 feed_forward_proj="gated-gelu", tie_word_embeddings=False)


def data_file(relative: str) -> pathlib.Path:
    path = DATA_DIR / relative
    if not path.exists():
        pytest.skip(f"{path} is absent: set T5NB_DATA_DIR to the shared data folder")
    return path


def padded_batch(vocab_size: int):
    """Encoder inputs [3, 12] and targets [3, 9] with a different length per row, ending in EOS."""
    rng = np.random.default_rng(0)

    def rows(width, lengths):
        tokens = np.zeros((len(lengths), width), np.int64)
        for row, length in enumerate(lengths):
            tokens[row, :length - 1] = rng.integers(2, vocab_size, length - 1)
            tokens[row, length - 1] = 1
        return tokens

    inputs, targets = rows(12, [12, 7, 3]), rows(9, [9, 5, 2])
    decoder_inputs = np.concatenate([np.zeros_like(targets[:, :1]), targets[:, :-1]], axis=1)
    return inputs, decoder_inputs, targets


def max_logit_diff(model, hf_model) -> float:
    """Largest |t5nb - transformers| logit over the non-padded targets of `padded_batch`."""
    inputs, decoder_inputs, targets = padded_batch(model.config.vocab_size)
    ours = np.asarray(model(jnp.asarray(inputs), jnp.asarray(decoder_inputs), jnp.asarray(targets)))
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.tensor(inputs), attention_mask=torch.tensor(inputs > 0),
                          decoder_input_ids=torch.tensor(decoder_inputs)).logits.numpy()
    assert np.abs(theirs).max() > 0.1  # not a degenerate model
    return float(np.abs(ours - theirs)[targets > 0].max())


def hf_param_count(hf_model) -> int:
    return sum(p.numel() for p in hf_model.parameters())  # shared tensors counted once


def t5nb_param_count(config) -> int:
    return sum(int(np.prod(v.shape)) for v in checkpoints.abstract_params(config).values())


def random_hf_model(hf_kwargs: dict):
    """A random transformers T5 in eval mode; the untied layout gets its own lm_head by hand."""
    torch.manual_seed(0)
    config = transformers.T5Config(**hf_kwargs, dropout_rate=0.0, layer_norm_epsilon=1e-6,
                                   decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "layer_norm" in name:  # ones by default: make every norm distinguishable
                param.uniform_(0.5, 1.5)
        if not hf_kwargs["tie_word_embeddings"]:  # transformers ties it anyway (REFERENCE_TRAPS.md)
            model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight) * config.d_model**-0.5)
    assert (model.lm_head.weight is model.shared.weight) == hf_kwargs["tie_word_embeddings"]
    return model


def random_t5nb_model(preset: str):
    """t5nb's own random init, with random norm scales (they start at one)."""
    config = get_config(preset, vocab_size=VOCAB, dropout_rate=0.0)
    params = checkpoints.model_params(Transformer(config, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    for path in params:
        if path.endswith("/scale"):
            params[path] = rng.uniform(0.5, 1.5, params[path].shape).astype(np.float32)
    return checkpoints.model_from_params(config, params)


@pytest.mark.parametrize("hf_kwargs", [HF_T5_1_0, HF_T5_1_1], ids=["t5-1.0-relu-tied", "t5.1.1-gated-untied"])
def test_transformers_model_imports_with_equal_logits(tmp_path, hf_kwargs):
    hf_model = random_hf_model(hf_kwargs)
    hf_model.save_pretrained(tmp_path)
    model = checkpoints.load_hf(tmp_path)
    assert model.config.logits_via_embedding == hf_kwargs["tie_word_embeddings"]
    assert model.config.num_decoder_layers == hf_kwargs.get("num_decoder_layers", hf_kwargs["num_layers"])
    assert t5nb_param_count(model.config) == hf_param_count(hf_model)
    diff = max_logit_diff(model, hf_model)
    print(f"HF -> t5nb {hf_kwargs['feed_forward_proj']}: max |logit diff| {diff:.2e}")
    assert diff < TOLERANCE


@pytest.mark.parametrize("preset", ["t5-tiny", "t5.1.1-tiny"])
def test_t5nb_model_exports_to_transformers_with_equal_logits(tmp_path, preset):
    model = random_t5nb_model(preset)
    checkpoints.save_hf(model, tmp_path)
    hf_model = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert (hf_model.lm_head.weight is hf_model.shared.weight) == model.config.logits_via_embedding
    assert hf_param_count(hf_model) == t5nb_param_count(model.config)
    diff = max_logit_diff(model, hf_model)
    print(f"t5nb -> HF {preset}: max |logit diff| {diff:.2e}")
    assert diff < TOLERANCE
    config, params = checkpoints.read_hf_checkpoint(tmp_path)  # and back, bit for bit
    assert config == model.config
    for path, value in checkpoints.model_params(model).items():
        np.testing.assert_array_equal(params[path], value, err_msg=path)


def test_real_t5x_checkpoint_matches_transformers_after_export(tmp_path):
    path = data_file("t5x/test_t5_tiny.checkpoint_0")
    config = get_config("t5.1.1-tiny", dropout_rate=0.0)
    model = checkpoints.load_t5x(path, config)
    assert t5nb_param_count(config) == 518_240  # the README's count of the checkpoint
    checkpoints.save_hf(model, tmp_path)
    hf_model = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert hf_model.lm_head.weight is not hf_model.shared.weight
    diff = max_logit_diff(model, hf_model)
    print(f"T5X checkpoint vs HF: max |logit diff| {diff:.2e}")
    assert diff < TOLERANCE

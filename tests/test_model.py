"""Model behaviour: cached decoding equals the full decoder; preset sizes. (Parity with
transformers, padded batches included, is in test_checkpoints.py.)"""
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t5nb import decode
from t5nb import model as model_lib
from t5nb.checkpoints import abstract_params, flatten, model_from_params, params_of, unflatten
from t5nb.config import get_config
from t5nb.model import Dropout, Transformer, attention_implementation, shift_right
from t5nb.profiles import CHIPS

VOCAB = 64
# Published sizes (vocab 32128): T5 paper / T5X model cards, T5.1.1 checkpoints.
PUBLISHED_SIZES = {
    "t5-small": "60.5M", "t5-base": "222.9M", "t5-large": "737.7M", "t5-3b": "2.85B", "t5-11b": "11.3B",
    "t5.1.1-small": "77.0M", "t5.1.1-base": "247.6M", "t5.1.1-large": "783.2M",
    "t5.1.1-xl": "2.85B", "t5.1.1-xxl": "11.1B",
}


def random_params(config, seed: int = 0) -> dict:
    """Random parameters by path (numpy: faster than tracing nnx's initialisers on a CPU)."""
    rng = np.random.default_rng(seed)
    params = {}
    for path, abstract in abstract_params(config).items():
        shape = abstract.shape
        if path.endswith("scale"):  # norms: not all ones, so that a misplaced norm shows
            params[path] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        else:
            std = 1.0 if path.endswith("embedding") else shape[0] ** -0.5
            params[path] = rng.normal(0.0, std, shape).astype(np.float32)
    return params


def flat_params(model) -> dict:
    """A model's parameters by T5X's flat names, as numpy."""
    return {path: np.asarray(value) for path, value in flatten(params_of(model)).items()}


def random_model(preset: str, seed: int = 0) -> Transformer:
    config = get_config(preset, vocab_size=VOCAB, dropout_rate=0.0)
    return model_from_params(config, unflatten(random_params(config, seed)))


def tokens(rng, lengths, width):
    """[len(lengths), width] random ids ending in EOS (1), padded with 0."""
    out = np.zeros((len(lengths), width), np.int32)
    for row, length in enumerate(lengths):
        out[row, :length - 1] = rng.integers(2, VOCAB, length - 1)
        out[row, length - 1] = 1
    return jnp.asarray(out)


forward = nnx.jit(lambda model, inputs, targets: model(inputs, shift_right(targets), targets))


def test_cached_decoding_matches_the_full_decoder_step_by_step():
    preset = "t5.1.1-tiny"
    model = random_model(preset)
    rng = np.random.default_rng(0)
    inputs, targets = tokens(rng, [9, 4], 9), tokens(rng, [7, 4], 7)
    decoder_inputs = shift_right(targets)
    full = np.asarray(forward(model, inputs, targets))
    # a cache longer than the targets: the unused positions must stay masked
    cache = nnx.jit(lambda model, inputs: model.init_cache(model.encode(inputs), inputs, 10))(model, inputs)
    step = nnx.jit(lambda model, token, cache: model.decode_step(token, cache))
    worst = 0.0
    for position in range(targets.shape[1]):
        logits, cache = step(model, decoder_inputs[:, position], cache)
        valid = np.asarray(targets[:, position] > 0)
        diff = np.abs(np.asarray(logits) - full[:, position])[valid].max()
        assert diff < 1e-5, f"position {position}: max |diff| {diff}"
        worst = max(worst, float(diff))
    assert int(cache["index"]) == targets.shape[1]
    print(f"{preset}: cached vs full decoder, max |logit diff| {worst:.2e}")


def test_preset_parameter_counts_match_published_sizes():
    for name, published in PUBLISHED_SIZES.items():
        count = sum(int(np.prod(v.shape)) for v in abstract_params(get_config(name)).values())
        number, unit = published[:-1], {"M": 1e6, "B": 1e9}[published[-1]]
        print(f"{name}: {count:,} parameters (published {published})")
        assert round(count / unit, len(number.split(".")[1])) == float(number), name


def test_dropout_drops_the_rate_independently_and_keeps_the_expectation():
    dropout = Dropout(0.1)
    x = jnp.ones((64, 8, 256, 32))  # 4.2M elements, a 4-d index
    first = np.asarray(dropout(x, deterministic=False, rngs=nnx.Rngs(dropout=0)))
    second = np.asarray(dropout(x, deterministic=False, rngs=nnx.Rngs(dropout=1)))
    kept, kept_again = first > 0, second > 0
    assert set(np.unique(first)) == {0.0, np.float32(1 / 0.9)}
    assert abs(kept.mean() - 0.9) < 1e-3 and abs(first.mean() - 1.0) < 2e-3
    # Independent across seeds and across neighbouring elements of every axis: P(both) = 0.81.
    assert abs((kept & kept_again).mean() - 0.81) < 2e-3
    for axis in range(4):
        this, neighbour = np.moveaxis(kept, axis, 0)[:-1], np.moveaxis(kept, axis, 0)[1:]
        assert abs((this & neighbour).mean() - 0.81) < 3e-3, axis
    # Each call draws a new seed from the stream; deterministic or rate 0 is the identity.
    rngs = nnx.Rngs(dropout=0)
    assert not np.array_equal(dropout(x, deterministic=False, rngs=rngs), dropout(x, deterministic=False, rngs=rngs))
    assert dropout(x, deterministic=True) is x and Dropout(0.0)(x, deterministic=False, rngs=rngs) is x


@pytest.mark.parametrize("scan_layers, remat_policy", [(False, "minimal"), (False, "full"), (True, "none"),
                                                       (True, "minimal"), (True, "full")])
def test_scanned_and_rematerialised_stacks_compute_what_the_unrolled_one_does(scan_layers, remat_policy):
    """The same parameters (one layout), the same dropout draws: the same loss, logits and gradients."""
    rng = np.random.default_rng(0)
    inputs, targets = tokens(rng, [9, 4], 9), tokens(rng, [7, 4], 7)
    unrolled = random_model("t5.1.1-tiny")
    config = unrolled.config.replace(dropout_rate=0.1)
    models = [model_from_params(c, params_of(unrolled))
              for c in (config, config.replace(scan_layers=scan_layers, remat_policy=remat_policy))]
    assert params_of(models[0]).keys() == params_of(models[1]).keys()

    def loss(model):  # with dropout, seeded alike
        logits = model(inputs, shift_right(targets), targets, rngs=nnx.Rngs(dropout=3))
        return -jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0] * (targets > 0))

    (loss_a, grads_a), (loss_b, grads_b) = (nnx.jit(nnx.value_and_grad(loss))(model) for model in models)
    np.testing.assert_allclose(loss_b, loss_a, rtol=1e-6)
    np.testing.assert_allclose(forward(models[1], inputs, targets), forward(models[0], inputs, targets), atol=1e-5)
    for (path, a), b in zip(flatten(params_of(grads_a)).items(), flatten(params_of(grads_b)).values()):
        np.testing.assert_allclose(b, a, atol=2e-5, err_msg=path)


def test_an_unknown_remat_policy_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"remat_policy must be one of none, minimal, full, auto, got 'some'"):
        get_config("t5.1.1-tiny", remat_policy="some")


def test_attention_through_dot_product_attention_computes_what_the_einsums_do():
    """jax.nn.dot_product_attention with T5's bias (XLA's form, as on a CPU or TPU), padded rows
    and causal masks included. In float32: the einsums' loss, logits and gradients to rounding
    (1e-5, relative and absolute), and cached decoding's tokens. In bfloat16: logits within 0.05
    of the einsums' (8 bits of mantissa), and each parameter's gradient no farther from the
    float32 one than 1.5 times the einsums' bfloat16 gradient is, plus 1% of its norm."""
    rng = np.random.default_rng(0)
    inputs, targets = tokens(rng, [9, 4], 9), tokens(rng, [7, 4], 7)
    base = random_model("t5.1.1-tiny")
    models = {(dtype.__name__, attention): model_from_params(base.config.replace(dtype=dtype, attention=attention),
                                                             params_of(base))
              for dtype in (jnp.float32, jnp.bfloat16) for attention in ("einsum", "dot_product_attention")}

    def loss(model):
        logits = model(inputs, shift_right(targets), targets).astype(jnp.float32)
        log_p = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
        return -jnp.sum(log_p * (targets > 0)), logits

    losses, grads, logits = {}, {}, {}
    for key, model in models.items():
        (losses[key], logits[key]), grad = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(model)
        grads[key] = {path: np.asarray(g, np.float64) for path, g in flatten(params_of(grad)).items()}
    fused, einsum = ("float32", "dot_product_attention"), ("float32", "einsum")
    np.testing.assert_allclose(float(losses[fused]), float(losses[einsum]), rtol=1e-6)
    np.testing.assert_allclose(logits[fused], logits[einsum], atol=1e-5, rtol=1e-5)
    for path, reference in grads[einsum].items():
        np.testing.assert_allclose(grads[fused][path], reference, atol=1e-5, rtol=1e-5, err_msg=path)
    np.testing.assert_array_equal(decode.greedy_decode(models[fused], inputs, 6).sequences,
                                  decode.greedy_decode(models[einsum], inputs, 6).sequences)
    np.testing.assert_allclose(logits["bfloat16", "dot_product_attention"], logits["bfloat16", "einsum"], atol=0.05)
    for path, reference in grads[einsum].items():
        scale = np.linalg.norm(reference)
        error = {attention: np.linalg.norm(grads["bfloat16", attention][path] - reference)
                 for attention in ("einsum", "dot_product_attention")}
        assert error["dot_product_attention"] <= 1.5 * error["einsum"] + 0.01 * scale, (path, error, scale)


def test_cudnns_attention_is_chosen_only_where_each_of_its_conditions_holds():
    """cuDNN's kernel on an NVIDIA GPU from Ampere on, in bfloat16 or float16, with a head dim a
    multiple of 8 (at most 128 before Hopper, 256 from it) and even lengths; XLA's otherwise,
    decided before tracing (a CPU has no cuDNN: the conditions are what this checks)."""
    h100, a100, t4 = (CHIPS[key].device() for key in ("h100", "a100", "t4"))
    rocm = types.SimpleNamespace(platform="gpu", compute_capability="gfx90a",
                                 client=types.SimpleNamespace(platform_version="rocm 6.4"))
    assert attention_implementation(512, 512, 64, jnp.bfloat16, h100) == "cudnn"
    assert attention_implementation(114, 512, 64, jnp.float16, a100) == "cudnn"
    excluded = [(127, 512, 64, jnp.bfloat16, h100), (114, 511, 64, jnp.bfloat16, h100),  # an odd length
                (1, 512, 64, jnp.bfloat16, h100),  # decoding's one-position step
                (512, 512, 64, jnp.float32, h100),  # float32
                (512, 512, 60, jnp.bfloat16, h100), (512, 512, 192, jnp.bfloat16, a100),  # head dims
                (512, 512, 64, jnp.bfloat16, t4),
                (512, 512, 64, jnp.bfloat16, rocm),  # a GPU without CUDA
                (512, 512, 64, jnp.bfloat16, jax.devices("cpu")[0])]
    assert [attention_implementation(*case) for case in excluded] == ["xla"] * len(excluded)
    assert attention_implementation(512, 512, 192, jnp.bfloat16, h100) == "cudnn"


def test_cudnns_attention_on_compute_capability_10_3_needs_cudnn_9_11(monkeypatch):
    """JAX refuses cuDNN's kernel on a B300 (10.3) below cuDNN 9.11: XLA's runs there instead."""
    b300 = types.SimpleNamespace(platform="gpu", compute_capability="10.3",
                                 client=types.SimpleNamespace(platform_version="cuda 13.0"))
    chosen = {}
    for version in (91000, 91100):
        monkeypatch.setattr(model_lib, "cudnn_version", lambda version=version: version)
        chosen[version] = attention_implementation(512, 512, 64, jnp.bfloat16, b300)
    assert chosen == {91000: "xla", 91100: "cudnn"}


def test_the_bias_cudnn_reads_is_finite_in_every_dtype():
    """A padded query row masks every key: in float16, -1e10 would be -inf there and cuDNN's softmax NaN."""
    valid = jnp.array([[True, True, False]])  # the third position is padding
    bias = model_lib.attention_mask_bias(valid, valid)
    for dtype in (jnp.float16, jnp.bfloat16, jnp.float32):
        in_dtype = model_lib.mask_bias_in(dtype, bias)
        assert in_dtype.dtype == dtype and bool(jnp.isfinite(in_dtype).all()), dtype
        assert float(in_dtype.min()) <= -65504  # still takes a key out of the softmax


def test_an_unknown_attention_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"attention must be one of einsum, dot_product_attention, got 'flash'"):
        get_config("t5.1.1-tiny", attention="flash")

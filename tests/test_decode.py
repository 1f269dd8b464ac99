"""Decoding: cached greedy vs full forward passes, beam search, sampling, scoring, a 4x2 mesh.

One model config and input length throughout, so each decoding program compiles once per bucket
of rows.
Run as a script (`python tests/test_decode.py`, 8 simulated devices) it is the mesh worker.
"""
import functools
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t5nb import decode
from t5nb.checkpoints import model_from_params, params_of, unflatten
from t5nb.config import get_config
from t5nb.model import Transformer
from test_model import flat_params

CONFIG = get_config("t5.1.1-tiny", vocab_size=64, dropout_rate=0.0)
LENGTH = 8  # max decode length
# Token transitions of the hand-set model: greedy takes 2 (0.6) then EOS (0.55): p = 0.33;
# the better sequence is 3 (0.4) then EOS (1.0): p = 0.4.
MARKOV = {0: {2: 0.6, 3: 0.4}, 2: {1: 0.55, 4: 0.45}, 3: {1: 1.0}, 4: {1: 1.0}}


def make_inputs(rows=4, seed=0):
    tokens = np.random.default_rng(seed).integers(2, CONFIG.vocab_size, (rows, 10)).astype(np.int32)
    tokens[:, -3:] = 0
    return tokens


@pytest.fixture(scope="module", autouse=True)
def mesh_worker_process():
    """The 4x2 mesh run (8 simulated devices need a fresh process), started first so that it
    compiles while the other tests do."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    process = subprocess.Popen([sys.executable, __file__], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    yield process
    process.kill()
    process.communicate()


@pytest.fixture(scope="module")
def model():
    return Transformer(CONFIG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def markov_model():
    """Decoder layers switched off (output projections zero) and one-hot embeddings: the next
    token's distribution is `MARKOV[previous token]`, whatever the inputs."""
    params = {name: np.array(value) for name, value in flat_params(Transformer(CONFIG, rngs=nnx.Rngs(1))).items()}
    for name in params:
        if name.startswith("decoder/layers_") and name.endswith(("attention/out/kernel", "mlp/wo/kernel")):
            params[name][:] = 0
    emb = CONFIG.emb_dim
    params["token_embedder/embedding"][:emb] = np.eye(emb)
    logits = np.full((emb, CONFIG.vocab_size), -1e4, np.float32)
    for previous, nexts in MARKOV.items():
        for token, p in nexts.items():
            logits[previous, token] = math.log(p)
    params["decoder/logits_dense/kernel"][:] = logits / math.sqrt(emb)  # RMS norm scales one-hot by sqrt(e)
    return model_from_params(CONFIG, unflatten(params))


@pytest.fixture(scope="module")
def greedy(model):
    return decode.greedy_decode(model, make_inputs(), LENGTH)


def test_cached_greedy_equals_argmax_of_full_forward_passes(model, greedy):
    inputs = make_inputs()
    forward = nnx.jit(lambda m, enc, dec: m(enc, dec, jnp.ones_like(dec)))
    tokens = np.zeros((len(inputs), LENGTH), np.int32)
    done = np.zeros(len(inputs), bool)
    for t in range(LENGTH):  # grow each sequence one token per full (uncached) forward pass
        decoder_inputs = np.pad(tokens[:, :t], ((0, 0), (1, LENGTH - 1 - t)))
        step = np.asarray(jnp.argmax(forward(model, inputs, decoder_inputs)[:, t], -1))
        tokens[:, t] = np.where(done, 0, step)
        done |= step == decode.EOS_ID
    np.testing.assert_array_equal(np.asarray(greedy.sequences), tokens)
    assert len(np.unique(tokens)) > 3  # a real test: several distinct tokens
    np.testing.assert_allclose(greedy.scores, decode.score(model, inputs, tokens), rtol=1e-5)


def test_a_scanned_model_decodes_as_the_unrolled_one(model, greedy):
    """Decoding walks a scanned stack's layers one by one, sliced from its stacked parameters."""
    scanned = model_from_params(model.config.replace(scan_layers=True), params_of(model))
    result = decode.greedy_decode(scanned, make_inputs(), LENGTH)
    np.testing.assert_array_equal(result.sequences, greedy.sequences)
    np.testing.assert_allclose(result.scores, greedy.scores, rtol=1e-5)


def test_inputs_cut_to_the_input_length_are_counted_and_named():
    from t5nb.tasks import get_vocabulary  # here only: the mesh worker (this file as a script) needs no TensorFlow

    vocabulary = get_vocabulary("facts")
    long = "Ada Klimberg plays the mandolin. " * 100 + "Where was Ada Klimberg born?"
    with pytest.warns(UserWarning, match=r"1 of 2 inputs are longer than the input length 64 tokens "
                                         rf"\(the longest has {len(vocabulary.encode(long)) + 1}, with EOS\).*--inputs-length"):
        tokens = decode.encode_texts(vocabulary, ["Where was Ada Klimberg born?", long], 64)
    short = list(vocabulary.encode("Where was Ada Klimberg born?")) + [decode.EOS_ID]
    assert tokens[0, : len(short)].tolist() == short and not tokens[0, len(short):].any()  # one EOS, then padding
    assert tokens[1, -1] == decode.EOS_ID


def test_greedy_stops_at_eos_and_scores_the_known_distribution(markov_model):
    result = decode.greedy_decode(markov_model, make_inputs(), LENGTH)
    np.testing.assert_array_equal(result.sequences, np.tile([2, 1, 0, 0, 0, 0, 0, 0], (4, 1)))
    np.testing.assert_allclose(result.scores, np.log(0.6 * 0.55), rtol=1e-4)


def test_beam_search_with_one_beam_equals_greedy(model, greedy):
    beams = decode.beam_search(model, make_inputs(), LENGTH, num_decodes=1, alpha=0.0)
    assert beams.sequences.shape == (4, 1, LENGTH)
    np.testing.assert_array_equal(beams.sequences[:, 0], greedy.sequences)
    np.testing.assert_allclose(beams.scores[:, 0], greedy.scores, rtol=1e-5)


def test_beam_search_finds_the_sequence_greedy_misses(markov_model):
    beams = decode.beam_search(markov_model, make_inputs(), LENGTH, num_decodes=2, alpha=0.6)
    np.testing.assert_array_equal(beams.sequences[:, :, :3], [[[3, 1, 0], [2, 1, 0]]] * 4)
    np.testing.assert_allclose(beams.scores, [np.log([0.4, 0.6 * 0.55])] * 4, rtol=1e-4)
    best = decode.generate(markov_model, make_inputs(), LENGTH, method="beam", num_decodes=2, alpha=0.6)
    np.testing.assert_array_equal(best.sequences, beams.sequences[:, 0])


def test_beam_scores_are_the_teacher_forced_log_likelihoods(model):
    """Every beam's score equals a full forward pass over it: the cache was reordered right."""
    inputs = make_inputs()
    beams = decode.beam_search(model, inputs, LENGTH, num_decodes=2, alpha=0.6)
    _, scores = decode.rank_classify(model, inputs, beams.sequences)
    np.testing.assert_allclose(scores, beams.scores, rtol=1e-4)
    lengths = np.where(np.asarray(beams.sequences) == decode.EOS_ID, np.arange(1, LENGTH + 1), LENGTH).min(-1)
    ranked = np.asarray(beams.scores) / decode.brevity_penalty(0.6, lengths)
    assert np.all(ranked[:, 0] >= ranked[:, 1] - 1e-5)


def test_score_and_rank_classification_on_the_known_distribution(markov_model):
    inputs = make_inputs()
    options = np.zeros((4, 2, LENGTH), np.int32)
    options[:, :, :2] = [[2, 1], [3, 1]]
    options[1:, 1, :3] = [2, 4, 1]  # rows 1-3: two options that both start with 2
    best, scores = decode.rank_classify(markov_model, inputs, options)
    np.testing.assert_array_equal(best, [1, 0, 0, 0])
    np.testing.assert_allclose(scores, [np.log([0.33, 0.4])] + [np.log([0.33, 0.6 * 0.45])] * 3, rtol=1e-4)
    targets = options[:, 1]
    np.testing.assert_allclose(decode.score(markov_model, inputs, targets), scores[:, 1], rtol=1e-5)


def test_top_k_one_sampling_equals_greedy(model, greedy):
    sampled = decode.sample_decode(model, make_inputs(), LENGTH, temperature=1.0, top_k=1, seed=7)
    np.testing.assert_array_equal(sampled.sequences, greedy.sequences)
    np.testing.assert_allclose(sampled.scores, greedy.scores, rtol=1e-5)


def test_sampling_is_reproducible_and_follows_the_distribution(markov_model):
    inputs = make_inputs()
    first = [np.asarray(decode.sample_decode(markov_model, inputs, LENGTH, seed=s).sequences) for s in range(50)]
    again = decode.sample_decode(markov_model, inputs, LENGTH, seed=3)
    np.testing.assert_array_equal(again.sequences, first[3])
    samples = np.concatenate(first)
    assert not all(np.array_equal(first[0], f) for f in first[1:])
    assert abs(np.mean(samples[:, 0] == 2) - 0.6) < 0.1  # 200 draws of P(2) = 0.6
    after_two = samples[samples[:, 0] == 2][:, 1]
    assert set(after_two) == {1, 4} and abs(np.mean(after_two == 1) - 0.55) < 0.15
    nucleus = decode.sample_decode(markov_model, inputs, LENGTH, top_p=0.5, seed=0)
    np.testing.assert_array_equal(np.asarray(nucleus.sequences)[:, :2], [[2, 1]] * 4)


def test_filter_logits_top_k_and_top_p():
    logits = jnp.log(jnp.array([[0.1, 0.5, 0.15, 0.25]]))
    kept = lambda **kw: np.asarray(decode.filter_logits(logits, **kw) > decode.NEG_INF)[0].tolist()  # noqa: E731
    assert kept(top_k=2) == [False, True, False, True]
    assert kept(top_p=0.5) == [False, True, False, False]
    assert kept(top_p=0.7) == [False, True, False, True]
    assert kept(top_p=0.8) == [False, True, True, True]


def test_top_k_above_the_vocabulary_is_refused_and_the_whole_vocabulary_keeps_every_token(model):
    inputs = make_inputs()
    for call in (lambda k: decode.sample_decode(model, inputs, LENGTH, top_k=k, seed=5),
                 lambda k: decode.generate(model, inputs, LENGTH, method="sample", top_k=k, seed=5)):
        with pytest.raises(ValueError, match=rf"top_k must be at most the model's vocabulary of {CONFIG.vocab_size} "
                                             rf"tokens \(0: no top-k filter\), got {CONFIG.vocab_size + 1}"):
            call(CONFIG.vocab_size + 1)
    everything = decode.sample_decode(model, inputs, LENGTH, top_k=CONFIG.vocab_size, seed=5)
    np.testing.assert_array_equal(everything.sequences, decode.sample_decode(model, inputs, LENGTH, seed=5).sequences)


def test_greedy_or_sampling_is_the_programs_own_and_one_sort_serves_top_k_and_top_p(model):
    """No conditional per step: a greedy program sorts nothing, sampling sorts only to filter,
    and the filter sorts once."""
    def program(**choice):
        run = functools.partial(decode._sample, model, max_decode_length=LENGTH, **choice)
        return str(jax.make_jaxpr(run)(make_inputs(), jax.random.key(0), 1.0, 2, 0.9, 4, LENGTH))

    for choice, sorts in (({"greedy": True, "filtered": False}, 0), ({"greedy": False, "filtered": False}, 0),
                          ({"greedy": False, "filtered": True}, 1)):
        text = program(**choice)
        assert (text.count("sort["), text.count("cond[")) == (sorts, 0), choice


@pytest.mark.parametrize("rows", [3, 65])
def test_a_batch_decodes_as_its_rows_one_at_a_time(model, rows):
    """Rows pad to their bucket (a few rows over, see `decode._buckets`): the padding changes
    no real row, whichever bucket it lands in, a Predictor's (`min_rows`) included."""
    inputs = make_inputs(rows, seed=rows)
    alone = [decode.greedy_decode(model, inputs[row:row + 1], LENGTH) for row in range(rows)]
    for batch in (decode.greedy_decode(model, inputs, LENGTH), decode.greedy_decode(model, inputs, LENGTH, min_rows=8)):
        np.testing.assert_array_equal(batch.sequences, np.concatenate([one.sequences for one in alone]))
        np.testing.assert_allclose(batch.scores, np.concatenate([one.scores for one in alone]), rtol=1e-5)
    assert len(np.unique(batch.sequences)) > 3


def test_rows_pad_to_a_power_of_two_up_to_8_then_to_a_multiple_of_8_or_of_the_meshs_data_axis():
    class Mesh:
        shape = {"data": 16}

    def padded(rows, mesh=None, min_rows=1):
        return len(decode._buckets(np.zeros((rows, 4), np.int32), LENGTH, mesh, min_rows)[0])

    assert [padded(rows) for rows in (1, 2, 3, 5, 8, 9, 17, 64, 65)] == [1, 2, 4, 8, 8, 16, 24, 64, 72]
    assert padded(3, min_rows=8) == padded(8) == 8  # a Predictor's last, shorter batch: the same program
    assert [padded(rows, Mesh()) for rows in (1, 17, 33)] == [16, 32, 48]


def test_decoding_on_a_4x2_mesh_matches_one_device(mesh_worker_process, model, greedy):
    output, _ = mesh_worker_process.communicate(timeout=600)
    assert mesh_worker_process.returncode == 0, output[-3000:]
    results = json.loads(output.strip().splitlines()[-1])
    assert results["mesh"] == {"data": 4, "model": 2}
    beams = decode.beam_search(model, make_inputs(), LENGTH, num_decodes=2, alpha=0.6)
    for name, one_device in (("greedy", greedy), ("beam", beams)):
        np.testing.assert_array_equal(results[name]["sequences"], one_device.sequences)
        np.testing.assert_allclose(results[name]["scores"], one_device.scores, rtol=1e-4)


def mesh_worker():
    """Greedy and beam search on a 4x2 mesh (parameters and inputs sharded): the same model and
    inputs as the tests' one-device runs."""
    from t5nb.mesh import make_mesh, param_shardings

    mesh = make_mesh(2, jax.devices()[:8])
    graphdef, state = nnx.split(Transformer(CONFIG, rngs=nnx.Rngs(0)))
    model = nnx.merge(graphdef, jax.device_put(state, param_shardings(state, mesh)))
    assert len(model.decoder.logits_dense.kernel[...].sharding.device_set) == 8
    results = {"mesh": dict(mesh.shape),
               "greedy": decode.greedy_decode(model, make_inputs(), LENGTH, mesh=mesh),
               "beam": decode.beam_search(model, make_inputs(), LENGTH, num_decodes=2, alpha=0.6, mesh=mesh)}
    print(json.dumps({name: r if name == "mesh" else {k: np.asarray(v).tolist() for k, v in r._asdict().items()}
                      for name, r in results.items()}))


if __name__ == "__main__":
    mesh_worker()

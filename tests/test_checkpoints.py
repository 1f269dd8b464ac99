"""Checkpoints in and out: parity with Hugging Face transformers, T5X msgpack and zarr layouts."""
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import tensorstore as ts
from flax import nnx, serialization

from t5nb import checkpoints
from t5nb.config import get_config
from t5nb.model import Transformer
from test_model import flat_params, forward, random_params, shift_right, tokens

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


def max_logit_diff(model, hf_model) -> float:
    """Largest |t5nb - transformers| logit over the real targets of a padded batch."""
    rng = np.random.default_rng(0)
    inputs, targets = tokens(rng, [12, 7, 3], 12), tokens(rng, [9, 5, 2], 9)
    ours = np.asarray(forward(model, inputs, targets))
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.tensor(np.asarray(inputs), dtype=torch.long),
                          attention_mask=torch.tensor(np.asarray(inputs) > 0),
                          decoder_input_ids=torch.tensor(np.asarray(shift_right(targets)), dtype=torch.long)).logits
    assert theirs.abs().max() > 0.1  # not a degenerate model
    return float(np.abs(ours - theirs.numpy())[np.asarray(targets) > 0].max())


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
    params = flat_params(Transformer(config, rngs=nnx.Rngs(0)))
    params.update({path: value for path, value in random_params(config).items() if path.endswith("scale")})
    return checkpoints.model_from_params(config, checkpoints.unflatten(params))


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
    params = checkpoints.flatten(params)
    for path, value in flat_params(model).items():
        np.testing.assert_array_equal(params[path], value, err_msg=path)


def test_parameter_gradients_equal_transformers(tmp_path):
    """The backward pass (t5nb's own matmul and dropout-free layers) against torch autograd."""
    model = random_t5nb_model("t5.1.1-tiny")
    checkpoints.save_hf(model, tmp_path)
    hf_model = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    rng = np.random.default_rng(1)
    inputs, targets = tokens(rng, [12, 7, 3], 12), tokens(rng, [9, 5, 2], 9)

    def summed_nll(model):
        logits = model(inputs, shift_right(targets), targets)
        log_probs = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
        return -jnp.sum(log_probs * (targets > 0))

    grads = flat_params(nnx.grad(summed_nll)(model))
    hf_loss = torch.nn.functional.cross_entropy(
        hf_model(input_ids=torch.tensor(np.asarray(inputs), dtype=torch.long),
                 attention_mask=torch.tensor(np.asarray(inputs) > 0),
                 decoder_input_ids=torch.tensor(np.asarray(shift_right(targets)), dtype=torch.long)).logits.flatten(0, 1),
        torch.tensor(np.asarray(targets), dtype=torch.long).flatten(), ignore_index=0, reduction="sum")
    hf_loss.backward()
    hf_grads = dict(hf_model.named_parameters())
    for path, grad in grads.items():
        name, transposed = checkpoints.hf_name(path)
        theirs = hf_grads[name].grad.numpy()
        theirs = theirs.T if transposed else theirs
        assert np.abs(theirs).max() > 0, path  # every parameter gets a gradient
        np.testing.assert_allclose(grad, theirs, rtol=1e-3, atol=1e-4 * np.abs(theirs).max(), err_msg=path)


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


def write_t5x_native_checkpoint(directory: pathlib.Path, params: dict) -> pathlib.Path:
    """A `checkpoint_<step>` dir as T5X writes it: msgpack `checkpoint` whose leaves are inline
    arrays (norm scales) or tensorstore zarr specs with paths relative to the dir: gzip, chunks
    smaller than the arrays, bf16 for the encoder, f32 elsewhere, and one spec in T5X's older
    gcs form (path on top, dummy bucket) as a checkpoint written to gs:// and copied here has."""
    checkpoint_dir = directory / "checkpoint_100"
    target = {}
    for path, value in params.items():
        name = "target." + path.replace("/", ".")
        dtype = "bfloat16" if path.startswith("encoder/") else "float32"
        metadata = {"compressor": {"id": "gzip"}, "shape": list(value.shape),
                    "chunks": [max(1, (n + 1) // 2) for n in value.shape]}
        spec = {"driver": "zarr", "dtype": dtype, "kvstore": {"driver": "file", "path": name}, "metadata": metadata}
        if path.endswith("scale"):
            leaf = value
        else:
            store = ts.open({**spec, "kvstore": {"driver": "file", "path": str(checkpoint_dir / name)}},
                            create=True).result()
            store.write(value.astype(jnp.bfloat16) if dtype == "bfloat16" else value).result()
            leaf = ts.Spec(spec).to_json()
            if path == "decoder/relpos_bias/rel_embedding":
                leaf = {**spec, "kvstore": {"driver": "gcs", "bucket": "t5x-dummy-bucket"}, "path": name}
        node = target
        *parents, last = path.split("/")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = leaf
    contents = {"version": 3, "optimizer": {"target": target, "state": {"step": np.int32(100)}}}
    (checkpoint_dir / "checkpoint").write_bytes(serialization.msgpack_serialize(contents))
    return checkpoint_dir


def test_native_t5x_zarr_layout_round_trips(tmp_path):
    config = get_config("t5.1.1-tiny", vocab_size=VOCAB, dropout_rate=0.0)
    params = random_params(config)
    checkpoint_dir = write_t5x_native_checkpoint(tmp_path, params)
    chunks = [p.name for p in (checkpoint_dir / "target.token_embedder.embedding").iterdir()]
    assert ".zarray" in chunks and len(chunks) == 5  # 2 x 2 chunks
    for path in (checkpoint_dir, checkpoint_dir / "checkpoint"):
        restored = checkpoints.flatten(checkpoints.read_t5x_checkpoint(path))
        assert restored.keys() == params.keys()
        for key, value in params.items():
            if key.startswith("encoder/") and not key.endswith("scale"):
                value = value.astype(jnp.bfloat16).astype(np.float32)
            np.testing.assert_array_equal(restored[key], value, err_msg=key)
    model = checkpoints.load_t5x(checkpoint_dir, config)
    np.testing.assert_array_equal(flat_params(model)["decoder/logits_dense/kernel"],
                                  params["decoder/logits_dense/kernel"])


def test_a_gs_t5x_checkpoint_is_read_from_its_standin_under_t5nb_standins(tmp_path, monkeypatch):
    """`gs://bucket/dir/checkpoint_100` with T5NB_STANDINS=S reads S/gs/bucket/dir/checkpoint_100,
    its zarr arrays relative to it; the recipe's loader takes it as a T5X checkpoint."""
    from t5nb import remote, restore

    config = get_config("t5.1.1-tiny", vocab_size=VOCAB, dropout_rate=0.0)
    params = random_params(config)
    local = write_t5x_native_checkpoint(tmp_path / "gs" / "t5-data" / "t5x", params)
    monkeypatch.setenv(remote.STANDINS_ENV, str(tmp_path))
    url = "gs://t5-data/t5x/checkpoint_100"
    assert checkpoints.checkpoint_kind(url) == "t5x"
    from_url, from_path = (checkpoints.flatten(checkpoints.read_t5x_checkpoint(where)) for where in (url, local))
    assert from_url.keys() == params.keys()
    for key, value in from_path.items():
        np.testing.assert_array_equal(from_url[key], value, err_msg=key)
    np.testing.assert_array_equal(checkpoints.flatten(restore.initial_params(url, config))["encoder/layers_1/mlp/wo/kernel"],
                                  from_path["encoder/layers_1/mlp/wo/kernel"])


def test_official_vocabulary_gives_the_golden_ids():
    seqio = pytest.importorskip("seqio")
    vocab = seqio.SentencePieceVocabulary(str(data_file("vocab/cc_all.32000.sentencepiece.model")), extra_ids=100)
    assert vocab.encode("translate English to German: The house is wonderful.") == [
        13959, 1566, 12, 2968, 10, 37, 629, 19, 1627, 5]
    assert vocab.encode("summarize: studies have shown that owning a dog is good for you") == [
        21603, 10, 2116, 43, 2008, 24, 293, 53, 3, 9, 1782, 19, 207, 21, 25]
    assert vocab.encode("<extra_id_0>") == [32099] and vocab.encode("<extra_id_99>") == [32000]
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id, vocab.vocab_size) == (0, 1, 2, 32100)


# -- errors: one message naming the key and both shapes ---------------------------------------
@pytest.fixture
def hf_dir(tmp_path):
    config = get_config("t5.1.1-tiny", vocab_size=VOCAB, dropout_rate=0.0)
    checkpoints.save_hf(checkpoints.model_from_params(config, checkpoints.unflatten(random_params(config))), tmp_path)
    return tmp_path


def edit_safetensors(directory, edit):
    path = directory / "model.safetensors"
    tensors = safetensors.numpy.load_file(path)
    edit(tensors)
    safetensors.numpy.save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.update({"encoder.block.1.layer.0.SelfAttention.q.weight": np.zeros((11, 8), np.float32)}),
     r"^encoder/layers_1/attention/query/kernel \(HF encoder\.block\.1\.layer\.0\.SelfAttention\.q\.weight, "
     r"transposed\): model expects shape \(8, 12\), checkpoint has shape \(8, 11\)$"),
    (lambda t: t.pop("decoder.final_layer_norm.weight"),
     r"^decoder/decoder_norm/scale \(HF decoder\.final_layer_norm\.weight\): missing from the checkpoint "
     r"\(model expects shape \(8,\)\)$"),
    (lambda t: t.update({"encoder.block.2.layer.0.layer_norm.weight": np.ones(8, np.float32)}),
     r"^encoder\.block\.2\.layer\.0\.layer_norm\.weight: unexpected in the checkpoint \(shape \(8,\)\)"),
], ids=["wrong-shape", "missing", "unexpected"])
def test_hf_checkpoint_that_does_not_fit_fails_with_one_clear_message(hf_dir, edit, message):
    edit_safetensors(hf_dir, edit)
    with pytest.raises(checkpoints.CheckpointError, match=message):
        checkpoints.load_hf(hf_dir)


def test_hf_unknown_layout_is_refused(hf_dir):
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, "feed_forward_proj": "gated-silu"}))
    with pytest.raises(checkpoints.CheckpointError, match="unsupported.*feed_forward_proj='gated-silu'"):
        checkpoints.load_hf(hf_dir)


def test_t5x_checkpoint_into_the_wrong_config_names_key_and_shapes():
    path = data_file("t5x/test_t5_tiny.checkpoint_0")
    with pytest.raises(checkpoints.CheckpointError,
                       match=r"^decoder/decoder_norm/scale: model expects shape \(16,\), checkpoint has "
                             r"shape \(8,\) \(and \d+ more problems\)$"):
        checkpoints.load_t5x(path, get_config("t5-tiny"))


def test_t5x_unknown_layout_and_missing_path_are_refused(tmp_path):
    (tmp_path / "not_t5x").write_bytes(serialization.msgpack_serialize({"params": {"w": np.zeros(2)}}))
    with pytest.raises(checkpoints.CheckpointError, match=r"unknown layout.*\['params'\]"):
        checkpoints.read_t5x_checkpoint(tmp_path / "not_t5x")
    with pytest.raises(checkpoints.CheckpointError, match="no T5X checkpoint there"):
        checkpoints.read_t5x_checkpoint(tmp_path / "checkpoint_7")


def test_sharded_hf_checkpoint_reads_like_a_single_file(hf_dir, tmp_path_factory):
    config, params = checkpoints.read_hf_checkpoint(hf_dir)
    params = checkpoints.flatten(params)
    tensors = safetensors.numpy.load_file(hf_dir / "model.safetensors")
    sharded = tmp_path_factory.mktemp("sharded")
    (sharded / "config.json").write_text((hf_dir / "config.json").read_text())
    weight_map = {name: f"model-0000{i % 2 + 1}-of-00002.safetensors" for i, name in enumerate(sorted(tensors))}
    for shard in set(weight_map.values()):
        safetensors.numpy.save_file({n: t for n, t in tensors.items() if weight_map[n] == shard}, sharded / shard)
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    sharded_config, sharded_params = checkpoints.read_hf_checkpoint(sharded)
    sharded_params = checkpoints.flatten(sharded_params)
    assert sharded_config == config and sharded_params.keys() == params.keys()
    for path, value in params.items():
        np.testing.assert_array_equal(sharded_params[path], value, err_msg=path)

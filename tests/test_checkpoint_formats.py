"""Official checkpoints in the forms they are published: every family x weights format loads with
the logits of transformers (float32, within 1e-4), from files with the upstream names and layout.

What the real Hub repositories ship on their main branch (their "Files and versions" pages,
huggingface.co/<repo>/tree/main; tf_model.h5, rust_model.ot and onnx/ are not read):

- T5 1.0, google-t5/t5-small: model.safetensors, pytorch_model.bin, flax_model.msgpack;
  google-t5/t5-11b: pytorch_model.bin only (one 45.2 GB file).
- T5.1.1, google/t5-v1_1-small: pytorch_model.bin, flax_model.msgpack; no model.safetensors (it is
  only in the unmerged PR refs/pr/1).
- FLAN-T5, google/flan-t5-small: model.safetensors, pytorch_model.bin, flax_model.msgpack;
  google/flan-t5-xxl: 5 shards of each, model-0000N-of-00005.safetensors,
  pytorch_model-0000N-of-00005.bin and flax_model-0000N-of-00005.msgpack, with their .index.json.
- mT5, google/mt5-small: pytorch_model.bin, flax_model.msgpack (a safetensors PR is not merged).
- ByT5, google/byt5-small: pytorch_model.bin, flax_model.msgpack.
- SSM (closed-book QA), google/t5-small-ssm-nq: pytorch_model.bin, flax_model.msgpack.

So `hf://google/t5-v1_1-small`, mT5, ByT5 and SSM-NQ load from flax_model.msgpack, without torch.
T5X checkpoints (GCS) are tested in test_checkpoints.py. The PyTorch and safetensors files are
written here by torch and transformers, the Flax msgpack in transformers 4.x's FlaxT5 layout
(`modeling_flax_t5.py`: `shared/embedding`, `encoder/block/0/layer/0/SelfAttention/q/kernel` as
[in, out], `.../layer_norm/weight`, `lm_head/kernel` when untied; sharded as
`modeling_flax_utils.py`'s `flax_shard_checkpoint`).
"""
import functools
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from t5nb import checkpoints, remote, restore
from standins import flax_params, msgpack_bytes
from test_model import forward, shift_right, tokens

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4
RNG = np.random.default_rng(0)
INPUTS, TARGETS = tokens(RNG, [12, 7, 3], 12), tokens(RNG, [9, 5, 2], 9)

# Each family's config.json as its smallest repository publishes it (keys, flags, vocabulary),
# with tiny sizes (d_model, d_kv, d_ff, num_heads, num_layers, num_decoder_layers).
_T5 = {"architectures": ["T5ForConditionalGeneration"], "d_ff": 32, "d_kv": 8, "d_model": 16,
       "decoder_start_token_id": 0, "dropout_rate": 0.1, "eos_token_id": 1, "initializer_factor": 1.0,
       "is_encoder_decoder": True, "layer_norm_epsilon": 1e-06, "model_type": "t5", "num_heads": 2,
       "num_layers": 2, "pad_token_id": 0, "relative_attention_num_buckets": 32, "vocab_size": 32128}
_T5_1_1 = {**_T5, "feed_forward_proj": "gated-gelu", "num_decoder_layers": 2, "output_past": True,
           "tie_word_embeddings": False}
FAMILIES = {
    # google-t5/t5-small: no feed_forward_proj (relu), tie_word_embeddings nor num_decoder_layers
    "t5": {**_T5, "n_positions": 512, "output_past": True,
           "task_specific_params": {"summarization": {"num_beams": 4, "prefix": "summarize: "}}},
    "t5.1.1": _T5_1_1,  # google/t5-v1_1-small
    "flan-t5": {**_T5_1_1, "dense_act_fn": "gelu_new", "is_gated_act": True, "n_positions": 512,  # google/flan-t5-small
                "relative_attention_max_distance": 128, "transformers_version": "4.23.1", "use_cache": True},
    "mt5": {**_T5_1_1, "architectures": ["MT5ForConditionalGeneration"], "model_type": "mt5",  # google/mt5-small
            "tokenizer_class": "T5Tokenizer", "vocab_size": 250112},
    "byt5": {**_T5_1_1, "gradient_checkpointing": False, "num_layers": 3,  # google/byt5-small: 12 + 4 layers
             "tokenizer_class": "T5Tokenizer", "transformers_version": "4.7.0.dev0", "vocab_size": 384},
    "ssm-nq": _T5_1_1,  # google/t5-small-ssm-nq
}


@functools.cache
def reference(family: str):
    """(transformers model of the family's config.json, random, in eval mode; its logits)."""
    published = FAMILIES[family]
    torch.manual_seed(0)
    model = transformers.AutoModelForSeq2SeqLM.from_config(transformers.AutoConfig.for_model(**published)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "layer_norm" in name:  # ones by default: make every norm distinguishable
                param.uniform_(0.5, 1.5)
        if published.get("tie_word_embeddings") is False:  # v5 ties it anyway (REFERENCE_TRAPS.md)
            std = published["d_model"] ** -0.5
            model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight) * std)
        logits = model(input_ids=torch.tensor(np.asarray(INPUTS), dtype=torch.long),
                       attention_mask=torch.tensor(np.asarray(INPUTS) > 0),
                       decoder_input_ids=torch.tensor(np.asarray(shift_right(TARGETS)), dtype=torch.long)).logits
    assert (model.lm_head.weight is model.shared.weight) == (family == "t5")
    assert logits.abs().max() > 0.1  # not a degenerate model
    return model, logits.numpy()


def write_shards(directory: pathlib.Path, tensors: dict, weights_name: str, save) -> None:
    """`tensors` in two shards named as transformers names them (`pytorch_model-00001-of-00002.bin`),
    and their index `<weights_name>.index.json`."""
    stem, ext = weights_name.rsplit(".", 1)
    names = list(tensors)
    halves = names[:len(names) // 2], names[len(names) // 2:]
    shards = {f"{stem}-{i + 1:05d}-of-00002.{ext}": half for i, half in enumerate(halves)}
    for shard, shard_names in shards.items():
        save({name: tensors[name] for name in shard_names}, directory / shard)
    index = {"metadata": {"total_size": sum(np.asarray(t).nbytes for t in tensors.values())},
             "weight_map": {name: shard for shard, shard_names in shards.items() for name in shard_names}}
    (directory / f"{weights_name}.index.json").write_text(json.dumps(index, indent=2))


# weights file -> writer(transformers model, directory). PyTorch files hold every state-dict name
# (embed_tokens and a tied lm_head too), as transformers 4.x saved them; the single file in
# torch's legacy (pre-1.6) format of the 2020 uploads.
def state_dict(model) -> dict[str, np.ndarray]:
    """Each parameter once (a shared one as shared.weight), by its PyTorch name."""
    return {name: param.detach().numpy() for name, param in model.named_parameters()}


WRITERS = {
    "model.safetensors": lambda model, directory: model.save_pretrained(directory),
    "model.safetensors.index.json": lambda model, directory: model.save_pretrained(directory, max_shard_size="100KB"),
    "flax_model.msgpack": lambda model, directory: (directory / "flax_model.msgpack").write_bytes(
        msgpack_bytes(flax_params(state_dict(model)))),
    "flax_model.msgpack.index.json": lambda model, directory: write_shards(
        directory, flax_params(state_dict(model)), "flax_model.msgpack",
        lambda shard, path: path.write_bytes(msgpack_bytes(shard))),
    "pytorch_model.bin": lambda model, directory: torch.save(
        model.state_dict(), directory / "pytorch_model.bin", _use_new_zipfile_serialization=False),
    "pytorch_model.bin.index.json": lambda model, directory: write_shards(
        directory, model.state_dict(), "pytorch_model.bin", torch.save),
}


def write_repository(directory: pathlib.Path, family: str, *weights: str) -> pathlib.Path:
    """The family's reference model in `weights` files and its published config.json."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in weights:
        WRITERS[name](reference(family)[0], directory)
    (directory / "config.json").write_text(json.dumps(FAMILIES[family], indent=2))  # over save_pretrained's
    return directory


def max_logit_diff(model, family: str) -> float:
    ours = np.asarray(forward(model, INPUTS, TARGETS))
    return float(np.abs(ours - reference(family)[1])[np.asarray(TARGETS) > 0].max())


@pytest.mark.parametrize("weights", WRITERS)
@pytest.mark.parametrize("family", FAMILIES)
def test_published_form_loads_with_the_logits_of_transformers(tmp_path, family, weights):
    write_repository(tmp_path, family, weights)
    assert checkpoints.hf_weights_file(os.listdir(tmp_path)) == weights
    assert (len(list(tmp_path.glob("*-of-0000*"))) >= 2) == weights.endswith(".index.json")
    model = checkpoints.load_hf(tmp_path)
    published = FAMILIES[family]
    assert model.config.vocab_size == published["vocab_size"]
    assert model.config.logits_via_embedding == (family == "t5")
    assert model.config.mlp_activations == (("relu",) if family == "t5" else ("gelu", "linear"))
    assert model.config.num_decoder_layers == published.get("num_decoder_layers", published["num_layers"])
    diff = max_logit_diff(model, family)
    print(f"{family} {weights}: max |logit diff| {diff:.2e}")
    assert diff < TOLERANCE


def test_hub_repository_reads_its_msgpack_through_standins(tmp_path, monkeypatch):
    """`hf://google/t5-v1_1-small` with the real repository's files: config.json and the msgpack
    are fetched, not the PyTorch file; a repository with no stand-in names its URL."""
    monkeypatch.setenv(remote.STANDINS_ENV, str(tmp_path))
    repo = write_repository(tmp_path / "hf/google/t5-v1_1-small", "t5.1.1", "flax_model.msgpack", "pytorch_model.bin")
    (repo / "tf_model.h5").write_bytes(b"")  # published, never read
    fetched, fetch = [], remote.fetch
    monkeypatch.setattr(remote, "fetch", lambda url: fetched.append(url) or fetch(url))
    model = checkpoints.load_hf("hf://google/t5-v1_1-small")
    assert fetched == ["hf://google/t5-v1_1-small/config.json", "hf://google/t5-v1_1-small/flax_model.msgpack"]
    assert max_logit_diff(model, "t5.1.1") < TOLERANCE
    restored, step = restore.load_model("hf://google/t5-v1_1-small")  # 05's span filling, without 02's run
    assert step == 0 and max_logit_diff(restored, "t5.1.1") < TOLERANCE
    with pytest.raises(remote.SourceUnreachable, match="hf://google/t5-v1_1-base: no stand-in"):
        checkpoints.load_hf("hf://google/t5-v1_1-base")


def test_only_pytorch_weights_need_torch(tmp_path):
    """In a fresh process: safetensors and msgpack load without importing torch; without torch
    installed, a PyTorch-only repository says what to do."""
    directories = [write_repository(tmp_path / name, "t5.1.1", name)
                   for name in ("model.safetensors", "flax_model.msgpack", "pytorch_model.bin")]
    script = ("import sys\nfrom t5nb import checkpoints\n"
              "for directory in sys.argv[1:3]:\n    checkpoints.load_hf(directory)\n"
              "print('torch imported:', 'torch' in sys.modules)\n"
              "sys.modules['torch'] = None  # as if not installed\n"
              "try:\n    checkpoints.load_hf(sys.argv[3])\nexcept ImportError as error:\n    print(error)\n")
    result = subprocess.run([sys.executable, "-c", script, *map(str, directories)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "torch imported: False" in result.stdout
    assert "pytorch_model.bin: reading pytorch_model.bin needs PyTorch (pip install torch)" in result.stdout


def test_pytorch_file_carrying_another_object_is_refused(tmp_path):
    directory = write_repository(tmp_path, "t5.1.1")
    torch.save({"shared.weight": torch.zeros(2), "args": pathlib.PurePosixPath("x")}, directory / "pytorch_model.bin")
    with pytest.raises(checkpoints.CheckpointError,
                       match=r"pytorch_model.bin: not a readable PyTorch state dict of tensors \(Unsupported global: "
                             r"GLOBAL pathlib.PurePosixPath was not an allowed global by default\)$"):
        checkpoints.load_hf(directory)

"""Hugging Face T5 <-> t5nb: config.json and safetensors, Flax msgpack or PyTorch weights (or
their shards), local or `hf://<org>/<repo>`; `HF_NAME_TABLE` is the one table of names."""
import json
import os
import pickle
import re

import numpy as np
import safetensors.numpy
from flax import serialization

from t5nb import remote
from t5nb.files import replacing, write_atomically
from t5nb.checkpoints.params import (CheckpointError, abstract_params, check_params, flatten, model_from_params,
                                     params_of, unflatten, warn_if_not_finite)
from t5nb.config import T5Config
from t5nb.model import Transformer

# (t5nb/T5X path regex, Hugging Face name template, HF stores the transpose). HF's q/k/v/o,
# wi/wo and lm_head are torch Linear weights [out, in]; relative biases are [buckets, heads]
# and live in block 0 of each stack.
HF_NAME_TABLE = (
    (r"token_embedder/embedding", "shared.weight", False),
    (r"decoder/logits_dense/kernel", "lm_head.weight", True),
    (r"(encoder|decoder)/relpos_bias/rel_embedding",
     r"\1.block.0.layer.0.SelfAttention.relative_attention_bias.weight", True),
    (r"encoder/encoder_norm/scale", "encoder.final_layer_norm.weight", False),
    (r"decoder/decoder_norm/scale", "decoder.final_layer_norm.weight", False),
    (r"encoder/layers_(\d+)/pre_attention_layer_norm/scale", r"encoder.block.\1.layer.0.layer_norm.weight", False),
    (r"encoder/layers_(\d+)/attention/(\w+)/kernel", r"encoder.block.\1.layer.0.SelfAttention.\2.weight", True),
    (r"encoder/layers_(\d+)/pre_mlp_layer_norm/scale", r"encoder.block.\1.layer.1.layer_norm.weight", False),
    (r"encoder/layers_(\d+)/mlp/(\w+)/kernel", r"encoder.block.\1.layer.1.DenseReluDense.\2.weight", True),
    (r"decoder/layers_(\d+)/pre_self_attention_layer_norm/scale", r"decoder.block.\1.layer.0.layer_norm.weight", False),
    (r"decoder/layers_(\d+)/self_attention/(\w+)/kernel", r"decoder.block.\1.layer.0.SelfAttention.\2.weight", True),
    (r"decoder/layers_(\d+)/pre_cross_attention_layer_norm/scale", r"decoder.block.\1.layer.1.layer_norm.weight", False),
    (r"decoder/layers_(\d+)/encoder_decoder_attention/(\w+)/kernel",
     r"decoder.block.\1.layer.1.EncDecAttention.\2.weight", True),
    (r"decoder/layers_(\d+)/pre_mlp_layer_norm/scale", r"decoder.block.\1.layer.2.layer_norm.weight", False),
    (r"decoder/layers_(\d+)/mlp/(\w+)/kernel", r"decoder.block.\1.layer.2.DenseReluDense.\2.weight", True),
)
_HF_PROJECTIONS = {".query.": ".q.", ".key.": ".k.", ".value.": ".v.", ".out.": ".o."}
_HF_ALIASES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")  # copies of shared.weight
_HF_ACTIVATIONS = {"relu": ("relu",), "gated-gelu": ("gelu", "linear"), "gated-relu": ("relu", "linear")}
_HF_REQUIRED = ("vocab_size", "d_model", "num_heads", "num_layers", "d_kv", "d_ff")
# The weights files a Hugging Face repository may ship, in the order `load_hf` prefers them; a
# `<name>.index.json` maps tensor names to the shards of `<name>`.
HF_WEIGHTS = ("model.safetensors.index.json", "model.safetensors", "flax_model.msgpack.index.json",
              "flax_model.msgpack", "pytorch_model.bin.index.json", "pytorch_model.bin")
HF_DIR = ("a Hugging Face T5 directory holds config.json and model.safetensors, flax_model.msgpack or "
          "pytorch_model.bin (or the shard index of one)")
_FLAX_LEAVES = ("kernel", "embedding", "weight")  # transformers' Flax T5: Dense, Embed, T5LayerNorm


def hf_name(path: str) -> tuple[str, bool]:
    """t5nb path `encoder/layers_0/attention/query/kernel` -> (HF name, HF stores the transpose)."""
    for pattern, template, transposed in HF_NAME_TABLE:
        if re.fullmatch(pattern, path):
            name = re.sub(pattern, template, path)
            for ours, theirs in _HF_PROJECTIONS.items():
                name = name.replace(ours, theirs)
            return name, transposed
    raise CheckpointError(f"{path}: no Hugging Face name for this parameter")


def config_from_hf(hf: dict) -> T5Config:
    """t5nb config from a Hugging Face `config.json` dict: T5 1.0 (relu, tied), T5.1.1, FLAN-T5,
    ByT5 and mT5 (`model_type` "mt5") layouts. `dense_act_fn` and `is_gated_act` are ignored, as
    transformers derives them from `feed_forward_proj`."""
    proj, model_type = hf.get("feed_forward_proj", "relu"), hf.get("model_type", "t5")
    if model_type not in ("t5", "mt5") or proj not in _HF_ACTIVATIONS:
        raise CheckpointError(f"unsupported Hugging Face layout: model_type={hf.get('model_type')!r}, "
                              f"feed_forward_proj={proj!r} (t5nb reads T5 with {sorted(_HF_ACTIVATIONS)})")
    if hf.get("layer_norm_epsilon", 1e-6) != 1e-6:
        raise CheckpointError(f"layer_norm_epsilon={hf['layer_norm_epsilon']}: t5nb uses T5's 1e-6")
    missing = [key for key in _HF_REQUIRED if key not in hf]
    if missing:
        raise CheckpointError(f"the Hugging Face config lacks {', '.join(missing)}")
    # transformers v5 writes `tie_word_embeddings: true` always and keeps the T5.1.1 flag as
    # `scale_decoder_outputs: false`; older configs say `tie_word_embeddings: false`. mT5 is never
    # tied nor rescaled (published configs say false; v5 writes true and ignores it).
    tied = model_type == "t5" and hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True))
    return T5Config(
        vocab_size=hf["vocab_size"], emb_dim=hf["d_model"], num_heads=hf["num_heads"],
        num_encoder_layers=hf["num_layers"],
        num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
        head_dim=hf["d_kv"], mlp_dim=hf["d_ff"], mlp_activations=_HF_ACTIVATIONS[proj],
        logits_via_embedding=bool(tied), dropout_rate=hf.get("dropout_rate", 0.1),
        relative_attention_num_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_attention_max_distance=hf.get("relative_attention_max_distance", 128))


def config_to_hf(config: T5Config) -> dict:
    """Hugging Face `config.json` dict for a t5nb config."""
    proj = {v: k for k, v in _HF_ACTIVATIONS.items()}.get(tuple(config.mlp_activations))
    if proj is None:
        raise CheckpointError(f"mlp_activations={config.mlp_activations} has no Hugging Face T5 equivalent")
    return {
        "architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
        "vocab_size": config.vocab_size, "d_model": config.emb_dim, "d_kv": config.head_dim,
        "d_ff": config.mlp_dim, "num_heads": config.num_heads, "num_layers": config.num_encoder_layers,
        "num_decoder_layers": config.num_decoder_layers, "feed_forward_proj": proj,
        "tie_word_embeddings": config.logits_via_embedding, "dropout_rate": config.dropout_rate,
        "layer_norm_epsilon": 1e-6, "initializer_factor": 1.0,
        "relative_attention_num_buckets": config.relative_attention_num_buckets,
        "relative_attention_max_distance": config.relative_attention_max_distance,
        "is_encoder_decoder": True, "pad_token_id": 0, "eos_token_id": 1,
        "decoder_start_token_id": 0, "dtype": "float32",
    }


def _read_json(path: str):
    """A JSON file, or a `CheckpointError` naming it."""
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path}: not valid JSON ({error})") from None


def _load_safetensors(path: str) -> dict[str, np.ndarray]:
    """One safetensors file, or an error naming it."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return safetensors.numpy.load_file(path)
    except safetensors.SafetensorError as error:
        raise CheckpointError(f"{path}: not a readable safetensors file ({error})") from None


def _load_msgpack(path: str) -> dict[str, np.ndarray]:
    """One `flax_model.msgpack` (or shard) of transformers' Flax T5, in its PyTorch names and layout:
    `encoder/block/0/layer/0/SelfAttention/q/kernel` [in, out] -> `encoder.block.0.layer.0.
    SelfAttention.q.weight` [out, in]; `.../embedding` and `.../weight` (norms) -> `.../weight`."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        tree = serialization.msgpack_restore(data)
    except ValueError as error:  # msgpack's errors for bytes that are not one msgpack value
        raise CheckpointError(f"{path}: not a readable msgpack file ({error})") from None
    if not isinstance(tree, dict):
        raise CheckpointError(f"{path}: holds a {type(tree).__name__}, not a tree of Flax parameters")
    tensors = {}
    for name, array in flatten(tree).items():
        stem, _, leaf = name.rpartition("/")
        if leaf in _FLAX_LEAVES:
            name = stem.replace("/", ".") + ".weight"
        tensors[name] = array.T if leaf == "kernel" else array  # other names: reported as unexpected
    return tensors


def _load_torch(path: str) -> dict[str, np.ndarray]:
    """One `pytorch_model.bin` (or shard), read with torch (imported here only) as tensors only:
    the pickle may name no other object."""
    try:
        import torch  # optional: only pytorch_model.bin needs it
    except ImportError:
        raise ImportError(f"{path}: reading pytorch_model.bin needs PyTorch (pip install torch); or load a "
                          "repository that has model.safetensors or flax_model.msgpack") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, EOFError) as error:
        # torch's message for a refused object advises loading it unsafely: keep only the cause
        reason = (str(error).partition("WeightsUnpickler error:")[2].strip() or str(error).strip()
                  or type(error).__name__)
        raise CheckpointError(f"{path}: not a readable PyTorch state dict of tensors "
                              f"({reason.splitlines()[0].split('. ')[0]})") from None
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not a state dict of tensors")
    return {name: tensor.float().numpy() for name, tensor in state.items()}


_HF_READERS = {"model.safetensors": _load_safetensors, "flax_model.msgpack": _load_msgpack,
               "pytorch_model.bin": _load_torch}


def _read_weights(name: str, local) -> dict[str, np.ndarray]:
    """Arrays by PyTorch name from `name` (one of `HF_WEIGHTS`), or from the shards its index
    lists; `local(file)` is the local path of a file of the repository."""
    if not name.endswith(".index.json"):
        return _HF_READERS[name](local(name))
    index = local(name)
    weight_map = _read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: no 'weight_map' of tensor names to shard files")
    read = _HF_READERS[name.removesuffix(".index.json")]
    return {tensor: array for shard in sorted(set(weight_map.values())) for tensor, array in read(local(shard)).items()}


def hf_weights_file(names) -> str | None:
    """The weights file `load_hf` reads among a repository's file `names` (the first of
    `HF_WEIGHTS` there), or None."""
    return next((name for name in HF_WEIGHTS if name in names), None)


def _hf_files(source: str):
    """(weights file name, file name -> local path) of a Hugging Face directory or `hf://<org>/<repo>`;
    refuses one without config.json or weights, naming what it holds."""
    if source.startswith("hf://"):
        url = source.rstrip("/")
        names, local = remote.list_files(url), lambda name: remote.fetch(f"{url}/{name}")
    elif os.path.isdir(source):
        names, local = sorted(os.listdir(source)), lambda name: os.path.join(source, name)
    else:
        problem = "not a directory" if os.path.exists(source) else "no such directory"
        raise FileNotFoundError(f"{source}: {problem}; {HF_DIR}")
    weights = hf_weights_file(names)
    if "config.json" not in names or weights is None:
        raise FileNotFoundError(f"{source}: {HF_DIR}; found {', '.join(names) or 'nothing'}")
    return weights, local


def _hf_config(local) -> T5Config:
    """The t5nb config of a repository's config.json (`local` as in `_hf_files`)."""
    config_path = local("config.json")
    hf = _read_json(config_path)
    try:
        return config_from_hf(hf)
    except ValueError as error:  # CheckpointError, or a T5Config field out of range
        raise CheckpointError(f"{config_path}: {error}") from None


def read_hf_config(source) -> T5Config:
    """The t5nb config of a Hugging Face directory or `hf://<org>/<repo>`, whose files are checked
    to be there."""
    return _hf_config(_hf_files(os.fspath(source))[1])


def read_hf_checkpoint(source) -> tuple[T5Config, dict]:
    """(config, params) from a Hugging Face directory or `hf://<org>/<repo>` (see `load_hf`)."""
    weights, local = _hf_files(os.fspath(source))
    config = _hf_config(local)
    tensors = _read_weights(weights, local)
    for alias in _HF_ALIASES:
        tensors.pop(alias, None)
    shared, lm_head = tensors.get("shared.weight"), tensors.pop("lm_head.weight", None)
    if config.logits_via_embedding:
        if lm_head is not None and not np.array_equal(lm_head, shared):
            raise CheckpointError("lm_head.weight: differs from shared.weight but the config ties them")
    elif lm_head is not None or shared is not None:
        tensors["lm_head.weight"] = shared if lm_head is None else lm_head  # HF ties a missing lm_head
    names = {}
    for path in abstract_params(config):
        name, transposed = hf_name(path)
        names[name] = path, transposed
    flat = {}
    for name, array in tensors.items():
        if name not in names:
            flat[name] = array  # reported by check_params as unexpected
            continue
        path, transposed = names[name]
        array = np.asarray(array, np.float32)
        flat[path] = array.T if transposed else array
    check_params(config, flat, {path: f"HF {name}" + (", transposed" if transposed else "")
                                for name, (path, transposed) in names.items()})
    return config, unflatten(flat)


def load_hf(source) -> Transformer:
    """A t5nb model from a Hugging Face T5 directory or Hub repository `hf://<org>/<repo>` (read
    through `t5nb.remote`, so stand-ins work): config.json and the first of `HF_WEIGHTS` there.
    Only PyTorch weights import torch. A warning names any parameter that is not finite."""
    model = model_from_params(*read_hf_checkpoint(source))
    warn_if_not_finite(model, source)
    return model


def save_hf(model: Transformer, directory) -> None:
    """Write config.json + model.safetensors that `T5ForConditionalGeneration.from_pretrained` loads."""
    if model.config.prompt_length:
        raise CheckpointError("a model with a soft prompt has no Hugging Face T5 form (T5ForConditionalGeneration "
                              "takes token ids only)")
    if model.config.lora_rank:
        raise CheckpointError("fold the model's LoRA into its kernels first: save_hf(t5nb.adapters.merged_model(model), ...)")
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    tensors = {}
    for path, array in flatten(params_of(model)).items():
        name, transposed = hf_name(path)
        array = np.asarray(array, np.float32)
        tensors[name] = np.ascontiguousarray(array.T if transposed else array)
    with replacing(os.path.join(directory, "model.safetensors")) as weights:
        safetensors.numpy.save_file(tensors, weights, metadata={"format": "pt"})
    write_atomically(os.path.join(directory, "config.json"), json.dumps(config_to_hf(model.config), indent=2))

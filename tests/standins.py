"""Local stand-ins of every remote source the accelerator course reads, laid out as the real ones.

    python tests/standins.py DIR      # then T5NB_STANDINS=DIR reads them (see t5nb.remote)

Same URLs, file names, formats and fields as the real sources; small contents, from the real
public files in `$T5NB_DATA_DIR` (NQ-open, TriviaQA, Gutenberg text, the official vocabulary)
where present, else a few made-up rows. The official checkpoint's stand-in is a tiny random
T5.1.1 with the real repository's files (config.json, flax_model.msgpack, pytorch_model.bin,
spiece.model); T5X's T5.1.1-small on GCS stands in as T5X's own test checkpoint, a T5.1.1
"tiny". Only the sizes are not the real ones.
"""
import gzip
import json
import os
import pathlib
import sys

import numpy as np

from t5nb import remote
from t5nb.tasks import real, vocab

PAIRS = [("The house is wonderful.", "Das Haus ist wunderbar."), ("I like tea.", "Ich mag Tee."),
         ("Where is the station?", "Wo ist der Bahnhof?"), ("The cat sleeps.", "Die Katze schläft."),
         ("We read a book.", "Wir lesen ein Buch.")]  # made up; no WMT text is in $T5NB_DATA_DIR


# google/t5-v1_1-small's config.json as published
T5_V1_1_SMALL_CONFIG = {
    "architectures": ["T5ForConditionalGeneration"], "d_ff": 1024, "d_kv": 64, "d_model": 512,
    "decoder_start_token_id": 0, "dropout_rate": 0.1, "eos_token_id": 1, "feed_forward_proj": "gated-gelu",
    "initializer_factor": 1.0, "is_encoder_decoder": True, "layer_norm_epsilon": 1e-06, "model_type": "t5",
    "num_decoder_layers": 8, "num_heads": 6, "num_layers": 8, "output_past": True, "pad_token_id": 0,
    "relative_attention_num_buckets": 32, "tie_word_embeddings": False, "vocab_size": 32128}


def _path(url: str) -> pathlib.Path:
    path = remote.standin_path(url)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _paragraphs(data: pathlib.Path) -> list[str]:
    """Gutenberg paragraphs (C4 holds web pages of a few paragraphs); made-up ones without the data."""
    books = sorted((data / "gutenberg").glob("*.txt"))[:3]
    paragraphs = [" ".join(p.split()) for book in books for p in book.read_text(encoding="utf-8").split("\n\n")]
    paragraphs = [p for p in paragraphs if len(p) > 200]
    return paragraphs or [f"Paragraph {i} of a stand-in web page about nothing in particular. " * 4 for i in range(400)]


def _write_c4(data):
    documents = _paragraphs(data)
    files = real.C4["train"] + real.C4["validation"]
    for index, url in enumerate(files):
        with gzip.open(_path(url), "wt", encoding="utf-8") as f:
            for number, text in enumerate(documents[index::len(files)]):
                f.write(json.dumps({"text": text, "timestamp": "2019-04-25T12:57:54Z",
                                    "url": f"https://example.com/{index}/{number}"}) + "\n")


def _write_nq_open(data):
    source = data / "nq_open" / "NQ-open.dev.jsonl"
    rows = ([json.loads(line) for line in source.read_text().splitlines()] if source.exists()
            else [{"question": f"what is {i} plus one", "answer": [str(i + 1)]} for i in range(200)])
    cut = len(rows) * 4 // 5
    for (url,), part in ((real.NQ_OPEN["train"], rows[:cut]), (real.NQ_OPEN["validation"], rows[cut:])):
        _path(url).write_text("".join(json.dumps(row) + "\n" for row in part))


def _write_parquet(url, rows):
    import pyarrow
    import pyarrow.parquet

    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), _path(url))


def _write_triviaqa(data):
    source = data / "triviaqa" / "triviaqa_sm_sub.jsonl"
    rows = (real.read_triviaqa_jsonl(source) if source.exists()
            else [{"inputs": f"what is {i} times two?", "targets": str(2 * i), "answers": [str(2 * i)]} for i in range(200)])
    rows = [{"question": row["inputs"], "question_id": f"standin_{i}", "question_source": "stand-in",
             "answer": {"aliases": row["answers"], "normalized_aliases": [a.lower() for a in row["answers"]],
                        "value": row["targets"], "normalized_value": row["targets"].lower(), "type": "WikipediaEntity"}}
            for i, row in enumerate(rows)]
    cut = len(rows) * 4 // 5
    _write_parquet(real.TRIVIAQA["train"][0], rows[:cut])
    _write_parquet(real.TRIVIAQA["validation"][0], rows[cut:])


def _write_wmt14():
    rows = [{"translation": {"de": de, "en": en}} for en, de in PAIRS]
    for split, (url,) in real.WMT14_ENDE.items():
        _write_parquet(url, rows * (40 if split == "train" else 4))


def flax_params(tensors: dict) -> dict[str, np.ndarray]:
    """PyTorch-named T5 tensors as transformers 4.x's FlaxT5ForConditionalGeneration names them,
    flat: Dense kernels [in, out], Embed `embedding`, T5LayerNorm `weight`."""
    flat = {}
    for name, array in tensors.items():
        path = name.removesuffix(".weight").replace(".", "/")
        if name == "shared.weight" or "relative_attention_bias" in name:
            flat[f"{path}/embedding"] = array
        elif "layer_norm" in name:
            flat[f"{path}/weight"] = array
        else:
            flat[f"{path}/kernel"] = array.T
    return flat


def msgpack_bytes(flat: dict) -> bytes:
    """Flat "/" names -> the nested tree transformers' Flax `to_bytes` serialises."""
    from flax import serialization, traverse_util

    return serialization.msgpack_serialize(traverse_util.unflatten_dict(flat, sep="/"))


def _write_official_checkpoint(data, repository: str):
    """A tiny random T5.1.1 in the files `repository` publishes: config.json, flax_model.msgpack,
    pytorch_model.bin (no model.safetensors), spiece.model."""
    import safetensors.numpy
    import torch
    from flax import nnx

    from t5nb import checkpoints
    from t5nb.config import get_config
    from t5nb.model import Transformer

    directory = _path(f"{repository}/config.json").parent
    checkpoints.save_hf(Transformer(get_config("t5.1.1-tiny", vocab_size=32128), rngs=nnx.Rngs(0)), directory)
    tensors = safetensors.numpy.load_file(directory / "model.safetensors")
    (directory / "model.safetensors").unlink()
    config = {**T5_V1_1_SMALL_CONFIG, "d_ff": 16, "d_kv": 3, "d_model": 8, "num_decoder_layers": 2, "num_heads": 4,
              "num_layers": 2}  # t5.1.1-tiny's sizes
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "flax_model.msgpack").write_bytes(msgpack_bytes(flax_params(tensors)))
    torch.save({name: torch.from_numpy(array) for name, array in tensors.items()}, directory / "pytorch_model.bin")
    spm = data / vocab.OFFICIAL_SPM_NAME
    if spm.exists():
        (directory / "spiece.model").write_bytes(spm.read_bytes())


def _write_t5x_checkpoint(data, url: str):
    """T5X's own test checkpoint (a T5.1.1 "tiny" of the official vocabulary, in T5X's layout)
    from `$T5NB_DATA_DIR` where present, else a tiny random T5.1.1 in that layout: the msgpack
    `checkpoint` file of a `checkpoint_<step>` directory, its arrays inline."""
    from flax import nnx

    from t5nb import checkpoints
    from t5nb.config import get_config
    from t5nb.model import Transformer

    path = _path(f"{url}/checkpoint")
    real = data / "t5x" / "test_t5_tiny.checkpoint_0"
    if real.is_file():
        path.write_bytes(real.read_bytes())
        return
    model = Transformer(get_config("t5.1.1-tiny", vocab_size=32128), rngs=nnx.Rngs(0))
    target = {f"optimizer/target/{name}": np.asarray(array)
              for name, array in checkpoints.flatten(checkpoints.params_of(model)).items()}
    path.write_bytes(msgpack_bytes({"version": 3, **target, "optimizer/state/step": np.int32(0)}))


def write_standins(directory) -> pathlib.Path:
    """Write every stand-in under `directory`; return it."""
    directory = pathlib.Path(directory).resolve()
    data = vocab.shared_data_dir()
    previous = os.environ.get(remote.STANDINS_ENV)
    os.environ[remote.STANDINS_ENV] = str(directory)
    try:
        _write_c4(data)
        _write_nq_open(data)
        _write_triviaqa(data)
        _write_wmt14()
        _write_official_checkpoint(data, "hf://google/t5-v1_1-small")
        _write_t5x_checkpoint(data, "gs://t5-data/pretrained_models/t5x/t5_1_1_small/checkpoint_1000000")
    finally:
        if previous is None:
            os.environ.pop(remote.STANDINS_ENV)
        else:
            os.environ[remote.STANDINS_ENV] = previous
    return directory


if __name__ == "__main__":
    print(write_standins(sys.argv[1]))

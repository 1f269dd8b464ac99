"""A training run in its own process, for the multi-device test (8 simulated devices).

Trains the tiny model on a deterministic synthetic copy task, once per mesh in --meshes, and
writes the final parameters to `<out>.<mesh>.npz`.
"""
import argparse
import json
import os
import sys

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--meshes", default="1x1", help="comma-separated DATAxMODEL mesh shapes")
args = parser.parse_args()

import jax  # noqa: E402

from t5nb import mesh as mesh_lib  # noqa: E402
from t5nb.config import get_config  # noqa: E402
from t5nb.model import shift_right  # noqa: E402
from t5nb.train import train  # noqa: E402
from t5nb.trainer import TrainConfig, Trainer  # noqa: E402


class CopyTask:
    """Batch n is a pure function of n: reversed random tokens."""

    def __init__(self, global_batch=8, length=12, vocab=128):
        self.n, self.global_batch, self.length, self.vocab = 0, global_batch, length, vocab

    def __next__(self):
        rng = np.random.default_rng(self.n)
        x = rng.integers(2, self.vocab, (self.global_batch, self.length), dtype=np.int32)
        x[:, -3:] = 0  # some padding
        t = x[:, ::-1].copy()
        d = np.asarray(shift_right(t))
        self.n += 1
        return {"encoder_input_tokens": x, "decoder_target_tokens": t, "decoder_input_tokens": d}


for shape in args.meshes.split(","):
    data, model = map(int, shape.split("x"))
    mesh = mesh_lib.make_mesh(model, jax.devices()[: data * model])
    trainer = Trainer(get_config("t5.1.1-tiny", vocab_size=128, dropout_rate=0.1),
                      TrainConfig(learning_rate=1e-2), mesh)
    result = train(trainer, CopyTask(), args.steps, f"{args.out}.{shape}.run", checkpoint_every=0, progress=False)
    flat = {"/".join(str(k.key) for k in path): np.asarray(v)
            for path, v in jax.tree_util.tree_flatten_with_path(result.state.params)[0]}
    np.savez(f"{args.out}.{shape}.npz", **flat)
    print(json.dumps({"mesh": dict(mesh.shape), "loss": result.history[-1]["loss"]}))
sys.stdout.flush()
os._exit(0)  # skip the slow interpreter teardown of TF and orbax threads

"""A training run in its own process, for the multi-device test (8 simulated devices).

Trains the tiny model on a deterministic synthetic copy task, once per mesh in --meshes, and
writes the final parameters to `<out>.<mesh>.npz` and each step's loss and gradient norm (before
the optimizer) to `<out>.<mesh>.json`. A mesh written `8x1:summed` runs with a deliberately wrong
reduction: the data shards' gradients summed instead of averaged (written as `8x1-summed`), to
show what the test's comparison catches. With --nudge-ulps K, it also trains on one
device from the same initial parameters each moved by K ulps (a random direction per element,
one run per --nudge-seeds), writing `<out>.nudged<seed>.npz` and the initial ones to
`<out>.init.npz`: how far float32 rounding alone moves this run's result.
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
parser.add_argument("--nudge-ulps", type=int, default=0, help="ulps each initial parameter is moved by")
parser.add_argument("--nudge-seeds", type=int, default=2)
args = parser.parse_args()

import jax  # noqa: E402

from t5nb import mesh as mesh_lib  # noqa: E402
from t5nb.checkpoints import flatten  # noqa: E402
from t5nb.config import get_config  # noqa: E402
from t5nb.model import shift_right  # noqa: E402
from t5nb.train import train  # noqa: E402
from t5nb import trainer as trainer_lib  # noqa: E402
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


def trainer_on(data: int, model: int) -> Trainer:
    mesh = mesh_lib.make_mesh(model, jax.devices()[: data * model])
    return Trainer(get_config("t5.1.1-tiny", vocab_size=128, dropout_rate=0.1), TrainConfig(learning_rate=1e-2), mesh)


def nudged(params, ulps: int, rng):
    """Each element moved `ulps` float32 steps up or down, the direction drawn per element."""
    def nudge(p):
        p, up = np.asarray(p, np.float32), rng.integers(0, 2, np.shape(p)).astype(bool)
        for _ in range(ulps):
            p = np.where(up, np.nextafter(p, np.float32(np.inf)), np.nextafter(p, np.float32(-np.inf)))
        return p
    return jax.tree.map(nudge, params)


def summing_over_data_shards(gradients):
    """`Trainer._gradients` as a mesh that sums each data shard's gradient instead of averaging them."""
    def summed(self, *args):
        grads, sums = gradients(self, *args)
        return jax.tree.map(lambda g: g * self.mesh.shape["data"], grads), sums
    return summed


averaged = Trainer._gradients
for mesh in args.meshes.split(","):
    shape, _, wrong = mesh.partition(":")
    Trainer._gradients = summing_over_data_shards(averaged) if wrong == "summed" else averaged
    trainer_lib._COMPILED.clear()  # a step compiled for this model and mesh before may not be reused
    name = "-".join(filter(None, (shape, wrong)))
    trainer = trainer_on(*map(int, shape.split("x")))
    result = train(trainer, CopyTask(), args.steps, f"{args.out}.{name}.run", checkpoint_every=0, log_every=1,
                   progress=False)
    np.savez(f"{args.out}.{name}.npz", **flatten(jax.device_get(result.state.params)))
    steps = [{key: entry[key] for key in ("loss", "grad_norm")} for entry in result.history]
    with open(f"{args.out}.{name}.json", "w") as file:
        json.dump(steps, file)
    print(json.dumps({"mesh": name, "steps": steps}))
Trainer._gradients = averaged
if args.nudge_ulps:
    trainer = trainer_on(1, 1)
    initial = trainer.init_params()
    np.savez(f"{args.out}.init.npz", **flatten(jax.device_get(initial)))
    for seed in range(args.nudge_seeds):
        state = trainer.init_state(nudged(initial, args.nudge_ulps, np.random.default_rng(seed)))
        result = train(trainer, CopyTask(), args.steps, f"{args.out}.nudged{seed}.run", checkpoint_every=0,
                       progress=False, state=state)
        np.savez(f"{args.out}.nudged{seed}.npz", **flatten(jax.device_get(result.state.params)))
sys.stdout.flush()
os._exit(0)  # skip the slow interpreter teardown of TF and orbax threads

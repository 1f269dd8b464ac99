"""The course's programs on one chip, from a profile alone (no TensorFlow, so the GPU machine
builds them too): bench/accelerator_estimates.py compiles them, bench/gpu.py runs them, and
tests/test_profiles.py holds them equal to what the workflow's recipes train; their batches as
shapes (bench/compile.py's too). Beside them, the
benchmarks' random batches (no torch: bench/run.py and bench/gpu.py share them)."""
import jax
import jax.numpy as jnp
import numpy as np

from t5nb.adapters import FINE_TUNING_METHODS
from t5nb.config import T5Config, get_config
from t5nb.model import shift_right
from t5nb.trainer import Trainer, TrainConfig

TRAIN_STEPS = ("pretrain_step", "finetune_step")
PROGRAMS = (*TRAIN_STEPS, "eval_step", "decode_batch")  # the keys of `course_trainers`


def course_trainers(profile, dtype, mesh) -> dict:
    """name -> (Trainer, feature lengths, packed): the profile's model as it runs it (`execution`);
    pretraining (T5.1.1 span corruption, no dropout, T5X's rsqrt schedule) and fine-tuning
    (Adafactor at 1e-3), whose trainer also runs the course's eval step and greedy decoding. The
    presets' vocabulary is T5's: a profile on another (the facts world's) sizes its models to its
    task's, which needs the task."""
    finetuning = _trainer(profile, dtype, mesh, TrainConfig(learning_rate=1e-3))
    finetune_lengths = {"inputs": profile.finetune_inputs_length, "targets": profile.finetune_targets_length}
    return {"pretrain_step": (_trainer(profile, dtype, mesh, TrainConfig(warmup_steps=10_000)),
                              {"inputs": profile.inputs_length, "targets": profile.targets_length}, True),
            "finetune_step": (finetuning, finetune_lengths, False),
            "eval_step": (finetuning, finetune_lengths, False),
            "decode_batch": (finetuning, finetune_lengths, False)}


def abstract_batch(trainer: Trainer, batch_size: int, lengths: dict, packed: bool) -> dict:
    """The feature converter's batch as shapes, placed as `trainer` shards it: packed
    pretraining batches add segment ids and positions."""
    names = {"encoder_input_tokens": "inputs", "decoder_input_tokens": "targets", "decoder_target_tokens": "targets",
             "decoder_loss_weights": "targets"}
    if packed:
        names.update(encoder_segment_ids="inputs", encoder_positions="inputs", decoder_segment_ids="targets",
                     decoder_positions="targets")
    return {name: jax.ShapeDtypeStruct((batch_size, lengths[feature]), jnp.int32, sharding=trainer.batch_sharding)
            for name, feature in names.items()}


def adapted_trainer(profile, dtype, mesh, method: str) -> Trainer:
    """The fine-tuning trainer of `method` (a key of `FINE_TUNING_METHODS` with an adapter): the
    profile's model with the adapter on, Adafactor's steps not scaled by the parameters' size."""
    adapter, learning_rate = FINE_TUNING_METHODS[method]
    return _trainer(profile, dtype, mesh, TrainConfig(learning_rate=learning_rate, parameter_scale=False), **adapter)


def _trainer(profile, dtype, mesh, train_config, **model_fields) -> Trainer:
    if profile.vocabulary != "t5":
        raise ValueError(f"profile {profile.name!r} trains on the {profile.vocabulary!r} vocabulary; "
                         "its programs come from workflow's recipes")
    config = get_config(profile.model, dtype=dtype, dropout_rate=0.0, **(profile.execution or {}), **model_fields)
    return Trainer(config, train_config, mesh)


def make_batch(c: T5Config, batch: int, inputs: int, targets: int, seed: int = 0) -> dict:
    """Full-length random tokens (no padding); targets end in EOS, decoder inputs shifted right."""
    rng = np.random.default_rng(seed)
    encoder = rng.integers(2, c.vocab_size, (batch, inputs), dtype=np.int32)
    target = rng.integers(2, c.vocab_size, (batch, targets), dtype=np.int32)
    target[:, -1] = 1
    decoder_input = np.asarray(shift_right(target))
    return {"encoder_input_tokens": encoder, "decoder_input_tokens": decoder_input,
            "decoder_target_tokens": target}

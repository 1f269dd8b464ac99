"""Profiles: one small table that tells every notebook how big to go on this machine.

`T5NB_PROFILE=ci|cpu|accelerator|rehearsal` picks one; unset, t5nb looks at JAX's default backend.
"""
import dataclasses
import os
import pathlib
import tomllib

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Profile:
    """What a notebook may spend: model preset, batch, feature lengths and step counts."""

    name: str
    description: str
    model: str  # a preset name in t5nb.config
    vocabulary: str  # "facts" (shipped in data/) or "t5" (the official SentencePiece model)
    pretrain_task: str
    qa_task: str
    finetune_task: str  # the downstream task of 03_finetuning
    transfer_sizes: list  # 03's sample-efficiency curve: fine-tuning on the task's first N examples, each N
    transfer_steps: int  # steps of each run of that curve
    batch_size: int
    inputs_length: int
    targets_length: int
    pretrain_steps: int
    finetune_steps: int
    finetune_inputs_length: int  # fine-tuning and evaluation (questions are short)
    finetune_targets_length: int
    eval_every: int  # steps between validation losses while training (pretraining and fine-tuning)
    eval_batches: int  # validation batches per such evaluation
    decoded_sample: int  # validation examples answered at each such evaluation of a fine-tuning run
    matmul_size: int  # side of the square matmul 00_setup times
    eval_examples: int | None  # validation examples decoded per evaluation (None: all)
    official_checkpoint: str | None  # a published T5.1.1 model of this vocabulary (03, 04), or None


def _read_profiles(path: pathlib.Path) -> dict[str, Profile]:
    """The profiles of `path` (TOML), each checked to name every field of `Profile` but the
    optional ones (None when left out), a `base` one's changes applied to that profile."""
    table, profiles = tomllib.loads(path.read_text()), {}
    optional = {f.name: None for f in dataclasses.fields(Profile) if "None" in str(f.type)}
    for name, fields in table.items():
        fields = dict(fields)
        base = fields.pop("base", None)
        try:
            profiles[name] = (dataclasses.replace(profiles[base], name=name, **fields) if base
                              else Profile(name=name, **{**optional, **fields}))
        except (TypeError, KeyError) as error:
            raise ValueError(f"{path}: profile [{name}]: {error}") from None
    return profiles


PROFILES = _read_profiles(pathlib.Path(__file__).with_name("profiles.toml"))


def detect_profile_name() -> str:
    """`T5NB_PROFILE` if set, else `accelerator` when JAX sees a GPU/TPU, else `cpu`."""
    name = os.environ.get("T5NB_PROFILE", "").strip().lower()
    if name:
        return name
    return "cpu" if jax.default_backend() == "cpu" else "accelerator"


def compute_dtype(device=None):
    """The model's compute dtype on `device` (default: JAX's first); parameters stay float32.

    bfloat16 where the chip computes in it natively: a TPU, or an NVIDIA GPU of compute
    capability 8.0 or more (A100, L4, H100). float32 on a CPU and on older GPUs: a T4 (7.5) has
    float16 tensor cores but no bfloat16 units, and T5 overflows float16 (largest value 65,504)
    in its feed-forward activations (huggingface/transformers#5651, #9295); the T5 checkpoints
    were trained in bfloat16 (google-research/text-to-text-transfer-transformer#539).
    """
    device = device or jax.devices()[0]
    if device.platform == "tpu":
        return jnp.bfloat16
    if device.platform == "gpu" and float(getattr(device, "compute_capability", 0)) >= 8.0:
        return jnp.bfloat16
    return jnp.float32


def get_profile(name: str | None = None) -> Profile:
    """The profile called `name`, or the detected one."""
    name = name or detect_profile_name()
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r} (T5NB_PROFILE); choose one of {sorted(PROFILES)}")
    return PROFILES[name]

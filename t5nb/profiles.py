"""Profiles: one small table that tells every notebook how big to go on this machine.

`T5NB_PROFILE=ci|cpu|accelerator|rehearsal` picks one; unset, t5nb looks at JAX's default backend.
"""
import dataclasses
import os

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
    batch_size: int
    inputs_length: int
    targets_length: int
    pretrain_steps: int
    finetune_steps: int
    finetune_inputs_length: int  # fine-tuning and evaluation (questions are short)
    finetune_targets_length: int
    eval_examples: int | None  # validation examples decoded per evaluation (None: all)
    eval_every: int  # steps between validation losses while training (pretraining and fine-tuning)
    eval_batches: int  # validation batches per such evaluation
    decoded_sample: int  # validation examples answered at each such evaluation of a fine-tuning run
    matmul_size: int  # side of the square matmul 00_setup times
    official_checkpoint: str | None = None  # a published T5.1.1 model of this vocabulary (03, 04)


PROFILES = {
    "ci": Profile(
        name="ci",
        description="CI: every notebook in about a minute on 2 CPU cores; numbers are not meaningful.",
        model="t5.1.1-tiny",
        vocabulary="facts",
        pretrain_task="facts_pretraining",
        qa_task="facts_qa",
        finetune_task="facts_fact_check",
        batch_size=8,
        inputs_length=64,
        targets_length=16,
        pretrain_steps=20,
        finetune_steps=20,
        finetune_inputs_length=32,
        finetune_targets_length=8,
        eval_examples=64,
        eval_every=10,
        eval_batches=1,
        decoded_sample=16,
        matmul_size=256,
    ),
    "cpu": Profile(
        name="cpu",
        description="The offline course on a CPU: small models on the embedded facts world.",
        model="t5.1.1-mini",
        vocabulary="facts",
        pretrain_task="facts_pretraining",
        qa_task="facts_qa",
        finetune_task="facts_fact_check",
        batch_size=32,
        inputs_length=128,
        targets_length=32,
        pretrain_steps=1000,
        finetune_steps=400,
        finetune_inputs_length=32,
        finetune_targets_length=8,
        eval_examples=None,
        eval_every=50,
        eval_batches=2,
        decoded_sample=64,
        matmul_size=1024,
    ),
    "accelerator": Profile(
        name="accelerator",
        description="A TPU or GPU: real T5.1.1 sizes on real data.",
        model="t5.1.1-small",
        vocabulary="t5",
        pretrain_task="c4_span_corruption",
        qa_task="closed_book_qa",
        finetune_task="wmt14_ende",
        batch_size=64,
        inputs_length=512,
        targets_length=114,
        pretrain_steps=10000,
        finetune_steps=2000,
        finetune_inputs_length=128,
        finetune_targets_length=32,
        eval_examples=None,
        eval_every=250,
        eval_batches=4,
        decoded_sample=128,
        matmul_size=8192,
        official_checkpoint="hf://google/t5-v1_1-small",
    ),
}
# The accelerator course shrunk to run on CPU: the same tasks, sources, loaders and notebook
# calls, with only the sizes changed. CI runs it on 8 simulated devices with the remote
# sources swapped for stand-ins (`T5NB_STANDINS`, see t5nb.remote) before Colab ever does.
PROFILES["rehearsal"] = dataclasses.replace(
    PROFILES["accelerator"], name="rehearsal",
    description="The accelerator course at toy sizes (CI's dress rehearsal of the Colab path).",
    model="t5.1.1-tiny", batch_size=8, inputs_length=64, targets_length=16, pretrain_steps=8,
    finetune_steps=4, finetune_inputs_length=32, finetune_targets_length=8, eval_examples=8, eval_every=4,
    eval_batches=1, decoded_sample=8, matmul_size=256)


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

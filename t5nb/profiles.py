"""Profiles: one small table that tells every notebook how big to go on this machine.

`T5NB_PROFILE=ci|cpu|accelerator|fp32-gpu|rehearsal` picks one (the setup cell's form field
does, through `setup_cell.choose_profile`); unset, t5nb looks at the first device JAX has
(`profile_name_for`). `CHIPS` lists the accelerators the course is sized for: detection, the
MFU a run reports and bench/accelerator_estimates.py read it; `course_minutes` says how long a
profile's course takes on this machine.
"""
import dataclasses
import functools
import json
import os
import pathlib
import tomllib
import types

import jax
import jax.numpy as jnp

from t5nb.paths import REPO_ROOT
from t5nb.system import time_matmul

ESTIMATES = REPO_ROOT / "bench" / "results" / "accelerator_estimates.json"  # computed for each chip, not measured
# `make course`'s wall times under the cpu profile, measured, per kind of CPU (`system.cpu_description`):
# scripts/course_table.py keeps the entry of the CPU a course ran on
COURSE_TIMES = REPO_ROOT / "docs" / "course_times.json"


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
    knowledge_widths: list  # 06: the widths (d_model, on T5.1.1-mini's shape) pretrained, then fine-tuned for QA
    knowledge_steps: int  # 06: steps of each of those pretrainings (the profile's batch and lengths)
    ssm_width: int  # 06: the width pretrained with span corruption alone and with salient span masking
    capacity_people: list  # 06: the sizes of the worlds memorised
    capacity_widths: list  # 06: the widths that memorise them
    capacity_exposures: int  # 06: how often each fact is seen while memorising
    capacity_seeds: int  # 06: the models (seeds) of each width and world, trained together
    eval_examples: int | None  # validation examples decoded per evaluation (None: all)
    official_checkpoint: str | None  # a published T5.1.1 model of this vocabulary (03, 04), or None
    t5x_checkpoint: str | None  # a T5X checkpoint of this profile's model and vocabulary (03), or None
    execution: dict | None  # how its models run (T5Config's scan_layers, remat_policy), or None: unrolled


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


@dataclasses.dataclass(frozen=True)
class Chip:
    """An accelerator the course is sized for, by its vendor's data sheet."""

    kind: str  # how jax.Device.device_kind starts on it
    platform: str  # tpu or gpu
    compute_capability: str | None  # an NVIDIA GPU's: 8.0 and up compute in bfloat16
    peak_flops: dict  # dense peak FLOP/s (no sparsity) by the matmul's number format: bfloat16, tf32, float32
    bandwidth: float  # memory bytes/s
    memory: float  # bytes per chip
    offered_by: str  # where a learner gets one

    def device(self):
        """What `compute_dtype`, `profile_name_for` and `model.attention_implementation` read of
        a jax.Device on this chip (an NVIDIA GPU's runtime: CUDA)."""
        runtime = "cuda" if self.platform == "gpu" else self.platform
        return types.SimpleNamespace(platform=self.platform, device_kind=self.kind,
                                     compute_capability=self.compute_capability,
                                     client=types.SimpleNamespace(platform_version=runtime))

    def peak_format(self, dtype) -> str | None:
        """The data sheet's matmul format that `dtype` computes in: float32 runs as TF32 where the
        chip has it (JAX's default matmul precision on an NVIDIA GPU from the A100 on). None where
        the data sheet gives no peak for it (bfloat16 on a T4 or P100, float32 on a TPU, float16):
        there is no MFU to report, and a training run reports none."""
        name = jnp.dtype(dtype).name
        if name == "float32" and "tf32" in self.peak_flops:
            name = "tf32"
        return name if name in self.peak_flops else None

    def peak(self, dtype) -> float:
        """The dense peak of matmuls computing in `dtype` (`peak_format`); the one denominator of
        every MFU t5nb and its benchmarks print."""
        name = self.peak_format(dtype)
        if name is None:
            raise ValueError(f"{self.kind} has no {jnp.dtype(dtype).name} peak in its data sheet "
                             f"(has {sorted(self.peak_flops)})")
        return self.peak_flops[name]


def _flops(bfloat16=None, tf32=None, float32=None) -> dict:
    """A chip's dense peaks by number format, the formats it has."""
    return {name: value for name, value in (("bfloat16", bfloat16), ("tf32", tf32), ("float32", float32)) if value}


CHIPS = {  # vendors' data sheets: dense peak (no sparsity), HBM bandwidth and size; the cards learners get:
    # the P100 as Kaggle's PCIe card (its SXM2 form: 10.6 TFLOP/s), the T4 and L4 (PCIe only), the A100
    # (the same peaks as PCIe and SXM4), the H100 and H200 in their SXM forms
    "v5e": Chip("TPU v5 lite", "tpu", None, _flops(bfloat16=197e12), 819e9, 16e9, "Colab (1 chip), Kaggle (8 chips)"),
    "v4": Chip("TPU v4", "tpu", None, _flops(bfloat16=275e12), 1228e9, 32e9, "Google Cloud"),
    "v3": Chip("TPU v3", "tpu", None, _flops(bfloat16=123e12), 900e9, 16e9, "Google Cloud"),
    # Turing and Pascal: no bfloat16 or TF32 units (a T4's 65 TFLOP/s are float16's, which T5 overflows)
    "t4": Chip("Tesla T4", "gpu", "7.5", _flops(float32=8.1e12), 320e9, 16e9, "Colab (1), Kaggle (2)"),
    "p100": Chip("Tesla P100", "gpu", "6.0", _flops(float32=9.3e12), 732e9, 16e9, "Kaggle (1)"),
    "l4": Chip("NVIDIA L4", "gpu", "8.9", _flops(121e12, 60e12, 30.3e12), 300e9, 24e9, "Colab Pro"),
    "a100": Chip("NVIDIA A100", "gpu", "8.0", _flops(312e12, 156e12, 19.5e12), 1555e9, 40e9, "Colab Pro"),
    "h100": Chip("NVIDIA H100", "gpu", "9.0", _flops(989e12, 494.7e12, 67e12), 3350e9, 80e9, "Colab Pro, clouds"),
    "h200": Chip("NVIDIA H200", "gpu", "9.0", _flops(989e12, 494.7e12, 67e12), 4800e9, 141e9, "clouds"),
}


def chip_of(device) -> Chip | None:
    """The entry of `CHIPS` for `device` (by its device_kind), or None (a CPU, an unknown chip)."""
    kind = getattr(device, "device_kind", "")
    return next((chip for chip in CHIPS.values() if kind.startswith(chip.kind)), None)


def profile_name_for(device) -> str:
    """The profile a device gets: `cpu` on a CPU; `accelerator` where it computes in bfloat16
    (a TPU, an A100, L4 or H100); `fp32-gpu` on a GPU without bfloat16 (a T4, a P100), the
    same course sized for float32's far lower peak."""
    if device.platform == "cpu":
        return "cpu"
    return "accelerator" if compute_dtype(device) == jnp.bfloat16 else "fp32-gpu"


def detect_profile_name() -> str:
    """`T5NB_PROFILE` if set, else `profile_name_for` JAX's first device."""
    name = os.environ.get("T5NB_PROFILE", "").strip().lower()
    if name:
        return name
    return profile_name_for(jax.devices()[0])


# AMD's CDNA GPUs, whose matrix cores compute in bfloat16: MI100 (gfx908), MI200 (gfx90a),
# MI300 (gfx942), MI350 (gfx950)
AMD_BFLOAT16_ARCHITECTURES = ("gfx908", "gfx90a", "gfx94", "gfx95")


def compute_dtype(device=None):
    """The model's compute dtype on `device` (default: JAX's first); parameters stay float32.

    bfloat16 where the chip computes in it natively: a TPU, an NVIDIA GPU of compute capability
    8.0 or more (A100, L4, H100), or an AMD GPU of the CDNA line (MI100's gfx908 on: its matrix
    cores take bfloat16; ROCm names the architecture where CUDA gives a capability). float32 on a
    CPU and on other GPUs: a T4 (7.5) has float16 tensor cores but no bfloat16 units, and T5
    overflows float16 (largest value 65,504) in its feed-forward activations
    (huggingface/transformers#5651, #9295); the T5 checkpoints were trained in bfloat16
    (google-research/text-to-text-transfer-transformer#539).
    """
    device = device or jax.devices()[0]
    if device.platform == "tpu":
        return jnp.bfloat16
    capability = str(getattr(device, "compute_capability", "") or "")
    if device.platform == "gpu" and capability.startswith("gfx"):  # ROCm
        return jnp.bfloat16 if capability.startswith(AMD_BFLOAT16_ARCHITECTURES) else jnp.float32
    if device.platform == "gpu" and capability and float(capability) >= 8.0:
        return jnp.bfloat16
    return jnp.float32


def get_profile(name: str | None = None) -> Profile:
    """The profile called `name`, or the detected one."""
    name = name or detect_profile_name()
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r} (T5NB_PROFILE); choose one of {sorted(PROFILES)}")
    return PROFILES[name]


def course_minutes(name: str, device=None, count: int | None = None, with_02s_run: bool = False
                   ) -> tuple[dict, str] | None:
    """(least, most) minutes per notebook of profile `name`'s course on `count` devices like
    `device` (default: this machine's), and where they come from; None where nothing was
    measured or estimated.

    The `cpu` profile on a CPU: from the least to the most of `make course`'s wall times on the
    kinds of CPU on record (`COURSE_TIMES`), not scaled to this one: a timed matmul did not say
    what a step costs (on 2 cores of an AMD EPYC without AVX-512, about 98 GFLOP/s against the
    record's 214, notebook 02 took 20 min where its matmul said 8-10; an Intel Xeon 1.6 times as
    fast at them took 0.85 of the time, not 0.61). With one kind on record, least and most are
    alike.
    A chip of `CHIPS`: bench/accelerator_estimates.py's estimate (`ESTIMATES`) for the profile
    detection gives that chip, on the setup with the nearest number of chips: one figure (least
    and most alike), its measured error said with it; each notebook in a runtime of its own,
    without notebook 02's run, or `with_02s_run` (found, as in one runtime).
    """
    device = device or jax.devices()[0]
    count = count or jax.device_count()
    if device.platform == "cpu":
        kinds = json.loads(COURSE_TIMES.read_text()) if name == "cpu" and COURSE_TIMES.is_file() else {}
        if not kinds:
            return None
        kinds = dict(sorted(kinds.items(), key=lambda kind: sum(kind[1]["notebooks"].values())))
        notebooks = sorted({notebook for kind in kinds.values() for notebook in kind["notebooks"]})
        minutes = {notebook: tuple(f(kind["notebooks"][notebook] / 60 for kind in kinds.values()
                                     if notebook in kind["notebooks"]) for f in (min, max))
                   for notebook in notebooks}
        on = [f"{cpu} ({sum(kind['notebooks'].values()) / 60:.0f} min in all)" for cpu, kind in kinds.items()]
        on = " and ".join([", ".join(on[:-1]), on[-1]] if len(on) > 1 else on)
        return minutes, (f"measured by `make course` (docs/course_times.json) on {on}; another CPU, or one busy "
                         "with other work, may take longer")
    chip = chip_of(device)
    if chip is None or name != profile_name_for(device) or not ESTIMATES.is_file():
        return None
    estimates = json.loads(ESTIMATES.read_text())
    setups = [(setup_name, setup) for setup_name, setup in estimates["setups"].items() if setup["chip"] == chip.kind]
    if not setups:
        return None
    setup_name, setup = min(setups, key=lambda item: abs(item[1]["chips"] - count))
    below, above = (1 - ratio for ratio in estimates["assumptions"]["calibration"]["error"])
    return ({notebook: (row["with_02s_run" if with_02s_run else "minutes"],) * 2
             for notebook, row in setup["notebooks"].items()},
            f"estimated for {setup_name} by bench/accelerator_estimates.py (docs/accelerators.md), not measured: "
            f"the programs an H200 ran took {below:.0%} less to {-above:.0%} more than such estimates")


@functools.cache
def cpu_matmul_flops() -> float:
    """This process's CPU's float32 matmul speed (FLOP/s) at the `cpu` profile's `matmul_size`,
    the number 00_setup prints first, which `make course` records beside each notebook's time:
    timed once per process (best of five, under a second)."""
    return time_matmul(PROFILES["cpu"].matmul_size, jnp.float32)


CHOICES = ["detected", "cpu", "accelerator", "fp32-gpu", "ci"]  # the setup cell's form field


def said_minutes(ends: tuple[float, float], about: str = "about ") -> str:
    """(least, most) minutes, said to a learner: `about` whole minutes, a range where they round
    apart, or under a minute."""
    if ends[1] < 0.5:
        return "under a minute"
    least, most = max(round(ends[0]), 1), round(ends[1])
    return f"{about}{most} min" if least >= most else f"{about}{least}-{most} min"

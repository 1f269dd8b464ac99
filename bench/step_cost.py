"""How long a program takes on a chip, from three counts of its work and three rates measured on an H200.

A program's jaxpr (what JAX traces, before XLA fuses anything) is counted (`count`):
- `matmul_flops`: 2 x M x N x K of every dot_general;
- `bytes`: what every operation reads and writes, matmuls included (reshapes, broadcasts and
  control flow, which XLA does not materialise, left out);
- `operations`: how many operations other than matmuls it runs: each costs a fixed time
  (a GPU launches kernels one after another; a decoding step is mostly that).
A scan's body counts as many times as it loops, a while loop's as many times as the caller says
(decoding: one per new token, the most it runs).

Its time on a chip (`seconds`) is

    matmul_flops / (peak x matmul_efficiency) + bytes / (bandwidth x bandwidth_efficiency)
        + operations x seconds_per_operation,

the peak the data sheet's in the program's dtype (`Chip.peak`), the bandwidth its memory's. The
three rates are fitted (`calibrate`) to what bench/gpu.py measured on an H200 (`MEASURED`): the
train steps of T5.1.1-small and -base in bfloat16 and of -small in float32 (as TF32), and greedy
decoding of 8 and of 64 rows, least squares on the relative error. The bytes are counted
unfused, so `bandwidth_efficiency` comes out above 1: the H200 moves each counted byte once in
about three, the rest staying in registers and caches inside XLA's fusions.

Where the efficiencies of a chip's kind were not measured (`measured_kind`: a TPU; a GPU without
TF32 or bfloat16 tensor cores, computing in float32 on its CUDA cores) the time is a range: from
the larger of its compute and memory terms (the two overlapping fully: compute-bound or
memory-bound) to their sum (not overlapping, as the H200's fit has them), operations added to
both.
"""
import dataclasses
import hashlib
import json
import math
import pathlib
import types

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.extend import core

from t5nb import decode
from t5nb import mesh as mesh_lib
from t5nb.config import get_config
from t5nb.model import Transformer
from t5nb.profiles import chip_of, get_profile
from t5nb.trainer import Trainer, TrainConfig
from programs import abstract_batch  # bench/programs.py

BENCH = pathlib.Path(__file__).resolve().parent
RESULTS = BENCH / "results"
GPU_RESULTS = RESULTS / "gpu-20261126-093508-gpu.json"  # bench/gpu.py on an H200
# bench/compile.py's compile seconds: on this CPU, and on an H200's host (bench/accelerator_estimates.py)
COMPILE_RESULTS, GPU_COMPILE_RESULTS = RESULTS / "compile.json", RESULTS / "compile-h200.json"
# what bench/accelerator_estimates.py's estimate is counted from: the programs it traces (t5nb's
# code and profiles), the method, and the measurements it reads; `made_from` digests them, the
# estimate records the digest, and tests/test_estimates.py holds the committed one to today's files
ESTIMATE_INPUTS = (*sorted((BENCH.parent / "t5nb").rglob("*.py")), BENCH.parent / "t5nb" / "profiles.toml",
                   *(BENCH / name for name in ("step_cost.py", "accelerator_estimates.py", "programs.py")),
                   COMPILE_RESULTS, GPU_COMPILE_RESULTS, GPU_RESULTS)
# what JAX's jaxpr holds that XLA does not run as work of its own: shape changes and broadcasts
# (fused into their users), control flow and calls (their bodies are counted), random keys
NOT_WORK = {"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "iota", "pjit", "jit", "closed_call", "remat",
            "checkpoint", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "scan", "while", "cond",
            "sharding_constraint", "mesh_cast", "stop_gradient", "random_wrap", "random_unwrap", "random_seed",
            "random_bits", "threefry2x32"}


def made_from() -> str:
    """SHA-256 of `ESTIMATE_INPUTS`, each file's path (from the repository root) and bytes."""
    digest = hashlib.sha256()
    for path in ESTIMATE_INPUTS:
        digest.update(f"{path.relative_to(BENCH.parent)}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@dataclasses.dataclass
class Work:
    """A program's work: matmul FLOPs, bytes read and written, other operations."""

    matmul_flops: float = 0.0
    bytes: float = 0.0
    operations: float = 0.0

    def __add__(self, other):
        return Work(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def __mul__(self, times: float):
        return Work(*(a * times for a in dataclasses.astuple(self)))

    def split(self, chips: int):
        """One chip's share where `chips` split the batch: its matmuls and bytes, every operation."""
        return Work(self.matmul_flops / chips, self.bytes / chips, self.operations)


def _bytes(var) -> int:
    aval = var.aval
    return math.prod(aval.shape) * aval.dtype.itemsize if hasattr(aval.dtype, "itemsize") else 0  # keys: none


def count(jaxpr, loop_trips: int = 1) -> Work:
    """The `Work` of a jaxpr (a ClosedJaxpr's `.jaxpr`), a while loop's body counted `loop_trips`
    times, a scan's as many times as its length, a cond's last branch once."""
    work = Work()
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        inner = [(key, value.jaxpr if isinstance(value, core.ClosedJaxpr) else value)
                 for key, values in eqn.params.items()
                 for value in (values if isinstance(values, (tuple, list)) else [values])
                 if isinstance(value, (core.ClosedJaxpr, core.Jaxpr))]
        if inner:
            times = eqn.params["length"] if name == "scan" else loop_trips if name == "while" else 1
            bodies = inner[-1:] if name == "cond" else [body for key, body in inner if key != "cond_jaxpr"]
            for body in bodies:
                work += count(body, loop_trips) * times
        elif name == "dot_general":
            (_, rhs_contracting), (_, rhs_batch) = eqn.params["dimension_numbers"]
            lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
            free = math.prod(size for axis, size in enumerate(rhs) if axis not in (*rhs_contracting, *rhs_batch))
            work += Work(2 * math.prod(lhs) * free, sum(map(_bytes, (*eqn.invars, *eqn.outvars))), 0)
        elif name not in NOT_WORK:
            inputs = [var for var in eqn.invars if isinstance(var, core.Var)]  # literals are in the instruction
            work += Work(0, sum(map(_bytes, (*inputs, *eqn.outvars))), 1)
    return work


# -- the course's programs, traced from abstract inputs (nothing allocated, nothing compiled) ------
def traced(function, *args) -> core.ClosedJaxpr:
    return jax.jit(function).trace(*args).jaxpr


def train_step_work(trainer: Trainer, batch: dict, step: bool = True) -> Work:
    """`trainer`'s train step (or with `step=False` its teacher-forced eval step) on `batch`
    (shapes), remat "auto" counted as "minimal", what the chips the course is sized for choose
    for its steps (docs/accelerators.md)."""
    if trainer.model_config.remat_policy == "auto":
        trainer = Trainer(trainer.model_config.replace(remat_policy="minimal"), trainer.train_config, trainer.mesh,
                          trainer.rules)
    with mesh_lib.activation_sharding(trainer.mesh, trainer.rules):
        if step:
            return count(traced(trainer._train_step_fn, trainer.abstract_state(), {}, batch).jaxpr)
        sums = lambda params, b: trainer._sums(params, {}, b, None)[1]  # noqa: E731
        return count(traced(sums, trainer.abstract_state().params, batch).jaxpr)


def decoding_work(config, rows: int, lengths: dict) -> Work:
    """One batch of greedy decoding (`decode.greedy_decode`'s program) of `rows` inputs of
    `lengths["inputs"]` tokens, `lengths["targets"]` steps (the most it runs)."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
    tokens = jax.ShapeDtypeStruct((rows, lengths["inputs"]), jnp.int32)
    steps = lengths["targets"]
    program = traced(lambda s, t: decode._sample(nnx.merge(graphdef, s), t, jax.random.key(0), 0.0, 0, 1.0, rows, steps,
                                                 max_decode_length=steps, greedy=True, filtered=False), state, tokens)
    return count(program.jaxpr, loop_trips=steps)


def matmul_work(size: int, dtype) -> Work:
    """One size x size matmul (00_setup's)."""
    operand = jax.ShapeDtypeStruct((size, size), dtype)
    return count(traced(jnp.matmul, operand, operand).jaxpr)


# -- calibration on the H200 ----------------------------------------------------------------------
def measured_programs(phases: dict) -> dict:
    """{name: (Work, dtype, measured seconds)} of bench/gpu.py's H200 run (`phases` of
    `GPU_RESULTS`): the train steps at the `accelerator` and `fp32-gpu` profiles' shapes, the
    profile's execution (scanned layers, remat "minimal", the H200's choice), and greedy decoding."""
    mesh = mesh_lib.make_mesh(devices=jax.devices("cpu")[:1])
    programs = {}
    for phase, profile_name in (("train-small", "accelerator"), ("train-base", "accelerator"),
                                ("train-small-fp32", "fp32-gpu")):
        profile, dtype = get_profile(profile_name), phases[phase]["dtype"]
        config = get_config(phases[phase]["model"], dtype=jnp.dtype(dtype), dropout_rate=0.0, **profile.execution)
        trainer = Trainer(config, TrainConfig(warmup_steps=10_000), mesh)
        batch = abstract_batch(trainer, profile.batch_size, {"inputs": profile.inputs_length,
                                                              "targets": profile.targets_length}, True)
        programs[phase] = (train_step_work(trainer, batch), dtype, phases[phase]["step_s"])
    config = get_config("t5.1.1-small", dtype=jnp.bfloat16, dropout_rate=0.0)
    for rows in (8, 64):
        measured = phases["decode"][f"batch_{rows}"]
        work = decoding_work(config, rows, {"inputs": measured["inputs"], "targets": measured["new_tokens"]})
        programs[f"decode-{rows}"] = (work, "bfloat16", measured["s"])
    return programs


def calibrate() -> dict:
    """The three rates fitted to `measured_programs` (least squares on the relative error), and
    what the fit gives back for each measured program."""
    phases = json.loads(GPU_RESULTS.read_text())["phases"]
    programs = measured_programs(phases)
    chip = chip_of(types.SimpleNamespace(device_kind=phases["train-small"]["device"]))
    terms = {name: np.array([work.matmul_flops / chip.peak(dtype), work.bytes / chip.bandwidth, work.operations])
             for name, (work, dtype, _) in programs.items()}
    seconds = {name: s for name, (_, _, s) in programs.items()}
    rows = np.stack([terms[name] / seconds[name] for name in programs])
    solution, *_ = np.linalg.lstsq(rows, np.ones(len(programs)), rcond=None)
    rates = {"matmul_efficiency": 1 / solution[0], "bandwidth_efficiency": 1 / solution[1],
             "seconds_per_operation": solution[2]}
    return {"measured_on": chip.kind, "file": GPU_RESULTS.name, **rates,
            "given_back": {name: {"measured_s": seconds[name], "estimated_s": float(terms[name] @ solution),
                                  "matmul_share": float(terms[name][0] * solution[0] / (terms[name] @ solution))}
                           for name in programs}}


def measured_kind(chip, dtype: str) -> bool:
    """Whether `chip` computes `dtype` as the H200 did when measured: an NVIDIA GPU's tensor cores
    in bfloat16 or TF32. Not a TPU, nor float32 on a GPU without TF32 (its CUDA cores)."""
    return chip.platform == "gpu" and chip.peak_format(dtype) in ("bfloat16", "tf32")


def seconds(work: Work, chip, dtype: str, rates: dict) -> tuple[float, float]:
    """(least, most) seconds of `work` computing in `dtype` on `chip` at the calibrated `rates`:
    equal where the chip's kind was measured, else compute and memory overlapping fully, then not."""
    compute = work.matmul_flops / (chip.peak(dtype) * rates["matmul_efficiency"])
    memory = work.bytes / (chip.bandwidth * rates["bandwidth_efficiency"])
    operations = work.operations * rates["seconds_per_operation"]
    most = compute + memory + operations
    return (most if measured_kind(chip, dtype) else max(compute, memory) + operations), most

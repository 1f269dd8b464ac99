"""How long a program takes on a chip, from three counts of its work and three rates measured on an H200.

A program's jaxpr (what JAX traces, before XLA fuses anything) is counted (`count`):
- `matmul_flops`: 2 x M x N x K of every dot_general;
- `bytes`: what every operation reads and writes, matmuls included (reshapes, broadcasts and
  control flow, which XLA does not materialise, left out);
- `operations`: how many operations other than matmuls it runs: each takes at least a fixed
  time (a GPU launches kernels one after another; a decoding step is mostly that).
A scan's body counts as many times as it loops, a while loop's as many times as the caller says
(decoding: one per new token, the most it runs).

Its time on a chip (`seconds`) is one figure:

    seconds = matmul_flops / (peak x matmul_efficiency)
              + bytes / (bandwidth x bandwidth_efficiency) + operations x seconds_per_operation

the peak the data sheet's in the program's dtype (`Chip.peak`), never above a public measurement
of the chip's matmul rate (`MEASURED_MATMUL_RATES`), the bandwidth its memory's: launching the
operations not overlapped with their memory traffic, so a program that gave a rate is estimated
above its measured time. Each rate is measured on an H200 (`calibrate`), none fitted:
- `matmul_efficiency`: the share of the peak its matmul kernels reach in T5.1.1-small's bfloat16
  train step (the analytic FLOPs over the matmul kernels' time, bench/step_profile.py's profile);
- `bandwidth_efficiency`: that train step's measured time less its matmuls, over its counted
  bytes. The bytes are counted unfused, so it comes out above 1: the H200 moves a counted byte
  about once in three, the rest staying in registers and caches inside XLA's fusions;
- `seconds_per_operation`: greedy decoding of 8 rows, which launches 50,000 small kernels and
  moves little: its measured time less its matmuls, over its operations.
The other measured programs (-base's train step, -small's in float32 as TF32, decoding 64 rows)
are out of sample: `calibrate` gives each its estimate beside its time, and leaves out each of the
two that gave a rate in turn, the rate then coming from the other program of its kind
(`RATE_FROM`: the bandwidth from -base's step, the time per operation from decoding 64 rows).
Those five out-of-sample times over their estimates are the estimate's measured error (`error`).
"""
import ast
import dataclasses
import hashlib
import json
import math
import pathlib
import types

import jax
import jax.numpy as jnp
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
# bench/gpu.py's profile phase on an H200 (its analytic FLOPs) and where its steps' time goes, by kind
PROFILED_RESULTS = RESULTS / "gpu-20261126-205658-gpu.json"
PROFILE_RESULTS = RESULTS / "gpu-20261126-205658-gpu-profile.json"
# Public measurements of a chip's matmul rate (FLOP/s) in a dtype, above which no estimate assumes
# it: float32 on Colab's T4, 4.17 TFLOP/s, 51% of its data sheet (PyTorch; the table of the
# `torch-performance-test-data` repository on GitHub; Kaggle's T4s measured 4.43)
MEASURED_MATMUL_RATES = {("Tesla T4", "float32"): 4.17e12}
# The measurement each rate comes from, and the one it comes from where that one is left out
RATE_FROM = {"bandwidth_efficiency": ("train-small", "train-base"), "seconds_per_operation": ("decode-8", "decode-64")}
USED = {programs[0]: rate for rate, programs in RATE_FROM.items()}  # the rest: out of sample
# bench/compile.py's compile seconds: on this CPU, and on an H200's host (bench/accelerator_estimates.py)
COMPILE_RESULTS, GPU_COMPILE_RESULTS = RESULTS / "compile.json", RESULTS / "compile-h200.json"
PIPELINE_RESULTS = RESULTS / "pipeline.json"  # bench/pipeline.py's seconds per batch on 2 cores
SETUP_RESULTS = RESULTS / "setup_cell.json"  # bench/setup_cell.py's seconds of a hosted notebook's setup cell
# What bench/accelerator_estimates.py's estimate is counted from: the code that builds the programs
# it traces (the scripts and the t5nb modules they import, `estimate_code`), the profiles, the lock
# whose jax and flax trace them, and the measurements it reads. `made_from` digests them, the
# estimate records the digest, and tests/test_estimates.py holds the committed one to today's.
ESTIMATE_SCRIPTS = tuple(BENCH / name for name in ("step_cost.py", "accelerator_estimates.py", "programs.py"))
ESTIMATE_FILES = (BENCH.parent / "t5nb" / "profiles.toml", BENCH.parent / "requirements" / "base.lock", COMPILE_RESULTS,
                  GPU_COMPILE_RESULTS, PIPELINE_RESULTS, SETUP_RESULTS, GPU_RESULTS, PROFILED_RESULTS, PROFILE_RESULTS)
# what JAX's jaxpr holds that XLA does not run as work of its own: shape changes and broadcasts
# (fused into their users), control flow and calls (their bodies are counted), random keys
NOT_WORK = {"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "iota", "pjit", "jit", "closed_call", "remat",
            "checkpoint", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "scan", "while", "cond",
            "sharding_constraint", "mesh_cast", "stop_gradient", "random_wrap", "random_unwrap", "random_seed",
            "random_bits", "threefry2x32"}


def made_from() -> str:
    """SHA-256 of what the estimate is counted from: each file's path (from the repository root),
    then the code of `estimate_code` as Python's parser reads it (comments and docstrings left
    out: they change no program), or the bytes of each of `ESTIMATE_FILES`."""
    digest = hashlib.sha256()
    for path in (*estimate_code(), *ESTIMATE_FILES):
        digest.update(f"{path.relative_to(BENCH.parent)}\n".encode())
        digest.update(_code(path).encode() if path.suffix == ".py" else path.read_bytes())
    return digest.hexdigest()


def estimate_code() -> list:
    """`ESTIMATE_SCRIPTS` and every t5nb module they import, directly or through one another
    (imports inside functions too), in a fixed order."""
    package = BENCH.parent / "t5nb"
    found, todo = set(), list(ESTIMATE_SCRIPTS)
    while todo:
        path = todo.pop()
        if path in found:
            continue
        found.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
                     if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                if name.split(".")[0] == "t5nb":
                    module = package.joinpath(*name.split(".")[1:])
                    todo += [candidate for candidate in (module.with_suffix(".py"), module / "__init__.py")
                             if candidate.is_file()]
    return sorted(found)


def _code(path: pathlib.Path) -> str:
    """The module at `path` as parsed, without its docstrings: what runs."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


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


def stacked(work: Work, models: int) -> Work:
    """The work of `models` copies of a program run as one, `jax.vmap` over them (notebook 06's
    seeds, `Trainer.stacked_train_steps`): every FLOP and byte `models` times, each operation once."""
    return Work(work.matmul_flops * models, work.bytes * models, work.operations)


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
    """The three rates, each from one H200 measurement (see the module's docstring), and the
    estimate they give each measured program beside its time: two of them gave a rate, the other
    three are out of sample; then each program's estimate with the rates measured without it
    (`leave_one_out`), and the `error`: the least and most of measured over estimated seconds,
    out of sample."""
    phases = json.loads(GPU_RESULTS.read_text())["phases"]
    programs = measured_programs(phases)
    chip = chip_of(types.SimpleNamespace(device_kind=phases["train-small"]["device"]))
    profiled = json.loads(PROFILED_RESULTS.read_text())["phases"]["profile"]["small"]
    kernels_s = json.loads(PROFILE_RESULTS.read_text())["models"][profiled["model"]]["ms"]["matmuls"] / 1e3
    matmul_efficiency = profiled["analytic_flops"] / (kernels_s * profiled["peak_flops"])
    rates = rates_from(programs, chip, matmul_efficiency)
    given_back, leave_one_out = {}, {}
    for name, (work, dtype, measured) in programs.items():
        given_back[name] = {"measured_s": measured, "estimate_s": seconds(work, chip, dtype, rates),
                            "gave": USED.get(name, "nothing: out of sample")}
        without = rates if name not in USED else rates_from(programs, chip, matmul_efficiency, left_out=name)
        leave_one_out[name] = {"measured_s": measured, "estimate_s": seconds(work, chip, dtype, without),
                               "rates_from": {rate: measured_by(rate, left_out=name) for rate in RATE_FROM}}
    ratios = [row["measured_s"] / row["estimate_s"] for row in leave_one_out.values()]
    return {"measured_on": chip.kind, "file": GPU_RESULTS.name, "profile_file": PROFILE_RESULTS.name, **rates,
            "given_back": given_back, "leave_one_out": leave_one_out, "error": [min(ratios), max(ratios)]}


def rates_from(programs: dict, chip, matmul_efficiency: float, left_out: str | None = None) -> dict:
    """The rates, the matmuls' at `matmul_efficiency` and each of the others from its measured
    program (`RATE_FROM`), or from the other of its kind where that one is `left_out`: the
    program's measured seconds less its matmuls', over its bytes (`BY_WORK`) or its operations."""
    rates = {"matmul_efficiency": matmul_efficiency}
    for rate, (field, per) in BY_WORK.items():
        work, dtype, measured = programs[measured_by(rate, left_out)]
        rest_s = measured - work.matmul_flops / matmul_rate(chip, dtype, rates)
        rates[rate] = per(getattr(work, field), rest_s, chip)
    return rates


# Each rate from its program's seconds beyond the matmuls: the counted bytes moved at it times the
# memory's bandwidth, or each operation taking it
BY_WORK = {"bandwidth_efficiency": ("bytes", lambda counted, rest_s, chip: counted / (chip.bandwidth * rest_s)),
           "seconds_per_operation": ("operations", lambda counted, rest_s, chip: rest_s / counted)}


def measured_by(rate: str, left_out: str | None = None) -> str:
    """The measured program `rate` comes from (`RATE_FROM`), the other of its kind where that one is `left_out`."""
    first, other = RATE_FROM[rate]
    return other if first == left_out else first


def matmul_rate(chip, dtype: str, rates: dict) -> float:
    """The matmul FLOP/s assumed of `chip` in `dtype`: its peak at the measured matmul efficiency,
    at most what it was measured at in public (`MEASURED_MATMUL_RATES`)."""
    assumed = chip.peak(dtype) * rates["matmul_efficiency"]
    return min(assumed, MEASURED_MATMUL_RATES.get((chip.kind, jnp.dtype(dtype).name), assumed))


def seconds(work: Work, chip, dtype: str, rates: dict) -> float:
    """Seconds of `work` computing in `dtype` on `chip` at the measured `rates`: its matmuls, its
    bytes and its operations' launches one after another."""
    return (work.matmul_flops / matmul_rate(chip, dtype, rates)
            + work.bytes / (chip.bandwidth * rates["bandwidth_efficiency"])
            + work.operations * rates["seconds_per_operation"])

"""The accelerator course's FLOPs, memory and estimated wall time on every chip a learner gets.

    .venv/bin/python bench/accelerator_estimates.py
    PYTHONPATH=/tmp/libtpu .venv/bin/python bench/accelerator_estimates.py   # compiled for a TPU v5e
    .venv/bin/python bench/accelerator_estimates.py --recount   # the same programs, new compile seconds

Each setup (a chip of `profiles.CHIPS`, and how many: Colab's v5e-1 and T4, Kaggle's v5e-8 and
2 x T4, ...) gets the profile and dtype that detection gives it (`profiles.profile_name_for`,
`profiles.compute_dtype`). For each profile and dtype this compiles, with abstract inputs
(nothing allocated), the programs the course runs: the Trainer's train step (pretraining and
fine-tuning shapes), its teacher-forced eval step, and greedy decoding of an evaluation batch.
With libtpu importable (`pip install --no-deps --target /tmp/libtpu "libtpu==<the version
jax[tpu] pins>"`) XLA's TPU compiler compiles them ahead of time for a v5e chip, none needed;
otherwise XLA:CPU does, whose memory figures are far larger than a TPU's (no TPU fusion and
scheduling). XLA's cost analysis gives FLOPs and bytes accessed, its memory analysis the bytes
a program needs (arguments + outputs - donated + temporaries). Each program runs at the
efficiency its kind was measured at on an H200 by bench/gpu.py (`GPU_RESULTS`), against the
data sheet's peak: a train or eval step at the train step's MFU in its dtype, decoding at its
fraction of the roofline (the larger of FLOPs at peak and bytes at full bandwidth). The TPUs get
the same efficiencies: libtpu's cost model counts a scanned layer's time once, as its FLOPs, so it
cannot time the course's scanned programs (`optimal_seconds`: a scan of 8 matmuls costs 1.5 of one).
Several chips split each batch
(data parallel, as t5nb's mesh does): their time is one chip's over their count, an ideal
scaling, and their memory is one chip's running the whole batch, an upper bound. Prints the
docs/accelerators.md's table (scripts/estimates_table.py); writes bench/results/accelerator_estimates.json.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # this only compiles; a TPU target needs no TPU

import t5nb  # noqa: E402

t5nb.tune_host()  # first: its malloc setting must precede any other thread's first allocation

import dataclasses  # noqa: E402
import datetime  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from t5nb import decode  # noqa: E402
from t5nb import mesh as mesh_lib  # noqa: E402
from t5nb.model import Transformer  # noqa: E402
from t5nb.config import get_config  # noqa: E402
from t5nb.profiles import CHIPS, chip_of, compute_dtype, get_profile, profile_name_for  # noqa: E402
from t5nb.trainer import Trainer  # noqa: E402
from programs import abstract_batch, course_trainers  # noqa: E402  (bench/programs.py)

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
# bench/gpu.py's measurements on an H200: the efficiency of each kind of program (`efficiencies`)
GPU_RESULTS = RESULTS / "gpu-20261126-093508-gpu.json"
# its decode phase's batch of 64: T5.1.1-small in bfloat16, 512 input tokens, 64 new ones
DECODE_MEASURED = ("t5.1.1-small", 64, {"inputs": 512, "targets": 64})
# Compiling: bench/compile.py's seconds per notebook on this CPU (the course in order, compiled
# programs kept), times how much slower a chip's host compiles them, measured: for a TPU, XLA's
# TPU compiler against XLA:CPU on the same programs in this run (with libtpu; else 1, unmeasured);
# for a GPU, the accelerator course's seconds with `bench/compile.py --accelerator` on an H200
# (its host's 16 cores) over this CPU's, the same programs (a T4's host has 2 vCPUs: unmeasured).
COMPILE_RESULTS = RESULTS / "compile.json"
GPU_COMPILE_RESULTS = RESULTS / "compile-h200.json"
EVAL_BATCH = 64  # workflow.finetune_and_evaluate and 05_evaluation decode in batches of 64
# Validation examples of the profile's tasks (the course decodes split="validation"):
# WMT14 en-de validation is newstest2013; NQ-open dev; TriviaQA unfiltered.nocontext validation.
VALIDATION_EXAMPLES = {"wmt14_ende": {"wmt14_ende": 3000},
                       "closed_book_qa": {"nq_open": 3610, "triviaqa_nocontext": 11313}}


# (what docs/accelerators.md calls it, the chip in profiles.CHIPS, how many): the free ones first
SETUPS = [("Colab TPU v5e-1", "v5e", 1), ("Kaggle TPU v5e-8", "v5e", 8), ("Colab T4", "t4", 1),
          ("Kaggle 2 x T4", "t4", 2), ("Kaggle P100", "p100", 1), ("Colab Pro L4", "l4", 1),
          ("Colab Pro A100", "a100", 1), ("H100", "h100", 1)]


def compile_target() -> jax.sharding.Mesh:
    """A one-chip mesh to compile for: a TPU v5e when libtpu is importable (XLA's TPU compiler
    runs ahead of time without a TPU), else this CPU."""
    if importlib.util.find_spec("libtpu") is None:
        return mesh_lib.make_mesh(devices=jax.devices()[:1])
    topology = topologies.get_topology_desc(platform="tpu", topology_name="v5e:1x1", chip_config_name="default",
                                            chips_per_host_bounds=(1, 1, 1), num_slices=1)
    return mesh_lib.make_mesh(devices=topology.devices)


def compiled_cost(jitted, *args) -> dict:
    """FLOPs, bytes accessed, memory (arguments + outputs - donated + temporaries) and compile
    seconds of `jitted` compiled for `args`."""
    return cost_of(lambda: jitted.lower(*args).compile())


def cost_of(compile) -> dict:
    """`compiled_cost` of the program `compile()` returns, its compile time included."""
    start = time.perf_counter()
    compiled = compile()
    seconds = time.perf_counter() - start
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    memory = compiled.memory_analysis()
    return {"flops": cost["flops"], "bytes_accessed": cost["bytes accessed"], "compile_s": round(seconds, 1),
            "memory": memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
            + memory.temp_size_in_bytes}


def train_step(trainer: Trainer, batch: dict) -> dict:
    """`trainer`'s own train step (`Trainer.compile_train_step`), for its abstract state."""
    cost = cost_of(lambda: trainer.compile_train_step(trainer.abstract_state(), batch))
    return {**cost, "flops": unrolled_flops(trainer, batch, step=True)}


def eval_step(trainer: Trainer, batch: dict) -> dict:
    """`trainer`'s teacher-forced eval step, as `Trainer.eval_step` jits it."""
    with mesh_lib.activation_sharding(trainer.mesh, trainer.rules):
        cost = compiled_cost(jax.jit(lambda p, b: trainer._sums(p, trainer.frozen, b, None)[1]),
                             trainer.abstract_state().params, batch)
    return {**cost, "flops": unrolled_flops(trainer, batch, step=False)}


def unrolled_flops(trainer: Trainer, batch: dict, step: bool) -> float:
    """FLOPs of `trainer`'s train step (or eval step) with its layers unrolled, from XLA's cost
    analysis of the program lowered for this CPU (nothing compiled; the count does not depend
    on the chip): the analysis counts a scanned stack's layer once. The recomputation a remat
    policy adds (elementwise work) is left out."""
    twin = Trainer(trainer.model_config.replace(scan_layers=False, remat_policy="none"), trainer.train_config,
                   mesh_lib.make_mesh(devices=jax.devices("cpu")[:1]), trainer.rules)
    state = twin.abstract_state()
    batch = {name: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=twin.batch_sharding) for name, x in batch.items()}
    with mesh_lib.activation_sharding(twin.mesh, twin.rules):
        lowered = (jax.jit(twin._train_step_fn).lower(state, {}, batch) if step
                   else jax.jit(lambda p, b: twin._sums(p, {}, b, None)[1]).lower(state.params, batch))
    cost = lowered.cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["flops"]


def greedy_decoding(config, mesh, batch_size: int, lengths: dict) -> dict:
    """One batch of `decode.greedy_decode`, `lengths["targets"]` steps (the loop may stop sooner).
    XLA's cost analysis counts a while loop's body once, so the steps are counted here: the
    whole program less encoding + cache is one step."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
    on_mesh = NamedSharding(mesh, PartitionSpec())
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on_mesh), state)
    tokens = jax.ShapeDtypeStruct((batch_size, lengths["inputs"]), jnp.int32, sharding=on_mesh)
    steps = lengths["targets"]
    start = compiled_cost(jax.jit(lambda s, t: decode._start(nnx.merge(graphdef, s), t, steps)), state, tokens)
    whole = compiled_cost(jax.jit(lambda s, t: decode._sample(
        nnx.merge(graphdef, s), t, jax.random.key(0), 0.0, 0, 1.0, batch_size, steps, max_decode_length=steps,
        greedy=True, filtered=False)),
        state, tokens)
    return {**{name: start[name] + steps * (whole[name] - start[name]) for name in ("flops", "bytes_accessed")},
            "memory": whole["memory"], "compile_s": start["compile_s"] + whole["compile_s"]}


def measured_decoding(mesh) -> dict:
    """The program of bench/gpu.py's measured decoding (`DECODE_MEASURED`), compiled for `mesh`."""
    model, batch_size, lengths = DECODE_MEASURED
    return greedy_decoding(get_config(model, dtype=jnp.bfloat16, dropout_rate=0.0), mesh, batch_size, lengths)


def programs_in(dtype, mesh, profile) -> dict:
    """Every program of the course, computing in `dtype`, compiled for `mesh`'s chip."""
    costs = {}
    for name, (trainer, lengths, packed) in course_trainers(profile, dtype, mesh).items():
        if name == "decode_batch":
            costs[name] = greedy_decoding(trainer.model_config, mesh, EVAL_BATCH, lengths)
            continue
        batch = abstract_batch(trainer, profile.batch_size, lengths, packed)
        costs[name] = eval_step(trainer, batch) if name == "eval_step" else train_step(trainer, batch)
    return costs


def course(profile) -> dict:
    """Per notebook: its training runs, decoded examples and how many times it runs each program.
    03 and 04 fine-tune from the pretraining, from scratch and from the official checkpoint and
    decode the validation set after each (03 also fine-tunes T5X's checkpoint and runs its
    sample-efficiency curve and LoRA and prompt tuning); 05 fine-tunes once (4 checkpoints, the last 3 kept),
    teacher-forces the validation set, decodes it at the end (infer_eval) and at each kept
    checkpoint (evaluate_checkpoints)."""
    def decoded(task):
        return [min(n, profile.eval_examples or n) for n in VALIDATION_EXAMPLES[task].values()]

    def batches(examples):
        return sum(math.ceil(n / EVAL_BATCH) for n in examples)

    wmt, qa = decoded(profile.finetune_task), decoded(profile.qa_task)
    steps = profile.finetune_steps
    forced = sum(VALIDATION_EXAMPLES[profile.qa_task].values()) // profile.batch_size  # full batches
    return {
        "02_pretraining": {"runs": 1, "examples": 0, "counts": {"pretrain_step": profile.pretrain_steps}},
        "03_finetuning": {"runs": 12, "examples": 12 * sum(wmt),  # + T5X's, the sample-efficiency curve's 6 runs
                          # and 2 adapter runs, whose steps count as full fine-tuning steps (an upper bound: no
                          # weight gradients)
                          "counts": {"finetune_step": 6 * steps + 6 * profile.transfer_steps,
                                     "decode_batch": 12 * batches(wmt)}},
        "04_closed_book_qa": {"runs": 3, "examples": 3 * sum(qa),
                              "counts": {"finetune_step": 3 * steps, "decode_batch": 3 * batches(qa)}},
        "05_evaluation": {"runs": 1, "examples": 4 * sum(qa),
                          "counts": {"finetune_step": steps, "eval_step": forced, "decode_batch": 4 * batches(qa)}},
    }


def roofline_seconds(chip, dtype: str, program: dict) -> float:
    """The least time a program can take: the larger of its FLOPs at the chip's peak in `dtype`
    and XLA's bytes accessed at the chip's full memory bandwidth."""
    return max(program["flops"] / chip.peak(dtype), program["bytes_accessed"] / chip.bandwidth)


def seconds_on(chip, dtype: str, name: str, program: dict, efficiency: dict) -> float:
    """Training and eval steps: FLOPs at the measured train step's MFU in `dtype`. Decoding,
    little arithmetic per byte: its roofline time over the measured decoding's fraction of it."""
    if name == "decode_batch":
        return roofline_seconds(chip, dtype, program) / efficiency["decode_batch"]
    return program["flops"] / (chip.peak(dtype) * efficiency["train_step"][dtype])


def efficiencies(decode_measured: dict) -> dict:
    """What bench/gpu.py measured on an H200 (`GPU_RESULTS`), each against the data sheet's peak:
    T5.1.1-small's train step at the accelerator course's shape in bfloat16, and at the fp32-gpu
    profile's in float32 (TF32's peak: JAX's default matmul precision there), as MFU (model FLOPs,
    `train_step_flops`); greedy decoding's roofline time over its measured time, for
    `decode_measured` (`DECODE_MEASURED`'s program, compiled here: for a v5e where libtpu is
    importable, so the ratio calibrates that program's bytes against the H200's time, not the
    H200 program's own fraction of its roofline). Eval steps were not timed:
    they get the train step's MFU."""
    phases = json.loads(GPU_RESULTS.read_text())["phases"]
    chip = chip_of(types.SimpleNamespace(device_kind=phases["train-small"]["device"]))

    def mfu(phase):
        return phases[phase]["analytic_flops"] / phases[phase]["step_s"] / chip.peak(phases[phase]["dtype"])

    decode_s = phases["decode"]["batch_64"]["s"]
    return {"measured_on": chip.kind, "file": GPU_RESULTS.name,
            "train_step": {"bfloat16": mfu("train-small"), "float32": mfu("train-small-fp32")},
            "decode_batch": roofline_seconds(chip, "bfloat16", decode_measured) / decode_s}


def compile_ratios(mesh, programs: dict) -> dict:
    """How many times longer a chip's host compiles a program than this CPU (see COMPILE_RESULTS)."""
    tpu = 1.0
    if mesh.devices.flat[0].platform == "tpu":  # the same programs compiled for this CPU as well
        cpu_mesh = mesh_lib.make_mesh(devices=jax.devices("cpu")[:1])
        tpu_s = cpu_s = 0.0
        for key, compiled in programs.items():
            profile_name, dtype = key.split()
            on_cpu = programs_in(jnp.dtype(dtype), cpu_mesh, get_profile(profile_name))
            tpu_s += sum(program["compile_s"] for program in compiled.values())
            cpu_s += sum(program["compile_s"] for program in on_cpu.values())
        tpu = tpu_s / cpu_s
    return {"tpu": round(tpu, 2)}


def gpu_compile_ratio() -> float:
    """The accelerator course's compile seconds on an H200 over those on this CPU (first runs)."""
    return sum(compile_seconds("accelerator", GPU_COMPILE_RESULTS).values()) / sum(
        compile_seconds("accelerator").values())


def compile_seconds(profile_name: str, path: pathlib.Path = COMPILE_RESULTS) -> dict:
    """bench/compile.py's measured compile seconds per notebook (this CPU's, or `path`'s), the
    course run in order."""
    measured = json.loads(path.read_text())
    first = measured["results"][measured["current"]][profile_name]["first"]
    return {notebook: sum(seconds["trace"] + seconds["compile"] for seconds in programs.values())
            for notebook, programs in first.items()}


def estimate() -> dict:
    started = time.perf_counter()
    mesh = compile_target()
    programs = {}  # "<profile> <dtype>" -> its programs
    for chip, _, profile_name in setups().values():
        dtype = jnp.dtype(compute_dtype(chip.device())).name
        if f"{profile_name} {dtype}" not in programs:
            programs[f"{profile_name} {dtype}"] = programs_in(jnp.dtype(dtype), mesh, get_profile(profile_name))
    result = {"date": datetime.date.today().isoformat(), "commit": commit(),
              "compiled_for": mesh.devices.flat[0].device_kind, "bench_seconds": round(time.perf_counter() - started),
              "profiles": {name: dataclasses.asdict(get_profile(name)) for name in {p for *_, p in setups().values()}},
              "assumptions": {"decode_measured": measured_decoding(mesh),
                              "compile_ratios": compile_ratios(mesh, programs),
                              "eval_batch": EVAL_BATCH, "validation_examples": VALIDATION_EXAMPLES,
                              "chips": {key: dataclasses.asdict(CHIPS[key]) for _, key, _ in SETUPS}},
              "programs": programs}
    return count(result)


def setups() -> dict:
    """name -> (chip, how many, the profile detection gives it)."""
    return {name: (CHIPS[key], count, profile_name_for(CHIPS[key].device())) for name, key, count in SETUPS}


def count(result: dict) -> dict:
    """`result` with each setup's minutes per notebook: its programs' compute, and compiling for
    `COMPILE_RESULTS`' seconds times the chip's ratio."""
    ratios = {**result["assumptions"]["compile_ratios"], "gpu": round(gpu_compile_ratio(), 2)}
    efficiency = efficiencies(result["assumptions"]["decode_measured"])
    results = {}
    for name, (chip, count, profile_name) in setups().items():
        dtype = jnp.dtype(compute_dtype(chip.device())).name
        compiled, notebooks = result["programs"][f"{profile_name} {dtype}"], {}
        cpu_compile_s = compile_seconds(profile_name)
        # one run of each program on `count` chips, splitting its batch
        seconds = {program: seconds_on(chip, dtype, program, cost, efficiency) / count
                   for program, cost in compiled.items()}
        for notebook, plan in course(get_profile(profile_name)).items():
            counts = plan["counts"]
            compute = sum(n * seconds[program] for program, n in counts.items())
            compiling = cpu_compile_s[notebook] * ratios[chip.platform]
            notebooks[notebook] = {
                "training_runs": plan["runs"], "decoded_examples": plan["examples"],
                "train_steps": counts.get("pretrain_step", 0) + counts.get("finetune_step", 0),
                "minutes": (compute + compiling) / 60, "compute_minutes": compute / 60,
                "compile_minutes": compiling / 60,
                "memory_gb": max(compiled[program]["memory"] for program in counts) / 1e9}
        compute_minutes = sum(row["compute_minutes"] for row in notebooks.values())
        compile_minutes = sum(row["compile_minutes"] for row in notebooks.values())
        memory_gb = max(row["memory_gb"] for row in notebooks.values())
        results[name] = {"chip": chip.kind, "chips": count, "profile": profile_name, "dtype": dtype,
                         "notebooks": notebooks, "minutes": compute_minutes + compile_minutes,
                         "seconds_per_run": seconds,
                         "compute_minutes": compute_minutes, "compile_minutes": compile_minutes,
                         "memory_gb": memory_gb, "fits_in_memory": memory_gb * 1e9 <= chip.memory,
                         "train_mfu": efficiency["train_step"][dtype],
                         # the train step's MFU at which the course takes an hour, every program sped up alike
                         "mfu_for_60_minutes": compute_minutes * efficiency["train_step"][dtype] / (60 - compile_minutes)}
    compile_results = json.loads(COMPILE_RESULTS.read_text())
    return {**result, "assumptions": {**result["assumptions"], "efficiency": efficiency, "compile_ratios": ratios,
                                      "compile_results": {
        "file": COMPILE_RESULTS.name, "commit": compile_results["current"], "cpu": compile_results["cpu"],
        "gpu_file": GPU_COMPILE_RESULTS.name}}, "setups": results}


def commit() -> str:
    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=pathlib.Path(__file__).parent)
    return run.stdout.strip() or "unknown"


def estimates_table():
    """scripts/estimates_table.py, which writes the docs' tables from this script's JSON."""
    script = RESULTS.parents[1] / "scripts" / "estimates_table.py"
    spec = importlib.util.spec_from_file_location("estimates_table", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    path = RESULTS / "accelerator_estimates.json"
    # --recount: the course times again from the programs kept in the JSON, for new compile seconds
    result = count(json.loads(path.read_text())) if "--recount" in sys.argv[1:] else estimate()
    print(estimates_table().table(result))
    efficiency = result["assumptions"]["efficiency"]
    print(f"\ncompiled for {result['compiled_for']} in {result['bench_seconds']} s; measured on an {efficiency['measured_on']}: "
          f"train step MFU {efficiency['train_step']['bfloat16']:.1%} (bfloat16), "
          f"{efficiency['train_step']['float32']:.1%} (float32 as TF32), decoding "
          f"{efficiency['decode_batch']:.2f} x the roofline of its program compiled for {result['compiled_for']}; "
          f"compiling {result['assumptions']['compile_ratios']} "
          f"times this CPU's {COMPILE_RESULTS.name}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""t5nb on a GPU, side by side with transformers' PyTorch T5 on the same GPU (issue #28).

    python bench/gpu.py --make-curve-batches      # here (TensorFlow): real batches for `curves`
    python bench/gpu.py [--sections S ...]        # on the GPU machine (no TensorFlow needed)
    python bench/gpu.py --quick                   # the harness end to end on a CPU, t5.1.1-tiny

Sections (each fits one device call; `--sections` picks):
- `train`: T5.1.1-small and -base train steps in bfloat16 and float32 at the accelerator
  course's shape (64 x 512/114) and at the largest batch whose planned memory fits the device:
  t5nb's step time, compile time, peak device memory and MFU against the matmul peak measured
  in this process; transformers with the same weights and batch, eager and `torch.compile`,
  bfloat16 autocast (bench/run.py's harness);
- `decode`: greedy decoding against `generate` (tokens compared) and beam search (4 beams);
- `adapters`: a LoRA and a prompt-tuning step beside the full step;
- `cap`: every program of the `accelerator` (bfloat16) and `fp32-gpu` (float32) courses run
  once in a process of its own whose JAX may use 16 GB (`XLA_PYTHON_CLIENT_MEM_FRACTION`): it
  fits a T4 or a v5e when it runs;
- `curves`: CURVE_STEPS pretraining steps of the accelerator course's model on real batches
  made here (`--make-curve-batches`: C4's span corruption, from the stand-in under
  T5NB_STANDINS or from C4 itself), bfloat16 against float32 from the same initialisation: the
  losses every CURVE_EVERY steps and their largest relative difference.

Writes bench/results/gpu-<stamp>-<backend>[-quick].json and prints each section's lines.
"""
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # bench/run.py's harness

import run as harness  # noqa: E402  (tunes the host and imports torch first)

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from t5nb import checkpoints, decode  # noqa: E402
from t5nb import mesh as mesh_lib  # noqa: E402
from t5nb.config import get_config  # noqa: E402
from t5nb.profiles import get_profile  # noqa: E402
from t5nb.trainer import Trainer, TrainConfig  # noqa: E402
from programs import PROGRAMS, TRAIN_STEPS, course_trainers  # noqa: E402  (bench/programs.py)

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
CURVE_BATCHES = pathlib.Path(__file__).resolve().parent / "gpu_curve_batches.npz"  # made here, carried there
CURVE_STEPS, CURVE_EVERY, CURVE_BATCH = 300, 10, 32
CAP_BYTES = 16 * 10**9  # a T4's and a v5e's memory
EVAL_BATCH = 64  # the course decodes in batches of 64
COURSE = "accelerator"


def sizes(quick: bool) -> dict:
    """What each section runs: real shapes on the GPU, t5.1.1-tiny on a CPU (`--quick`)."""
    if quick:
        return {"presets": ["t5.1.1-tiny"], "batch": 4, "lengths": (64, 16), "repeats": 2, "decode_batch": 2,
                "new_tokens": 8, "curve_steps": 20, "cap_profiles": {"rehearsal": "float32"}}
    profile = get_profile(COURSE)
    return {"presets": ["t5.1.1-small", "t5.1.1-base"], "batch": profile.batch_size,
            "lengths": (profile.inputs_length, profile.targets_length), "repeats": 10, "decode_batch": 8,
            "new_tokens": 64, "curve_steps": CURVE_STEPS, "cap_profiles": {COURSE: "bfloat16", "fp32-gpu": "float32"}}


def device_bytes() -> int | None:
    """The device's memory as JAX's allocator may use it; None on a CPU."""
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_limit")


# -- train ---------------------------------------------------------------------------------
def bench_hf_compiled(hf_dir: str, batch: dict, dtype: str, repeats: int) -> dict:
    """bench/run.py's transformers step with the model through `torch.compile`."""
    try:
        return harness.bench_hf(hf_dir, batch, dtype, 2, repeats, compiled=True)
    except Exception as error:  # inductor needs a compiler and a supported device; report why not
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}


def largest_batch(config, train_config, lengths: tuple, start: int) -> int:
    """The largest power-of-two multiple of `start` whose train step XLA plans within the device's memory."""
    limit, batch = device_bytes(), start
    if limit is None:
        return start
    while True:
        trainer = Trainer(config, train_config, mesh_lib.make_mesh(devices=jax.devices()[:1]))
        planned = trainer.train_step_memory(harness.make_batch(config, 2 * batch, *lengths))
        if planned > 0.9 * limit:
            return batch
        batch *= 2


def train_section(plan: dict) -> list[dict]:
    runs = []
    for preset in plan["presets"]:
        for dtype in ("bfloat16", "float32"):
            config = get_config(preset, dtype=jnp.dtype(dtype), dropout_rate=0.0)
            train_config = TrainConfig(learning_rate=harness.LEARNING_RATE)
            batches = sorted({plan["batch"], largest_batch(config, train_config, plan["lengths"], plan["batch"])})
            for batch_size in batches:
                print(f"train: {preset} {dtype} batch {batch_size}", flush=True)
                runs.append({"preset": preset, **train_run(config, train_config, batch_size, plan)})
    return runs


def train_run(config, train_config, batch_size: int, plan: dict) -> dict:
    inputs, targets = plan["lengths"]
    batch = harness.make_batch(config, batch_size, inputs, targets)
    trainer = Trainer(config, train_config, mesh_lib.make_mesh(devices=jax.devices()[:1]))
    params = jax.device_get(trainer.init_params())
    dtype = jnp.dtype(config.dtype).name
    with tempfile.TemporaryDirectory() as hf_dir:
        checkpoints.save_hf(trainer.model(params), hf_dir)
        hf = {"eager": harness.bench_hf(hf_dir, batch, dtype, 1, plan["repeats"]),
              "compiled": bench_hf_compiled(hf_dir, batch, dtype, plan["repeats"])}
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    ours = harness.bench_t5nb(trainer, params, batch, 1, plan["repeats"])
    flops = harness.analytic_train_flops(config, batch_size, inputs, targets)
    result = {"dtype": dtype, "batch": batch_size, "lengths": [inputs, targets],
              "analytic_flops": flops, "t5nb": ours, "hf": hf}
    for run in (ours, *(r for r in hf.values() if "step_s" in r)):
        run["flops_per_s"] = flops / run["step_s"]
    best_hf = min((r["step_s"] for r in hf.values() if "step_s" in r), default=None)
    result["speedup_vs_best_hf"] = best_hf / ours["step_s"] if best_hf else None
    return result


# -- decode --------------------------------------------------------------------------------
def decode_section(plan: dict) -> dict:
    preset = plan["presets"][0]
    config = get_config(preset, dtype=jnp.bfloat16 if jax.default_backend() != "cpu" else jnp.float32,
                        dropout_rate=0.0)
    trainer = Trainer(config, TrainConfig())
    model = trainer.model(trainer.init_params())
    tokens = harness.make_batch(config, plan["decode_batch"], plan["lengths"][0], 1, seed=1)["encoder_input_tokens"]
    inputs = torch.from_numpy(tokens.astype(np.int64)).to(harness.torch_device())
    n = plan["new_tokens"]
    result = {"preset": preset, "dtype": jnp.dtype(config.dtype).name, "batch": len(tokens), "new_tokens": n}
    with tempfile.TemporaryDirectory() as hf_dir:
        checkpoints.save_hf(model, hf_dir)
        hf_model = transformers.T5ForConditionalGeneration.from_pretrained(hf_dir).to(harness.torch_device()).eval()
        for method, beams in (("greedy", 1), ("beam", 4)):
            out = {}

            def ours():
                decoded = (decode.greedy_decode(model, tokens, n) if beams == 1
                           else decode.beam_search(model, tokens, n, num_decodes=beams, alpha=0.0))
                out["t5nb"] = np.asarray(decoded.sequences)

            def hf():
                with torch.no_grad(), torch.autocast(harness.torch_device().type, torch.bfloat16,
                                                     enabled=result["dtype"] == "bfloat16"):
                    out["hf"] = hf_model.generate(inputs, attention_mask=inputs > 0, do_sample=False, num_beams=beams,
                                                  use_cache=True, max_new_tokens=n, min_new_tokens=n,
                                                  **({"length_penalty": 0.0} if beams > 1 else {})  # as alpha=0
                                                  ).cpu().numpy()[:, 1:]
                harness.torch_sync()

            row = {}
            for name, fn in (("t5nb", ours), ("hf", hf)):
                first, times = harness.timed_steps(fn, 1, plan["repeats"])
                row[name] = {"s": statistics.median(times), "first_call_s": first}
            ours_tokens = out["t5nb"].reshape(len(tokens), -1, out["t5nb"].shape[-1])[:, 0, :n]
            row["same_tokens_frac"] = float(np.mean(ours_tokens == out["hf"][:, :n]))
            row["speedup_vs_hf"] = row["hf"]["s"] / row["t5nb"]["s"]
            result[method] = row
            print(f"decode {method}: t5nb {row['t5nb']['s']:.3f} s, hf {row['hf']['s']:.3f} s, "
                  f"same tokens {row['same_tokens_frac']:.0%}", flush=True)
    return result


# -- adapters ------------------------------------------------------------------------------
def adapters_section(plan: dict) -> list[dict]:
    preset, (inputs, targets) = plan["presets"][-1], plan["lengths"]
    dtype = jnp.bfloat16 if jax.default_backend() != "cpu" else jnp.float32
    runs = []
    for name, changes, train_config in (
            ("full", {}, TrainConfig(learning_rate=1e-3)),
            ("lora rank 8", {"lora_rank": 8}, TrainConfig(learning_rate=1e-3, parameter_scale=False)),
            ("prompt 20", {"prompt_length": 20}, TrainConfig(learning_rate=0.3, parameter_scale=False))):
        config = get_config(preset, dtype=dtype, dropout_rate=0.0, **changes)
        trainer = Trainer(config, train_config, mesh_lib.make_mesh(devices=jax.devices()[:1]))
        batch = harness.make_batch(config, plan["batch"], inputs, targets)
        ours = harness.bench_t5nb(trainer, None, batch, 1, plan["repeats"])
        runs.append({"method": name, "preset": preset, "dtype": jnp.dtype(dtype).name, "batch": plan["batch"], **ours})
        print(f"adapters: {name} step {ours['step_s']:.4f} s, compile {ours['compile_s']:.1f} s", flush=True)
    return runs


# -- cap -----------------------------------------------------------------------------------
def course_programs(profile, dtype, mesh) -> dict:
    """bench/programs.py's course programs with concrete batches: name -> (Trainer, batch)."""
    programs = {}
    for name, (trainer, lengths, packed) in course_trainers(profile, dtype, mesh).items():
        make = packed_batch if packed else harness.make_batch
        programs[name] = (trainer, make(trainer.model_config, profile.batch_size, lengths["inputs"], lengths["targets"]))
    return programs


def packed_batch(config, batch_size: int, inputs: int, targets: int) -> dict:
    """A packed pretraining batch's features: two examples a row."""
    batch = harness.make_batch(config, batch_size, inputs, targets)
    for name, length in (("encoder", inputs), ("decoder", targets)):
        half = length // 2
        batch[f"{name}_segment_ids"] = np.repeat(np.r_[np.ones(half, np.int32), np.full(length - half, 2, np.int32)][None],
                                                 batch_size, 0)
        batch[f"{name}_positions"] = np.repeat(np.r_[np.arange(half), np.arange(length - half)][None].astype(np.int32),
                                               batch_size, 0)
    return batch


def run_program(profile_name: str, dtype: str, program: str) -> dict:
    """One course program run once here (the cap's child process): its peak device memory."""
    profile = get_profile(profile_name)
    trainer, batch = course_programs(profile, jnp.dtype(dtype), mesh_lib.make_mesh(devices=jax.devices()[:1]))[program]
    state = trainer.init_state()
    if program in TRAIN_STEPS:
        state, out = trainer.train_step(state, trainer.shard_batch(batch))
    elif program == "eval_step":
        out = trainer.eval_step(state.params, trainer.shard_batch(batch))
    else:
        tokens = batch["encoder_input_tokens"][:EVAL_BATCH]
        tokens = np.resize(tokens, (EVAL_BATCH, tokens.shape[1]))
        out = decode.greedy_decode(trainer.model(state.params), tokens, profile.finetune_targets_length).sequences
    jax.block_until_ready(out)
    stats = jax.devices()[0].memory_stats() or {}
    return {"peak_device_mb": stats.get("peak_bytes_in_use", 0) / 2**20 or None,
            "planned_mb": trainer.train_step_memory(batch) / 2**20 if program in TRAIN_STEPS else None}


def cap_section(plan: dict) -> list[dict]:
    limit = device_bytes()
    fraction = min(1.0, CAP_BYTES / limit) if limit else None
    rows = []
    for profile_name, dtype in plan["cap_profiles"].items():
        for program in PROGRAMS:
            env = {**os.environ, **({"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{fraction:.4f}"} if fraction else {})}
            child = subprocess.run([sys.executable, __file__, "--child", profile_name, dtype, program],
                                   capture_output=True, text=True, env=env)
            row = {"profile": profile_name, "dtype": dtype, "program": program, "cap_gb": CAP_BYTES / 1e9 if fraction else None,
                   "fits": child.returncode == 0}
            if child.returncode == 0:
                row.update(json.loads(child.stdout.strip().splitlines()[-1]))
            else:
                row["error"] = (child.stderr.strip().splitlines() or ["exit %d" % child.returncode])[-1][:300]
            rows.append(row)
            print(f"cap: {profile_name} {dtype} {program}: {'fits' if row['fits'] else row['error']}", flush=True)
    return rows


# -- curves --------------------------------------------------------------------------------
def make_curve_batches(steps: int = CURVE_STEPS) -> None:
    """Here, with TensorFlow: CURVE_STEPS packed span-corruption batches of the accelerator
    course's pretraining task (CURVE_BATCH rows), tokens as uint16, into CURVE_BATCHES."""
    from t5nb import tasks, workflow  # the input pipeline: TensorFlow, on this machine only

    profile = get_profile(COURSE)
    iterator = tasks.BatchIterator(profile.pretrain_task, workflow.feature_lengths(profile), CURVE_BATCH, seed=0)
    features = [next(iterator) for _ in range(steps)]
    arrays = {name: np.stack([f[name] for f in features]) for name in features[0]}
    arrays = {name: a.astype(np.uint16) if "tokens" in name else a.astype(np.int16) for name, a in arrays.items()}
    np.savez_compressed(CURVE_BATCHES, **arrays)
    print(f"{CURVE_BATCHES}: {steps} batches of {CURVE_BATCH}, {CURVE_BATCHES.stat().st_size / 2**20:.1f} MB")


def curves_section(plan: dict) -> dict:
    if CURVE_BATCHES.exists():
        stored = np.load(CURVE_BATCHES)
        batches = [{name: stored[name][i].astype(np.int32) for name in stored.files} for i in range(len(stored["encoder_input_tokens"]))]
        source = CURVE_BATCHES.name
    else:  # the harness without them: random full-length batches
        config = get_config(plan["presets"][0])
        batches = [harness.make_batch(config, plan["batch"], *plan["lengths"], seed=i) for i in range(plan["curve_steps"])]
        source = "random tokens"
    batches = batches[:plan["curve_steps"]]
    preset = plan["presets"][0]
    losses = {}
    for dtype in ("float32", "bfloat16"):
        trainer = Trainer(get_config(preset, dtype=jnp.dtype(dtype), dropout_rate=0.0),
                          TrainConfig(warmup_steps=10_000), mesh_lib.make_mesh(devices=jax.devices()[:1]))
        state, curve = trainer.init_state(), []
        for step, batch in enumerate(batches, 1):
            state, sums = trainer.train_step(state, trainer.shard_batch(batch))
            if step % CURVE_EVERY == 0 or step == len(batches):
                sums = jax.device_get(sums)
                curve.append(float(sums["loss"] / sums["weight"]))
        losses[dtype] = curve
        print(f"curves: {dtype} losses {', '.join(f'{x:.3f}' for x in curve)}", flush=True)
    relative = np.abs(np.subtract(losses["bfloat16"], losses["float32"])) / np.asarray(losses["float32"])
    return {"preset": preset, "batches": source, "steps": len(batches), "every": CURVE_EVERY, "losses": losses,
            "max_relative_difference": float(relative.max()),
            "last_relative_difference": float(relative[-1])}


SECTIONS = {"train": train_section, "decode": decode_section, "adapters": adapters_section, "cap": cap_section,
            "curves": curves_section}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    parser.add_argument("--quick", action="store_true", help="t5.1.1-tiny at toy shapes: the harness on a CPU")
    parser.add_argument("--make-curve-batches", action="store_true", help="write the curves' batches (needs TensorFlow)")
    parser.add_argument("--child", nargs=3, metavar=("PROFILE", "DTYPE", "PROGRAM"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_program(*args.child)))
        return
    if args.make_curve_batches:
        make_curve_batches()
        return
    plan = sizes(args.quick)
    peak_n = 1024 if args.quick else 8192
    results = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "quick": args.quick,
               "device": harness.describe_device(), "peaks": harness.matmul_peaks(peak_n)}
    for name in args.sections:
        results[name] = SECTIONS[name](plan)
    for run in results.get("train", []):
        peak = results["peaks"]["jax_bf16" if run["dtype"] == "bfloat16" else "jax_fp32"]
        run["mfu"] = run["t5nb"]["flops_per_s"] / peak
        print(f"train {run['preset']} {run['dtype']} batch {run['batch']}: t5nb {run['t5nb']['step_s'] * 1e3:.1f} ms "
              f"({run['mfu']:.0%} of the measured matmul peak), best transformers "
              f"{run['speedup_vs_best_hf'] or float('nan'):.2f}x slower")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = args.out / f"gpu-{stamp}-{jax.default_backend()}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(path)


if __name__ == "__main__":
    main()

"""Memory that scales: the compiled per-device memory of T5.1.1 training on 8 simulated devices
with 1-D and 2-D (optimizer state sharded over 'data') parameter rules; peak RSS of a
T5.1.1-small train step under each rematerialisation policy beside Hugging Face PyTorch's on
the same batch; the compile time of a deep model's train step, scanned or unrolled.

    .venv/bin/python bench/memory.py            # all three tables; about 20 minutes on 2 CPU cores
    .venv/bin/python bench/memory.py --only-sharded

Each measurement runs in a fresh process (`--child`), so one's freed memory (which
`t5nb.tune_host()` keeps in the process) never counts toward another's peak. Writes
`bench/results/memory-<time>.json` and prints the tables.
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
PRESET, BATCH, INPUTS, TARGETS = "t5.1.1-small", 8, 512, 114  # bench/run.py's small shape
POLICIES = ("none", "minimal", "full")
RUNS = ("hf", *POLICIES, *(f"scan-{policy}" for policy in POLICIES))  # a train step each
COMPILED = ("unrolled:none", "unrolled:full", "scan:none", "scan:full")  # the deep model's step, each compiled


def child(kind: str, repeats: int) -> dict:
    """One measurement in this process: `hf`, a remat policy (`scan-<policy>`: with scanned
    layers), or `compile:<preset>:<scan|unrolled>:<policy>`."""
    import t5nb

    t5nb.tune_host()
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import run as bench  # bench/run.py: the same batch, steps and peak sampler

    import jax

    from t5nb import checkpoints
    from t5nb.config import get_config
    from t5nb.trainer import Trainer, TrainConfig

    if kind.startswith("shard:"):  # in a process with 8 simulated devices (see `measure`)
        from t5nb import mesh as mesh_lib

        _, preset, dims = kind.split(":")
        config = get_config(preset, dropout_rate=0.0)
        trainer = Trainer(config, TrainConfig(learning_rate=bench.LEARNING_RATE), mesh_lib.make_mesh(1),
                          rules=mesh_lib.standard_rules(parameter_dims=int(dims)))
        batch = bench.make_batch(config, jax.device_count(), INPUTS, TARGETS)  # one row per device
        stats = trainer.compile_train_step(trainer.abstract_state(), trainer.shard_batch(batch)).memory_analysis()
        sizes = {name: getattr(stats, f"{name}_size_in_bytes") / 2**20 for name in ("argument", "output", "alias", "temp")}
        return {**sizes, "per_device_mb": sizes["argument"] + sizes["output"] - sizes["alias"] + sizes["temp"]}
    if kind.startswith("compile:"):
        _, preset, scan, policy = kind.split(":")
        config = get_config(preset, dropout_rate=0.0, scan_layers=scan == "scan", remat_policy=policy)
        trainer = Trainer(config, TrainConfig(learning_rate=bench.LEARNING_RATE))
        batch = bench.make_batch(config, 1, 64, 16)
        start = time.perf_counter()
        compiled = trainer.compile_train_step(trainer.abstract_state(), trainer.shard_batch(batch))
        seconds = time.perf_counter() - start
        stats = compiled.memory_analysis()
        return {"compile_s": seconds, "temp_mb": stats.temp_size_in_bytes / 2**20}
    config = get_config(PRESET, dropout_rate=0.1, scan_layers=kind.startswith("scan-"),
                        remat_policy="none" if kind == "hf" else kind.removeprefix("scan-"))
    batch = bench.make_batch(config, BATCH, INPUTS, TARGETS)
    trainer = Trainer(config, TrainConfig(learning_rate=bench.LEARNING_RATE, optimizer="adafactor"))
    params = trainer.init_params()
    if kind == "hf":
        with tempfile.TemporaryDirectory() as hf_dir:
            checkpoints.save_hf(trainer.model(params), hf_dir)
            del params, trainer
            return bench.bench_hf(hf_dir, batch, "float32", 1, repeats)
    result = bench.bench_t5nb(trainer, params, batch, 1, repeats)
    memory = trainer.compile_train_step(trainer.abstract_state(), trainer.shard_batch(batch)).memory_analysis()
    return {**result, "xla_temp_mb": memory.temp_size_in_bytes / 2**20}  # the step's own buffers, as XLA plans them


def measure(kind: str, repeats: int) -> dict:
    env = dict(os.environ)
    if kind.startswith("shard:"):
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()
    result = subprocess.run([sys.executable, __file__, "--child", kind, "--repeats", str(repeats)],
                            capture_output=True, text=True, env=env)
    if result.returncode:
        raise RuntimeError(f"{kind}: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3, help="timed train steps per measurement")
    parser.add_argument("--compile-preset", default="t5.1.1-xl", help="the deep model whose compile time is measured")
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--sharded", nargs="*", default=["t5.1.1-base", "t5.1.1-large", "t5.1.1-xl"],
                        help="presets whose per-device memory is compiled on 8 simulated devices")
    parser.add_argument("--only-sharded", action="store_true", help="just that table")
    parser.add_argument("--only-compile", action="store_true", help="just the deep model's compile table")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.repeats), default=float))
        return
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu_count": os.cpu_count(),
              "machine": platform.processor() or platform.machine(), "load_average_start": os.getloadavg(),
              "shape": f"{PRESET} b{BATCH} {INPUTS}/{TARGETS} float32, dropout 0.1", "sharded": {}, "remat": {},
              "compile": {}}
    for preset in () if args.only_compile else args.sharded:
        for dims in (1, 2):
            print(f"8 devices: {preset}, {dims}-D parameter rules", flush=True)
            report["sharded"][f"{preset} {dims}-D"] = measure(f"shard:{preset}:{dims}", args.repeats)
    for kind in () if args.only_sharded or args.only_compile else RUNS:
        print(f"train step: {kind}", flush=True)
        report["remat"][kind] = measure(kind, args.repeats)
    # scanned with full remat: each layer updated inside the backward pass (t5nb.layerwise)
    for layout in () if args.skip_compile or args.only_sharded else COMPILED:
        print(f"compile: {args.compile_preset} {layout}", flush=True)
        report["compile"][layout] = measure(f"compile:{args.compile_preset}:{layout}", args.repeats)
    report["load_average_end"] = os.getloadavg()
    if report["sharded"]:
        print(f"\ntrain step on a data=8 mesh, batch 8 x {INPUTS}/{TARGETS} (one row per device), per-device MB "
              "(arguments + outputs - donated + temporaries):")
        for name, run in report["sharded"].items():
            print(f"  {name:22s} {run['per_device_mb']:9.0f}  (arguments {run['argument']:.0f}, temp {run['temp']:.0f})")
    if report["remat"]:
        hf, none = report["remat"]["hf"], report["remat"]["none"]
        print(f"\n{report['shape']}, each in a fresh process; load average {report['load_average_start']}")
        print(f"{'run':13s} {'peak RSS MB':>12s} {'vs HF':>7s} {'step s':>8s} {'vs no remat':>12s} {'XLA temp MB':>12s}")
        for kind, run in report["remat"].items():
            slowdown, temp = (("", "") if kind == "hf" else
                              (f"{run['step_s'] / none['step_s']:.2f}x", f"{run['xla_temp_mb']:.0f}"))
            print(f"{kind:13s} {run['peak_rss_mb']:12.0f} {run['peak_rss_mb'] / hf['peak_rss_mb']:6.2f}x "
                  f"{run['step_s']:8.2f} {slowdown:>12s} {temp:>12s}")
    if report["compile"]:
        print(f"\n{args.compile_preset} train step (batch 1, 64/16), compile seconds:")
        for layout, run in report["compile"].items():
            print(f"  {layout:14s} {run['compile_s']:7.1f} s, temp buffers {run['temp_mb']:.0f} MB")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"memory-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2, default=float) + "\n")
    print(f"\nwritten: {path}")


if __name__ == "__main__":
    main()

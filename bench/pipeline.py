"""Does the host keep up? Sequences per second of the C4 pretraining pipeline, against what
each chip consumes.

    .venv/bin/python bench/pipeline.py                  # 1 core, then every core of this machine
    .venv/bin/python bench/pipeline.py --cores 1 --batches 40
    .venv/bin/python bench/pipeline.py --recount        # the kept rates against new estimates

The pipeline is the course's own (`tasks.BatchIterator` over `c4_span_corruption`: streaming
the .json.gz files, SentencePiece tokenization, span corruption, packing, batching) at each
pretraining profile's shapes, reading C4's stand-in (tests/standins.py writes it from the
Gutenberg books of $T5NB_DATA_DIR, laid out as C4 on the Hub; `T5NB_STANDINS` may name one
already written). Each core count runs in a process of its own pinned to that many cores
before TensorFlow sizes its thread pools; the first batch (start-up) is not timed. What a
setup consumes: its batch over its estimated pretraining step
(bench/results/accelerator_estimates.json). Writes bench/results/pipeline.json.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PROFILES = ("accelerator", "fp32-gpu")  # the profiles that pretrain on C4


def measure(profile_name: str, batches: int) -> dict:
    """Sequences/s and tokens/s of `batches` batches after the first, in this process."""
    from t5nb import get_profile, tasks, workflow

    profile = get_profile(profile_name)
    iterator = tasks.BatchIterator(profile.pretrain_task, workflow.feature_lengths(profile), profile.batch_size)
    next(iterator)  # start-up: opening files, building the graph, filling the shuffle buffer
    start = time.perf_counter()
    tokens = sum(int((next(iterator)["encoder_input_tokens"] > 0).sum()) for _ in range(batches))
    seconds = time.perf_counter() - start
    return {"batch": [profile.batch_size, profile.inputs_length, profile.targets_length], "batches": batches,
            "sequences_per_s": batches * profile.batch_size / seconds, "input_tokens_per_s": tokens / seconds}


def consumption(estimates: dict, profile_name: str) -> dict:
    """Sequences/s each setup of that profile pretrains at, by the estimates: at their least step
    time, the most it consumes."""
    return {name: estimates["profiles"][profile_name]["batch_size"] / setup["seconds_per_run"]["pretrain_step"][0]
            for name, setup in estimates["setups"].items() if setup["profile"] == profile_name}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=int, nargs="*", default=[1, len(os.sched_getaffinity(0))])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # a child process: PROFILE
    parser.add_argument("--recount", action="store_true", help="the kept measurements against new estimates")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.batches)))
        return
    if args.recount:
        kept = json.loads((RESULTS / "pipeline.json").read_text())
        return report(kept["cpu"], kept["cores"], {profile: {int(cores): rate for cores, rate in by_cores.items()}
                                                      for profile, by_cores in kept["measured"].items()})
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ)
        if not env.get("T5NB_STANDINS"):
            subprocess.run([sys.executable, ROOT / "tests" / "standins.py", scratch], check=True, env=env)
            env["T5NB_STANDINS"] = scratch
        measured = {}
        for cores in args.cores:
            for profile in PROFILES:
                pinned = ["taskset", "-c", f"0-{cores - 1}"]
                out = subprocess.run([*pinned, sys.executable, __file__, "--measure", profile,
                                      "--batches", str(args.batches)], check=True, env=env,
                                     capture_output=True, text=True).stdout
                measured.setdefault(profile, {})[cores] = json.loads(out.splitlines()[-1])
    report(_cpu(), args.cores, measured)


def report(cpu: str, cores: list, measured: dict) -> None:
    """Print and write the pipeline's rates beside what each setup consumes."""
    estimates = json.loads((RESULTS / "accelerator_estimates.json").read_text())
    result = {"cpu": cpu, "cores": cores, "measured": measured,
              "consumed": {profile: consumption(estimates, profile) for profile in PROFILES}}
    for profile in PROFILES:
        one = measured[profile][min(cores)]["sequences_per_s"] / min(cores)
        print(f"{profile} ({'x'.join(map(str, measured[profile][min(cores)]['batch']))}): "
              + ", ".join(f"{cores} core(s) {m['sequences_per_s']:.0f} seq/s" for cores, m in measured[profile].items())
              + f"; {one:.0f} per core")
        for setup, rate in result["consumed"][profile].items():
            print(f"  {setup} consumes {rate:.0f} seq/s: {rate / one:.1f} cores, {2 * rate / one:.1f} for 2x")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "pipeline.json").write_text(json.dumps(result, indent=2) + "\n")


def _cpu() -> str:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()

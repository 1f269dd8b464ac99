"""Does the host keep up? Seconds per batch of each of the course's input pipelines on 2 cores.

    .venv/bin/python bench/pipeline.py                  # every pipeline of both accelerator profiles
    .venv/bin/python bench/pipeline.py --batches 40

Each pipeline is the course's own (`tasks.BatchIterator` at the shapes the profile trains it):
C4's span corruption (streaming the .json.gz files, SentencePiece tokenization, span corruption,
packing), the fine-tuning tasks (WMT14 en-de, closed-book QA), and 06's (the facts world's
pretraining mixture packed, its closed-book QA, a world's salient span masking for memorising).
The remote sources are read from their stand-ins (tests/standins.py writes them from the files
of $T5NB_DATA_DIR, laid out as the real ones; `T5NB_STANDINS` may name some already written),
through seqio's own path (`try_in_mem_cache=False`): the real ones are too large to keep in
memory, the stand-ins are not. Each profile runs in a process of its own pinned to `HOST_CORES`
cores before TensorFlow sizes its thread pools; a pipeline's first batch is its start-up, timed
apart. bench/accelerator_estimates.py adds the seconds per batch as each setup's host term (a
step takes the longer of the chip's and the host's). Writes bench/results/pipeline.json.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from compile import cpu_name  # bench/compile.py

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PROFILES = ("accelerator", "fp32-gpu")  # the profiles of the accelerators' course
# The host every free setup is given: Colab's T4 runtime has 2 vCPUs, the fewest of them.
HOST_CORES = 2


def pipelines(profile) -> dict:
    """The course's input pipelines under `profile`, by what bench/accelerator_estimates.py
    calls them: (task, feature lengths, global batch, packed, kept in memory as seqio may)."""
    from t5nb import capacity, tasks, workflow
    from t5nb.tasks.offline import PRETRAINING, QA

    pretraining, finetuning = workflow.feature_lengths(profile), workflow.finetune_lengths(profile)
    world = tasks.register_world_task(max(profile.capacity_people))
    return {"pretrain": (profile.pretrain_task, pretraining, profile.batch_size, True, False),
            "finetune": (profile.finetune_task, finetuning, profile.batch_size, False, False),
            "qa": (profile.qa_task, finetuning, profile.batch_size, False, False),
            "knowledge_pretrain": (PRETRAINING, pretraining, profile.batch_size, True, True),
            "facts_qa": (QA, finetuning, profile.batch_size, False, True),
            "memorise": (world, capacity.FACT_LENGTHS, capacity.MEMORISATION_BATCH, False, True)}


def measure(profile_name: str, batches: int) -> dict:
    """Per pipeline: its start-up (building it, the first batch), then wall and CPU seconds per
    batch over `batches` batches, in this process."""
    from t5nb import get_profile, tasks

    measured = {}
    for name, (task, lengths, batch_size, pack, in_memory) in pipelines(get_profile(profile_name)).items():
        start = time.perf_counter()
        iterator = tasks.BatchIterator(task, lengths, batch_size, pack=pack, try_in_mem_cache=in_memory)
        next(iterator)
        startup = time.perf_counter() - start
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(batches):
            next(iterator)
        measured[name] = {"task": str(task), "batch": [batch_size, lengths["inputs"], lengths["targets"]],
                          "packed": pack, "batches": batches, "startup_s": startup,
                          "s_per_batch": (time.perf_counter() - wall) / batches,
                          "cpu_s_per_batch": (time.process_time() - cpu) / batches}
    return measured


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # a child process: PROFILE
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.batches)))
        return
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ)
        if not env.get("T5NB_STANDINS"):
            subprocess.run([sys.executable, ROOT / "tests" / "standins.py", scratch], check=True, env=env)
            env["T5NB_STANDINS"] = scratch
        measured = {}
        for profile in PROFILES:
            pinned = ["taskset", "-c", f"0-{HOST_CORES - 1}"]
            out = subprocess.run([*pinned, sys.executable, __file__, "--measure", profile, "--batches", str(args.batches)],
                                 check=True, env=env, capture_output=True, text=True).stdout
            measured[profile] = json.loads(out.splitlines()[-1])
    report(cpu_name(), measured)


def report(cpu: str, measured: dict) -> None:
    """Print and write each pipeline's seconds per batch."""
    for profile, rows in measured.items():
        print(f"{profile}, {HOST_CORES} cores:")
        for name, row in rows.items():
            print(f"  {name} ({row['task']}, {'x'.join(map(str, row['batch']))}{', packed' if row['packed'] else ''}): "
                  f"{1e3 * row['s_per_batch']:.1f} ms a batch ({1e3 * row['cpu_s_per_batch']:.1f} CPU-ms), start-up "
                  f"{row['startup_s']:.1f} s")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "pipeline.json").write_text(json.dumps({"cpu": cpu, "cores": HOST_CORES, "measured": measured},
                                                      indent=2) + "\n")


if __name__ == "__main__":
    main()

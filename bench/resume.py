"""Time to resume a data iterator at N batches: replaying the pipeline (`set_state`) against
restoring its saved tf.data state (`restore_pipeline`), on the cpu profile's pretraining batches.

    .venv/bin/python bench/resume.py [--task facts_span_corruption] [--positions 1000 10000]
"""
import argparse
import tempfile
import time

import numpy as np

import t5nb
from t5nb import tasks

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--task", default="facts_span_corruption")
parser.add_argument("--positions", type=int, nargs="+", default=[1000, 10000])
args = parser.parse_args()
profile = t5nb.get_profile("cpu")
lengths, batch_size = {"inputs": profile.inputs_length, "targets": profile.targets_length}, profile.batch_size


def timed(function):
    start = time.perf_counter()
    value = function()
    return time.perf_counter() - start, value


iterator = tasks.BatchIterator(args.task, lengths, batch_size)
print(f"{args.task}, batch {batch_size}, lengths {lengths}")
for position in args.positions:
    while iterator.batches < position:
        next(iterator)
    state = iterator.state()
    with tempfile.TemporaryDirectory() as folder:
        save_s, _ = timed(lambda: iterator.save_pipeline(folder))
        expected = next(iterator)
        restored = tasks.BatchIterator(args.task, lengths, batch_size)
        restore_s, batch = timed(lambda: (restored.restore_pipeline(folder, state), next(restored))[1])
        assert all(np.array_equal(batch[k], expected[k]) for k in batch)
    replay_s, batch = timed(lambda: next(tasks.BatchIterator.from_state(state)))
    assert all(np.array_equal(batch[k], expected[k]) for k in batch)
    print(f"at {position:>6} batches: replay {replay_s:7.1f} s | saved pipeline: save {save_s:.2f} s, "
          f"restore + first batch {restore_s:.2f} s", flush=True)

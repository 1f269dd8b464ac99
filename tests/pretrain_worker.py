"""The course's pretraining (`workflow.pretrain`, the `ci` profile, real seqio tasks) in its own
process, for the kill-and-resume test.

Usage: pretrain_worker.py STEPS OUT. Runs go under $T5NB_RUNS_DIR. Each batch the run consumes
of the train split is appended to OUT as `<position> <hash>`; `T5NB_TEST_BATCH_DELAY` (seconds) slows every batch
so that a test can signal the process at a chosen point. The final parameters go to OUT.npz.
"""
import os
import sys

import jax
import numpy as np
from slow_batches import record_batches

import t5nb
from t5nb import workflow

steps, out = int(sys.argv[1]), sys.argv[2]
record_batches(out)
_, result = workflow.pretrain(t5nb.get_profile("ci"), num_steps=steps, progress=False)
np.savez(f"{out}.npz", **{"/".join(str(k.key) for k in path): np.asarray(v) for path, v in
                          jax.tree_util.tree_flatten_with_path(result.state.params)[0]})
sys.stdout.flush()
os._exit(0)  # skip the slow interpreter teardown of TF and orbax threads

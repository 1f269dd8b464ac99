"""`t5nb train ARGS...` in its own process, each train batch recorded to $T5NB_TEST_BATCHES_OUT
(and slowed by $T5NB_TEST_BATCH_DELAY seconds; see slow_batches), for the kill-and-resume tests.
With $T5NB_TEST_KILL_AT, the process waits at that point (kill_points) for the test to kill it,
having written $T5NB_TEST_KILL_MARKER."""
import os
import sys

import jax
import kill_points
from slow_batches import record_batches

from t5nb import cli

record_batches(os.environ["T5NB_TEST_BATCHES_OUT"])
if point := os.environ.get("T5NB_TEST_KILL_AT"):
    kill_points.arm(point, os.environ["T5NB_TEST_KILL_MARKER"])
status = cli.main(sys.argv[1:])
sys.stdout.flush()
sys.stderr.flush()
if jax.process_count() > 1:
    jax.distributed.shutdown()  # what exiting normally does: leave the job together
os._exit(status)  # skip the slow interpreter teardown of TF and orbax threads

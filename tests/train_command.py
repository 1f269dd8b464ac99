"""`t5nb train ARGS...` in its own process, each train batch recorded to $T5NB_TEST_BATCHES_OUT
(and slowed by $T5NB_TEST_BATCH_DELAY seconds; see slow_batches), for the kill-and-resume tests."""
import os
import sys

import jax
from slow_batches import record_batches

from t5nb import cli

record_batches(os.environ["T5NB_TEST_BATCHES_OUT"])
status = cli.main(sys.argv[1:])
sys.stdout.flush()
sys.stderr.flush()
if jax.process_count() > 1:
    jax.distributed.shutdown()  # what exiting normally does: leave the job together
os._exit(status)  # skip the slow interpreter teardown of TF and orbax threads

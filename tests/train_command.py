"""`t5nb train ARGS...` in its own process, each train batch recorded to $T5NB_TEST_BATCHES_OUT
(and slowed by $T5NB_TEST_BATCH_DELAY seconds; see slow_batches), for the kill-and-resume tests.
$T5NB_TEST_SAVE_DELAY seconds more in each checkpoint's write, while orbax's temporary folder
exists, give a test the time to kill the process in the middle of a save."""
import os
import sys
import time

import jax
from slow_batches import record_batches

from t5nb import cli
from t5nb.checkpoints import runs

record_batches(os.environ["T5NB_TEST_BATCHES_OUT"])
if save_delay := float(os.environ.get("T5NB_TEST_SAVE_DELAY", "0")):
    write = runs._write

    def slow_write(directory, files):
        time.sleep(save_delay)
        write(directory, files)

    runs._write = slow_write
status = cli.main(sys.argv[1:])
sys.stdout.flush()
sys.stderr.flush()
if jax.process_count() > 1:
    jax.distributed.shutdown()  # what exiting normally does: leave the job together
os._exit(status)  # skip the slow interpreter teardown of TF and orbax threads

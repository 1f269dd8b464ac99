"""TensorFlow feeds tf.data only: hide every GPU/TPU from it and keep its start-up quiet.

Importing this module imports TensorFlow so, once. Every t5nb module that imports TensorFlow,
seqio, t5, tfds or clu imports it first, so TensorFlow never claims an accelerator's memory,
which JAX owns; `import t5nb` alone imports none of them.

TF 2.21 prints CUDA probing messages through absl *before* its own log level applies, so
`TF_CPP_MIN_LOG_LEVEL` alone cannot silence them; we capture file descriptor 2 while
importing and re-emit every line that is not known start-up noise.
"""
import contextlib
import logging
import os
import re
import sys
import tempfile

_NOISE = re.compile(
    r"absl::InitializeLog|cudart_stub|cuda_(platform|dnn|fft|blas|executor)|cuInit"
    r"|TF-TRT|oneDNN custom operations|Unable to register cu|computation_placer"
    r"|This TensorFlow binary is optimized|rebuild TensorFlow with the appropriate"
)


@contextlib.contextmanager
def _stderr_without_noise():
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines(keepends=True):
                if not _NOISE.search(line):
                    sys.stderr.write(line)


class _DropDeprecatedDtypeWarning(logging.Filter):
    """tfds-nightly warns about its own `TensorInfo.dtype` on every dataset it builds."""

    def filter(self, record):
        return "TensorInfo.dtype` is deprecated" not in record.getMessage()


def import_tensorflow():
    """Import TensorFlow for tf.data only: no accelerators, no start-up flood."""
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1") == "1":  # unset, or JAX's default (its import sets 1)
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"  # no tf.data warnings, errors only
    with _stderr_without_noise():
        import tensorflow as tf  # here only: tf.data's, with accelerators hidden first

        for kind in ("GPU", "TPU"):
            tf.config.set_visible_devices([], kind)
    logging.getLogger("absl").addFilter(_DropDeprecatedDtypeWarning())
    return tf


tf = import_tensorflow()

"""t5nb: T5-style encoder-decoder models in JAX, and the notebook course that teaches them."""
from t5nb._host_memory import keep_freed_host_memory
from t5nb._tensorflow import import_tensorflow

keep_freed_host_memory()  # before any thread allocates: XLA:CPU's step buffers are then reused

import_tensorflow()  # before seqio or tfds touch TensorFlow: JAX owns the accelerator

from t5nb import mesh, plots, system  # noqa: E402
from t5nb.profiles import Profile, get_profile  # noqa: E402
from t5nb.system import in_colab, report  # noqa: E402

__version__ = "0.1.0"
__all__ = ["Profile", "get_profile", "in_colab", "mesh", "plots", "report", "system", "__version__"]

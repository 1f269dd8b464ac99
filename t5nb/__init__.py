"""t5nb: T5-style encoder-decoder models in JAX, and the notebook course that teaches them.

Importing t5nb changes nothing in the process (it does not even import JAX, whose import sets
environment variables). Call `t5nb.tune_host()` first, as the notebooks' setup cell and the
`t5nb` command do (see `t5nb.host`). Everything else loads when first used: `t5nb.get_profile`,
`t5nb.plots`, `t5nb.workflow`, ...; modules that need TensorFlow import it then.
"""
import importlib

from t5nb.host import tune_host

__version__ = "0.1.0"
_EXPORTS = {"Profile": "profiles", "choose_profile": "setup_cell", "get_profile": "profiles", "in_colab": "system", "report": "system"}
__all__ = [*_EXPORTS, "tune_host", "__version__"]


def __getattr__(name: str):
    """The names above, and any submodule as `t5nb.<name>`, imported on first use."""
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"t5nb.{_EXPORTS[name]}"), name)
    try:
        return importlib.import_module(f"t5nb.{name}")
    except ModuleNotFoundError as error:
        if error.name != f"t5nb.{name}":
            raise
        raise AttributeError(f"module 't5nb' has no attribute {name!r}") from None

"""T5X checkpoints -> t5nb: the msgpack `checkpoint` file and its tensorstore (zarr) arrays,
local or `gs://` (from its local stand-in under `T5NB_STANDINS`, see `t5nb.remote`)."""
import os
import re

import jax
import numpy as np
import tensorstore as ts
from flax import serialization

from t5nb import remote
from t5nb.checkpoints.params import CheckpointError, model_from_params, unflatten, warn_if_not_finite
from t5nb.config import T5Config
from t5nb.model import Transformer


def _kvstore(path: str) -> dict:
    """Tensorstore kvstore spec for a local path or a `gs://bucket/...` path (a trailing / kept);
    with `T5NB_STANDINS` set, a `gs://` path's stand-in."""
    match = re.fullmatch(r"gs://([^/]+)/?(.*)", path)
    if match and remote.standins_dir() is not None:
        path = str(remote.standin_path(path.rstrip("/"))) + ("/" if path.endswith("/") else "")
    elif match:
        return {"driver": "gcs", "bucket": match[1], "path": match[2]}
    return {"driver": "file", "path": os.path.abspath(path) + ("/" if path.endswith("/") else "")}


def _read_file(path: str) -> bytes | None:
    """A whole file through tensorstore (local or gs://), or None where it does not exist."""
    directory, name = path.rstrip("/").rsplit("/", 1) if "/" in path.rstrip("/") else (".", path)
    store = ts.KvStore.open(_kvstore(directory + "/")).result()
    result = store.read(name).result()
    return None if result.state == "missing" else bytes(result.value)


def _is_tensorstore_spec(value) -> bool:
    return isinstance(value, dict) and {"driver", "kvstore"} <= set(value)


def _read_leaf(value, checkpoint_dir: str) -> np.ndarray:
    """An inline array, or a tensorstore spec with a path relative to the checkpoint dir."""
    if not _is_tensorstore_spec(value):
        return np.asarray(value, np.float32)
    spec = dict(value)
    relative = spec.pop("path", None) or spec["kvstore"]["path"]  # T5X's gcs specs keep it on top
    spec["kvstore"] = _kvstore(f"{checkpoint_dir.rstrip('/')}/{relative}")
    return np.asarray(ts.open(spec, read=True).result().read().result(), np.float32)


def read_t5x_checkpoint(path) -> dict:
    """The float32 params of a T5X checkpoint's `target` (optimizer state is skipped).

    `path`: a `checkpoint_<step>` directory, its `checkpoint` msgpack file, or a single-file
    msgpack checkpoint; local or `gs://` (read through tensorstore).
    """
    path = os.fspath(path)
    data = _read_file(f"{path.rstrip('/')}/checkpoint")
    checkpoint_dir = path if data is not None else os.path.dirname(path) or "."
    data = data if data is not None else _read_file(path)
    if data is None:
        raise CheckpointError(f"{path}: no T5X checkpoint there (neither a file nor a dir with 'checkpoint')")
    try:
        contents = serialization.msgpack_restore(data)
    except ValueError as error:  # msgpack's errors for bytes that are not one msgpack value
        raise CheckpointError(f"{path}: not a T5X checkpoint, unreadable as msgpack ({error})") from None
    target = contents.get("optimizer", {}).get("target") if isinstance(contents, dict) else None
    if target is None:
        keys = sorted(contents) if isinstance(contents, dict) else type(contents).__name__
        raise CheckpointError(f"{path}: unknown layout, expected T5X's optimizer/target, found {keys}")
    leaves = jax.tree.leaves_with_path(target, is_leaf=_is_tensorstore_spec)
    return unflatten({"/".join(str(k.key) for k in keypath): _read_leaf(leaf, checkpoint_dir)
                      for keypath, leaf in leaves})


def load_t5x(path, config: T5Config) -> Transformer:
    """A t5nb model of `config` from a T5X checkpoint (T5X checkpoints carry no config); a
    warning names any parameter that is not finite."""
    if not isinstance(config, T5Config):
        raise TypeError(f"config must be a T5Config (e.g. t5nb.config.get_config('t5.1.1-small')), "
                        f"got {type(config).__name__} {config!r:.60}")
    model = model_from_params(config, read_t5x_checkpoint(path))
    warn_if_not_finite(model, path)
    return model

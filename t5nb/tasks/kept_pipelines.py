"""Input pipelines kept as graphs: a task's tf.data pipeline, once built, is written beside the
compiled programs (`<JAX's compilation cache folder>/pipelines`, set by
`t5nb.system.keep_compiled_programs` or JAX_COMPILATION_CACHE_DIR), and a later process loads it
in a fraction of a second instead of building it again. Building traces every function of the
pipeline, and AutoGraph rewrites the source of those that need it (seqio's packing, your own
preprocessors): span corruption's pipeline takes 2 to 3 s of one CPU core, every process
(2-core AMD EPYC).

A pipeline is kept only where everything it is built from is known by its digest, so that a
changed input is a new entry, never a stale one:
- the task's examples (`examples_digest`: the facts world, your own data files; a remote
  source's `split_digest`, up to MAX_EXAMPLES_BYTES), its splits, vocabularies (their model
  files' bytes) and preprocessors, which must be t5nb's, seqio's or T5's own functions (with
  their arguments); a task with a preprocessor of yours is built each time;
- `get_dataset`'s settings, TensorFlow's, seqio's and T5's versions, t5nb's task code, and gin's
  bindings;
- a pipeline without external state (tf.data's own check when it is serialized).

The graph holds every function of the pipeline, so a loaded pipeline yields the batches a built
one yields, and their iterator checkpoints are interchangeable (tests/test_kept_pipelines.py).

What a pipeline yields can be kept the same way (`kept_arrays`): the token lengths that every
fine-tuning run measures, and the fixed validation batches, computed once and loaded after.
"""
import contextlib
import functools
import hashlib
import importlib.metadata
import io
import json
import pathlib
import uuid
import warnings
import zipfile

import gin
import jax
import numpy as np
import seqio
import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow.core.framework import graph_pb2, types_pb2

from t5nb.files import write_atomically

# the oldest used go first beyond it: an entry is 0.1 to 2 MB, more where its graph holds a large
# task's examples (06's world of 4,000 people: 5 MB packed, 20 MB unpacked, served from arrays)
MAX_BYTES = 256 * 2**20
# a remote source's examples, read into memory, beyond which its pipelines are not kept: their
# graph holds the examples (WMT's 1.5 M training pairs would make it hundreds of MB)
MAX_EXAMPLES_BYTES = 16 * 2**20
SUFFIXES = (".pipeline", ".arrays")  # a kept pipeline, and what one yielded (`kept_arrays`)
OWN_MODULES = ("t5nb.", "seqio.", "t5.")  # whose preprocessors a key can name
PACKAGES = ("tensorflow", "tensorflow-text", "seqio-nightly", "t5")
TASK_CODE = pathlib.Path(__file__).parent  # t5nb/tasks: every built-in source and preprocessor


def folder() -> pathlib.Path | None:
    """Where pipelines are kept: `pipelines` in JAX's compilation cache folder, if one is set."""
    compiled = jax.config.jax_compilation_cache_dir
    return pathlib.Path(compiled) / "pipelines" if compiled else None


@functools.cache
def _code_digest() -> str:
    """t5nb's task code and the versions of the packages that build a pipeline."""
    digest = hashlib.sha256()
    for path in sorted(TASK_CODE.glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    for package in PACKAGES:
        try:
            digest.update(f"{package}=={importlib.metadata.version(package)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{package} absent".encode())
    return digest.hexdigest()


def _function(fn) -> str:
    """A preprocessor as text (module, name, bound arguments); ValueError if it is not one of
    OWN_MODULES' functions."""
    if isinstance(fn, functools.partial):
        keywords = sorted((k, _value(v)) for k, v in fn.keywords.items())
        return f"{_function(fn.func)}({[_value(a) for a in fn.args]}, {keywords})"
    module = getattr(fn, "__module__", None) or type(fn).__module__
    if not f"{module}.".startswith(OWN_MODULES):
        raise ValueError(f"{module}'s {getattr(fn, '__qualname__', type(fn).__qualname__)}")
    if hasattr(fn, "__qualname__"):
        return f"{module}.{fn.__qualname__}"
    return f"{module}.{type(fn).__qualname__}{sorted((k, _value(v)) for k, v in vars(fn).items())}"


def _value(value) -> str:
    return _function(value) if callable(value) else repr(value)


def _vocabulary(vocabulary) -> str:
    model = getattr(vocabulary, "sp_model", None) or b""
    return f"{type(vocabulary).__qualname__} {vocabulary.extra_ids} {hashlib.sha256(model).hexdigest()}"


def _task(task, split: str | None) -> dict:
    """What a task's pipeline of `split` is built from; ValueError where something is unknown."""
    if isinstance(task, seqio.Mixture):
        return {"mixture": task.name, "tasks": [(_task(t, split), _value(task.get_rate(t))) for t in task.tasks]}
    source = task.source
    digest = source.split_digest(split) if hasattr(source, "split_digest") else getattr(source, "examples_digest", None)
    if digest is None:
        raise ValueError(f"task {task.name!r}'s examples have no digest")
    return {"task": task.name, "examples": digest, "splits": sorted(task.source.splits),
            "preprocessors": [_function(p) for p in task.preprocessors],
            "features": {name: (_vocabulary(f.vocabulary), f.add_eos, f.required, repr(f.dtype), f.rank)
                         for name, f in sorted(task.output_features.items())}}


def key(task, settings: dict) -> str | None:
    """The entry's name for `task`'s pipeline with `get_dataset`'s `settings` (their `split`), or
    None where it is not kept (no folder, or something it is built from has no digest)."""
    if folder() is None:
        return None
    try:
        described = _task(task, settings.get("split"))
    except ValueError:
        return None
    text = json.dumps([described, settings, _code_digest(), gin.config_str()], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load(name: str) -> tf.data.Dataset | None:
    """The kept pipeline `name`, or None if there is none or it cannot be read (it is then
    built and written again)."""
    path = folder() / f"{name}.pipeline"
    try:
        header, graph = path.read_bytes().split(b"\n", 1)
        path.touch()  # used: kept longest
        spec = {feature: tf.TensorSpec(shape, dtype) for feature, (shape, dtype) in json.loads(header).items()}
        return tf.data.experimental.from_variant(tf.raw_ops.DatasetFromGraph(graph_def=_own_resources(graph)), spec)
    except FileNotFoundError:
        return None
    except (ValueError, DecodeError, tf.errors.OpError) as error:
        warnings.warn(f"{path}: not a pipeline ({type(error).__name__}), built again", stacklevel=3)
        return None


def _own_resources(graph: bytes) -> bytes:
    """The graph with resources of its own: a serialized pipeline names its shuffles' seed
    generators (`ShuffleDatasetV3/SeedGenerator_0`, ...), and two pipelines loaded in one process
    would share them, each reshuffling as if iterated again. Named afresh, each starts where a
    built pipeline starts."""
    definition = graph_pb2.GraphDef.FromString(graph)
    suffix = f"/{uuid.uuid4().hex}"
    nodes = [*definition.node, *(node for function in definition.library.function for node in function.node_def)]
    for node in nodes:
        if node.op == "Const" and node.attr["value"].tensor.dtype == types_pb2.DT_RESOURCE:
            for handle in node.attr["value"].tensor.resource_handle_val:
                handle.name += suffix
    return definition.SerializeToString()


def keep(name: str, dataset: tf.data.Dataset) -> None:
    """Write `dataset`'s graph as the entry `name` (one file, written whole); a pipeline with
    external state (a Python function, a stateful random op) is not kept."""
    try:
        graph = dataset._as_serialized_graph(  # what tf.data's service sends to its workers
            external_state_policy=tf.data.experimental.ExternalStatePolicy.FAIL).numpy()
    except tf.errors.OpError:
        return
    spec = {feature: (s.shape.as_list(), s.dtype.name) for feature, s in dataset.element_spec.items()}
    _write(f"{name}.pipeline", json.dumps(spec).encode() + b"\n" + graph)


def kept_arrays(task, settings: dict, compute) -> list[dict]:
    """`compute()`, a list of {name: numpy array} computed from `task`'s data with `settings`
    (their `split`), kept as the entry that `key(task, settings)` names and loaded, not
    computed, next time; computed each time where `key` is None."""
    name = key(task, settings)
    if name is None:
        return compute()
    path = folder() / f"{name}.arrays"
    try:
        with np.load(path) as stored:
            rows = [{} for _ in range(int(stored["rows"]))]
            for entry in (entry for entry in stored.files if entry != "rows"):
                row, array_name = entry.split("/", 1)
                rows[int(row)][array_name] = stored[entry]
        path.touch()  # used: kept longest
        return rows
    except FileNotFoundError:
        pass
    except (ValueError, OSError, EOFError, KeyError, IndexError, zipfile.BadZipFile) as error:  # damaged
        warnings.warn(f"{path}: not kept arrays ({type(error).__name__}), computed again", stacklevel=3)
    rows = compute()
    buffer = io.BytesIO()
    np.savez(buffer, rows=len(rows), **{f"{i}/{array_name}": value for i, row in enumerate(rows)
                                        for array_name, value in row.items()})
    _write(path.name, buffer.getvalue())
    return rows


def _write(file_name: str, data: bytes) -> None:
    """Write an entry whole into the folder, then prune it."""
    folder().mkdir(parents=True, exist_ok=True)
    write_atomically(folder() / file_name, data)
    _prune()


def _prune() -> None:
    """Remove the entries used longest ago beyond MAX_BYTES (another process may remove some too)."""
    entries = []
    for entry in (entry for entry in folder().iterdir() if entry.suffix in SUFFIXES):
        with contextlib.suppress(FileNotFoundError):
            stat = entry.stat()
            entries.append((stat.st_mtime, stat.st_size, entry))
    total = 0
    for _, size, entry in sorted(entries, reverse=True):
        total += size
        if total > MAX_BYTES:
            entry.unlink(missing_ok=True)

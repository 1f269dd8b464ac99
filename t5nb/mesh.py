"""Device mesh, T5X's logical axis rules, and shardings for parameters, batches and activations."""
import contextlib
import contextvars
import functools
import operator

import jax
import numpy as np
from flax import nnx
from flax.linen import partitioning
from jax.sharding import NamedSharding, PartitionSpec


def standard_rules(activation_dims: int = 1, parameter_dims: int = 1) -> tuple:
    """T5X's `standard_logical_axis_rules`: the batch over 'data', the wide model dimensions
    (vocab, mlp, heads) over 'model'; with 2-D partitioning `embed` also goes over 'model'
    (activations) and/or 'data' (parameters). Earlier rules win; the rest is replicated."""
    rules = [("batch", "data"), ("vocab", "model"), ("mlp", "model"), ("heads", "model"), ("kv", None),
             ("joined_kv", "model")]
    if activation_dims == 2:
        rules.append(("embed", "model"))
    if parameter_dims == 2:
        rules.append(("embed", "data"))
    return tuple(rules + [("embed", None), ("relpos_buckets", None), ("length", None), ("layers", None)])


STANDARD_RULES = standard_rules()

# The metadata field that holds a parameter's logical axis names, the one thing about parameters
# that differs across the flax versions t5nb runs on: flax 0.12.4 renamed it from `sharding_names`
# to `out_sharding`, and each version's partitioning (`nnx.get_partition_spec`) reads only its own
# name (Colab's runtime has 0.11.2, Kaggle's TPU image 0.12.0, requirements/base.lock 0.12.8).
# t5nb writes and reads the names only through `axes_metadata` and `logical_axes`, in the field
# the installed flax names itself.
def _axes_field() -> str:
    """The metadata field the installed flax's `nnx.with_partitioning` puts logical axis names in."""
    probe = nnx.with_partitioning(lambda: None, ("axes",))()
    return next(name for name, value in probe.metadata.items() if value == ("axes",))


_AXES_FIELD = _axes_field()


def axes_metadata(axes) -> dict:
    """A parameter's metadata for its logical axis names: `nnx.Param(value, **axes_metadata(axes))`."""
    return {_AXES_FIELD: tuple(axes)}


def logical_axes(variable) -> tuple:
    """The logical axis names a parameter (`nnx.Variable`) carries; () where it carries none."""
    return tuple(variable.get_metadata().get(_AXES_FIELD) or ())

_ACTIVE = contextvars.ContextVar("t5nb_activation_sharding", default=None)


def logical_to_spec(axes, rules=STANDARD_RULES) -> PartitionSpec:
    """PartitionSpec for an array whose dimensions carry logical `axes` (Flax's
    `logical_to_mesh_axes`: rules apply in order, each mesh axis used at most once)."""
    return partitioning.logical_to_mesh_axes(tuple(axes), rules)


@contextlib.contextmanager
def activation_sharding(mesh, rules=STANDARD_RULES):
    """Within this block, `constrain` pins activations to `mesh` by logical names."""
    token = _ACTIVE.set((mesh, rules))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def constrain(x, axes):
    """Sharding constraint by logical axis names; a no-op outside `activation_sharding`."""
    active = _ACTIVE.get()
    if active is None:
        return x
    mesh, rules = active
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, logical_to_spec(axes, rules)))


def make_mesh(num_partitions: int = 1, devices=None) -> jax.sharding.Mesh:
    """A ('data', 'model') mesh: `num_partitions` devices per model replica (T5X's partitioner)."""
    devices = jax.devices() if devices is None else list(devices)
    if not devices:
        raise ValueError("make_mesh: no devices given")
    if not isinstance(num_partitions, (int, np.integer)) or isinstance(num_partitions, bool) or num_partitions < 1:
        raise ValueError(f"num_partitions must be a positive whole number of devices per model replica, "
                         f"got {num_partitions!r}")
    if len(devices) % num_partitions:
        choices = [n for n in range(1, len(devices) + 1) if len(devices) % n == 0]
        raise ValueError(f"num_partitions={num_partitions} does not divide the {len(devices)} devices"
                         + (" (more than there are)" if num_partitions > len(devices) else "")
                         + f"; use one of {choices}")
    return jax.make_mesh((len(devices) // num_partitions, num_partitions), ("data", "model"), devices=devices,
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)  # shardings by annotation, as in T5X


def param_shardings(state, mesh, rules=STANDARD_RULES):
    """NamedSharding for every parameter of an `nnx.State`, from its logical axis names."""
    specs = nnx.get_partition_spec(state)
    return jax.tree.map(lambda spec: NamedSharding(mesh, logical_to_spec(spec, rules)), specs,
                        is_leaf=lambda x: isinstance(x, PartitionSpec))


def batch_sharding(mesh) -> NamedSharding:
    """Batches are split over 'data' on their leading (batch) dimension."""
    return NamedSharding(mesh, PartitionSpec("data"))


def describe_mesh(mesh) -> str:
    """One line per mesh axis and the device kinds: what the notebooks print."""
    kinds = ", ".join(sorted({d.device_kind for d in mesh.devices.flat}))
    axes = " x ".join(f"{name}={size}" for name, size in mesh.shape.items())
    return f"Mesh {axes} over {mesh.devices.size} device(s) ({kinds}), {jax.process_count()} process(es)"


def describe_sharding(state, params) -> str:
    """A table: each parameter's shape, logical axes, and how its array in `params` (a pure dict
    of placed arrays, as `Trainer.init_params` gives) is split: the mesh axes its sharding names
    for each dimension and the shape each device holds. It reads the arrays, not the axes."""
    lines = [f"{'parameter':56s} {'shape':10s} {'logical axes':26s} {'split over':18s} per device"]
    for path, variable in nnx.to_flat_state(state):
        array = functools.reduce(operator.getitem, path, params)
        shape, shard = ("x".join(map(str, s)) for s in (array.shape, array.sharding.shard_shape(array.shape)))
        spec = tuple(array.sharding.spec) if isinstance(array.sharding, NamedSharding) else ()
        lines.append(f"{'/'.join(map(str, path)):56s} {shape:10s} {str(logical_axes(variable)):26s} "
                     f"{str(spec):18s} {shard}")
    return "\n".join(lines)


def initialize_distributed(coordinator_address=None, num_processes=None, process_id=None, detect: bool = False):
    """Multi-host: join the other processes, described by the arguments or, with `detect`, found
    by JAX (TPU pod slices, SLURM, Open MPI, Kubernetes); without either, nothing (one process)."""
    if coordinator_address is None and num_processes is None and not detect:
        return
    jax.distributed.initialize(coordinator_address, num_processes, process_id)

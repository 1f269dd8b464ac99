"""Logical axis names → device mesh axes (T5X's rules), and sharding constraints on activations."""
import contextlib
import contextvars

import jax
from jax.sharding import NamedSharding, PartitionSpec

# T5X's standard rules with 1-D parameter and activation partitioning: batch over 'data',
# the wide model dimensions over 'model', everything else replicated.
STANDARD_RULES = (
    ("batch", "data"),
    ("vocab", "model"),
    ("embed", None),
    ("mlp", "model"),
    ("heads", "model"),
    ("kv", None),
    ("joined_kv", "model"),
    ("relpos_buckets", None),
    ("length", None),
    ("layers", None),
)

_ACTIVE = contextvars.ContextVar("t5nb_activation_sharding", default=None)


def logical_to_spec(axes, rules=STANDARD_RULES) -> PartitionSpec:
    """PartitionSpec for an array whose dimensions carry logical `axes` (each mesh axis used once)."""
    table = dict(rules)
    used, spec = set(), []
    for name in axes:
        mesh_axis = table.get(name) if name is not None else None
        if mesh_axis in used:
            mesh_axis = None
        used.add(mesh_axis)
        spec.append(mesh_axis)
    return PartitionSpec(*spec)


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

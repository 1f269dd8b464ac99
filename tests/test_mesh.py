"""Logical axis rules (T5X's 1-D and 2-D variants), mesh construction and the summaries."""
import jax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from t5nb import mesh as mesh_lib
from t5nb.config import get_config
from t5nb.model import Transformer


@pytest.mark.parametrize("axes, expected", [
    (("batch", "length", "embed"), P("data", None, None)),
    (("embed", "mlp"), P(None, "model")),
    (("vocab", "embed"), P("model", None)),
    (("embed", "joined_kv"), P(None, "model")),
    (("heads", "relpos_buckets"), P("model", None)),
])
def test_standard_1d_rules(axes, expected):
    assert mesh_lib.logical_to_spec(axes) == expected


def test_2d_rules_put_embed_on_the_free_mesh_axis():
    params_2d = mesh_lib.standard_rules(parameter_dims=2)
    assert mesh_lib.logical_to_spec(("embed", "mlp"), params_2d) == P("data", "model")
    assert mesh_lib.logical_to_spec(("vocab", "embed"), params_2d) == P("model", "data")
    activations_2d = mesh_lib.standard_rules(activation_dims=2)
    assert mesh_lib.logical_to_spec(("batch", "length", "embed"), activations_2d) == P("data", None, "model")
    assert mesh_lib.logical_to_spec(("batch", "length", "mlp"), activations_2d) == P("data", None, "model")


def test_make_mesh_and_a_clear_error_when_partitions_do_not_divide():
    mesh = mesh_lib.make_mesh(1)
    assert dict(mesh.shape) == {"data": jax.device_count(), "model": 1}
    with pytest.raises(ValueError, match="num_partitions=3 does not divide the 2 devices"):
        mesh_lib.make_mesh(3, jax.devices() * 2)


def test_sharding_summary_names_every_parameter_with_its_axes():
    state = nnx.state(nnx.eval_shape(lambda: Transformer(get_config("t5.1.1-tiny"), rngs=nnx.Rngs(0))), nnx.Param)
    table = mesh_lib.describe_sharding(state, mesh_lib.make_mesh())
    row = next(line for line in table.splitlines() if line.startswith("decoder/layers/0/mlp/wi_0/kernel"))
    assert "8x16" in row and "('embed', 'mlp')" in row and "(None, 'model')" in row
    assert len(table.splitlines()) == 1 + len(jax.tree.leaves(state))
    assert "Mesh data=1 x model=1 over 1 device(s)" in mesh_lib.describe_mesh(mesh_lib.make_mesh())

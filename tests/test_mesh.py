"""Logical axis rules (T5X's 1-D and 2-D variants), mesh construction and the summaries."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from t5nb import mesh as mesh_lib
from t5nb.config import get_config
from t5nb.trainer import TrainConfig, Trainer


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


def test_flax_partitioning_reads_the_axes_t5nb_writes():
    param = nnx.Param(jnp.zeros((2, 3)), eager_sharding=False, **mesh_lib.axes_metadata(("embed", "mlp")))
    assert nnx.get_partition_spec(param).value == P("embed", "mlp")
    assert mesh_lib.logical_axes(param) == ("embed", "mlp")


@pytest.mark.parametrize("field", ["sharding_names", "out_sharding"])  # flax up to 0.12.3; from 0.12.4
def test_the_axes_field_is_the_one_flax_with_partitioning_writes(monkeypatch, field):
    def with_partitioning(initializer, sharding, mesh=None):
        return lambda *args: nnx.VariableMetadata(initializer(*args), metadata={field: sharding, "mesh": mesh})
    monkeypatch.setattr(nnx, "with_partitioning", with_partitioning)
    assert mesh_lib._axes_field() == field


def test_make_mesh_and_a_clear_error_when_partitions_do_not_divide():
    mesh = mesh_lib.make_mesh(1)
    assert dict(mesh.shape) == {"data": jax.device_count(), "model": 1}
    with pytest.raises(ValueError, match="num_partitions=3 does not divide the 2 devices"):
        mesh_lib.make_mesh(3, jax.devices() * 2)


def test_sharding_summary_names_every_parameter_with_its_axes_and_its_placement():
    trainer = Trainer(get_config("t5.1.1-tiny"), TrainConfig())
    table = mesh_lib.describe_sharding(trainer.param_state, trainer.init_params())
    row = next(line for line in table.splitlines() if line.startswith("decoder/layers/0/mlp/wi_0/kernel"))
    assert row.split()[1:] == ["8x16", "('embed',", "'mlp')", "(None,", "'model')", "8x16"]  # one device holds it all
    assert len(table.splitlines()) == 1 + len(jax.tree.leaves(trainer.param_state))
    assert "Mesh data=1 x model=1 over 1 device(s)" in mesh_lib.describe_mesh(mesh_lib.make_mesh())


# Each parameter of T5.1.1-tiny as a Trainer places it on a 4 x 2 mesh of 8 CPU devices: its
# shape and the shape one device holds, unrolled and scanned; and the placement table's rows
ON_4_X_2 = """
import json, sys
import jax
from t5nb import checkpoints, mesh
from t5nb.config import get_config
from t5nb.trainer import TrainConfig, Trainer
placed = {}
for scan in (False, True):
    trainer = Trainer(get_config("t5.1.1-tiny", scan_layers=scan), TrainConfig(), mesh.make_mesh(2))
    params = trainer.init_params()
    placed[scan] = {name: [array.shape, array.sharding.shard_shape(array.shape)]
                    for name, array in checkpoints.flatten(params).items()}
table = mesh.describe_sharding(trainer.param_state, params)
json.dump({"unrolled": placed[False], "scanned": placed[True], "table": table}, sys.stdout)
"""


def test_the_trainer_splits_the_parameters_over_a_4_x_2_mesh():
    """The parameters a Trainer places on a 4 x 2 mesh are split by their logical axes, on every
    flax t5nb supports (tests/test_hosted_path.py runs this on each hosted runtime's): flax 0.12.4
    renamed the metadata its partitioning reads, and a model whose axes it cannot read is
    replicated whole on every device, silently. 40 of T5.1.1-tiny's 52 parameters: every kernel
    and embedding (vocab, mlp, heads or joined_kv over 'model'), none of the norms' scales."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    out = subprocess.run([sys.executable, "-c", ON_4_X_2], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    placed = json.loads(out.stdout)
    for layout, count, total in (("unrolled", 40, 52), ("scanned", 22, 29)):
        split = {name for name, (shape, shard) in placed[layout].items() if shard != shape}
        assert (len(split), len(placed[layout])) == (count, total), layout
        assert all(name.endswith(("kernel", "embedding", "rel_embedding")) for name in split), split
    unrolled = placed["unrolled"]
    assert unrolled["encoder/layers_0/mlp/wi_0/kernel"] == [[8, 16], [8, 8]]  # mlp over 'model': halves
    assert unrolled["token_embedder/embedding"][1][0] * 2 == unrolled["token_embedder/embedding"][0][0]  # vocab
    assert unrolled["encoder/encoder_norm/scale"] == [[8], [8]]  # replicated
    assert placed["scanned"]["encoder/layers/mlp/wi_0/kernel"] == [[2, 8, 16], [2, 8, 8]]
    row = next(line for line in placed["table"].splitlines() if line.startswith("encoder/layers/mlp/wi_0/kernel"))
    assert row.split()[1:] == ["2x8x16", "('layers',", "'embed',", "'mlp')", "(None,", "None,", "'model')", "2x8x8"]

"""t5nb's one parameter form, the nested dict, and the model that holds it: `params_of`,
`model_from_params`, the shape check every loader runs, and T5X's flat names (`flatten`,
`unflatten`) that the converters read and write."""
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from t5nb.config import T5Config
from t5nb.model import Transformer, stack_layers, unstack_layers

_STACK = "layers"  # the model's layer stacks; T5X names their layers layers_0, layers_1, ...


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model: names the key and both shapes."""


class _ShapeOnlyRngs:
    """One fixed key for every parameter: enough for shapes, and tracing `nnx.Rngs`' counter
    inside `nnx.eval_shape` is slow (JAX builds an error message on every update)."""

    def params(self):
        return jax.random.key(0)


def abstract_model(config: T5Config) -> Transformer:
    """A `config` model whose parameters are `ShapeDtypeStruct`s: nothing is allocated."""
    return nnx.eval_shape(lambda: Transformer(config, rngs=_ShapeOnlyRngs()))


def abstract_params(config: T5Config) -> dict[str, jax.ShapeDtypeStruct]:
    """Every parameter of a `config` model, `path -> ShapeDtypeStruct` (per layer, scanned or not)."""
    return flatten(nnx.to_pure_dict(nnx.state(abstract_model(config.replace(scan_layers=False)), nnx.Param)))


def flatten(tree: dict) -> dict[str, np.ndarray]:
    """Nested parameter dicts -> `{"encoder/layers_0/...": array}`: T5X's names, where layer i of
    a stack (`layers` keyed by index) is `layers_i`."""
    flat = {}
    for key, value in tree.items():
        if key == _STACK and isinstance(value, dict) and all(isinstance(i, int) for i in value):
            value = {f"{_STACK}_{i}": layer for i, layer in value.items()}
            flat.update({f"{name}/{sub}": v for name, layer in value.items() for sub, v in flatten(layer).items()})
        elif isinstance(value, dict):
            flat.update({f"{key}/{sub}": v for sub, v in flatten(value).items()})
        else:
            flat[str(key)] = value
    return flat


def unflatten(flat: dict) -> dict:
    """T5X's flat names -> the model's nested parameter dict (`flatten`'s inverse)."""
    tree = {}
    for path, value in flat.items():
        node = tree
        *parents, leaf = path.split("/")
        for part in parents:
            match = re.fullmatch(rf"{_STACK}_(\d+)", part)
            for key in ((_STACK, int(match[1])) if match else (part,)):
                node = node.setdefault(key, {})
        node[leaf] = value
    return tree


def check_params(config: T5Config, flat: dict, source_names: dict[str, str] | None = None) -> None:
    """Raise one `CheckpointError` naming the first mis-shaped, missing or unexpected key.

    `source_names` maps t5nb paths to the checkpoint's own names, shown beside them.
    """
    expected = abstract_params(config)
    source_names = source_names or {}

    def key(path):
        return f"{path} ({source_names[path]})" if path in source_names else path

    problems = [f"{key(k)}: model expects shape {tuple(expected[k].shape)}, checkpoint has shape "
                f"{tuple(np.shape(v))}" for k, v in flat.items()
                if k in expected and tuple(np.shape(v)) != tuple(expected[k].shape)]
    problems += [f"{key(k)}: missing from the checkpoint (model expects shape {tuple(v.shape)})"
                 for k, v in expected.items() if k not in flat]
    problems += [f"{key(k)}: unexpected in the checkpoint (shape {tuple(np.shape(v))}), not a "
                 f"parameter of this model" for k, v in flat.items() if k not in expected]
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise CheckpointError(problems[0] + more)


def params_of(model: Transformer) -> dict:
    """A model's parameters in t5nb's one form: the nested dict, each stack's layers keyed by
    index (a scanned model's unstacked)."""
    return unstack_layers(nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def model_from_params(config: T5Config, params: dict) -> Transformer:
    """A t5nb `Transformer` of `config` holding `params` (the nested dict), checked first."""
    if isinstance(params, dict) and any("/" in str(key) for key in params):
        raise TypeError("params is a flat dict of paths such as 'encoder/layers_0/...'; t5nb takes the nested dict "
                        "that checkpoints.params_of, read_hf_checkpoint and read_t5x_checkpoint return "
                        "(checkpoints.unflatten turns T5X's flat names into it)")
    flat = flatten(params)
    check_params(config, flat)
    model = abstract_model(config)
    state = nnx.state(model, nnx.Param)
    params = unflatten({key: jnp.asarray(value, jnp.float32) for key, value in flat.items()})
    nnx.replace_by_pure_dict(state, stack_layers(params) if config.scan_layers else params)
    nnx.update(model, state)
    return model


@jax.jit
def _all_finite(params: dict) -> dict:
    return {path: jnp.all(jnp.isfinite(value)) for path, value in params.items()}


def warn_if_not_finite(model: Transformer, source) -> None:
    """Warn, naming them, about parameters of `model` (loaded from `source`) holding NaN or infinity."""
    finite = jax.device_get(_all_finite(flatten(params_of(model))))  # one program for every parameter
    bad = [path for path, ok in finite.items() if not ok]
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        warnings.warn(f"{source}: NaN or infinite values in {len(bad)} parameter(s): {', '.join(bad[:3])}{more}",
                      RuntimeWarning, stacklevel=3)

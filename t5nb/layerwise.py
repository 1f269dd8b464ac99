"""An optimizer over scanned stacks, one layer at a time.

A scanned model holds each stack's parameters stacked on a leading `layers` axis
(`model.layer_stack`). Its optimizer state is held the same way: optax's state for the model's
per-layer parameters, each parameter-shaped tree in it stacked by `model.stack_layers`
(`stack_state`; `unstack_state` gives back the per-layer form every checkpoint keeps). `update`
steps each stack in a loop over its layers, each layer's slice updated as its own parameters
and written back in place, so the numbers are the unrolled model's and XLA keeps one layer's
temporaries at a time: updating a whole stack at once keeps its gradients and its updates alive
together, a second copy of the stack (T5.1.1-xl's step planned 22.0 GB of temporaries that way,
12.6 GB this way, 11.1 GB unrolled: docs/benchmarks.md).

Only transformations that treat each parameter alone may run layer by layer (Adafactor, Adam);
one that reads all gradients together (a global-norm clip) goes in `whole`.

`update_in_backward` goes further where each layer is computed again in the backward pass
anyway (`remat_policy='full'`): it updates each layer inside the stack's backward pass, as soon
as that layer's gradient exists, so a stack's gradients never exist together (T5.1.1-xl's step
plans 1.3 GB of temporaries that way, against 11.1 GB unrolled)."""
import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from t5nb.model import stack_layers, stacks_run_by, unstack_layers


def _on_param_trees(change, state, *others):
    """`change` applied to each parameter-shaped tree (a dict) of an optax state, paired with the
    same tree of `others` (states of the same optimizer); counters and the like stay `state`'s."""
    return jax.tree.map(lambda tree, *more: change(tree, *more) if isinstance(tree, dict) else tree,
                        state, *others, is_leaf=lambda x: isinstance(x, dict))


def stack_state(opt_state):
    """An optimizer state for per-layer parameters -> the same for stacked ones."""
    return _on_param_trees(stack_layers, opt_state)


def unstack_state(opt_state):
    """`stack_state`'s inverse."""
    return _on_param_trees(unstack_layers, opt_state)


def stack_paths(params: dict, path: tuple = ()) -> list[tuple]:
    """Key paths of the stacked `layers` trees of a parameter tree."""
    paths = []
    for key, value in params.items():
        if key == "layers" and isinstance(value, dict) and not all(isinstance(index, int) for index in value):
            paths.append((*path, key))
        elif isinstance(value, dict):
            paths += stack_paths(value, (*path, key))
    return paths


def _get(tree: dict, path: tuple):
    for key in path:
        tree = tree[key]
    return tree


def _put(tree: dict, path: tuple, value) -> dict:
    """`tree` with `value` at `path` (a copy of the dicts on the way)."""
    return {**tree, path[0]: value if len(path) == 1 else _put(tree[path[0]], path[1:], value)}


def _without(tree: dict, paths: list[tuple]) -> dict:
    for path in paths:
        parent = _get(tree, path[:-1])
        tree = _put(tree, path[:-1], {key: value for key, value in parent.items() if key != path[-1]})
    return tree


def update(optimizer: optax.GradientTransformation, grads: dict, opt_state, params: dict,
           whole: optax.GradientTransformation | None = None):
    """One optimizer step of stacked `params` -> (new params, new state). With `whole`, the
    optimizer is `optax.chain(whole, optimizer)`: `whole` sees all gradients at once first."""
    if whole is not None:
        whole_state, opt_state = opt_state
        grads, whole_state = whole.update(grads, whole_state, params)
    # every gradient before any update (measured: a smaller peak than without)
    params, grads, opt_state = jax.lax.optimization_barrier((params, grads, opt_state))
    paths = stack_paths(params)
    rest = lambda tree: _without(tree, paths)  # noqa: E731
    updates, new_state = optimizer.update(rest(grads), _on_param_trees(rest, opt_state), rest(params))
    new_params = optax.apply_updates(rest(params), updates)
    stacks = {path: _update_stack(optimizer, _get(grads, path), _on_param_trees(lambda tree: _get(tree, path), opt_state),
                                  _get(params, path)) for path in paths}
    new_params, new_state = _with_stacks(new_params, new_state, stacks)
    return new_params, new_state if whole is None else (whole_state, new_state)


def _with_stacks(params: dict, opt_state, stacks: dict):
    """`params` and `opt_state` with each stack put in at its path, `stacks` {path: (layers, their state)}."""
    for path, (layers, layer_state) in stacks.items():
        params = _put(params, path, layers)
        opt_state = _on_param_trees(lambda tree, stacked, path=path: _put(tree, path, stacked), opt_state, layer_state)
    return params, opt_state


def _layer(tree, index):
    """Layer `index` of a stacked tree."""
    return jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, index, keepdims=False), tree)


def _update_layer(optimizer, index, grads, layers, opt_state):
    """A stack (and its optimizer state) with layer `index` updated by its `grads`, in place."""
    put = lambda tree, value: jax.tree.map(  # noqa: E731
        lambda x, y: jax.lax.dynamic_update_index_in_dim(x, y, index, 0), tree, value)
    layer = _layer(layers, index)
    updates, new_state = optimizer.update(grads, _on_param_trees(lambda tree: _layer(tree, index), opt_state), layer)
    return put(layers, optax.apply_updates(layer, updates)), _on_param_trees(put, opt_state, new_state)


def _update_stack(optimizer, grads, opt_state, layers):
    """A stack's layers (and their optimizer state) updated one at a time, in place."""
    def step(index, carry):
        return _update_layer(optimizer, index, _layer(grads, index), *carry)

    return jax.lax.fori_loop(0, jax.tree.leaves(layers)[0].shape[0], step, (layers, opt_state))


def _param_trees(opt_state) -> list:
    """The parameter-shaped trees (dicts) of an optax state, in order."""
    return [tree for tree in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, dict)) if isinstance(tree, dict)]


def _with_param_trees(opt_state, trees: list):
    """`opt_state` with its parameter-shaped trees replaced by `trees`, in order."""
    trees = iter(trees)
    return _on_param_trees(lambda _: next(trees), opt_state)


def update_in_backward(optimizer: optax.GradientTransformation, loss, params: dict, opt_state, normalizer):
    """One optimizer step of stacked `params` whose stacks are updated inside their own backward
    pass, each layer as soon as its gradient exists, so no stack's gradients are ever held
    together (as none of an unrolled model's need be: T5.1.1-xl's step, docs/benchmarks.md).
    `loss(params) -> (loss, aux)` runs the model; every gradient is divided by `normalizer`.
    Each layer's forward pass is computed again in the backward pass, as `remat_policy='full'`
    asks. Returns (new params, new state, the gradients' global norm, aux).

    `jax.grad` hands out cotangents only: the stacks' next state leaves the differentiated
    function as the cotangent of a placeholder, one `slot` per stack shaped like that state,
    while the stacks' parameters and optimizer state are held constant."""
    paths = stack_paths(params)
    stacks = {path: _get(params, path) for path in paths}
    stack_states = {path: _on_param_trees(lambda tree, path=path: _get(tree, path), opt_state) for path in paths}
    slots = {path: (stacks[path], _param_trees(stack_states[path]), jnp.zeros((), jnp.float32)) for path in paths}
    rest = lambda tree: _without(tree, paths)  # noqa: E731

    def differentiated(rest_params, slots):
        def run(name, apply, x, stacked, keys):  # model.stacks_run_by's runner
            path = (name, "layers")

            def layer(layer_params, x, key):  # `apply` on one layer's parameters as a plain dict
                state = jax.tree.map(lambda v: v, stacked)
                nnx.replace_by_pure_dict(state, layer_params)
                return apply(state, x, key)

            first = lambda tree: jax.tree.map(lambda leaf: leaf[0], tree)  # noqa: E731
            layer, consts = jax.closure_convert(layer, first(stacks[path]), x, first(keys))
            return _stack_updating(layer, optimizer, x, consts, stacks[path], stack_states[path], slots[path],
                                   keys, normalizer)

        with stacks_run_by(run):
            return loss(functools.reduce(lambda tree, path: _put(tree, path, stacks[path]), paths, rest_params))

    (grads, slot_grads), aux = jax.grad(differentiated, argnums=(0, 1), has_aux=True)(rest(params), slots)
    grads = jax.tree.map(lambda g: g / normalizer, grads)
    updates, new_state = optimizer.update(grads, _on_param_trees(rest, opt_state), rest(params))
    new_params = optax.apply_updates(rest(params), updates)
    new_params, new_state = _with_stacks(new_params, new_state, {
        path: (layers, _with_param_trees(stack_states[path], trees)) for path, (layers, trees, _) in slot_grads.items()})
    squares = sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)) + sum(s[2] for s in slot_grads.values())
    return new_params, new_state, jnp.sqrt(squares), aux


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _stack_updating(layer, optimizer, x, consts, params, opt_state, slot, keys, normalizer):
    """x through the stack's layers, `layer(layer_params, x, key, *consts) -> x`."""
    return _forward(layer, x, consts, params, keys)[0]


def _forward(layer, x, consts, params, keys):
    """The stack's output and each layer's input [layers, ...]."""
    def body(x, layer_input):
        layer_params, key = layer_input
        return layer(layer_params, x, key, *consts), x

    return jax.lax.scan(body, x, (params, keys))


def _stack_updating_forward(layer, optimizer, x, consts, params, opt_state, slot, keys, normalizer):
    y, inputs = _forward(layer, x, consts, params, keys)
    return y, (inputs, consts, params, opt_state, keys, normalizer)


def _stack_updating_backward(layer, optimizer, residuals, dy):
    """The layers from the last: each one's forward pass again, its vector-Jacobian product, and
    its update, written in place into the stack."""
    inputs, consts, params, opt_state, keys, normalizer = residuals
    depth = jax.tree.leaves(params)[0].shape[0]

    def step(back, carry):
        dy, dconsts, params, opt_state, square = carry
        index = depth - 1 - back
        key = None if keys is None else keys[index]
        _, pullback = jax.vjp(lambda p, x, c: layer(p, x, key, *c), _layer(params, index), _layer(inputs, index), consts)
        grads, dx, dc = pullback(dy)
        grads = jax.tree.map(lambda g: g / normalizer, grads)
        params, opt_state = _update_layer(optimizer, index, grads, params, opt_state)
        square = square + sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads))
        return dx, jax.tree.map(jnp.add, dconsts, dc), params, opt_state, square

    zeros = jax.tree.map(jnp.zeros_like, consts)
    dx, dconsts, params, opt_state, square = jax.lax.fori_loop(
        0, depth, step, (dy, zeros, params, opt_state, jnp.zeros((), jnp.float32)))
    return dx, dconsts, None, None, (params, _param_trees(opt_state), square), None, None


_stack_updating.defvjp(_stack_updating_forward, _stack_updating_backward)

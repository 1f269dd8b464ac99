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
one that reads all gradients together (a global-norm clip) goes in `whole`."""
import jax
import optax

from t5nb.model import stack_layers, unstack_layers


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
    for path, (layers, layer_state) in stacks.items():
        new_params = _put(new_params, path, layers)
        new_state = _on_param_trees(lambda tree, stacked, path=path: _put(tree, path, stacked), new_state, layer_state)
    return new_params, new_state if whole is None else (whole_state, new_state)


def _update_stack(optimizer, grads, opt_state, layers):
    """A stack's layers (and their optimizer state) updated one at a time, in place."""
    def step(index, carry):
        layers, opt_state = carry
        take = lambda tree: jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, index, keepdims=False), tree)  # noqa: E731
        put = lambda tree, value: jax.tree.map(  # noqa: E731
            lambda x, y: jax.lax.dynamic_update_index_in_dim(x, y, index, 0), tree, value)
        layer = take(layers)
        updates, new_state = optimizer.update(take(grads), _on_param_trees(take, opt_state), layer)
        return put(layers, optax.apply_updates(layer, updates)), _on_param_trees(put, opt_state, new_state)

    return jax.lax.fori_loop(0, jax.tree.leaves(layers)[0].shape[0], step, (layers, opt_state))

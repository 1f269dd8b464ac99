"""T5 encoder-decoder in Flax NNX, with T5X's parameter names, shapes and logical axes.

Shapes in comments: b batch, l / q / k lengths, e emb_dim, h heads, d head_dim, m mlp_dim,
v vocab. Parameters are float32; `config.dtype` is the compute dtype. Each module runs its own
forward pass; `Encoder` and `Decoder` hold their layers in a stack, `layers[i]` (with
`config.scan_layers`, one layer module whose parameters lead with a `layers` axis, as T5X's
scanned models: see `layer_stack`). Parameter names and shapes are T5X's
(`encoder/layers_0/attention/query/kernel` as [e, h*d], layer i of a stack named `layers_i` by
`t5nb.checkpoints`), so converters are renames.
"""
import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from t5nb import speedups
from t5nb.config import REMAT_POLICIES, T5Config
from t5nb.mesh import axes_metadata, constrain, logical_axes

# A bias or logit that takes a position out of a softmax (T5X's attention mask bias): exp of it
# is 0 in float32 and bfloat16, and sums of a few of them stay finite. Decoding uses it too.
NEG_INF = -1e10
PAD_ID = 0  # T5's ids: padding, also the decoder's start token
EOS_ID = 1  # the end of every sequence
ACTIVATIONS = {"relu": jax.nn.relu, "gelu": functools.partial(jax.nn.gelu, approximate=True),
               "linear": lambda x: x}

# the initialisers, one object each: each (initialiser, shape) is one program (`_initial`)
_fan_in_normal = jax.nn.initializers.variance_scaling(1.0, "fan_in", "normal")
_fan_in_truncated = jax.nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
_fan_avg_uniform = jax.nn.initializers.variance_scaling(1.0, "fan_avg", "uniform")
_unit_normal = jax.nn.initializers.normal(1.0)


@functools.cache
def _query_init(head_dim: int):
    """The query's initialiser: T5 folds attention's 1/sqrt(head_dim) into it."""
    return lambda key, shape, dtype: _fan_in_normal(key, shape, dtype) / head_dim**0.5


@functools.partial(jax.jit, static_argnums=(0, 2))
def _initial(init, key, shape):
    """A parameter's first value in float32. A model built outside jit (`built_on_host`)
    compiles one small program per initialiser and shape, however many layers it has; inside
    jit, the same numbers."""
    return init(key, shape, jnp.float32)


def _param(rngs, init, shape, axes):
    """A float32 parameter carrying its logical axis names (sharded later by mesh rules)."""
    return nnx.Param(_initial(init, rngs.params(), shape), eager_sharding=False, **axes_metadata(axes))


class Dropout(nnx.Module):
    """Inverted dropout; its mask comes from `speedups.keep_mask`, seeded by one draw from
    `rngs.dropout` (nnx.Dropout's threefry mask is slow on CPU, see there)."""

    def __init__(self, rate: float):
        self.rate = rate

    def __call__(self, x, *, deterministic: bool, rngs=None):
        if deterministic or self.rate == 0.0:
            return x
        keep = speedups.keep_mask(jax.random.bits(rngs.dropout(), (), jnp.uint32), x.shape, self.rate)
        return jnp.where(keep, x / (1.0 - self.rate), jnp.zeros_like(x)).astype(x.dtype)


class Dense(nnx.Module):
    """y = x @ kernel, kernel [in, out] with logical `axes`, computed in `dtype`; with a LoRA
    `rank` (Hu et al. 2021), plus scale * (x @ lora_a) @ lora_b, lora_a [in, r] random and
    lora_b [r, out] zero, so an adapted model starts as the model it adapts."""

    def __init__(self, features_in, features_out, axes, dtype, rngs, init=_fan_in_truncated, rank=0, scale=1.0):
        self.kernel = _param(rngs, init, (features_in, features_out), axes)
        if rank:
            self.lora_a = _param(rngs, _fan_in_normal, (features_in, rank), (axes[0], None))
            self.lora_b = _param(rngs, jax.nn.initializers.zeros, (rank, features_out), (None, axes[1]))
        self.dtype, self.lora_scale = dtype, scale if rank else None

    def __call__(self, x):
        x = x.astype(self.dtype)
        y = speedups.matmul(x, self.kernel[...].astype(self.dtype))
        if self.lora_scale is None:
            return y
        return y + self.lora_scale * ((x @ self.lora_a[...].astype(self.dtype)) @ self.lora_b[...].astype(self.dtype))


def lora(config: T5Config, name: str) -> dict:
    """Dense's LoRA arguments for the kernel `name` (query, wi, ...): none unless it is a target."""
    if not config.lora_rank or name not in config.lora_targets:
        return {}
    return {"rank": config.lora_rank, "scale": config.lora_scale}


class Embed(nnx.Module):
    """Token embedding [v, e]; `attend` reuses it as the (tied) output layer."""

    def __init__(self, vocab_size, features, dtype, rngs):
        self.embedding = _param(rngs, _unit_normal, (vocab_size, features), ("vocab", "embed"))
        self.dtype = dtype

    def __call__(self, tokens):
        return jnp.take(self.embedding[...], tokens, axis=0).astype(self.dtype)

    def attend(self, x):
        return jnp.dot(x.astype(self.dtype), self.embedding[...].astype(self.dtype).T)


class LayerNorm(nnx.Module):
    """T5's RMS norm: no mean, no bias, computed in float32."""

    def __init__(self, features, dtype, rngs, epsilon=1e-6):
        self.scale = _param(rngs, jax.nn.initializers.ones, (features,), ("embed",))
        self.dtype, self.epsilon = dtype, epsilon

    def __call__(self, x):
        x = x.astype(jnp.float32)
        x = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.epsilon)
        return (x * self.scale[...]).astype(self.dtype)


def relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """Mesh-TF's bucketing: exact for small offsets, logarithmic up to `max_distance`."""
    n = -relative_position
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        bucket += (n < 0).astype(jnp.int32) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    log_ratio = jnp.log(n.astype(jnp.float32) / max_exact + jnp.finfo(jnp.float32).eps)
    large = max_exact + (log_ratio / jnp.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return bucket + jnp.where(n < max_exact, n, large)


class RelativePositionBiases(nnx.Module):
    """One learned bias per (head, bucket), shared by all layers of a stack."""

    def __init__(self, config: T5Config, bidirectional: bool, rngs):
        self.config, self.bidirectional = config, bidirectional
        self.rel_embedding = _param(
            rngs, _fan_avg_uniform,
            (config.num_heads, config.relative_attention_num_buckets), ("heads", "relpos_buckets"))

    def __call__(self, query_positions, key_positions):
        """[q] and [k] positions -> bias [1, h, q, k]."""
        bucket = relative_position_bucket(
            key_positions[None, :] - query_positions[:, None], self.bidirectional,
            self.config.relative_attention_num_buckets, self.config.relative_attention_max_distance)
        return self.rel_embedding[...][:, bucket][None].astype(self.config.dtype)


class MultiHeadAttention(nnx.Module):
    """Dot-product attention without 1/sqrt(d) scaling (T5 folds it into the query init)."""

    def __init__(self, config: T5Config, rngs):
        c = config
        joined = c.num_heads * c.head_dim
        self.query = Dense(c.emb_dim, joined, ("embed", "joined_kv"), c.dtype, rngs, _query_init(c.head_dim),
                           **lora(c, "query"))
        self.key = Dense(c.emb_dim, joined, ("embed", "joined_kv"), c.dtype, rngs, _fan_in_normal, **lora(c, "key"))
        self.value = Dense(c.emb_dim, joined, ("embed", "joined_kv"), c.dtype, rngs, _fan_in_normal,
                           **lora(c, "value"))
        self.out = Dense(joined, c.emb_dim, ("joined_kv", "embed"), c.dtype, rngs, _fan_in_normal, **lora(c, "out"))
        self.dropout = Dropout(c.dropout_rate)
        self.config = c

    def project_kv(self, x):
        """[b, k, e] -> keys and values [b, h, k, d] (cached once for decoding)."""
        return self._heads(self.key(x)), self._heads(self.value(x))

    def _heads(self, x):
        """[b, l, h*d] -> [b, h, l, d]: heads lead, so each head's scores are one plain matmul
        (decoding reads the cached cross keys/values every step without transposing them)."""
        x = x.reshape(*x.shape[:-1], self.config.num_heads, self.config.head_dim).swapaxes(1, 2)
        return constrain(x, ("batch", "heads", "length", "kv"))

    def __call__(self, x_q, keys, values, bias, rngs=None):
        """x_q [b, q, e], keys/values [b, h, k, d], bias [b or 1, h or 1, q, k] -> [b, q, e]."""
        query = self._heads(self.query(x_q))
        if self.config.attention == "dot_product_attention" and (rngs is None or not self.config.dropout_rate):
            y = fused_attention(query, keys, values, bias)
        else:
            logits_dtype = jnp.float32 if self.config.float32_attention_logits else self.config.dtype
            logits = jnp.einsum("bhqd,bhkd->bhqk", query, keys, preferred_element_type=logits_dtype)
            weights = jax.nn.softmax(logits + bias.astype(logits_dtype)).astype(self.config.dtype)
            weights = self.dropout(weights, deterministic=rngs is None, rngs=rngs)
            y = jnp.einsum("bhqk,bhkd->bqhd", weights, values)
        return self.out(y.reshape(*y.shape[:2], -1))


def attention_implementation(query_length: int, key_length: int, head_dim: int, dtype, device=None) -> str:
    """Which kernel `fused_attention` runs, decided from shapes, dtype and device before anything
    is traced: "cudnn", cuDNN's fused kernel, where all of its conditions hold (those
    `jax.nn.dot_product_attention` checks, some only in the forward rule of its gradient, which
    JAX traces late under `lax.scan` or `jax.checkpoint`, outside any `try`):
    - an NVIDIA GPU through CUDA (cuDNN ships with JAX's CUDA build; a ROCm GPU has none) of
      compute capability 8.0 (Ampere) or later; at 10.3 (B300) with cuDNN 9.11 or later;
    - bfloat16 or float16;
    - a head dim that is a multiple of 8, at most 128 (256 from compute capability 9.0);
    - even query and key lengths: with a bias, cuDNN's training kernel takes no other. A trace
      cannot tell whether it will be differentiated, so this holds for every call, decoding's
      one-position step included.
    Else "xla": XLA's attention, on every backend. `device`: jax.devices()[0] by default."""
    device = jax.devices()[0] if device is None else device
    capability = getattr(device, "compute_capability", None)
    on_cuda = device.platform == "gpu" and "cuda" in device.client.platform_version.lower() and capability
    if not on_cuda or jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
        return "xla"
    capability = tuple(int(part) for part in str(capability).split("."))
    largest_head = 256 if capability >= (9, 0) else 128
    if capability < (8, 0) or head_dim % 8 or head_dim > largest_head or query_length % 2 or key_length % 2:
        return "xla"
    if capability == (10, 3) and cudnn_version() < 91100:
        return "xla"
    return "cudnn"


def cudnn_version() -> int:
    """The version of cuDNN that JAX's CUDA build loaded (91100 for 9.11), as JAX's own checks read
    it; 0 where there is none."""
    from jax._src.lib import cuda_versions  # only where a CUDA GPU asks: no public API has it

    return cuda_versions.cudnn_get_version() if cuda_versions else 0


def mask_bias_in(dtype, bias):
    """An attention bias in `dtype`, every value finite: `NEG_INF` (-1e10) is -inf in float16, and a
    query whose keys are all masked (a padding row) would then softmax to NaN; it becomes the
    dtype's most negative value instead (bfloat16 and float32 hold -1e10 as it is)."""
    return jnp.maximum(bias, jnp.finfo(dtype).min).astype(dtype)


def fused_attention(query, keys, values, bias):
    """softmax(q k^T + bias) v through `jax.nn.dot_product_attention` (no 1/sqrt(d) scale, as
    T5), by the kernel `attention_implementation` picks: cuDNN's, its bias in the inputs' dtype,
    or XLA's, which computes the logits and softmax in float32 as the einsum path does. It has
    no dropout: with dropout on, attention takes the einsum path.
    [b, h, q, d], [b, h, k, d] x 2, [b or 1, h or 1, q, k] -> [b, q, h, d]."""
    heads_second = [x.swapaxes(1, 2) for x in (query, keys, values)]  # its layout: [b, length, h, d]
    bias = jnp.broadcast_to(bias, (*bias.shape[:2], query.shape[2], keys.shape[2]))
    if attention_implementation(query.shape[2], keys.shape[2], query.shape[3], query.dtype) == "cudnn":
        return jax.nn.dot_product_attention(*heads_second, bias=mask_bias_in(query.dtype, bias), scale=1.0,
                                            implementation="cudnn")
    return jax.nn.dot_product_attention(*heads_second, bias=bias, scale=1.0, implementation="xla")


class MlpBlock(nnx.Module):
    """wi (or wi_0, wi_1 for gated activations) -> activation product -> dropout -> wo."""

    def __init__(self, config: T5Config, rngs):
        c = config
        names = c.mlp_inputs
        for name in names:
            setattr(self, name, Dense(c.emb_dim, c.mlp_dim, ("embed", "mlp"), c.dtype, rngs, **lora(c, name)))
        self.wo = Dense(c.mlp_dim, c.emb_dim, ("mlp", "embed"), c.dtype, rngs, **lora(c, "wo"))
        self.dropout = Dropout(c.dropout_rate)
        self.names, self.activations = names, c.mlp_activations

    def __call__(self, x, rngs=None):
        h = functools.reduce(jnp.multiply, [ACTIVATIONS[act](getattr(self, name)(x))
                                            for name, act in zip(self.names, self.activations)])
        h = constrain(self.dropout(h, deterministic=rngs is None, rngs=rngs), ("batch", "length", "mlp"))
        return self.wo(h)


def pre_norm(config: T5Config, rngs) -> LayerNorm:
    """The norm in front of each block of a layer (T5 normalises a block's input, not its output)."""
    return LayerNorm(config.emb_dim, config.dtype, rngs)


def residual(x, h, dropout: Dropout, rngs):
    """x + dropout(h): how each block's output joins the residual stream."""
    return x + dropout(h, deterministic=rngs is None, rngs=rngs)


class EncoderLayer(nnx.Module):
    """Pre-norm self-attention and MLP blocks, each added back as a residual."""

    def __init__(self, config: T5Config, rngs):
        self.pre_attention_layer_norm, self.attention = pre_norm(config, rngs), MultiHeadAttention(config, rngs)
        self.pre_mlp_layer_norm, self.mlp = pre_norm(config, rngs), MlpBlock(config, rngs)
        self.dropout = Dropout(config.dropout_rate)

    def __call__(self, x, bias, rngs=None):
        """x [b, l, e], bias [b, h, l, l] -> [b, l, e]."""
        h = self.pre_attention_layer_norm(x)
        x = residual(x, self.attention(h, *self.attention.project_kv(h), bias, rngs), self.dropout, rngs)
        x = residual(x, self.mlp(self.pre_mlp_layer_norm(x), rngs), self.dropout, rngs)
        return constrain(x, ("batch", "length", "embed"))


class DecoderLayer(nnx.Module):
    """Pre-norm causal self-attention, attention to the encoder's output, and MLP blocks."""

    def __init__(self, config: T5Config, rngs):
        c = config
        self.pre_self_attention_layer_norm, self.self_attention = pre_norm(c, rngs), MultiHeadAttention(c, rngs)
        self.pre_cross_attention_layer_norm = pre_norm(c, rngs)
        self.encoder_decoder_attention = MultiHeadAttention(c, rngs)
        self.pre_mlp_layer_norm, self.mlp = pre_norm(c, rngs), MlpBlock(c, rngs)
        self.dropout = Dropout(c.dropout_rate)

    def __call__(self, y, encoded, self_bias, cross_bias, rngs=None):
        """Teacher forced: y [b, q, e], encoded [b, k, e] -> [b, q, e]."""
        return self._blocks(y, None, self_bias, self.encoder_decoder_attention.project_kv(encoded), cross_bias, rngs)

    def step(self, y, cache: dict, index, self_bias, cross_bias):
        """One position y [b, 1, e] at `index`, its keys and values written into this layer's
        `cache` (see `Decoder.init_cache`) -> ([b, 1, e], the updated cache)."""
        key, value = self.self_attention.project_kv(self.pre_self_attention_layer_norm(y))
        cache = {**cache, **{name: jax.lax.dynamic_update_slice_in_dim(cache[name], new, index, axis=2)
                             for name, new in (("self_key", key), ("self_value", value))}}
        y = self._blocks(y, (cache["self_key"], cache["self_value"]), self_bias,
                         (cache["cross_key"], cache["cross_value"]), cross_bias, None)
        return y, cache

    def _blocks(self, y, self_kv, self_bias, cross_kv, cross_bias, rngs):
        """`self_kv`/`cross_kv`: (keys, values) [b, h, k, d]; `self_kv` None: projected from y."""
        h = self.pre_self_attention_layer_norm(y)
        self_kv = self_kv or self.self_attention.project_kv(h)
        y = residual(y, self.self_attention(h, *self_kv, self_bias, rngs), self.dropout, rngs)
        h = self.pre_cross_attention_layer_norm(y)
        y = residual(y, self.encoder_decoder_attention(h, *cross_kv, cross_bias, rngs), self.dropout, rngs)
        y = residual(y, self.mlp(self.pre_mlp_layer_norm(y), rngs), self.dropout, rngs)
        return constrain(y, ("batch", "length", "embed"))


def attention_mask_bias(query_valid, key_valid, query_segments=None, key_segments=None, causal=False):
    """Additive bias [b, 1, q, k]: 0 where a query may attend to a key, NEG_INF elsewhere."""
    allowed = query_valid[:, :, None] & key_valid[:, None, :]
    if query_segments is not None:
        allowed &= query_segments[:, :, None] == key_segments[:, None, :]
    if causal:
        q, k = allowed.shape[1:]
        allowed &= jnp.arange(q)[:, None] >= jnp.arange(k)[None, :]
    return jnp.where(allowed, 0.0, NEG_INF)[:, None]


def shift_right(targets):
    """Decoder inputs [b, q] from targets [b, q]: 0 (the start token) first, the last one dropped."""
    return jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))


def _embed(embedder: Embed, tokens, dropout: Dropout, rngs, prompt=None):
    """Token ids [b, l] -> embeddings [b, l, e] (after a `prompt` [p, e]: [b, p + l, e]), dropped out."""
    x = embedder(tokens)
    if prompt is not None:
        x = jnp.concatenate([jnp.broadcast_to(prompt.astype(x.dtype), (x.shape[0], *prompt.shape)), x], axis=1)
    x = dropout(x, deterministic=rngs is None, rngs=rngs)
    return constrain(x, ("batch", "length", "embed"))


def encoder_valid(config: T5Config, encoder_input_tokens):
    """Which encoder positions hold something [b, p + l]: the prompt's p, then the tokens but padding."""
    valid = encoder_input_tokens > 0
    if not config.prompt_length:
        return valid
    return jnp.concatenate([jnp.ones((valid.shape[0], config.prompt_length), bool), valid], axis=1)


def layer_stack(config: T5Config, layers: list):
    """A stack's layers as the model holds them: a list of modules, or with `config.scan_layers`
    one module of their kind whose parameters are the layers' stacked on a leading `layers` axis,
    as T5X's scanned models hold them (a scan reads them as they are: no copy at each call).
    Either way layer i starts with the same numbers."""
    if not config.scan_layers:
        return nnx.data(layers)
    graphdef = nnx.split(layers[0])[0]

    def stack(*variables):
        stacked = jnp.stack([variable[...] for variable in variables])
        return variables[0].replace(stacked, **axes_metadata(("layers", *logical_axes(variables[0]))))

    states = [nnx.split(layer)[1] for layer in layers]
    return nnx.merge(graphdef, jax.tree.map(stack, *states, is_leaf=lambda x: isinstance(x, nnx.Variable)))


def each_layer(layers) -> list:
    """A stack's layers one by one; a scanned stack's sliced from its stacked parameters."""
    if not isinstance(layers, (EncoderLayer, DecoderLayer)):  # a list of them
        return list(layers)
    graphdef, state = nnx.split(layers)
    return [nnx.merge(graphdef, jax.tree.map(lambda x, i=i: x[i], state)) for i in range(_depth(state))]


def _depth(stacked) -> int:
    return jax.tree.leaves(stacked)[0].shape[0]


# Who runs a scanned stack, when not `lax.scan`: a train step that updates each layer inside
# the stack's backward pass (`t5nb.layerwise.update_in_backward`) sets it for its forward pass.
_STACK_RUNNER = contextvars.ContextVar("t5nb_stack_runner", default=None)


@contextlib.contextmanager
def stacks_run_by(runner):
    """Within this block, each scanned stack runs as `runner(name, apply, x, stacked, keys) -> x`:
    `name` 'encoder' or 'decoder', `apply(layer_state, x, key) -> x` one layer, `stacked` the
    stack's parameters (an `nnx.State`), `keys` each layer's dropout key or None."""
    token = _STACK_RUNNER.set(runner)
    try:
        yield
    finally:
        _STACK_RUNNER.reset(token)


def run_stack(layers, x, config: T5Config, rngs, call, name: str):
    """x through each layer of the stack `name` in turn, `call(layer, x, rngs) -> x`: unrolled,
    or as one `lax.scan` over the stacked parameters of a scanned stack (`layer_stack`), each
    layer's activations kept or recomputed for the backward pass by `config.remat_policy`. Each
    layer's dropout draws from its own key, split from one, so every way gives the same numbers."""
    graphdef, stacked = nnx.split(layers) if config.scan_layers else (nnx.split(layers[0])[0], None)
    keys = None if rngs is None else jax.random.split(rngs.dropout(), _depth(stacked) if stacked else len(layers))
    policy = REMAT_POLICIES[config.remat_policy]
    if not config.scan_layers and policy is None:
        for i, layer in enumerate(layers):
            x = call(layer, x, None if keys is None else nnx.Rngs(dropout=keys[i]))
        return x

    def apply(state, x, key):
        return call(nnx.merge(graphdef, state), x, None if key is None else nnx.Rngs(dropout=key))

    runner = _STACK_RUNNER.get() if config.scan_layers else None
    if runner is not None:
        return runner(name, apply, x, stacked, keys)
    if policy is not None:
        apply = jax.checkpoint(apply, policy=getattr(jax.checkpoint_policies, policy))
    if not config.scan_layers:
        for i, layer in enumerate(layers):
            x = apply(nnx.state(layer), x, None if keys is None else keys[i])
        return x

    def body(x, layer_input):  # layer_input: (the layer's parameters, its dropout key or None)
        state, key = layer_input
        return apply(state, x, key), None

    return jax.lax.scan(body, x, (stacked, keys))[0]


def _map_stacks(params: dict, change) -> dict:
    return {key: change(value) if key == "layers" and isinstance(value, dict)
            else _map_stacks(value, change) if isinstance(value, dict) else value for key, value in params.items()}


def stack_layers(params: dict) -> dict:
    """Parameters (a nested dict) with each stack's layers `{0: layer, 1: layer, ...}` stacked into
    one layer's tree of `[layers, ...]` arrays, as a scanned model holds them; stacked ones stay."""
    def stack(layers):
        if not layers or not all(isinstance(index, int) for index in layers):
            return layers
        return jax.tree.map(lambda *leaves: jnp.stack(leaves), *(layers[index] for index in sorted(layers)))

    return _map_stacks(params, stack)


def unstack_layers(params: dict) -> dict:
    """`stack_layers`' inverse: each stack's layers keyed by index (t5nb's one form); per-layer ones stay."""
    def unstack(layers):
        if all(isinstance(index, int) for index in layers):
            return layers
        return {index: jax.tree.map(lambda leaf: leaf[index], layers) for index in range(_depth(layers))}

    return _map_stacks(params, unstack)


class Encoder(nnx.Module):
    """Token ids -> encoded [b, l, e]: embedding, a stack of layers sharing one relative
    position bias, final norm. `embedder` is the token embedding shared with the decoder. With
    `config.prompt_length` p (prompt tuning), p learned vectors go before the embedded tokens
    and the output is [b, p + l, e]."""

    def __init__(self, config: T5Config, rngs):
        if config.prompt_length:
            self.prompt = _param(rngs, _unit_normal, (config.prompt_length, config.emb_dim),
                                 (None, "embed"))
        self.relpos_bias = RelativePositionBiases(config, bidirectional=True, rngs=rngs)
        self.layers = layer_stack(config, [EncoderLayer(config, rngs) for _ in range(config.num_encoder_layers)])
        self.encoder_norm = LayerNorm(config.emb_dim, config.dtype, rngs)
        self.dropout = Dropout(config.dropout_rate)
        self.config = config

    def __call__(self, embedder: Embed, encoder_input_tokens, encoder_segment_ids=None, rngs=None):
        """[b, l] token ids (0 = padding) -> [b, l, e] ([b, p + l, e] after a prompt)."""
        prompt = self.prompt[...] if self.config.prompt_length else None
        if prompt is not None and encoder_segment_ids is not None:
            raise ValueError("prompt tuning needs one example per row: pack=False")
        valid = encoder_valid(self.config, encoder_input_tokens)
        length = valid.shape[1]
        bias = (attention_mask_bias(valid, valid, encoder_segment_ids, encoder_segment_ids)
                + self.relpos_bias(jnp.arange(length), jnp.arange(length)))
        x = _embed(embedder, encoder_input_tokens, self.dropout, rngs, prompt)
        x = run_stack(self.layers, x, self.config, rngs, lambda layer, x, rngs: layer(x, bias, rngs), "encoder")
        return self.dropout(self.encoder_norm(x), deterministic=rngs is None, rngs=rngs)


class Decoder(nnx.Module):
    """Target ids and the encoder's output -> logits [b, q, v], teacher forced (`__call__`) or
    one position at a time with a key/value cache (`init_cache`, `step`)."""

    def __init__(self, config: T5Config, rngs):
        self.relpos_bias = RelativePositionBiases(config, bidirectional=False, rngs=rngs)
        self.layers = layer_stack(config, [DecoderLayer(config, rngs) for _ in range(config.num_decoder_layers)])
        self.decoder_norm = LayerNorm(config.emb_dim, config.dtype, rngs)
        self.dropout = Dropout(config.dropout_rate)
        if not config.logits_via_embedding:
            self.logits_dense = Dense(config.emb_dim, config.vocab_size, ("embed", "vocab"), jnp.float32, rngs)
        self.config = config

    def __call__(self, embedder: Embed, encoded, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
                 encoder_segment_ids=None, decoder_segment_ids=None, rngs=None):
        """Inputs [b, q] (the targets shifted right) -> logits [b, q, v]. Padding is read from
        `decoder_target_tokens` (> 0), as in T5X: the inputs start with 0."""
        length = decoder_input_tokens.shape[1]
        target_valid = decoder_target_tokens > 0
        self_bias = (attention_mask_bias(target_valid, target_valid, decoder_segment_ids,
                                         decoder_segment_ids, causal=True)
                     + self.relpos_bias(jnp.arange(length), jnp.arange(length)))
        cross_bias = attention_mask_bias(target_valid, encoder_valid(self.config, encoder_input_tokens),
                                         decoder_segment_ids, encoder_segment_ids)
        y = _embed(embedder, decoder_input_tokens, self.dropout, rngs)
        y = run_stack(self.layers, y, self.config, rngs,
                      lambda layer, y, rngs: layer(y, encoded, self_bias, cross_bias, rngs), "decoder")
        return self.logits(embedder, y, rngs)

    def logits(self, embedder: Embed, y, rngs=None):
        """Final norm, dropout and output layer: [b, q, e] -> float32 logits [b, q, v]."""
        y = self.dropout(self.decoder_norm(y), deterministic=rngs is None, rngs=rngs)
        if self.config.logits_via_embedding:  # tied: rescale by 1/sqrt(e) as T5 does
            logits = embedder.attend(y).astype(jnp.float32) / jnp.sqrt(y.shape[-1])
        else:
            logits = self.logits_dense(y).astype(jnp.float32)
        return constrain(logits, ("batch", "length", "vocab"))

    def init_cache(self, encoded, encoder_input_tokens, max_decode_length: int) -> dict:
        """Cache for `step`: per layer, self-attention keys/values (zeros) and the cross-attention
        keys/values of `encoded`. A pytree whose array leaves lead with the batch, but `index`."""
        c = self.config
        empty = jnp.zeros((encoded.shape[0], c.num_heads, max_decode_length, c.head_dim), c.dtype)
        layers = []
        for layer in each_layer(self.layers):
            cross_key, cross_value = layer.encoder_decoder_attention.project_kv(encoded)
            layers.append({"self_key": empty, "self_value": empty, "cross_key": cross_key, "cross_value": cross_value})
        return {"layers": layers, "encoder_valid": encoder_valid(c, encoder_input_tokens),
                "index": jnp.zeros((), jnp.int32)}

    def step(self, embedder: Embed, token, cache: dict):
        """Token [b] at position `cache['index']` -> (logits [b, v], the updated cache)."""
        index = cache["index"]
        key_positions = jnp.arange(cache["layers"][0]["self_key"].shape[2])
        self_bias = (jnp.where(key_positions <= index, 0.0, NEG_INF)[None, None, None, :]
                     + self.relpos_bias(index[None], key_positions))  # [1, h, 1, k]
        cross_bias = jnp.where(cache["encoder_valid"], 0.0, NEG_INF)[:, None, None, :]
        y = _embed(embedder, token[:, None], self.dropout, None)  # [b, 1, e]
        layers = []
        for layer, layer_cache in zip(each_layer(self.layers), cache["layers"]):
            y, layer_cache = layer.step(y, layer_cache, index, self_bias, cross_bias)
            layers.append(layer_cache)
        return self.logits(embedder, y)[:, 0], {**cache, "layers": layers, "index": index + 1}


class Transformer(nnx.Module):
    """The T5 model: the token embedding shared by an `Encoder` and a `Decoder`."""

    def __init__(self, config: T5Config, *, rngs: nnx.Rngs):
        self.config = config
        self.token_embedder = Embed(config.vocab_size, config.emb_dim, config.dtype, rngs)
        self.encoder = Encoder(config, rngs)
        self.decoder = Decoder(config, rngs)

    def encode(self, encoder_input_tokens, encoder_segment_ids=None, rngs=None):
        """[b, l] token ids (0 = padding) -> encoded [b, l, e]."""
        return self.encoder(self.token_embedder, encoder_input_tokens, encoder_segment_ids, rngs)

    def decode(self, encoded, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
               encoder_segment_ids=None, decoder_segment_ids=None, rngs=None):
        """Teacher-forced decoder: inputs [b, q] (shifted targets) -> logits [b, q, v]."""
        return self.decoder(self.token_embedder, encoded, encoder_input_tokens, decoder_input_tokens,
                            decoder_target_tokens, encoder_segment_ids, decoder_segment_ids, rngs)

    def __call__(self, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
                 encoder_segment_ids=None, decoder_segment_ids=None, rngs=None):
        """Logits [b, q, v] for a batch of seqio's encoder-decoder features."""
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids, rngs)
        return self.decode(encoded, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
                           encoder_segment_ids, decoder_segment_ids, rngs)

    def init_cache(self, encoded, encoder_input_tokens, max_decode_length: int) -> dict:
        """The decoder's cache for `decode_step` (`Decoder.init_cache`)."""
        return self.decoder.init_cache(encoded, encoder_input_tokens, max_decode_length)

    def decode_step(self, token, cache: dict):
        """One decoder position: token [b] at `cache['index']` -> logits [b, v], new cache."""
        return self.decoder.step(self.token_embedder, token, cache)


def built_on_host(config: T5Config, seed: int) -> Transformer:
    """A fresh `config` model built on this process's CPU (the default device where JAX has no
    CPU), a parameter at a time (`_initial`): a few small programs, however deep the model, where
    one program of the whole model took minutes to compile on a GPU; the same numbers."""
    try:
        host = jax.local_devices(backend="cpu")[0]
    except RuntimeError:  # JAX_PLATFORMS without cpu
        host = None
    with jax.default_device(host):
        return Transformer(config, rngs=nnx.Rngs(seed))

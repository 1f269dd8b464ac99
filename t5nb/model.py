"""T5 encoder-decoder in Flax NNX, with T5X's parameter names, shapes and logical axes.

Shapes in comments: b batch, l / q / k lengths, e emb_dim, h heads, d head_dim, m mlp_dim,
v vocab. Parameters are float32; `config.dtype` is the compute dtype. Parameter paths match
T5X (`encoder/layers_0/attention/query/kernel` as [e, h*d]), so converters are renames.
"""
import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from t5nb.config import T5Config
from t5nb.mesh import constrain

NEG_INF = -1e10  # T5X's attention mask bias
ACTIVATIONS = {"relu": jax.nn.relu, "gelu": functools.partial(jax.nn.gelu, approximate=True),
               "linear": lambda x: x}

_fan_in_normal = jax.nn.initializers.variance_scaling(1.0, "fan_in", "normal")
_fan_in_truncated = jax.nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


def _param(rngs, init, shape, axes):
    """A float32 parameter carrying its logical axis names (sharded later by mesh rules)."""
    return nnx.Param(init(rngs.params(), shape, jnp.float32), out_sharding=axes, eager_sharding=False)


def _hashed_bits(seed, shape):
    """32 pseudo-random bits per element: murmur3's finaliser of (element index * golden ratio
    + seed). Indices wrap modulo 2**32, so patterns repeat only past 4G elements."""
    index = sum(jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(math.prod(shape[axis + 1:]) % 2**32)
                for axis in range(len(shape)))
    x = index * jnp.uint32(0x9E3779B9) + seed
    x = (x ^ (x >> 16)) * jnp.uint32(0x85EBCA6B)
    x = (x ^ (x >> 13)) * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


class Dropout(nnx.Module):
    """Inverted dropout whose mask is a counter-based hash seeded by one draw from
    `rngs.dropout`. XLA:CPU spends ~25 ns per element on threefry (`nnx.Dropout`), which made
    dropout a third of a T5.1.1-small train step; the hash fuses into the multiply (~0.5 ns)."""

    def __init__(self, rate: float):
        self.rate = rate

    def __call__(self, x, *, deterministic: bool, rngs=None):
        if deterministic or self.rate == 0.0:
            return x
        seed = jax.random.bits(rngs.dropout(), (), jnp.uint32)
        keep = _hashed_bits(seed, x.shape) >= jnp.uint32(round(self.rate * 2**32))
        return jnp.where(keep, x / (1.0 - self.rate), jnp.zeros_like(x)).astype(x.dtype)


@jax.custom_vjp
def matmul(x, kernel):
    """x [..., i] @ kernel [i, o], with the kernel gradient computed as x^T @ grad.

    Left to itself, JAX asks for (grad^T @ x)^T, and XLA:CPU then transposes the wide MLP
    gradient [tokens, m] inside the fusion that computes it, at ~25 ns per element: a fifth of
    a T5.1.1-small train step. Contracting x instead transposes a saved activation: a plain copy.
    """
    return jnp.dot(x, kernel)


def _matmul_fwd(x, kernel):
    return jnp.dot(x, kernel), (x, kernel)


def _matmul_bwd(residuals, grad):
    x, kernel = residuals
    return jnp.dot(grad, kernel.T), jnp.einsum("...i,...o->io", x, grad)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


class Dense(nnx.Module):
    """y = x @ kernel, kernel [in, out] with logical `axes`, computed in `dtype`."""

    def __init__(self, features_in, features_out, axes, dtype, rngs, init=_fan_in_truncated):
        self.kernel = _param(rngs, init, (features_in, features_out), axes)
        self.dtype = dtype

    def __call__(self, x):
        return matmul(x.astype(self.dtype), self.kernel[...].astype(self.dtype))


class Embed(nnx.Module):
    """Token embedding [v, e]; `attend` reuses it as the (tied) output layer."""

    def __init__(self, vocab_size, features, dtype, rngs):
        self.embedding = _param(rngs, jax.nn.initializers.normal(1.0), (vocab_size, features), ("vocab", "embed"))
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
            rngs, jax.nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
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
        query_init = lambda key, shape, dtype: _fan_in_normal(key, shape, dtype) / c.head_dim**0.5  # noqa: E731
        self.query = Dense(c.emb_dim, joined, ("embed", "joined_kv"), c.dtype, rngs, query_init)
        self.key = Dense(c.emb_dim, joined, ("embed", "joined_kv"), c.dtype, rngs, _fan_in_normal)
        self.value = Dense(c.emb_dim, joined, ("embed", "joined_kv"), c.dtype, rngs, _fan_in_normal)
        self.out = Dense(joined, c.emb_dim, ("joined_kv", "embed"), c.dtype, rngs, _fan_in_normal)
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
        logits_dtype = jnp.float32 if self.config.float32_attention_logits else self.config.dtype
        logits = jnp.einsum("bhqd,bhkd->bhqk", query, keys, preferred_element_type=logits_dtype)
        weights = jax.nn.softmax(logits + bias.astype(logits_dtype)).astype(self.config.dtype)
        weights = self.dropout(weights, deterministic=rngs is None, rngs=rngs)
        y = jnp.einsum("bhqk,bhkd->bqhd", weights, values)
        return self.out(y.reshape(*y.shape[:2], -1))


class MlpBlock(nnx.Module):
    """wi (or wi_0, wi_1 for gated activations) -> activation product -> dropout -> wo."""

    def __init__(self, config: T5Config, rngs):
        c = config
        names = ["wi"] if len(c.mlp_activations) == 1 else [f"wi_{i}" for i in range(len(c.mlp_activations))]
        for name in names:
            setattr(self, name, Dense(c.emb_dim, c.mlp_dim, ("embed", "mlp"), c.dtype, rngs))
        self.wo = Dense(c.mlp_dim, c.emb_dim, ("mlp", "embed"), c.dtype, rngs)
        self.dropout = Dropout(c.dropout_rate)
        self.names, self.activations = names, c.mlp_activations

    def __call__(self, x, rngs=None):
        h = functools.reduce(jnp.multiply, [ACTIVATIONS[act](getattr(self, name)(x))
                                            for name, act in zip(self.names, self.activations)])
        h = constrain(self.dropout(h, deterministic=rngs is None, rngs=rngs), ("batch", "length", "mlp"))
        return self.wo(h)


class EncoderLayer(nnx.Module):
    def __init__(self, config: T5Config, rngs):
        self.pre_attention_layer_norm = LayerNorm(config.emb_dim, config.dtype, rngs)
        self.attention = MultiHeadAttention(config, rngs)
        self.pre_mlp_layer_norm = LayerNorm(config.emb_dim, config.dtype, rngs)
        self.mlp = MlpBlock(config, rngs)
        self.dropout = Dropout(config.dropout_rate)

    def __call__(self, x, bias, rngs=None):
        deterministic = rngs is None
        h = self.pre_attention_layer_norm(x)
        x = x + self.dropout(self.attention(h, *self.attention.project_kv(h), bias, rngs),
                             deterministic=deterministic, rngs=rngs)
        h = self.mlp(self.pre_mlp_layer_norm(x), rngs)
        return constrain(x + self.dropout(h, deterministic=deterministic, rngs=rngs), ("batch", "length", "embed"))


class DecoderLayer(nnx.Module):
    def __init__(self, config: T5Config, rngs):
        self.pre_self_attention_layer_norm = LayerNorm(config.emb_dim, config.dtype, rngs)
        self.self_attention = MultiHeadAttention(config, rngs)
        self.pre_cross_attention_layer_norm = LayerNorm(config.emb_dim, config.dtype, rngs)
        self.encoder_decoder_attention = MultiHeadAttention(config, rngs)
        self.pre_mlp_layer_norm = LayerNorm(config.emb_dim, config.dtype, rngs)
        self.mlp = MlpBlock(config, rngs)
        self.dropout = Dropout(config.dropout_rate)

    def __call__(self, y, self_kv, self_bias, cross_kv, cross_bias, rngs=None):
        """`self_kv`/`cross_kv`: (keys, values) [b, h, k, d]; pass None to project from y."""
        deterministic = rngs is None
        h = self.pre_self_attention_layer_norm(y)
        self_kv = self_kv or self.self_attention.project_kv(h)
        y = y + self.dropout(self.self_attention(h, *self_kv, self_bias, rngs),
                             deterministic=deterministic, rngs=rngs)
        h = self.pre_cross_attention_layer_norm(y)
        y = y + self.dropout(self.encoder_decoder_attention(h, *cross_kv, cross_bias, rngs),
                             deterministic=deterministic, rngs=rngs)
        h = self.mlp(self.pre_mlp_layer_norm(y), rngs)
        return constrain(y + self.dropout(h, deterministic=deterministic, rngs=rngs), ("batch", "length", "embed"))


class Encoder(nnx.Module):
    def __init__(self, config: T5Config, rngs):
        self.relpos_bias = RelativePositionBiases(config, bidirectional=True, rngs=rngs)
        for i in range(config.num_encoder_layers):
            setattr(self, f"layers_{i}", EncoderLayer(config, rngs))
        self.encoder_norm = LayerNorm(config.emb_dim, config.dtype, rngs)
        self.dropout = Dropout(config.dropout_rate)
        self.num_layers = config.num_encoder_layers


class Decoder(nnx.Module):
    def __init__(self, config: T5Config, rngs):
        self.relpos_bias = RelativePositionBiases(config, bidirectional=False, rngs=rngs)
        for i in range(config.num_decoder_layers):
            setattr(self, f"layers_{i}", DecoderLayer(config, rngs))
        self.decoder_norm = LayerNorm(config.emb_dim, config.dtype, rngs)
        self.dropout = Dropout(config.dropout_rate)
        if not config.logits_via_embedding:
            self.logits_dense = Dense(config.emb_dim, config.vocab_size, ("embed", "vocab"),
                                      jnp.float32, rngs)
        self.num_layers = config.num_decoder_layers


def attention_mask_bias(query_valid, key_valid, query_segments=None, key_segments=None, causal=False):
    """Additive bias [b, 1, q, k]: 0 where a query may attend to a key, NEG_INF elsewhere."""
    allowed = query_valid[:, :, None] & key_valid[:, None, :]
    if query_segments is not None:
        allowed &= query_segments[:, :, None] == key_segments[:, None, :]
    if causal:
        q, k = allowed.shape[1:]
        allowed &= jnp.arange(q)[:, None] >= jnp.arange(k)[None, :]
    return jnp.where(allowed, 0.0, NEG_INF)[:, None]


class Transformer(nnx.Module):
    """The T5 model: `encode`, `decode` (teacher forcing), and cached one-step decoding."""

    def __init__(self, config: T5Config, *, rngs: nnx.Rngs):
        self.config = config
        self.token_embedder = Embed(config.vocab_size, config.emb_dim, config.dtype, rngs)
        self.encoder = Encoder(config, rngs)
        self.decoder = Decoder(config, rngs)

    def _embed(self, tokens, rngs, dropout):
        x = self.token_embedder(tokens)  # [b, l, e]
        return constrain(dropout(x, deterministic=rngs is None, rngs=rngs), ("batch", "length", "embed"))

    def encode(self, encoder_input_tokens, encoder_segment_ids=None, rngs=None):
        """[b, l] token ids (0 = padding) -> encoded [b, l, e]."""
        enc = self.encoder
        length = encoder_input_tokens.shape[1]
        valid = encoder_input_tokens > 0
        bias = (attention_mask_bias(valid, valid, encoder_segment_ids, encoder_segment_ids)
                + enc.relpos_bias(jnp.arange(length), jnp.arange(length)))
        x = self._embed(encoder_input_tokens, rngs, enc.dropout)
        for i in range(enc.num_layers):
            x = getattr(enc, f"layers_{i}")(x, bias, rngs)
        x = enc.encoder_norm(x)
        return enc.dropout(x, deterministic=rngs is None, rngs=rngs)

    def _logits(self, y, rngs):
        """Final norm, dropout and output layer: [b, q, e] -> float32 logits [b, q, v]."""
        dec = self.decoder
        y = dec.dropout(dec.decoder_norm(y), deterministic=rngs is None, rngs=rngs)
        if self.config.logits_via_embedding:  # tied: rescale by 1/sqrt(e) as T5 does
            logits = self.token_embedder.attend(y).astype(jnp.float32) / jnp.sqrt(y.shape[-1])
        else:
            logits = dec.logits_dense(y).astype(jnp.float32)
        return constrain(logits, ("batch", "length", "vocab"))

    def decode(self, encoded, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
               encoder_segment_ids=None, decoder_segment_ids=None, rngs=None):
        """Teacher-forced decoder: inputs [b, q] (shifted targets) -> logits [b, q, v].

        Padding is read from `decoder_target_tokens` (> 0), as in T5X: the inputs start with 0.
        """
        dec = self.decoder
        length = decoder_input_tokens.shape[1]
        target_valid, encoder_valid = decoder_target_tokens > 0, encoder_input_tokens > 0
        self_bias = (attention_mask_bias(target_valid, target_valid, decoder_segment_ids,
                                         decoder_segment_ids, causal=True)
                     + dec.relpos_bias(jnp.arange(length), jnp.arange(length)))
        cross_bias = attention_mask_bias(target_valid, encoder_valid, decoder_segment_ids, encoder_segment_ids)
        y = self._embed(decoder_input_tokens, rngs, dec.dropout)
        for i in range(dec.num_layers):
            layer = getattr(dec, f"layers_{i}")
            cross_kv = layer.encoder_decoder_attention.project_kv(encoded)
            y = layer(y, None, self_bias, cross_kv, cross_bias, rngs)
        return self._logits(y, rngs)

    def __call__(self, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
                 encoder_segment_ids=None, decoder_segment_ids=None, rngs=None):
        """Logits [b, q, v] for a batch of seqio's encoder-decoder features."""
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids, rngs)
        return self.decode(encoded, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens,
                           encoder_segment_ids, decoder_segment_ids, rngs)

    # -- incremental decoding -------------------------------------------------------------
    def init_cache(self, encoded, encoder_input_tokens, max_decode_length):
        """Cache for `decode_step`: per-layer self keys/values (zeros), cross keys/values.

        A pytree whose array leaves all lead with the batch dimension, except `index`.
        """
        c, dec = self.config, self.decoder
        batch = encoded.shape[0]
        empty = jnp.zeros((batch, c.num_heads, max_decode_length, c.head_dim), c.dtype)
        layers = []
        for i in range(dec.num_layers):
            cross_key, cross_value = getattr(dec, f"layers_{i}").encoder_decoder_attention.project_kv(encoded)
            layers.append({"self_key": empty, "self_value": empty,
                           "cross_key": cross_key, "cross_value": cross_value})
        return {"layers": layers, "encoder_valid": encoder_input_tokens > 0,
                "index": jnp.zeros((), jnp.int32)}

    def decode_step(self, token, cache):
        """One decoder position: token [b] at `cache['index']` -> logits [b, v], new cache."""
        dec = self.decoder
        index = cache["index"]
        max_length = cache["layers"][0]["self_key"].shape[2]
        key_positions = jnp.arange(max_length)
        self_bias = (jnp.where(key_positions <= index, 0.0, NEG_INF)[None, None, None, :]
                     + dec.relpos_bias(index[None], key_positions))  # [1, h, 1, k]
        cross_bias = jnp.where(cache["encoder_valid"], 0.0, NEG_INF)[:, None, None, :]
        y = self._embed(token[:, None], None, dec.dropout)  # [b, 1, e]
        new_layers = []
        for i, layer_cache in enumerate(cache["layers"]):
            layer = getattr(dec, f"layers_{i}")
            key, value = layer.self_attention.project_kv(layer.pre_self_attention_layer_norm(y))
            layer_cache = dict(layer_cache)
            for name, new in (("self_key", key), ("self_value", value)):
                layer_cache[name] = jax.lax.dynamic_update_slice_in_dim(layer_cache[name], new, index, axis=2)
            y = layer(y, (layer_cache["self_key"], layer_cache["self_value"]), self_bias,
                      (layer_cache["cross_key"], layer_cache["cross_value"]), cross_bias)
            new_layers.append(layer_cache)
        logits = self._logits(y, None)[:, 0]
        return logits, {**cache, "layers": new_layers, "index": index + 1}


def param_count(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))

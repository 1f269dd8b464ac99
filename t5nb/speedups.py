"""Two CPU speed-ups under the T5 layers of `t5nb.model`, each kept for its measured gain on a
T5.1.1-small train step (XLA:CPU, 2 cores; `make bench`). Both compute what the plain JAX
expression computes, with the same FLOPs; only the program XLA gets differs.
"""
import math

import jax
import jax.numpy as jnp


def hashed_bits(seed, shape) -> jax.Array:
    """32 pseudo-random bits per element: murmur3's finaliser of (element index * golden ratio
    + seed). Indices wrap modulo 2**32, so patterns repeat only past 4G elements."""
    index = sum(jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(math.prod(shape[axis + 1:]) % 2**32)
                for axis in range(len(shape)))
    x = index * jnp.uint32(0x9E3779B9) + seed
    x = (x ^ (x >> 16)) * jnp.uint32(0x85EBCA6B)
    x = (x ^ (x >> 13)) * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def keep_mask(seed, shape, rate: float) -> jax.Array:
    """Dropout's mask: True with probability 1 - `rate`, from a counter-based hash of `seed`.

    Measured: XLA:CPU spends ~25 ns per element on threefry (`jax.random.bernoulli`, which
    `nnx.Dropout` uses), which made dropout a third of a T5.1.1-small train step; the hash fuses
    into the multiply that applies it (~0.5 ns per element)."""
    return hashed_bits(seed, shape) >= jnp.uint32(round(rate * 2**32))


@jax.custom_vjp
def matmul(x, kernel):
    """x [..., i] @ kernel [i, o], with the kernel gradient computed as x^T @ grad.

    Measured: left to itself, JAX asks for (grad^T @ x)^T, and XLA:CPU then transposes the wide
    MLP gradient [tokens, m] inside the fusion that computes it, at ~25 ns per element: a fifth
    of a T5.1.1-small train step. Contracting x instead transposes a saved activation: a copy.
    """
    return jnp.dot(x, kernel)


def _matmul_fwd(x, kernel):
    return jnp.dot(x, kernel), (x, kernel)


def _matmul_bwd(residuals, grad):
    x, kernel = residuals
    return jnp.dot(grad, kernel.T), jnp.einsum("...i,...o->io", x, grad)


matmul.defvjp(_matmul_fwd, _matmul_bwd)

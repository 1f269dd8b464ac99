"""The Trainer: T5X's loss and optimizer, the train state, and the sharded, compiled train and
eval steps of one model on one mesh (the loop that drives them is `t5nb.train`)."""
import collections
import dataclasses
import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from t5nb import adapters, layerwise
from t5nb import mesh as mesh_lib
from t5nb.config import T5Config
from t5nb.model import EOS_ID, Transformer, built_on_host, stack_layers, unstack_layers
from t5nb.profiles import chip_of

# remat_policy="auto": the policies tried, least recomputation first, and the share of the chip's
# memory a step may plan (XLA's plan leaves out the allocator's fragmentation and its own workspace)
REMAT_CHOICES = ("none", "minimal", "full")
FITS = 0.9


def remat_choices(platform: str) -> tuple:
    """The policies "auto" tries on `platform`. A GPU starts at "minimal": keeping every
    activation made the slower step on an H200, T5.1.1-small's 63.9 ms against minimal's 53.6 at
    the accelerator course's batch (bench/results/gpu-20261126-205658-gpu.json), as writing the
    activations and reading them back costs more than recomputing the elementwise work that
    minimal does not keep."""
    return REMAT_CHOICES[1:] if platform == "gpu" else REMAT_CHOICES


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How to optimise. `learning_rate=None` is T5X's pretraining `rsqrt_decay` with warmup."""

    learning_rate: float | None = None  # fine-tuning: 1e-3 constant, as in T5X
    warmup_steps: int = 10_000
    optimizer: str = "adafactor"  # or "adamw"
    # Adafactor's steps relative to each parameter's scale (T5X's default); off for adapters that
    # start at zero (LoRA's B), as prompt tuning (Lester et al. 2021) turns it off
    parameter_scale: bool = True
    z_loss: float = 1e-4
    label_smoothing: float = 0.0
    loss_normalizing_factor: float | None = None  # 233472 (2048*114) for MTF checkpoints
    grad_accum_steps: int = 1
    seed: int = 0

    def __post_init__(self):
        def refuse(name, expected):
            raise ValueError(f"TrainConfig.{name} must be {expected}, got {getattr(self, name)!r}")

        if self.learning_rate is not None and not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            refuse("learning_rate", "a positive number (or None: rsqrt decay)")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 1:
            refuse("warmup_steps", "a positive number of steps")
        if self.optimizer not in ("adafactor", "adamw"):
            refuse("optimizer", "'adafactor' or 'adamw'")
        if not self.z_loss >= 0:
            refuse("z_loss", "at least 0")
        if not 0 <= self.label_smoothing < 1:
            refuse("label_smoothing", "in [0, 1)")
        if self.loss_normalizing_factor is not None and not self.loss_normalizing_factor > 0:
            refuse("loss_normalizing_factor", "positive (or None: the number of target tokens)")
        if not isinstance(self.grad_accum_steps, int) or self.grad_accum_steps < 1:
            refuse("grad_accum_steps", "a positive whole number")


def train_step_flops(c: T5Config, batch: int, inputs: int, targets: int) -> float:
    """The model FLOPs of one train step (PaLM's MFU counts these): the matmuls' forward, and in
    the backward pass the gradients the step computes, counted per matmul; what
    rematerialisation computes again is not counted.

    Counts projections (LoRA's too), attention scores and mixing, MLPs and the output layer;
    leaves out norms, softmax, embedding lookups and the optimizer (a few % at most). Each
    matmul y = x @ w costs 2·|x|·|w|/n forward, as much again for x's gradient where x carries
    one (something trainable lies below it) and for w's where w trains. Full training: 3x the
    forward. With adapters (`adapters.split`), only LoRA's matrices or the prompt train: a
    frozen kernel gets no gradient, and what depends on nothing trainable (LoRA: each stack's
    first projections of its input; prompt tuning: the decoder's first self-attention) none at
    all. A prompt's p vectors lengthen the encoder's input to p + inputs.
    """
    e, hd, m, v = c.emb_dim, c.num_heads * c.head_dim, c.mlp_dim, c.vocab_size
    base_trains = not (c.lora_rank or c.prompt_length)
    encoder_length = inputs + c.prompt_length
    te, td = batch * encoder_length, batch * targets

    def dense(tokens, n, out, live, name):
        """x [tokens, n] @ w [n, out], and LoRA's x @ a @ b where it adapts `name`: (FLOPs,
        whether the output carries a gradient)."""
        forward = 2 * tokens * n * out
        flops = forward * (1 + live + base_trains)
        rank = c.lora_rank if name in c.lora_targets else 0
        if rank:  # x @ a: forward, a's gradient, x's if live; (x a) @ b: forward, b's, (x a)'s
            flops += 2 * tokens * n * rank * (2 + live) + 2 * tokens * rank * out * 3
        return flops, live or base_trains or bool(rank)

    def attention(q_tokens, kv_tokens, q_len, k_len, q_live, kv_live):
        (fq, lq), (fk, lk), (fv, lv) = (dense(q_tokens, e, hd, q_live, "query"),
                                        dense(kv_tokens, e, hd, kv_live, "key"), dense(kv_tokens, e, hd, kv_live, "value"))
        core = 2 * batch * q_len * k_len * hd
        weights_live = lq or lk
        scores = core * (1 + lq + lk) + core * (1 + weights_live + lv)  # q k^T; softmax(...) v
        fo, lo = dense(q_tokens, hd, e, weights_live or lv, "out")
        return fq + fk + fv + scores + fo, lo or q_live

    def mlp(tokens, live):
        projections = [dense(tokens, e, m, live, name) for name in c.mlp_inputs]
        fo, lo = dense(tokens, m, e, any(carries for _, carries in projections), "wo")
        return sum(f for f, _ in projections) + fo, lo or live

    flops, live = 0, base_trains or bool(c.prompt_length)  # the embedded inputs (and prompt)
    for _ in range(c.num_encoder_layers):
        f, live = attention(te, te, encoder_length, encoder_length, live, live)
        flops += f
        f, live = mlp(te, live)
        flops += f
    encoded_live, live = live, base_trains
    for _ in range(c.num_decoder_layers):
        f, live = attention(td, td, targets, targets, live, live)
        flops += f
        f, live = attention(td, te, targets, encoder_length, live, encoded_live)
        flops += f
        f, live = mlp(td, live)
        flops += f
    return float(flops + 2 * td * e * v * (1 + live + base_trains))  # the output layer


def learning_rate_schedule(config: TrainConfig):
    if config.learning_rate is not None:
        return optax.constant_schedule(config.learning_rate)
    return lambda step: 1.0 / jnp.sqrt(jnp.maximum(step, config.warmup_steps))


def optimizer_parts(config: TrainConfig) -> tuple[optax.GradientTransformation | None, optax.GradientTransformation]:
    """(what reads all gradients together, or None; what updates each parameter alone):
    optax's Adafactor with T5X's defaults, or AdamW after a global-norm clip."""
    schedule = learning_rate_schedule(config)
    if config.optimizer == "adafactor":
        return None, optax.adafactor(schedule, decay_rate=0.8, clipping_threshold=1.0,
                                     multiply_by_parameter_scale=config.parameter_scale, min_dim_size_to_factor=128)
    return optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01)


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """The optimizer of `optimizer_parts`, as one transformation."""
    whole, each = optimizer_parts(config)
    return each if whole is None else optax.chain(whole, each)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def cross_entropy_with_z_loss(logits, targets, z_loss=1e-4, label_smoothing=0.0):
    """T5X's loss per position: smoothed cross-entropy + z_loss * log(Z)^2 (and that term alone).

    Its gradient is written out (as T5X's `cross_entropy_with_logits` does): the backward pass
    makes one float32 [b, q, v] array, the logits' gradient, from the logits kept from the
    forward pass, where differentiating these lines made the softmax and a scatter of the
    targets' entries as arrays of their own."""
    return _cross_entropy_forward(logits, targets, z_loss, label_smoothing)[0]


def _smoothing(vocab: int, label_smoothing: float) -> tuple[float, float, float]:
    """(the target's probability, every other token's, the smoothed targets' entropy)."""
    confidence, low = 1.0 - label_smoothing, label_smoothing / (vocab - 1)
    return confidence, low, -(confidence * math.log(confidence) + (vocab - 1) * low * math.log(low + 1e-20))


def _cross_entropy_forward(logits, targets, z_loss, label_smoothing):
    confidence, low, entropy = _smoothing(logits.shape[-1], label_smoothing)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    # -sum(soft_targets * log_softmax) without materialising the one-hot [b, q, v]
    loss = log_z - (confidence - low) * target_logit - low * jnp.sum(logits, axis=-1) - entropy
    z_term = z_loss * jnp.square(log_z)
    return (loss + z_term, z_term), (logits, targets, log_z)


def _cross_entropy_backward(z_loss, label_smoothing, saved, cotangents):
    """d/dlogits: softmax * (g_loss + 2 z_loss log Z (g_loss + g_z)) - g_loss * soft targets."""
    logits, targets, log_z = saved
    g_loss, g_z = cotangents
    confidence, low, _ = _smoothing(logits.shape[-1], label_smoothing)
    softmax_scale = g_loss + 2 * z_loss * log_z * (g_loss + g_z)
    is_target = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1) == targets[..., None]
    soft_targets = jnp.where(is_target, confidence, low)
    grad = jnp.exp(logits - log_z[..., None]) * softmax_scale[..., None] - g_loss[..., None] * soft_targets
    return grad.astype(logits.dtype), None


cross_entropy_with_z_loss.defvjp(_cross_entropy_forward, _cross_entropy_backward)


def is_argmax(logits, targets):
    """argmax(logits) == targets, ties going to the first index as argmax's do, in two plain
    reduces (a max, then a min over the indices holding it): XLA:CPU's variadic argmax
    reduce took 50 ms per step on a 32k vocabulary."""
    top = jnp.max(logits, axis=-1, keepdims=True)
    index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    first_top = jnp.min(jnp.where(logits == top, index, logits.shape[-1]), axis=-1)
    return first_top == targets


@struct.dataclass
class TrainState:
    step: jax.Array
    params: dict  # the trained float32 parameters, a nested dict (each stack stacked with scan_layers): all, or the adapters
    opt_state: optax.OptState


@functools.cache  # one per model: every run of it builds Trainers (a tenth of a small run's set-up)
def _abstract_params(config: T5Config):
    """(graphdef, parameter state) of a `config` model, nothing allocated; a template: copy it before changing it."""
    return nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))), nnx.Param)


def _shardings(abstract):
    return jax.tree.map(lambda x: x.sharding, abstract)


# Compiled steps shared by a process's Trainers, keyed by all they depend on: a notebook's
# fine-tunings of one model, or a sweep's runs, trace, lower and compile (or load from JAX's
# persistent cache) each step once: a second or two a run for a small model. The newest
# `_COMPILED_KEPT` are kept.
_COMPILED: collections.OrderedDict = collections.OrderedDict()
_COMPILED_KEPT = 32


def _signature(tree) -> tuple:
    """What a compiled program's inputs must match: structure, shapes, dtypes and shardings."""
    return jax.tree.structure(tree), tuple((x.shape, x.dtype, x.sharding) for x in jax.tree.leaves(tree))


def _loss_weights(batch):
    if "decoder_loss_weights" in batch:
        return batch["decoder_loss_weights"].astype(jnp.float32)
    return (batch["decoder_target_tokens"] > 0).astype(jnp.float32)


class Trainer:
    """A model on a mesh, with its compiled, sharded train and eval steps.

    A model with adapters (`t5nb.adapters`: LoRA, a prompt) trains only those: the train state
    holds them and their optimizer state, and `frozen` the rest, an input of the steps that gets
    no gradient. `model(params)` joins the two.

    With `scan_layers`, the state holds each stack's parameters, and their optimizer state,
    stacked on a leading `layers` axis, as the scan reads them (T5X's scanned layout); the
    optimizer updates each layer as its own, one at a time (`t5nb.layerwise`: Adafactor factors
    and scales it as unrolled), and every checkpoint keeps the per-layer layout
    (`checkpoint_state`, `from_checkpoint`). With `remat_policy='full'` as well, Adafactor, no
    adapters and one batch a step, each layer is updated inside the backward pass
    (`layerwise.update_in_backward`): the step never holds a stack's gradients together."""

    def __init__(self, model_config: T5Config, train_config: TrainConfig, mesh=None,
                 rules=mesh_lib.STANDARD_RULES):
        self.model_config, self.train_config = model_config, train_config
        self.mesh = mesh if mesh is not None else mesh_lib.make_mesh()
        self.rules = rules
        self.optimizer = make_optimizer(train_config)
        self._optimizer_parts = optimizer_parts(train_config)
        self.graphdef, self.param_state = _abstract_params(model_config)  # the state keeps the logical axes
        self.param_shardings = nnx.to_pure_dict(mesh_lib.param_shardings(self.param_state, self.mesh, rules))
        self.trainable_shardings, self.frozen_shardings = adapters.split(model_config, self.param_shardings)
        # the parameters' shapes and dtypes, trained and frozen, as `init_params` makes them
        self._abstract_trainable, self._abstract_frozen = adapters.split(model_config, nnx.to_pure_dict(self.param_state))
        # the trained parameters per layer: as the optimizer and every checkpoint see them
        per_layer = (_abstract_params(model_config.replace(scan_layers=False))[1] if model_config.scan_layers
                     else self.param_state)
        self._abstract_per_layer = adapters.split(model_config, nnx.to_pure_dict(per_layer))[0]
        self._per_layer_shardings = adapters.split(
            model_config, nnx.to_pure_dict(mesh_lib.param_shardings(per_layer, self.mesh, rules)))[0]
        self._frozen = None if adapters.has_adapters(model_config) else {}
        self._run_as(model_config, self.graphdef)
        self.batch_sharding = mesh_lib.batch_sharding(self.mesh)
        self._replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        self.compile_seconds = None
        self._train_step = self._eval_step = self._step_shape = None

    def _run_as(self, model_config: T5Config, graphdef=None) -> None:
        """Run the model as `model_config` says: `run_config`, `model_config` with its remat policy
        chosen where it is "auto" (`compile_train_step`)."""
        self.run_config = model_config
        self.graphdef = graphdef or _abstract_params(model_config)[0]
        # scanned layers computed again in the backward pass anyway, and an optimizer that updates
        # each parameter alone, in one step: each layer is updated inside that pass (`layerwise`)
        self._updates_in_backward = (model_config.scan_layers and model_config.remat_policy == "full"
                                     and self._optimizer_parts[0] is None and self.train_config.grad_accum_steps == 1
                                     and not adapters.has_adapters(model_config))

    # -- state ---------------------------------------------------------------------------
    def _compiled(self, name, build, *inputs):
        """`build()`'s compiled program, compiled once per process for this model, optimizer,
        mesh, rules and `inputs` (arrays or `ShapeDtypeStruct`s with shardings)."""
        key = (name, self.run_config, self.train_config, self.mesh, self.rules, *map(_signature, inputs))
        if key not in _COMPILED:
            _COMPILED[key] = build()
            while len(_COMPILED) > _COMPILED_KEPT:
                _COMPILED.popitem(last=False)
        _COMPILED.move_to_end(key)
        return _COMPILED[key]

    def init_params(self, seed: int | None = None) -> dict:
        """Randomly initialised parameters in this trainer's layout and shardings: the model built
        on the host (`model.built_on_host`), then placed on the mesh."""
        seed = self.train_config.seed if seed is None else seed
        params = nnx.to_pure_dict(nnx.state(built_on_host(self.model_config, seed), nnx.Param))
        return jax.tree.map(lambda x, sharding: jax.make_array_from_callback(x.shape, sharding, np.asarray(x).__getitem__),
                            params, self.param_shardings)

    def init_state(self, params: dict | None = None) -> TrainState:
        """Step 0 with a copy of `params` (all of the model's, per layer as from a checkpoint or
        stacked; the train step donates its state, the caller's arrays survive) or a fresh
        initialisation. With adapters, their frozen base becomes `frozen`."""
        params = self.init_params() if params is None else jax.device_put(
            jax.tree.map(jnp.copy, stack_layers(params) if self.model_config.scan_layers else params),
            self.param_shardings)
        params, self._frozen = adapters.split(self.model_config, params)
        opt_state = self._compiled("opt_init", lambda: jax.jit(
            self._init_opt_state, out_shardings=self._opt_state_shardings(stacked=True)).lower(params).compile(), params)(params)
        step = jax.device_put(jnp.zeros((), jnp.int32), self._replicated)
        return TrainState(step=step, params=params, opt_state=opt_state)

    @property
    def frozen(self) -> dict:
        """The parameters that do not train: none, or an adapted model's base (from `init_state`;
        before it, the seed's initialisation)."""
        if self._frozen is None:
            self._frozen = adapters.split(self.model_config, self.init_params())[1]
        return self._frozen

    def abstract_state(self) -> TrainState:
        """The train state's shapes, dtypes and shardings, nothing allocated: what the train step compiles for."""
        return self._abstract(stacked=True)

    def abstract_checkpoint(self) -> TrainState:
        """The train state as checkpoints hold it (`checkpoint_state`), nothing allocated: what to restore into."""
        return self._abstract(stacked=False)

    def _abstract(self, stacked: bool) -> TrainState:
        """The train state (`stacked`: as the steps take it) or a checkpoint's, nothing allocated."""
        params, param_shardings = ((self._abstract_trainable, self.trainable_shardings) if stacked
                                   else (self._abstract_per_layer, self._per_layer_shardings))
        abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params,
                              opt_state=jax.eval_shape(self._init_opt_state if stacked else self.optimizer.init, params))
        shardings = TrainState(step=self._replicated, params=param_shardings,
                               opt_state=self._opt_state_shardings(stacked))
        return jax.tree.map(lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                            abstract, shardings)

    def _init_opt_state(self, params):
        """The optimizer's initial state for `params` as the train state holds them."""
        if not self.model_config.scan_layers:
            return self.optimizer.init(params)
        return layerwise.stack_state(self.optimizer.init(unstack_layers(params)))

    def checkpoint_state(self, state: TrainState) -> TrainState:
        """`state` as checkpoints hold it: each stack's layers keyed by index (a scanned state's unstacked)."""
        if not self.model_config.scan_layers:
            return state
        per_layer = lambda s: s.replace(params=unstack_layers(s.params), opt_state=layerwise.unstack_state(s.opt_state))  # noqa: E731
        return jax.jit(per_layer, out_shardings=_shardings(self.abstract_checkpoint()))(state)

    def from_checkpoint(self, state: TrainState) -> TrainState:
        """`checkpoint_state`'s inverse: a restored state as this trainer's steps take it."""
        if not self.model_config.scan_layers:
            return state
        stacked = lambda s: s.replace(params=stack_layers(s.params), opt_state=layerwise.stack_state(s.opt_state))  # noqa: E731
        return jax.jit(stacked, out_shardings=_shardings(self.abstract_state()))(state)

    def _opt_state_shardings(self, stacked: bool):
        """Optimizer statistics shaped like their parameter share its sharding; the rest
        (Adafactor's factored rows/columns, counters) are replicated. `stacked`: for the train
        state's parameters (stacked with `scan_layers`), else for the per-layer ones."""
        params, shardings = ((self._abstract_trainable, self.trainable_shardings) if stacked
                             else (self._abstract_per_layer, self._per_layer_shardings))
        return optax.tree_map_params(
            self.optimizer,
            lambda leaf, param, sharding: sharding if leaf.shape == param.shape else self._replicated,
            jax.eval_shape(self._init_opt_state if stacked else self.optimizer.init, params), params, shardings,
            transform_non_params=lambda _: self._replicated)

    def model(self, params) -> Transformer:
        """The NNX module holding `params` (for decoding, inspection, export), joined with
        `frozen` if they are a train state's trained parameters."""
        params = stack_layers(params) if self.model_config.scan_layers else params
        return self._module(adapters.merge(self.frozen, params) if self.frozen else params)

    def _module(self, params) -> Transformer:
        """The NNX module holding all of its parameters, `params` (traced or not)."""
        state = jax.tree.map(lambda x: x, self.param_state)  # a fresh copy of the template
        nnx.replace_by_pure_dict(state, params)
        return nnx.merge(self.graphdef, state)

    def shard_batch(self, batch: dict) -> dict:
        """Process-local numpy batch -> global arrays split over 'data'."""
        data = self.mesh.shape["data"] * self.train_config.grad_accum_steps
        for name, array in batch.items():
            global_rows = array.shape[0] * jax.process_count()
            if global_rows % data:
                raise ValueError(f"global batch {global_rows} ({name}) is not divisible by the "
                                 f"data-parallel degree {self.mesh.shape['data']} x grad_accum_steps "
                                 f"{self.train_config.grad_accum_steps}")
        return {name: jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(array))
                for name, array in batch.items()}

    # -- steps ---------------------------------------------------------------------------
    def _sums(self, params, frozen, batch, dropout_key):
        """Summed loss (what we differentiate, with respect to `params`) and the metric sums of
        one (micro)batch."""
        model = self._module(adapters.merge(frozen, params))
        rngs = nnx.Rngs(dropout=dropout_key) if dropout_key is not None else None
        logits = model(batch["encoder_input_tokens"], batch["decoder_input_tokens"], batch["decoder_target_tokens"],
                       batch.get("encoder_segment_ids"), batch.get("decoder_segment_ids"), rngs=rngs)
        targets, weights = batch["decoder_target_tokens"], _loss_weights(batch)
        loss, z_term = cross_entropy_with_z_loss(logits, targets, self.train_config.z_loss,
                                                 self.train_config.label_smoothing)
        correct, answer = is_argmax(logits, targets) * weights, weights * (targets != EOS_ID)
        sums = {"loss": jnp.sum(loss * weights), "z_loss": jnp.sum(z_term * weights),
                "correct": jnp.sum(correct), "weight": jnp.sum(weights),
                "answer_correct": jnp.sum(correct * answer), "answer_weight": jnp.sum(answer),  # EOS left out
                # float32, as every sum: XLA combines their all-reduces with the gradients' into
                # one, after the layer loops. An int32 sum kept an all-reduce of its own, with no
                # data dependence on the loops' all-reduces: XLA:CPU starts such collectives at
                # once on each simulated device, and devices waiting in both can deadlock (aborted
                # after 40 s: the rehearsal's 04 and 05, now and then)
                "sequences": jnp.sum(jnp.any(weights > 0, axis=-1), dtype=jnp.float32)}
        return sums["loss"], sums

    def _gradients(self, params, frozen, batch, dropout_key):
        """Gradients of the summed loss and the metric sums of `batch`, over `grad_accum_steps`
        microbatches if more than one."""
        cfg = self.train_config
        grad_fn = jax.grad(self._sums, has_aux=True)
        if cfg.grad_accum_steps == 1:
            return grad_fn(params, frozen, batch, dropout_key)
        micro = jax.tree.map(lambda x: x.reshape(cfg.grad_accum_steps, -1, *x.shape[1:]), batch)

        def accumulate(carry, inputs):
            index, microbatch = inputs
            key = None if dropout_key is None else jax.random.fold_in(dropout_key, index)
            grads, sums = grad_fn(params, frozen, microbatch, key)
            return jax.tree.map(jnp.add, carry, (grads, sums)), None

        zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(grad_fn, params, frozen,
                                                            jax.tree.map(lambda x: x[0], micro), dropout_key))
        return jax.lax.scan(accumulate, zeros, (jnp.arange(cfg.grad_accum_steps), micro))[0]

    def _train_step_fn(self, state: TrainState, frozen: dict, batch):
        cfg = self.train_config
        dropout_key = (jax.random.fold_in(jax.random.key(cfg.seed), state.step)
                       if self.model_config.dropout_rate > 0 else None)
        # the target tokens' count (the loss weights are 0 or 1), or T5X's fixed factor
        normalizer = cfg.loss_normalizing_factor or jnp.maximum(jnp.sum(_loss_weights(batch)), 1.0)
        if self._updates_in_backward:
            params, opt_state, grad_norm, sums = layerwise.update_in_backward(
                self._optimizer_parts[1], lambda params: self._sums(params, frozen, batch, dropout_key),
                state.params, state.opt_state, normalizer)
        else:
            grads, sums = self._gradients(state.params, frozen, batch, dropout_key)
            grads = jax.tree.map(lambda g: g / normalizer, grads)
            if self.model_config.scan_layers:  # each layer of a stack updated as its own, one at a time
                whole, each = self._optimizer_parts
                params, opt_state = layerwise.update(each, grads, state.opt_state, state.params, whole)
            else:
                updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
                params = optax.apply_updates(state.params, updates)
            grad_norm = optax.global_norm(grads)
        sums = {**sums, "grad_norm": grad_norm, "learning_rate": learning_rate_schedule(cfg)(state.step)}
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), sums

    def compile_train_step(self, state: TrainState, batch: dict):
        """The train step compiled for `state` and `batch`: arrays, or `ShapeDtypeStruct`s with
        shardings (`abstract_state()`), which compile it without allocating anything. With
        `remat_policy="auto"`, the first of `remat_choices` whose step XLA plans within `FITS` of
        the chip's memory (`memory_limit`) and compiles at all (a TPU's compiler refuses a step
        that does not fit); the last where none does. This trainer then runs as that choice
        (`run_config`)."""
        if self.model_config.remat_policy != "auto":
            return self._compile_train_step(state, batch)
        device = self.mesh.devices.flat[0]
        limit, choices = memory_limit(device), remat_choices(device.platform)
        for policy in choices:
            self._run_as(self.model_config.replace(remat_policy=policy))
            try:
                compiled = self._compile_train_step(state, batch)
            except jax.errors.JaxRuntimeError as error:  # a TPU's compiler refuses a step larger than the chip
                if "RESOURCE_EXHAUSTED" not in str(error) or policy == choices[-1]:
                    raise
                continue
            if limit is None or planned_bytes(compiled) <= FITS * limit:
                break
        return compiled

    def _compile_train_step(self, state: TrainState, batch: dict):
        state_shardings = _shardings(state)
        frozen = jax.tree.map(lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                              self._abstract_frozen, self.frozen_shardings)  # abstract, as `state` may be
        jitted = jax.jit(self._train_step_fn, in_shardings=(state_shardings, self.frozen_shardings, self.batch_sharding),
                         out_shardings=(state_shardings, None), donate_argnums=0)

        def build():
            with mesh_lib.activation_sharding(self.mesh, self.rules):
                return jitted.lower(state, frozen, batch).compile()

        return self._compiled("train_step", build, state, batch)

    def train_step(self, state: TrainState, batch: dict):
        """One optimizer step on a sharded batch; returns the new state and metric sums."""
        if self._train_step is None:
            start = time.perf_counter()
            self._train_step = self.compile_train_step(state, batch)
            self.compile_seconds = time.perf_counter() - start
            self._step_shape = (*batch["encoder_input_tokens"].shape, batch["decoder_target_tokens"].shape[1])
        return self._train_step(state, self.frozen, batch)

    def stacked_train_steps(self, states: TrainState, batches: dict):
        """Train a stack of models together, in one program: `states` holds them on a leading
        model axis (every leaf), `batches` [steps, models, rows, ...] (host arrays, unsharded).
        jax.vmap over the models, jax.lax.scan over the steps. Returns the new states and each
        step's summed loss and target tokens per model, {"loss", "weight"} [steps, models]. For
        models too small to fill the chip one at a time (notebook 06 trains a width's seeds so).
        On a CPU, compiled without Eigen's thread pool: for such small operations its threads
        cost more than they give (width 4, 3 models on 2 cores: 12.0 against 17.0 ms a model-step)."""
        def steps(states, batches):
            def step(states, batch):
                states, sums = jax.vmap(lambda state, batch: self._train_step_fn(state, {}, batch))(states, batch)
                return states, {key: sums[key] for key in ("loss", "weight")}
            return jax.lax.scan(step, states, batches)

        options = {"xla_cpu_multi_thread_eigen": False} if self.mesh.devices.flat[0].platform == "cpu" else {}
        compiled = self._compiled("stacked_train_steps",
                                  lambda: jax.jit(steps, donate_argnums=0).lower(states, batches).compile(options),
                                  states, batches)
        return compiled(states, batches)

    def eval_step(self, params: dict, batch: dict) -> dict:
        """Teacher-forced metric sums on a batch (T5X's train_eval); `params` as the state holds them."""
        if self._eval_step is None:
            def build():
                with mesh_lib.activation_sharding(self.mesh, self.rules):
                    return jax.jit(lambda p, f, b: self._sums(p, f, b, None)[1]).lower(params, self.frozen, batch).compile()

            self._eval_step = self._compiled("eval_step", build, params, self.frozen, batch)
        return self._eval_step(params, self.frozen, batch)

    def train_step_memory(self, batch: dict) -> int:
        """Bytes of the compiled train step at its peak, as XLA plans them: arguments (state,
        frozen parameters, batch), outputs and temporaries, less what outputs reuse of arguments.
        Compiles the step for `batch` (numpy, this process's rows) unless it has run."""
        return planned_bytes(self._train_step or self.compile_train_step(self.abstract_state(), self.shard_batch(batch)))

    def step_flops(self) -> float | None:
        """The model FLOPs of the train step that has run (`train_step_flops` at its batch's
        shape: XLA's cost analysis counts a scanned stack's layer once); None before it ran."""
        if self._step_shape is None:
            return None
        return train_step_flops(self.model_config, *self._step_shape)


def planned_bytes(compiled) -> int:
    """What XLA plans a compiled program to hold at its peak: arguments, outputs and temporaries,
    less what outputs reuse of arguments (donated)."""
    memory = compiled.memory_analysis()
    return (memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
            - memory.alias_size_in_bytes)


def memory_limit(device) -> int | None:
    """Bytes a program may hold on `device`: its allocator's limit; for a chip compiled for ahead
    of time (no allocator), its data sheet's memory (`profiles.CHIPS`); None on a CPU."""
    if device.platform != "cpu":
        try:
            stats = device.memory_stats() or {}
        except jax.errors.JaxRuntimeError:  # a device of a topology compiled for, not this process's
            stats = {}
        if "bytes_limit" in stats:
            return stats["bytes_limit"]
    chip = chip_of(device)
    return int(chip.memory) if chip else None


def finalize(sums: dict) -> dict:
    """Metric sums (host numpy) -> per-token averages, as logged; `answer_accuracy` leaves out
    the EOS that ends every target, which a trained model nearly always gets right."""
    weight = max(float(sums["weight"]), 1.0)
    out = {"loss": sums["loss"] / weight, "z_loss": sums["z_loss"] / weight, "accuracy": sums["correct"] / weight}
    if "answer_weight" in sums:
        out["answer_accuracy"] = sums["answer_correct"] / max(float(sums["answer_weight"]), 1.0)
    for name in ("grad_norm", "learning_rate"):
        if name in sums:
            out[name] = sums[name]
    return {name: float(value) for name, value in out.items()}


def teacher_forced(trainer: Trainer, params: dict, batches) -> dict:
    """Teacher-forced loss and token accuracy over an iterable of batches."""
    total = None
    for batch in batches:
        sums = trainer.eval_step(params, trainer.shard_batch(batch))
        total = sums if total is None else jax.tree.map(jnp.add, total, sums)
    if total is None:
        raise ValueError("teacher_forced() got no batches")
    return finalize(jax.device_get(total))

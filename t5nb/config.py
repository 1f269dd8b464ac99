"""Model configuration: one dataclass and the published T5 / T5.1.1 presets."""
import dataclasses
import numbers

import jax.numpy as jnp

# What each layer keeps for the backward pass (T5X's and MaxText's names): "none" keeps every
# activation, "minimal" only the outputs of matmuls without batch dimensions (the projections),
# "full" nothing, recomputing the layer's forward pass. Memory against compute: docs/benchmarks.md.
# "auto": a Trainer takes the first of none, minimal, full whose step fits the chip's memory
# (`trainer.REMAT_CHOICES`); a model run outside a Trainer keeps every activation, as "none".
REMAT_POLICIES = {"none": None, "minimal": "dots_with_no_batch_dims_saveable", "full": "nothing_saveable",
                  "auto": None}
# the kernels LoRA can adapt: attention's projections and the MLP's (wi, or wi_0/wi_1 when gated)
LORA_TARGETS = ("query", "key", "value", "out", "wi", "wi_0", "wi_1", "wo")
# fields that say how the model runs, not what it is: a run may resume with them changed
EXECUTION_FIELDS = ("dtype", "scan_layers", "remat_policy", "attention")
# how attention computes softmax(q k^T + bias) v: T5X's einsums, or jax.nn.dot_product_attention
# (cuDNN's fused kernel on a GPU where it applies; XLA's elsewhere): t5nb.model.attention_implementation
ATTENTION = ("einsum", "dot_product_attention")
# fields that count something: positive whole numbers
_SIZES = ("vocab_size", "emb_dim", "num_heads", "num_encoder_layers", "num_decoder_layers", "head_dim", "mlp_dim",
          "relative_attention_num_buckets", "relative_attention_max_distance")


@dataclasses.dataclass(frozen=True)
class T5Config:
    """Hyperparameters of a T5 encoder-decoder (names follow T5X's `network.T5Config`)."""

    vocab_size: int = 32128  # 32000 pieces + 100 sentinels, padded to a multiple of 128
    emb_dim: int = 512  # d_model
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    head_dim: int = 64  # d_kv
    mlp_dim: int = 2048  # d_ff
    mlp_activations: tuple[str, ...] = ("relu",)  # T5.1.1: ("gelu", "linear") = gated GELU
    logits_via_embedding: bool = True  # T5 1.0 ties the output layer to the embedding
    dropout_rate: float = 0.1
    dtype: jnp.dtype = jnp.float32  # compute dtype; parameters are always float32
    float32_attention_logits: bool = True
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    # Parameter-efficient fine-tuning (t5nb.adapters): with either, only these parameters train.
    lora_rank: int = 0  # LoRA (Hu et al. 2021): kernel + (lora_alpha / lora_rank) * A @ B (0: none)
    lora_alpha: float = 8.0
    lora_targets: tuple[str, ...] = ("query", "value")  # which kernels, of every layer: see LORA_TARGETS
    prompt_length: int = 0  # prompt tuning (Lester et al. 2021): learned vectors before the encoder's input
    # How the model runs, not what it computes (a run may resume with them changed):
    scan_layers: bool = False  # each layer stack as one lax.scan: compile time that does not grow with depth
    remat_policy: str = "none"  # activations recomputed in the backward pass: see REMAT_POLICIES
    attention: str = "einsum"  # see ATTENTION

    def __post_init__(self):
        for field in _SIZES:
            value = getattr(self, field)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
                raise ValueError(f"T5Config.{field} must be a positive whole number, got {value!r}")
        if not 0 <= self.dropout_rate < 1:
            raise ValueError(f"T5Config.dropout_rate must be in [0, 1), got {self.dropout_rate!r}")
        for field in ("lora_rank", "prompt_length"):
            value = getattr(self, field)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
                raise ValueError(f"T5Config.{field} must be a whole number, 0 for none, got {value!r}")
        if not self.lora_alpha > 0:
            raise ValueError(f"T5Config.lora_alpha must be positive, got {self.lora_alpha!r}")
        unknown = sorted(set(self.lora_targets) - set(LORA_TARGETS))
        if unknown or not self.lora_targets:
            raise ValueError(f"T5Config.lora_targets must name kernels among {', '.join(LORA_TARGETS)}, "
                             f"got {tuple(self.lora_targets)!r}")
        absent = sorted(set(self.lora_targets) - {"query", "key", "value", "out", "wo", *self.mlp_inputs})
        if self.lora_rank and absent:
            raise ValueError(f"T5Config.lora_targets: this model has no kernel {', '.join(absent)} (its MLP's are "
                             f"{', '.join(self.mlp_inputs + ('wo',))})")
        if self.attention not in ATTENTION:
            raise ValueError(f"T5Config.attention must be one of {', '.join(ATTENTION)}, got {self.attention!r}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"T5Config.remat_policy must be one of {', '.join(REMAT_POLICIES)}, "
                             f"got {self.remat_policy!r}")

    @property
    def mlp_inputs(self) -> tuple[str, ...]:
        """The MLP's input kernels: `wi`, or `wi_0`, `wi_1`, ... for gated activations."""
        activations = len(self.mlp_activations)
        return ("wi",) if activations == 1 else tuple(f"wi_{i}" for i in range(activations))

    @property
    def lora_scale(self) -> float:
        """The factor of LoRA's update A @ B: lora_alpha / lora_rank."""
        return self.lora_alpha / self.lora_rank

    @classmethod
    def check_fields(cls, names) -> None:
        """Refuse names that are not fields of T5Config, listing the fields."""
        unknown = sorted(set(names) - {field.name for field in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"T5Config has no field {', '.join(unknown)}; its fields: "
                             + ", ".join(field.name for field in dataclasses.fields(cls)))

    def replace(self, **changes) -> "T5Config":
        self.check_fields(changes)
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        """The fields as JSON values (the dtype by name), as a run's `config.json` keeps them."""
        return {**dataclasses.asdict(self), "dtype": jnp.dtype(self.dtype).name}

    @classmethod
    def from_json(cls, fields: dict) -> "T5Config":
        cls.check_fields(fields)
        tuples = {name: tuple(fields[name]) for name in ("mlp_activations", "lora_targets") if name in fields}
        return cls(**{**fields, "dtype": jnp.dtype(fields["dtype"]), **tuples})


_T5_1_0 = T5Config()
_T5_1_1 = T5Config(mlp_activations=("gelu", "linear"), logits_via_embedding=False)


def _size(base, emb, heads, layers, head_dim, mlp):
    return base.replace(emb_dim=emb, num_heads=heads, num_encoder_layers=layers,
                        num_decoder_layers=layers, head_dim=head_dim, mlp_dim=mlp)


PRESETS = {
    # T5 1.0 (Raffel et al. 2020): ReLU MLP, tied embedding, logits scaled by 1/sqrt(d_model).
    "t5-tiny": _size(_T5_1_0, 16, 2, 2, 8, 32),
    "t5-small": _size(_T5_1_0, 512, 8, 6, 64, 2048),
    "t5-base": _size(_T5_1_0, 768, 12, 12, 64, 3072),
    "t5-large": _size(_T5_1_0, 1024, 16, 24, 64, 4096),
    "t5-3b": _size(_T5_1_0, 1024, 32, 24, 128, 16384),
    "t5-11b": _size(_T5_1_0, 1024, 128, 24, 128, 65536),
    # T5.1.1: gated GELU, untied `logits_dense`. "tiny" is T5X's test model (emb 8, 4x3 heads).
    "t5.1.1-tiny": _size(_T5_1_1, 8, 4, 2, 3, 16),
    "t5.1.1-mini": _size(_T5_1_1, 128, 2, 3, 64, 512),  # the offline course on a CPU (~2 M + embeddings)
    "t5.1.1-small": _size(_T5_1_1, 512, 6, 8, 64, 1024),
    "t5.1.1-base": _size(_T5_1_1, 768, 12, 12, 64, 2048),
    "t5.1.1-large": _size(_T5_1_1, 1024, 16, 24, 64, 2816),
    "t5.1.1-xl": _size(_T5_1_1, 2048, 32, 24, 64, 5120),
    "t5.1.1-xxl": _size(_T5_1_1, 4096, 64, 24, 64, 10240),
}


def get_config(name: str, **changes) -> T5Config:
    """A preset by name, with optional field changes (e.g. `vocab_size=`, `dtype=`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name].replace(**changes)

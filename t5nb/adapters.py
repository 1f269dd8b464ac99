"""Parameter-efficient fine-tuning: LoRA and prompt tuning on a frozen T5.

A model whose config has `lora_rank` or `prompt_length` (t5nb.config) carries adapter
parameters beside T5's: `lora_a`, `lora_b` on the kernels in `lora_targets` and the encoder's
`prompt`. Then only those train (`split`): the rest stay as the base checkpoint has them, get
no gradient and no optimizer state, and a run's checkpoints hold only the trained ones, its
recipe naming the base. `add_adapters` puts fresh adapters on a base model's parameters (the
prompt drawn from the vocabulary's embeddings, as Lester et al. 2021 initialise it);
`merge_lora` folds LoRA into the kernels for export.
"""
import jax
import jax.numpy as jnp
import numpy as np

from t5nb.checkpoints.params import model_from_params, params_of
from t5nb.config import T5Config
from t5nb.model import built_on_host

ADAPTERS = ("lora_a", "lora_b", "prompt")  # the parameter names adapters add
PROMPT_INIT_TOKENS = 5000  # the prompt starts as the embeddings of tokens among the most frequent 5,000
# The fine-tuning methods 03 compares, method -> (adapter's model fields, learning rate), chosen on
# the cpu profile's slot filling: LoRA of rank 8 on the attention's query and value (Hugging Face
# peft's default for T5) at 1e-3 (at 1e-2 its training loss diverged; no other rate was tried, and
# none was chosen on the held-out split 03 reports), a 20-vector prompt at 0.3, Lester et al.'s
# rate. "full" is plain fine-tuning, T5X's 1e-3.
FINE_TUNING_METHODS = {"full": (None, 1e-3), "lora": ({"lora_rank": 8}, 1e-3), "prompt": ({"prompt_length": 20}, 0.3)}


def has_adapters(config: T5Config) -> bool:
    return config.lora_rank > 0 or config.prompt_length > 0


def base_config(config: T5Config) -> T5Config:
    """The model the adapters adapt: `config` without them."""
    return config.replace(lora_rank=0, prompt_length=0)


def _partition(tree: dict, keep) -> tuple[dict, dict]:
    """A nested dict's leaves split by `keep(name)` into two nested dicts (empty branches dropped)."""
    kept, rest = {}, {}
    for key, value in tree.items():
        if isinstance(value, dict):
            sub_kept, sub_rest = _partition(value, keep)
            if sub_kept:
                kept[key] = sub_kept
            if sub_rest:
                rest[key] = sub_rest
        elif keep(key):
            kept[key] = value
        else:
            rest[key] = value
    return kept, rest


def split(config: T5Config, params: dict) -> tuple[dict, dict]:
    """(trainable, frozen) parameters: with adapters, the adapters and the rest; else all and none."""
    if not has_adapters(config):
        return params, {}
    return _partition(params, lambda name: name in ADAPTERS)


def merge(*trees: dict) -> dict:
    """Nested dicts joined, later ones winning (`split`'s inverse)."""
    joined = {}
    for tree in trees:
        for key, value in tree.items():
            joined[key] = merge(joined[key], value) if isinstance(value, dict) and key in joined else value
    return joined


def add_adapters(base_params: dict, config: T5Config, seed: int = 0) -> dict:
    """The parameters of the adapted model `config` from its base model's: LoRA's `lora_a`
    random and `lora_b` zero (the adapted model computes what the base does), and the prompt
    the embeddings of `prompt_length` distinct tokens drawn among the vocabulary's 5,000 most
    frequent (SentencePiece numbers its pieces by frequency; 0-2 are pad, EOS and UNK)."""
    adapters = _partition(params_of(built_on_host(config, seed)), lambda name: name in ADAPTERS)[0]
    if config.prompt_length:
        embedding = base_params["token_embedder"]["embedding"]
        high = max(4, min(3 + PROMPT_INIT_TOKENS, config.vocab_size - 128))  # not the sentinels nor the padding
        tokens = np.random.default_rng(seed).choice(np.arange(3, high), config.prompt_length,
                                                    replace=config.prompt_length > high - 3)
        adapters["encoder"]["prompt"] = jnp.asarray(embedding)[tokens]
    return merge(base_params, adapters)


def merge_lora(params: dict, config: T5Config) -> tuple[dict, T5Config]:
    """(parameters, config) with each LoRA update folded into its kernel, kernel + scale * A @ B,
    and no LoRA left: the same function, as a plain T5 (a prompt stays)."""
    scale = config.lora_scale if config.lora_rank else 0.0

    def fold(tree):
        if not isinstance(tree, dict):
            return tree
        if "lora_a" in tree:
            a, b = (jnp.asarray(tree[name], jnp.float32) for name in ("lora_a", "lora_b"))
            kernel = jnp.asarray(tree["kernel"], jnp.float32) + scale * (a @ b)
            return {**{k: v for k, v in tree.items() if k not in ("lora_a", "lora_b", "kernel")}, "kernel": kernel}
        return {key: fold(value) for key, value in tree.items()}

    return fold(params), config.replace(lora_rank=0)


def merged_model(model):
    """A model with its LoRA folded into the kernels (`merge_lora`), e.g. for `save_hf`."""
    params, config = merge_lora(params_of(model), model.config)
    return model_from_params(config, params)


def count(tree: dict) -> int:
    """Number of parameters in a nested dict."""
    return sum(int(np.prod(np.shape(leaf))) for leaf in jax.tree.leaves(tree))

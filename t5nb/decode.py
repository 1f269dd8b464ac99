"""Decoding and scoring with the model's key/value cache, each jitted whole.

- `greedy_decode`, `sample_decode` (temperature, top-k, top-p) and `beam_search` (`num_decodes`
  beams, T5X / Flax WMT length penalty `((5 + length) / 6) ** alpha`): one `lax.while_loop`
  over `Transformer.decode_step`, stopping at EOS or `max_decode_length`.
- `generate`: one of those three by name (`method`), with its options checked.
- `score`: the log-likelihood of given targets (teacher forced); `rank_classify`: the best of
  given options per input.
- `Predictor`: strings in, strings out, through a task's prefix, vocabulary and postprocessor.

Sequences are token ids without the start token, ending in EOS (1), then padding (0). Scores
are sums of the model's log-probabilities of the tokens up to and including EOS. Pass a `mesh`
(with parameters sharded on it, e.g. `Trainer.model(params)`) to split the batch over 'data'.
"""
import functools
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from t5nb import mesh as mesh_lib
from t5nb.model import EOS_ID, NEG_INF, PAD_ID, shift_right
DECODING_OPTIONS = {"greedy": (), "beam": ("num_decodes", "alpha"),
                    "sample": ("temperature", "top_k", "top_p", "seed")}


def _whole(least: int):
    return lambda value: isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= least


# setting -> (valid, what it must be)
_SETTINGS = {
    "input_length": (_whole(1), "a positive whole number of tokens"),
    "max_decode_length": (_whole(1), "a positive whole number of tokens"),
    "batch_size": (_whole(1), "a positive whole number"),
    "num_decodes": (_whole(1), "a positive whole number of beams"),
    "top_k": (_whole(0), "a whole number (0: no top-k filter)"),
    "temperature": (lambda value: value >= 0, "at least 0 (0: greedy)"),
    "top_p": (lambda value: 0 < value <= 1, "in (0, 1]"),
}


def _check_settings(**settings) -> None:
    """Refuse the first setting out of its range, naming it and its value."""
    for name, value in settings.items():
        valid, expected = _SETTINGS[name]
        if not valid(value):
            raise ValueError(f"{name} must be {expected}, got {value!r}")


def check_decoding(method: str, max_decode_length: int, vocab_size: int | None = None, **options) -> None:
    """Refuse an unknown decoding `method`, an option it does not take, or a value out of range
    (with the model's `vocab_size`, a `top_k` above it)."""
    if method not in DECODING_OPTIONS:
        raise ValueError(f"unknown decoding method {method!r}: use 'greedy', 'beam' or 'sample'")
    unknown = sorted(set(options) - set(DECODING_OPTIONS[method]))
    if unknown:
        raise ValueError(f"decoding method {method!r} takes no option {', '.join(unknown)}; "
                         f"its options: {', '.join(DECODING_OPTIONS[method]) or 'none'}")
    _check_settings(max_decode_length=max_decode_length, **{k: v for k, v in options.items() if k in _SETTINGS})
    if vocab_size is not None and options.get("top_k", 0) > vocab_size:
        raise ValueError(f"top_k must be at most the model's vocabulary of {vocab_size} tokens (0: no top-k "
                         f"filter), got {options['top_k']}")


class Decoded(NamedTuple):
    """`sequences` [b, max_decode_length] (beam search: [b, num_decodes, L], best first) and
    `scores` [b] ([b, num_decodes]): summed log-probabilities; on the host."""

    sequences: np.ndarray
    scores: np.ndarray


def brevity_penalty(alpha: float, length):
    """T5X / Flax WMT (GNMT) length penalty: ((5 + length) / 6) ** alpha."""
    return jnp.power((5.0 + length) / 6.0, alpha)


def filter_logits(logits, top_k=0, top_p=1.0):
    """Keep the `top_k` largest logits (0: all), then of those the smallest set whose probability
    reaches `top_p`; the rest become NEG_INF. One sort serves both. Both may be traced: one
    program for every value."""
    descending = jnp.sort(logits, axis=-1)[..., ::-1]
    kth_largest = jnp.take(descending, jnp.clip(top_k - 1, 0, logits.shape[-1] - 1), axis=-1)[..., None]
    kth_largest = jnp.where(top_k > 0, kth_largest, -jnp.inf)
    kept = jnp.where(descending < kth_largest, NEG_INF, descending)  # top-k's, still in order
    probs = jax.nn.softmax(kept, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # probability of the larger logits
    cutoff = jnp.min(jnp.where(before < top_p, kept, jnp.inf), axis=-1, keepdims=True)
    cutoff = jnp.where(top_p < 1.0, cutoff, -jnp.inf)
    return jnp.where(logits < jnp.maximum(kth_largest, cutoff), NEG_INF, logits)


# -- the jitted programs ----------------------------------------------------------------------
class _ByConfig:
    """A static jit argument: a model's graph, hashed and compared by (model class, config)."""

    def __init__(self, graphdef, key):
        self.graphdef, self.key = graphdef, key

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, _ByConfig) and self.key == other.key


def _sharded(fn):
    """Jit `fn(model, *arrays, **static)` with the model split into graph and state; with a
    `mesh`, inputs are split over 'data' and activations constrained by the mesh rules."""

    @functools.partial(jax.jit, static_argnames=("graphdef", "mesh", "options"))
    def run(graphdef, state, arrays, mesh, options):
        model = nnx.merge(graphdef.graphdef, state)
        if mesh is None:
            return fn(model, *arrays, **dict(options))
        with mesh_lib.activation_sharding(mesh):
            return fn(model, *arrays, **dict(options))

    @functools.wraps(fn)
    def call(model, *arrays, mesh=None, **options):
        graphdef, state = nnx.split(model)
        graphdef = _ByConfig(graphdef, (type(model), model.config))
        if mesh is not None:
            data = mesh.shape["data"]
            rows = next(len(a) for a in arrays if np.ndim(a))
            if rows % data:
                raise ValueError(f"a batch of {rows} rows does not split over the mesh's {data} data-parallel "
                                 f"devices; use a multiple of {data}")
            sharding = mesh_lib.batch_sharding(mesh)
            arrays = tuple(jax.device_put(a, sharding) if np.ndim(a) else a for a in arrays)
        return run(graphdef, state, arrays, mesh, tuple(sorted(options.items())))

    return call


def _start(model, encoder_input_tokens, max_decode_length, copies=1):
    """Encode once and build the cache, each row repeated `copies` times (beams)."""
    encoded = model.encode(encoder_input_tokens)
    cache = model.init_cache(encoded, encoder_input_tokens, max_decode_length)
    return jax.tree.map(lambda x: jnp.repeat(x, copies, axis=0) if x.ndim else x, cache)


def _sample(model, encoder_input_tokens, rng, temperature, top_k, top_p, rows, limit, *, max_decode_length,
            greedy, filtered):
    """Greedy (`greedy`) or temperature sampling (through `filter_logits` where `filtered`): one
    token per row per step, for the first `rows` rows and `limit` steps (the rest pad a bucket,
    see `_buckets`). Both choices are the program's own, made once per call, not per step."""
    batch = encoder_input_tokens.shape[0]
    cache = _start(model, encoder_input_tokens, max_decode_length)

    def cond(state):
        step, _, _, _, done, _, _ = state
        return (step < limit) & ~jnp.all(done)

    def body(state):
        step, token, sequences, scores, done, cache, rng = state
        logits, cache = model.decode_step(token, cache)
        log_probs = jax.nn.log_softmax(logits)
        rng, key = jax.random.split(rng)
        if greedy:
            choice = jnp.argmax(logits, axis=-1)
        else:
            tempered = logits / temperature
            choice = jax.random.categorical(key, filter_logits(tempered, top_k, top_p) if filtered else tempered)
        choice = jnp.where(done, PAD_ID, choice).astype(jnp.int32)
        chosen = jnp.take_along_axis(log_probs, choice[:, None], axis=-1)[:, 0]
        scores = scores + jnp.where(done, 0.0, chosen)
        sequences = jax.lax.dynamic_update_slice_in_dim(sequences, choice[:, None], step, axis=1)
        return step + 1, choice, sequences, scores, done | (choice == EOS_ID), cache, rng

    initial = (jnp.zeros((), jnp.int32), jnp.full((batch,), PAD_ID, jnp.int32),
               jnp.zeros((batch, max_decode_length), jnp.int32), jnp.zeros((batch,), jnp.float32),
               jnp.arange(batch) >= rows, cache, rng)
    _, _, sequences, scores, _, _, _ = jax.lax.while_loop(cond, body, initial)
    return Decoded(sequences, scores)


def _beam_search(model, encoder_input_tokens, alpha, rows, limit, *, max_decode_length, num_decodes):
    """Flax WMT's beam search over the cache: `num_decodes` live and finished beams per row,
    for the first `rows` rows and `limit` steps (the rest pad a bucket, see `_buckets`)."""
    batch, beams, length = encoder_input_tokens.shape[0], num_decodes, max_decode_length
    cache = _start(model, encoder_input_tokens, length, copies=beams)
    padding = jnp.arange(batch) >= rows

    def take(x, indices):  # x [b, k', ...], indices [b, n] -> [b, n, ...]
        return jnp.take_along_axis(x, indices.reshape(*indices.shape, *[1] * (x.ndim - 2)), axis=1)

    def take_cache(cache, indices):  # cache rows [b * k, ...] reordered by beam indices [b, k]
        return jax.tree.map(lambda x: take(x.reshape(batch, beams, *x.shape[1:]), indices).reshape(x.shape)
                            if x.ndim else x, cache)

    def cond(state):
        step, live_logprobs, _, finished_scores, _, _, finished, _ = state
        best_possible = jnp.max(live_logprobs, axis=1) / brevity_penalty(alpha, limit)
        worst_finished = jnp.where(jnp.all(finished, axis=1), jnp.min(finished_scores, axis=1), NEG_INF)
        return (step < limit) & ~jnp.all((worst_finished > best_possible) | padding)

    def body(state):
        step, live_logprobs, live_seqs, finished_scores, finished_logprobs, finished_seqs, finished, cache = state
        tokens = jnp.where(step == 0, PAD_ID, live_seqs[:, :, jnp.maximum(step - 1, 0)])
        logits, cache = model.decode_step(tokens.reshape(-1), cache)
        vocab = logits.shape[-1]
        candidates = live_logprobs[:, :, None] + jax.nn.log_softmax(logits).reshape(batch, beams, vocab)
        top_logprobs, top_indices = jax.lax.top_k(candidates.reshape(batch, -1), 2 * beams)
        top_beams, top_tokens = top_indices // vocab, (top_indices % vocab).astype(jnp.int32)
        top_seqs = jax.lax.dynamic_update_slice_in_dim(
            take(live_seqs, top_beams), top_tokens[:, :, None], step, axis=2)
        ended = top_tokens == EOS_ID
        # live: the best `beams` candidates that did not end
        live_logprobs, keep = jax.lax.top_k(jnp.where(ended, NEG_INF, top_logprobs), beams)
        live_seqs = take(top_seqs, keep)
        cache = take_cache(cache, take(top_beams, keep))
        # finished: the best `beams` of the old finished and the candidates that ended now
        new_scores = jnp.where(ended, top_logprobs / brevity_penalty(alpha, step + 1), NEG_INF)
        all_scores = jnp.concatenate([finished_scores, new_scores], axis=1)
        finished_scores, keep = jax.lax.top_k(all_scores, beams)
        finished_logprobs = take(jnp.concatenate([finished_logprobs, top_logprobs], axis=1), keep)
        finished_seqs = take(jnp.concatenate([finished_seqs, top_seqs], axis=1), keep)
        finished = take(jnp.concatenate([finished, ended], axis=1), keep)
        return (step + 1, live_logprobs, live_seqs, finished_scores, finished_logprobs, finished_seqs,
                finished, cache)

    first_live = jnp.where(jnp.arange(beams) == 0, 0.0, NEG_INF)
    initial = (jnp.zeros((), jnp.int32), jnp.tile(first_live, (batch, 1)),
               jnp.zeros((batch, beams, length), jnp.int32), jnp.full((batch, beams), NEG_INF),
               jnp.zeros((batch, beams)), jnp.zeros((batch, beams, length), jnp.int32),
               jnp.zeros((batch, beams), bool), cache)
    _, live_logprobs, live_seqs, finished_scores, finished_logprobs, finished_seqs, finished, _ = (
        jax.lax.while_loop(cond, body, initial))
    # finished beams by score, then the live ones by score (in slots no finished beam filled)
    scores = jnp.concatenate([finished_scores, live_logprobs / brevity_penalty(alpha, limit)], axis=1)
    group = jnp.concatenate([jnp.where(finished, 0, 2), jnp.ones_like(finished, jnp.int32)], axis=1)
    order = jnp.lexsort((-scores, group), axis=-1)[:, :beams]
    return Decoded(take(jnp.concatenate([finished_seqs, live_seqs], axis=1), order),
                   take(jnp.concatenate([finished_logprobs, live_logprobs], axis=1), order))


def _score(model, encoder_input_tokens, decoder_target_tokens):
    """Sum over target positions (> 0) of log p(target token | previous targets, inputs)."""
    logits = model(encoder_input_tokens, shift_right(decoder_target_tokens), decoder_target_tokens)
    log_probs = jnp.take_along_axis(jax.nn.log_softmax(logits), decoder_target_tokens[..., None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(decoder_target_tokens > 0, log_probs, 0.0), axis=-1)


def _rank(model, encoder_input_tokens, option_tokens):
    """Scores [b, n] of n options [b, n, L] per input; each input is encoded once."""
    batch, options, length = option_tokens.shape
    encoded = jnp.repeat(model.encode(encoder_input_tokens), options, axis=0)
    inputs = jnp.repeat(encoder_input_tokens, options, axis=0)
    targets = option_tokens.reshape(batch * options, length)
    logits = model.decode(encoded, inputs, shift_right(targets), targets)
    log_probs = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(targets > 0, log_probs, 0.0), axis=-1).reshape(batch, options)


_sample_jit, _beam_jit, _score_jit, _rank_jit = map(_sharded, (_sample, _beam_search, _score, _rank))


# -- public functions -------------------------------------------------------------------------
# Decoding compiles one program per model, method, input length and these buckets of rows and of
# steps, not one per size asked. Rows cost a CPU in proportion, so they pad little: up to
# ROWS_STEP to a power of two (1, 2, 4, 8), above it to a multiple of ROWS_STEP, and with a mesh
# to a multiple of its data-parallel degree. Steps pad to a power of two, at least LEAST_STEPS (a
# longer cache costs a step little).
ROWS_STEP, LEAST_STEPS = 8, 32


def _buckets(encoder_input_tokens, max_decode_length: int, mesh, min_rows: int) -> tuple[np.ndarray, int]:
    """The inputs padded with empty rows to the bucket of their rows (at least `min_rows`), and
    the steps' bucket."""
    rows = max(len(encoder_input_tokens), min_rows)
    padded = 1 << (rows - 1).bit_length() if rows <= ROWS_STEP else -(-rows // ROWS_STEP) * ROWS_STEP
    if mesh is not None:
        padded = -(-padded // mesh.shape["data"]) * mesh.shape["data"]
    tokens = np.asarray(encoder_input_tokens)
    steps = max(LEAST_STEPS, 1 << (max_decode_length - 1).bit_length())
    return np.pad(tokens, ((0, padded - len(tokens)), (0, 0))), steps


# Each decoding below takes `min_rows`: the rows its program is compiled for at least, so that
# batches of up to that many rows (a Predictor's chunks) share one program; their padding rows
# start done.
def greedy_decode(model, encoder_input_tokens, max_decode_length: int, *, mesh=None, min_rows: int = 1) -> Decoded:
    """The most likely token at every step: sequences [b, L] and their log-likelihoods [b]."""
    return sample_decode(model, encoder_input_tokens, max_decode_length, temperature=0.0, mesh=mesh,
                         min_rows=min_rows)


def sample_decode(model, encoder_input_tokens, max_decode_length: int, *, temperature: float = 1.0,
                  top_k: int = 0, top_p: float = 1.0, seed: int | jax.Array = 0, mesh=None,
                  min_rows: int = 1) -> Decoded:
    """Temperature sampling from the top-k / top-p filtered distribution (temperature 0: greedy).

    Scores are the model's own (untempered) log-probabilities of the sampled tokens; the same
    `seed` gives the same samples."""
    check_decoding("sample", max_decode_length, model.config.vocab_size, temperature=temperature, top_k=top_k,
                   top_p=top_p)
    rng = jax.random.key(seed) if isinstance(seed, int) else seed
    rows = len(encoder_input_tokens)
    tokens, steps = _buckets(encoder_input_tokens, max_decode_length, mesh, min_rows)
    sequences, scores = _sample_jit(model, tokens, rng, jnp.float32(temperature), jnp.int32(top_k),
                                    jnp.float32(top_p), jnp.int32(rows), jnp.int32(max_decode_length), mesh=mesh,
                                    max_decode_length=steps, greedy=bool(temperature == 0),
                                    filtered=bool(temperature != 0 and (top_k > 0 or top_p < 1)))
    return Decoded(np.asarray(sequences)[:rows, :max_decode_length], np.asarray(scores)[:rows])


def beam_search(model, encoder_input_tokens, max_decode_length: int, *, num_decodes: int = 4,
                alpha: float = 0.6, mesh=None, min_rows: int = 1) -> Decoded:
    """Beam search: sequences [b, num_decodes, L] ranked by log-prob / brevity_penalty(alpha,
    length), best first, and their log-likelihoods [b, num_decodes]."""
    _check_settings(max_decode_length=max_decode_length, num_decodes=num_decodes)
    rows = len(encoder_input_tokens)
    tokens, steps = _buckets(encoder_input_tokens, max_decode_length, mesh, min_rows)
    sequences, scores = _beam_jit(model, tokens, jnp.float32(alpha), jnp.int32(rows), jnp.int32(max_decode_length),
                                  mesh=mesh, max_decode_length=steps, num_decodes=int(num_decodes))
    return Decoded(np.asarray(sequences)[:rows, :, :max_decode_length], np.asarray(scores)[:rows])


def generate(model, encoder_input_tokens, max_decode_length: int, *, method: str = "greedy", mesh=None,
             min_rows: int = 1, **options) -> Decoded:
    """The best sequence per input [b, L] and its score [b], by `method`: "greedy", "beam"
    (options `num_decodes`, `alpha`) or "sample" (`temperature`, `top_k`, `top_p`, `seed`)."""
    check_decoding(method, max_decode_length, model.config.vocab_size, **options)
    if method == "greedy":
        return greedy_decode(model, encoder_input_tokens, max_decode_length, mesh=mesh, min_rows=min_rows, **options)
    if method == "sample":
        return sample_decode(model, encoder_input_tokens, max_decode_length, mesh=mesh, min_rows=min_rows,
                             **options)
    sequences, scores = beam_search(model, encoder_input_tokens, max_decode_length, mesh=mesh, min_rows=min_rows,
                                    **options)
    return Decoded(sequences[:, 0], scores[:, 0])


def score(model, encoder_input_tokens, decoder_target_tokens, *, mesh=None) -> jax.Array:
    """Log-likelihood [b] of each target sequence [b, L] (padding 0 ignored), teacher forced."""
    return _score_jit(model, encoder_input_tokens, decoder_target_tokens, mesh=mesh)


def rank_classify(model, encoder_input_tokens, option_tokens, *, mesh=None) -> tuple[jax.Array, jax.Array]:
    """Rank classification: options [n, L] (the same for every input) or [b, n, L] ->
    (index of the most likely option [b], log-likelihoods [b, n])."""
    option_tokens = jnp.asarray(option_tokens)
    if option_tokens.ndim == 2:
        option_tokens = jnp.broadcast_to(option_tokens, (len(encoder_input_tokens), *option_tokens.shape))
    scores = _rank_jit(model, encoder_input_tokens, option_tokens, mesh=mesh)
    return jnp.argmax(scores, axis=-1), scores


# -- strings in, strings out ------------------------------------------------------------------
def _shared(task, what: str, value_of, describe=repr):
    """`value_of(task)`; for a mixture, the value all its tasks share, or a ValueError naming
    each task's (`describe`d)."""
    import seqio  # decoding runs without TensorFlow (a GPU host); only tasks need it

    if not isinstance(task, seqio.Mixture):
        return value_of(task)
    values = {sub.name: value_of(sub) for sub in task.tasks}
    first = next(iter(values.values()))
    if any(value != first for value in values.values()):
        raise ValueError(f"the tasks of mixture {task.name!r} differ in {what} ("
                         + ", ".join(f"{name}: {describe(value)}" for name, value in values.items())
                         + f"); strings in, strings out needs one {what}: use one of its tasks")
    return first


def _own_prefix(task) -> str:
    from t5nb.tasks.pieces import add_prefix  # tasks load TensorFlow: only strings in, strings out needs them

    for preprocessor in task.preprocessors:
        if isinstance(preprocessor, functools.partial) and preprocessor.func is add_prefix:
            return preprocessor.keywords["prefix"]
    return ""


def task_prefix(task) -> str:
    """The text prefix a t5nb task's preprocessors add to `inputs` ("" if none); a mixture's is
    the one its tasks share (a ValueError names each task's if they differ)."""
    from t5nb.tasks import get_task  # tasks load TensorFlow: only strings in, strings out needs them

    return _shared(get_task(task), "input prefix", _own_prefix)


def encode_texts(vocabulary, texts, length: int) -> np.ndarray:
    """Token ids [n, length]: each text's pieces, trimmed to leave room for EOS, then EOS and 0s;
    one warning counts the texts that were cut."""
    tokens = np.zeros((len(texts), length), np.int32)
    lengths = []
    for row, text in enumerate(texts):
        ids = list(vocabulary.encode(text))
        lengths.append(len(ids) + 1)  # with EOS
        ids = ids[: length - 1] + [EOS_ID]
        tokens[row, : len(ids)] = ids
    if cut := sum(n > length for n in lengths):
        warnings.warn(f"{cut} of {len(texts)} inputs are longer than the input length {length} tokens (the longest "
                      f"has {max(lengths)}, with EOS) and were cut to it; a longer input length keeps them whole "
                      "(`t5nb infer --inputs-length`, `Predictor(input_length=...)`)", stacklevel=3)
    return tokens


class Predictor:
    """`predictor(texts) -> answers`: a task's prefix and vocabulary in, its postprocessor out.

        ask = Predictor(model, "facts_qa")
        ask(["Where was Ada Klimberg born?"])   # ['Havana']

    A mixture's tasks must share their prefix and vocabularies (as `closed_book_qa`'s do);
    otherwise it is refused, naming each task's.
    """

    def __init__(self, model, task, *, input_length: int = 128, max_decode_length: int = 32,
                 batch_size: int = 8, method: str = "greedy", mesh=None, **options):
        from t5nb.tasks import check_vocabulary, describe_vocabulary, get_task  # tasks load TensorFlow (see above)

        self.model, self.task = model, get_task(task)
        self.input_vocabulary, self.vocabulary = (
            _shared(self.task, f"{feature} vocabulary", describe=describe_vocabulary,
                    value_of=lambda sub, feature=feature: sub.output_features[feature].vocabulary)
            for feature in ("inputs", "targets"))
        self.prefix = task_prefix(self.task)
        check_vocabulary(model.config.vocab_size, self.task)
        _check_settings(input_length=input_length, batch_size=batch_size)
        check_decoding(method, max_decode_length, model.config.vocab_size, **options)
        self.input_length, self.max_decode_length, self.batch_size = input_length, max_decode_length, batch_size
        self.method, self.mesh, self.options = method, mesh, options

    def inputs(self, texts) -> np.ndarray:
        """Token ids [n, input_length] of `texts`, with the task's prefix where it is missing."""
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"input {index} is a {type(text).__name__}, not a string: {text!r:.80}")
        texts = [t if t.startswith(self.prefix) else self.prefix + t for t in texts]
        return encode_texts(self.input_vocabulary, texts, self.input_length)

    def generate(self, encoder_input_tokens) -> tuple[np.ndarray, np.ndarray]:
        """Sequences [n, L] and scores [n] in batches of `batch_size` rows (one compiled program;
        a shorter last batch's padding rows start done)."""
        sequences, scores = [], []
        for start in range(0, len(encoder_input_tokens), self.batch_size):
            result = generate(self.model, encoder_input_tokens[start:start + self.batch_size], self.max_decode_length,
                              method=self.method, mesh=self.mesh, min_rows=self.batch_size, **self.options)
            sequences.append(result.sequences)
            scores.append(result.scores)
        if not sequences:  # no inputs
            return np.zeros((0, self.max_decode_length), np.int32), np.zeros(0, np.float32)
        return np.concatenate(sequences), np.concatenate(scores)

    def detokenize(self, sequences) -> list[str]:
        return [self.vocabulary.decode(row.tolist()) for row in sequences]

    def postprocess(self, sequences) -> list:
        """Sequences -> answers, through the task's postprocessor (as its metrics see them); a
        mixture's tasks may postprocess differently, so a mixture returns the decoded text."""
        texts = self.detokenize(sequences)
        if not hasattr(self.task, "postprocess_fn"):  # a seqio.Mixture
            return texts
        return [self.task.postprocess_fn(text, example=None, is_target=False) for text in texts]

    def __call__(self, texts) -> list:
        """Answers for `texts` (a string or a list of them)."""
        single = isinstance(texts, str)
        answers = self.postprocess(self.generate(self.inputs([texts] if single else list(texts)))[0])
        return answers[0] if single else answers


def predict(model, task, texts, **kwargs) -> list:
    """One-off `Predictor(model, task, **kwargs)(texts)`."""
    return Predictor(model, task, **kwargs)(texts)

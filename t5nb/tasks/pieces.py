"""The pieces every t5nb task is built from: features, T5's preprocessors, metrics, registry,
and the check that a model's embedding fits a task's vocabulary (`check_vocabulary`).

Three objectives: `span_corruption` (a text source; T5's own preprocessor, 15% noise, mean
span 3), `salient_span_masking` (a text source; one named entity or date masked per text, as in
the T5 closed-book QA paper's "+SSM" pretraining) and `supervised` (an `inputs`/`targets`
source with a text prefix). Closed-book QA
examples carry every accepted answer in `answers`, which `t5.data.postprocessors.qa` hands to
the metric.
"""
import difflib
import functools
import logging

import seqio
import t5.data
import t5.evaluation.metrics
import tensorflow as tf

from t5nb.tasks.vocab import EMBEDDING_MULTIPLE, describe_vocabulary, get_vocabulary

NOISE_DENSITY = 0.15
MEAN_NOISE_SPAN_LENGTH = 3.0

# metric name -> (postprocess_fn, metric_fns)
METRICS = {
    None: (None, []),
    "squad": (t5.data.postprocessors.qa, [t5.evaluation.metrics.squad]),  # EM and F1, every alias
    "accuracy": (None, [t5.evaluation.metrics.accuracy]),
    "bleu": (None, [t5.evaluation.metrics.bleu]),
}


class _DropUncachedSourceWarning(logging.Filter):
    """seqio warns on every in-memory source; t5nb's are small and shuffled by seed."""

    def filter(self, record):
        return "uncached FunctionDataset" not in record.getMessage()


logging.getLogger("absl").addFilter(_DropUncachedSourceWarning())


class TaskNameError(ValueError):
    """An unknown task or mixture name, or a name registered twice."""


def without_autograph(preprocessor):
    """`preprocessor` with the functions it maps traced as written, not first rewritten by
    AutoGraph (`tf.autograph.experimental.do_not_convert`). t5nb's own objectives run so: none of
    their seqio and T5 functions branches or loops on a tensor in Python (the tests build batches
    through each of them both ways, the same), and the rewrite, Python walking each function's
    syntax tree in every process, was most of a pipeline's build: span corruption's took 6.7 CPU s
    with it, 2.0 without (2-core AMD EPYC). A preprocessor of yours (`extra_preprocessors`) keeps
    AutoGraph."""
    @functools.wraps(preprocessor)  # its name for kept_pipelines' key, its signature for seqio
    def traced_as_written(dataset, *args, **kwargs):
        return tf.autograph.experimental.do_not_convert(preprocessor)(dataset, *args, **kwargs)

    return traced_as_written


@without_autograph
@seqio.map_over_dataset
def add_prefix(example, prefix: str):
    """Prepend the task prefix (`trivia question: `, `fact check: `) to `inputs`."""
    return {**example, "inputs": tf.strings.join([prefix, example["inputs"]])}


def output_features(vocabulary: str, inputs_required: bool = True) -> dict:
    """`inputs` and `targets` in one vocabulary, both ending in EOS, as in T5."""
    vocab = get_vocabulary(vocabulary)
    return {
        "inputs": seqio.Feature(vocab, add_eos=True, required=inputs_required),
        "targets": seqio.Feature(vocab, add_eos=True),
    }


def span_corruption_preprocessors() -> list:
    """`c4_v220_span_corruption`'s recipe, after a source that yields `targets` text."""
    return [
        without_autograph(seqio.preprocessors.tokenize),
        seqio.CacheDatasetPlaceholder(),
        functools.partial(without_autograph(t5.data.preprocessors.span_corruption), noise_density=NOISE_DENSITY,
                          mean_noise_span_length=MEAN_NOISE_SPAN_LENGTH),
        without_autograph(seqio.preprocessors.append_eos_after_trim),
    ]


@seqio.map_over_dataset
def _mask_first_salient_span(example, pattern: str, sentinel: str):
    text = example["targets"]
    span = tf.strings.regex_replace(text, rf"^.*?\b({pattern})\b.*$", r"\1")
    masked = tf.strings.regex_replace(text, rf"\b({pattern})\b", sentinel, replace_global=False)
    return {**example, "inputs": masked, "targets": tf.strings.join([sentinel, span], " ")}


@without_autograph
def salient_span_masking(dataset, pattern: str, sentinel: str = "<extra_id_0>"):
    """Guu et al.'s salient span masking, as T5's closed-book QA paper pretrained with it: the
    first match of `pattern` (a regex of entities and dates) becomes the sentinel in `inputs`,
    and `targets` is the sentinel then the span. Texts without a match are dropped."""
    dataset = dataset.filter(lambda example: tf.strings.regex_full_match(example["targets"], rf".*\b({pattern})\b.*"))
    return _mask_first_salient_span(dataset, pattern=pattern, sentinel=sentinel)


def supervised_preprocessors(prefix: str = "") -> list:
    """Prefix, tokenize, append EOS after trimming: T5's text-to-text recipe."""
    prefixing = [functools.partial(add_prefix, prefix=prefix)] if prefix else []
    return prefixing + [
        without_autograph(seqio.preprocessors.tokenize),
        seqio.CacheDatasetPlaceholder(),
        without_autograph(seqio.preprocessors.append_eos_after_trim),
    ]


def add_task(name: str, source: seqio.DataSource, *, objective: str, vocabulary: str,
             prefix: str = "", metric: str | None = None, extra_preprocessors=(),
             salient_spans: str = "", exist_ok: bool = False) -> seqio.Task:
    """Register a task; `exist_ok` returns the registered one (idempotent built-ins), else a
    second registration of `name` is a `TaskNameError`. `salient_spans` is the regex that
    `salient_span_masking` masks."""
    if is_registered(name):
        if exist_ok:
            return seqio.get_mixture_or_task(name)
        raise TaskNameError(f"a task or mixture called {name!r} is already registered; choose another name")
    if objective == "span_corruption":
        preprocessors = list(extra_preprocessors) + span_corruption_preprocessors()
    elif objective == "salient_span_masking":
        if not salient_spans:
            raise ValueError("objective 'salient_span_masking' needs `salient_spans`, a regex of the spans to mask")
        preprocessors = (list(extra_preprocessors) + [functools.partial(salient_span_masking, pattern=salient_spans)]
                         + supervised_preprocessors())
    elif objective == "supervised":
        preprocessors = list(extra_preprocessors) + supervised_preprocessors(prefix)
    else:
        raise ValueError(f"unknown objective {objective!r}; choose 'span_corruption', "
                         "'salient_span_masking' or 'supervised'")
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {[m for m in METRICS if m]}")
    postprocess_fn, metric_fns = METRICS[metric]
    return seqio.TaskRegistry.add(
        name, source=source, preprocessors=preprocessors,
        output_features=output_features(vocabulary, inputs_required=objective == "supervised"),
        postprocess_fn=postprocess_fn, metric_fns=metric_fns,
    )


def add_mixture(name: str, tasks: list, **kwargs) -> seqio.Mixture:
    """Register a mixture of registered tasks (`[(name, rate), ...]` or names with a
    `default_rate`) once; registering it again returns the registered one."""
    if name not in seqio.MixtureRegistry.names():
        seqio.MixtureRegistry.add(name, tasks, **kwargs)
    return seqio.get_mixture_or_task(name)


def first_examples(task, count: int) -> str:
    """The name of `task` trained on only the first `count` examples of its train split (in its
    source's order; its other splits whole), registered as `<task>_first<count>` on first use:
    the training sets of a sample-efficiency curve."""
    task = get_task(task)
    if isinstance(task, seqio.Mixture):
        raise TaskNameError(f"{task.name!r} is a mixture; first_examples takes one of its tasks")
    name = f"{task.name}_first{count}"
    if name not in seqio.TaskRegistry.names():
        source = task.source

        def dataset_fn(split, shuffle_files, seed=None):
            dataset = source.get_dataset(split=split, shuffle=False)
            return dataset.take(count) if split == "train" else dataset

        seqio.TaskRegistry.add(name, source=seqio.FunctionDataSource(dataset_fn, splits=source.splits),
                               preprocessors=task.preprocessors, output_features=task.output_features,
                               postprocess_fn=task.postprocessor, metric_fns=task.metric_fns)
    return name


def is_registered(name: str) -> bool:
    """Whether a task or mixture called `name` is registered."""
    return name in seqio.TaskRegistry.names() or name in seqio.MixtureRegistry.names()


def remove_task(name: str) -> None:
    """Unregister the task `name` (to register it again from files that changed)."""
    seqio.TaskRegistry.remove(name)


def get_task(name_or_task) -> seqio.Task | seqio.Mixture:
    """A registered task or mixture, or a `TaskNameError` that suggests close names."""
    if isinstance(name_or_task, seqio.DatasetProviderBase):
        return name_or_task
    names = sorted(seqio.TaskRegistry.names()) + sorted(seqio.MixtureRegistry.names())
    if name_or_task not in names:
        close = difflib.get_close_matches(name_or_task, names, n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise TaskNameError(f"no task or mixture called {name_or_task!r} is registered{hint}")
    return seqio.get_mixture_or_task(name_or_task)


def check_vocabulary(vocab_size: int, task) -> None:
    """Refuse a model whose embedding of `vocab_size` rows does not fit `task`'s vocabularies
    (a name, seqio.Task or seqio.Mixture): it must hold exactly the vocabulary's ids, or that
    rounded up to a multiple of 128, as T5's 32128-row table holds 32100 ids."""
    task = get_task(task)
    for feature in ("targets", "inputs"):
        if feature not in task.output_features:
            continue
        vocabulary = task.output_features[feature].vocabulary
        ids = vocabulary.vocab_size
        fitting = sorted({ids, -(-ids // EMBEDDING_MULTIPLE) * EMBEDDING_MULTIPLE})
        if vocab_size not in fitting:
            raise ValueError(f"the model's vocab_size={vocab_size} does not fit task {task.name!r}: its {feature} "
                             f"vocabulary is {describe_vocabulary(vocabulary)}, which needs vocab_size "
                             + " or ".join(map(str, fitting)))

"""Batches for the model: seqio's encoder-decoder feature converter, deterministic shuffling,
an iterator that resumes exactly, and a preview of one example.

    batches = BatchIterator("facts_span_corruption", {"inputs": 128, "targets": 32}, batch_size=32)
    batch = next(batches)          # numpy arrays: encoder_input_tokens, decoder_target_tokens, ...
    state = batches.state()        # {"task": ..., "batches": 1, ...}: JSON-able
    resumed = BatchIterator.from_state(state)  # yields exactly the batches `batches` yields next
    batches.save_pipeline(folder)  # the input pipeline's own state (a few MB): resuming from it
    batches.restore_pipeline(folder, state)  # costs a fraction of a second, not a replay

In a run of several processes (hosts), each `BatchIterator` yields its process's rows of the
global batch; see `BatchIterator`.
"""
import dataclasses
import inspect
import itertools
import json
import math
import pathlib
import warnings

import jax
import numpy as np
import seqio
import tensorflow as tf

from t5nb.tasks import kept_pipelines
from t5nb.tasks.pieces import get_task


def is_pretraining(task) -> bool:
    """Targets-only tasks (span corruption) pack; supervised ones do not, by default."""
    task = get_task(task)
    tasks = task.tasks if isinstance(task, seqio.Mixture) else [task]
    return not any(t.output_features["inputs"].required for t in tasks)


def get_dataset(task, feature_lengths: dict, batch_size: int, *, split: str = "train",
                pack: bool | None = None, shuffle: bool = True, seed: int = 0,
                num_epochs: int | None = None, try_in_mem_cache: bool = True) -> tf.data.Dataset:
    """Batched model features from `seqio.EncDecFeatureConverter` (packing pretraining tasks
    unless `pack` says otherwise); the same `seed` gives the same batches, in the same order,
    shuffled or not (it also seeds random preprocessing such as span corruption's noise).
    `num_epochs=None` repeats forever; the last partial batch is dropped. `try_in_mem_cache`
    must be False under `tfds.testing.mock_data`. Where JAX keeps its compiled programs, the
    pipeline is kept beside them and loaded, not built, next time (`kept_pipelines`)."""
    task = get_task(task)
    pack = is_pretraining(task) if pack is None else pack
    kept = kept_pipelines.key(task, dict(feature_lengths=dict(feature_lengths), batch_size=batch_size, split=split,
                                         pack=pack, shuffle=shuffle, seed=seed, num_epochs=num_epochs,
                                         try_in_mem_cache=try_in_mem_cache))
    if kept and (dataset := kept_pipelines.load(kept)) is not None:
        return dataset
    kept_tokens = try_in_mem_cache and keeps_tokens(task, split)
    if kept_tokens and not pack and _fixed_after_cache(task):
        dataset = _batches_of_kept_examples(task, feature_lengths, batch_size, split, shuffle, seed, num_epochs)
    else:
        dataset = _examples(task, feature_lengths, split, shuffle, seed, num_epochs, try_in_mem_cache, kept_tokens)
        dataset = _converted(dataset, feature_lengths, pack).batch(batch_size, drop_remainder=True)
    if kept:
        kept_pipelines.keep(kept, dataset)
    return dataset


def keeps_tokens(task, split: str) -> bool:
    """Whether `get_dataset` keeps `task`'s `split` in memory preprocessed (`_tokens_kept_in_memory`):
    a task (not a mixture) whose preprocessing up to its `seqio.CacheDatasetPlaceholder` is
    deterministic (tokenizing, salient span masking: seqio could cache it offline) and whose
    split is small enough for seqio to keep in memory, or is in memory already and small enough
    to keep in a pipeline's graph (an `in_memory_source` of up to `kept_pipelines.MAX_EXAMPLES_BYTES`
    of JSON: 06's worlds of 1,000 and 4,000 people, 30,000 and 120,000 sentences)."""
    examples = isinstance(task, seqio.Task) and task.supports_caching and task.source.num_input_examples(split)
    if not examples:
        return False
    in_memory = getattr(task.source, "examples_bytes", math.inf) <= kept_pipelines.MAX_EXAMPLES_BYTES
    return examples < seqio.dataset_providers._MAX_EXAMPLES_TO_MEM_CACHE or in_memory


def _examples(task, feature_lengths: dict, split: str, shuffle: bool, seed: int, num_epochs: int | None,
              try_in_mem_cache: bool, kept_tokens: bool) -> tf.data.Dataset:
    """`task.get_dataset(...)`'s examples: a task kept tokenized (`kept_tokens`: it `keeps_tokens`,
    as its caller asked) tokenized once (`_tokens_kept_in_memory`), a mixture's tasks each so
    (`_mixture_of_tokens_kept`), the rest as seqio gives them."""
    if kept_tokens:
        return _tokens_kept_in_memory(task, feature_lengths, split, shuffle, seed, num_epochs)
    if try_in_mem_cache and isinstance(task, seqio.Mixture):
        return _mixture_of_tokens_kept(task, feature_lengths, split, shuffle, seed, num_epochs)
    return task.get_dataset(feature_lengths, split=split, shuffle=shuffle, seed=seed, num_epochs=num_epochs,
                            try_in_mem_cache=try_in_mem_cache)


def _converted(dataset: tf.data.Dataset, feature_lengths: dict, pack: bool) -> tf.data.Dataset:
    """A task's examples through `seqio.EncDecFeatureConverter`: the model's features."""
    dataset = dataset.map(lambda example: {k: v for k, v in example.items() if k in feature_lengths})  # the
    # text the model never sees (`*_pretokenized`, `answers`), which the packing converter warns about
    convert = seqio.EncDecFeatureConverter(pack=pack)
    if not pack:  # packing alone loops over tensors in Python (seqio's pack_batch), which needs AutoGraph
        convert = tf.autograph.experimental.do_not_convert(convert)
    return convert(dataset, task_feature_lengths=feature_lengths)


def _preprocessed(task, feature_lengths: dict, split: str, shuffle: bool, seed: int,
                  num_epochs: int | None) -> tf.data.Dataset:
    """`task.get_dataset(...)`'s examples before its shuffle, its memory cache placed after the
    preprocessing before the task's cache placeholder instead of before it: seqio keeps a small
    source in memory as text and tokenizes it again every epoch (06's memorisation runs see each
    fact 40 times or more), here once. The steps are seqio's (`Task.get_dataset`, seqio 0.0.18),
    each as it runs them; the preprocessing that follows the placeholder (span corruption's
    noise) still runs each epoch, seeded as there."""
    dataset = task.source.get_dataset(split=split, shuffle=shuffle, seed=seed)
    dataset = task.preprocess_precache(dataset, seed=seed).cache()
    if num_epochs != 1:
        dataset = dataset.repeat(num_epochs)
    dataset = task.preprocess_postcache(dataset, sequence_length=feature_lengths, seed=seed)
    return task._trim_output_features(task._validate_preprocessing(dataset), sequence_length=feature_lengths)


def _tokens_kept_in_memory(task, feature_lengths: dict, split: str, shuffle: bool, seed: int,
                           num_epochs: int | None) -> tf.data.Dataset:
    """`task.get_dataset(...)`: the same examples in the same order, tokenized once
    (`_preprocessed`), then shuffled as seqio shuffles them."""
    dataset = _preprocessed(task, feature_lengths, split, shuffle, seed, num_epochs)
    if shuffle:
        dataset = dataset.shuffle(task._shuffle_buffer_size, seed=seed)
    return dataset.prefetch(tf.data.experimental.AUTOTUNE)


def _mixture_of_tokens_kept(mixture, feature_lengths: dict, split: str, shuffle: bool, seed: int,
                            num_epochs: int | None) -> tf.data.Dataset:
    """`mixture.get_dataset(...)`: its tasks sampled at their rates as seqio samples them, each
    task's examples from `_tokens_kept_in_memory` where it `keeps_tokens` (06's and 02's facts
    pretraining: the corpus tokenized and its salient spans masked once, not every epoch). The
    steps are seqio's (`Mixture.get_dataset` and `get_task_dataset`, seqio 0.0.18), without its
    logging of the mixing proportions."""
    tasks = [task for task in mixture.tasks if split in task.splits]
    keys = set(mixture.output_features)
    datasets = []
    for task in tasks:
        dataset = _examples(task, feature_lengths, split, shuffle, seed, num_epochs, try_in_mem_cache=True,
                            kept_tokens=keeps_tokens(task, split))
        datasets.append(dataset.map(lambda example: {k: v for k, v in example.items() if k in keys},
                                    num_parallel_calls=tf.data.experimental.AUTOTUNE))
    sample_seed = seed if seed is not None else None if shuffle else 42
    return mixture._sample_fn(datasets, mixture._get_all_mixing_rates(tasks), sample_seed)


# What may follow a cache placeholder for `_batches_of_kept_examples`: preprocessing that gives an
# example the same features every epoch (no random noise, as span corruption's is).
FIXED_AFTER_CACHE = (seqio.preprocessors.append_eos_after_trim,)


def _fixed_after_cache(task) -> bool:
    """Whether every preprocessor after the cache placeholder of `task` (one that `keeps_tokens`,
    so has one) is one of FIXED_AFTER_CACHE."""
    placeholder = next(i for i, p in enumerate(task.preprocessors) if isinstance(p, seqio.CacheDatasetPlaceholder))
    return all(inspect.unwrap(getattr(p, "func", p)) in FIXED_AFTER_CACHE for p in task.preprocessors[placeholder + 1:])


def _batches_of_kept_examples(task, feature_lengths: dict, batch_size: int, split: str, shuffle: bool,
                              seed: int, num_epochs: int | None) -> tf.data.Dataset:
    """Unpacked batches of a task kept in memory whose examples are the same every epoch
    (`_fixed_after_cache`): one epoch preprocessed and converted once, held as arrays, and each
    batch gathered from them by the rows seqio's shuffle picks (shuffling the examples' indices
    with its seed and buffer picks the same permutation): the batches `_tokens_kept_in_memory`
    gives, at a fraction of the host's time (06's memorisation, about 20 to 1 CPU-ms a batch of
    128)."""
    epoch = _converted(_preprocessed(task, feature_lengths, split, shuffle, seed, 1), feature_lengths, pack=False)
    chunks = list(epoch.batch(4096).as_numpy_iterator())  # all of it: keeps_tokens' splits are small
    if not chunks:
        raise ValueError(f"task {task.name!r} has no examples in its {split!r} split")
    examples = {feature: tf.constant(np.concatenate([chunk[feature] for chunk in chunks])) for feature in chunks[0]}
    indices = tf.data.Dataset.range(len(examples["decoder_target_tokens"]))
    if num_epochs != 1:
        indices = indices.repeat(num_epochs)
    if shuffle:
        indices = indices.shuffle(task._shuffle_buffer_size, seed=seed)
    batches = indices.batch(batch_size, drop_remainder=True)
    return batches.map(lambda picked: {feature: tf.gather(values, picked) for feature, values in examples.items()})


def validation_batches(task, feature_lengths: dict, batch_size: int, num_batches: int) -> list[dict]:
    """A fixed sample for a validation curve: the first `num_batches` numpy batches of `task`'s
    validation split, unshuffled, the same in every run (fewer if the split is shorter); kept
    beside the pipelines (`kept_pipelines.kept_arrays`)."""
    def first_batches():
        batches = BatchIterator(task, feature_lengths, batch_size, split="validation", shuffle=False, num_epochs=1)
        return list(itertools.islice(batches, num_batches))

    settings = dict(feature_lengths=dict(feature_lengths), batch_size=batch_size, num_batches=num_batches)
    return kept_pipelines.kept_arrays(get_task(task), {"split": "validation", "validation_batches": settings},
                                      first_batches)


def examples_digest(task) -> str | None:
    """What a task's examples hash to, when its source knows (tasks read from files, the facts
    world); a mixture's from its tasks'."""
    tasks = task.tasks if isinstance(task, seqio.Mixture) else [task]
    digests = [getattr(t.source, "examples_digest", None) for t in tasks]
    return None if None in digests else "+".join(digests)


class BatchIterator:
    """An endless (or `num_epochs`-long) iterator of numpy batches that can resume.

    Its position has two forms. `state()` is a small JSON-able dict: the settings plus how many
    batches were consumed; `set_state` and `from_state` rebuild the same deterministic pipeline
    and replay that many batches (seconds per thousand batches). `save_pipeline` writes the
    tf.data iterator's own checkpoint (shuffle buffer, packing, position), as T5X does, and
    `restore_pipeline` resumes from it in constant time. Both give exactly the batches an
    uninterrupted iterator yields next.

    `batch_size` is the global batch. With several JAX processes, every process runs the same
    deterministic pipeline and keeps its share of each batch's rows (`process_share`: index,
    count; default JAX's), so the batches do not depend on how many hosts train: a run on 2
    hosts sees the rows a run on one sees, and may resume on another number of hosts. (T5X
    shards the source files per host instead, which costs each host less preprocessing and
    ties the data to the host count.)
    """

    PIPELINE_PREFIX = "pipeline"  # file prefix of the tf.data checkpoint in a folder

    def __init__(self, task, feature_lengths: dict, batch_size: int, *, split: str = "train",
                 pack: bool | None = None, shuffle: bool = True, seed: int = 0,
                 num_epochs: int | None = None, try_in_mem_cache: bool = True, batches: int = 0,
                 process_share: tuple[int, int] | None = None):
        self.task = get_task(task)
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.process_share = process_share or (jax.process_index(), jax.process_count())
        if batch_size % self.process_share[1]:
            raise ValueError(f"batch_size {batch_size} (the global batch) does not split evenly over "
                             f"{self.process_share[1]} processes")
        self.settings = dict(task=self.task.name, feature_lengths=dict(feature_lengths), batch_size=batch_size,
                             split=split, pack=is_pretraining(self.task) if pack is None else pack,
                             shuffle=shuffle, seed=seed, num_epochs=num_epochs, try_in_mem_cache=try_in_mem_cache)
        if digest := examples_digest(self.task):
            self.settings["examples_digest"] = digest
        self._seek(batches)

    def _new_pipeline(self, skip: int = 0) -> tf.data.Dataset:
        """A fresh pipeline (seqio reshuffles each new iteration of a dataset, so iterate each once)."""
        dataset = get_dataset(self.task, **{k: v for k, v in self.settings.items() if k not in ("task", "examples_digest")})
        index, count = self.process_share
        if count > 1:
            rows = self.settings["batch_size"] // count
            dataset = dataset.map(lambda batch: {k: v[index * rows:(index + 1) * rows] for k, v in batch.items()})
        return dataset.skip(skip).prefetch(2)

    def _seek(self, batches: int) -> None:
        """The pipeline built now (a source that cannot be read says so at once), its iterator made
        at the first batch: a resumed run restores its iterator into this pipeline, built once."""
        self.batches, self._pipeline, self._iterator = batches, self._new_pipeline(batches), None

    def _batches(self):
        if self._iterator is None:
            self._iterator = iter(self._pipeline)
        return self._iterator

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        batch = {name: value.numpy() for name, value in next(self._batches()).items()}
        self.batches += 1
        return batch

    def state(self) -> dict:
        """Everything needed to resume: settings and the number of batches consumed."""
        return {**self.settings, "batches": self.batches}

    def _check_settings(self, state: dict) -> None:
        saved = {k: v for k, v in state.items() if k != "batches"}
        mine = json.loads(json.dumps(self.settings))
        if "examples_digest" in saved.keys() ^ mine.keys():  # a checkpoint from before digests, or a source without
            saved.pop("examples_digest", None), mine.pop("examples_digest", None)
        changed = sorted(k for k in saved.keys() | mine.keys() if saved.get(k) != mine.get(k))
        if changed == ["examples_digest"]:
            raise ValueError(f"task {self.task.name!r} holds other examples than when this checkpoint was saved (its "
                             f"data file changed): resuming would read other examples from batch {state['batches']} "
                             "on. Put the file back as it was, or train into a new run folder")
        if changed:
            raise ValueError("the checkpoint's data settings differ from this iterator's: " + ", ".join(
                f"{k} {saved.get(k)!r} in the checkpoint, {mine.get(k)!r} here" for k in changed))

    def set_state(self, state: dict) -> None:
        """Move to the position `state()` recorded, replaying the pipeline up to it."""
        self._check_settings(state)
        self._seek(state["batches"])

    def save_pipeline(self, folder) -> None:
        """Write the input pipeline's state into `folder` (tf.data's iterator checkpoint)."""
        tf.train.Checkpoint(iterator=self._batches()).write(str(pathlib.Path(folder) / self.PIPELINE_PREFIX))

    def restore_pipeline(self, folder, state: dict) -> None:
        """Resume from `save_pipeline`'s files and the `state()` saved with them; if they cannot
        be read (another TensorFlow, a damaged file), warn and replay to `state` instead."""
        self._check_settings(state)
        # the pipeline built at the start, if it is as save_pipeline's was: never iterated, and
        # skipping no batches (a checkpoint does not restore into a pipeline that skips some)
        unused = self._iterator is None and self.batches == 0
        iterator = iter(self._pipeline if unused else self._new_pipeline())
        try:
            tf.train.Checkpoint(iterator=iterator).read(str(pathlib.Path(folder) / self.PIPELINE_PREFIX)).assert_consumed()
        except (tf.errors.OpError, ValueError, AssertionError) as error:
            warnings.warn(f"could not restore the input pipeline from {folder} ({type(error).__name__}: "
                          f"{str(error).splitlines()[0] if str(error) else ''}); replaying {state['batches']} batches "
                          f"instead", stacklevel=2)
            self._seek(state["batches"])
            return
        self._iterator, self.batches = iterator, state["batches"]

    @classmethod
    def from_state(cls, state: dict) -> "BatchIterator":
        """The iterator `state()` was taken from, positioned where it was."""
        settings = {k: v for k, v in state.items() if k != "examples_digest"}
        iterator = cls(settings.pop("task"), settings.pop("feature_lengths"), settings.pop("batch_size"), **settings)
        iterator._check_settings(state)
        return iterator


@dataclasses.dataclass
class Preview:
    """One example on its way to the model, per feature: text, token ids, pieces."""

    raw: dict  # the source example, as text
    preprocessed: dict  # feature -> the tokens decoded back to text
    ids: dict  # feature -> token ids
    pieces: dict  # feature -> one string per token id

    def __str__(self) -> str:
        lines = ["raw:"] + [f"  {k}: {v}" for k, v in self.raw.items()]
        for feature in self.ids:
            lines += [f"{feature}:", f"  text:   {self.preprocessed[feature]}", f"  ids:    {self.ids[feature]}",
                      f"  pieces: {self.pieces[feature]}"]
        return "\n".join(lines)


def as_text(value) -> str | list:
    """bytes, and arrays or lists of them (tf.data's strings) -> str, for printing, postprocessors
    and JSON; anything else as it is."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if hasattr(value, "tolist"):
        return as_text(value.tolist())
    return [as_text(v) for v in value] if isinstance(value, (list, tuple)) else value


class Previews(dict):
    """A mixture's preview: task name -> the `Preview` of each of its tasks; printed, each under
    its `[task name]`."""

    def __str__(self) -> str:
        return "\n\n".join(f"[{name}]\n{shown}" for name, shown in self.items())


def preview(task, feature_lengths: dict | None = None, split: str = "train", index: int = 0) -> Preview | Previews:
    """Example `index` of `split`: raw -> preprocessed -> token ids -> pieces; for a mixture,
    `Previews` of example `index` of each of its tasks."""
    task = get_task(task)
    feature_lengths = feature_lengths or {"inputs": 128, "targets": 32}
    if isinstance(task, seqio.Mixture):
        return Previews({sub.name: preview(sub, feature_lengths, split, index) for sub in task.tasks})
    source = task.source.get_dataset(split=split, shuffle=False)
    raw = next(source.skip(index).take(1).as_numpy_iterator())
    example = next(task.get_dataset(feature_lengths, split=split, shuffle=False, seed=0)
                   .skip(index).take(1).as_numpy_iterator())
    preprocessed, ids, pieces = {}, {}, {}
    for feature, spec in task.output_features.items():
        if feature in example:
            ids[feature] = example[feature].tolist()
            preprocessed[feature] = spec.vocabulary.decode(ids[feature])
            pieces[feature] = [spec.vocabulary.decode([i]) or f"<id {i}>" for i in ids[feature]]
    return Preview({k: as_text(v) for k, v in raw.items()}, preprocessed, ids, pieces)

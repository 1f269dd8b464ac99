"""Batches for the model: seqio's encoder-decoder feature converter, deterministic shuffling,
an iterator whose position saves to a small dict, and a preview of one example.

    batches = BatchIterator("facts_span_corruption", {"inputs": 128, "targets": 32}, batch_size=32)
    batch = next(batches)          # numpy arrays: encoder_input_tokens, decoder_target_tokens, ...
    state = batches.state()        # {"task": ..., "batches": 1, ...}: JSON-able
    resumed = BatchIterator.from_state(state)  # yields exactly the batches `batches` yields next
"""
import dataclasses
import json

import seqio
import tensorflow as tf

from t5nb.tasks.recipes import get_task


def is_pretraining(task) -> bool:
    """Targets-only tasks (span corruption) pack; supervised ones do not, by default."""
    task = get_task(task)
    tasks = task.tasks if isinstance(task, seqio.Mixture) else [task]
    return not any(t.output_features["inputs"].required for t in tasks)


def get_dataset(task, feature_lengths: dict, batch_size: int, *, split: str = "train",
                pack: bool | None = None, shuffle: bool = True, seed: int = 0,
                num_epochs: int | None = None, try_in_mem_cache: bool = True) -> tf.data.Dataset:
    """Batched model features from `seqio.EncDecFeatureConverter` (packing pretraining tasks
    unless `pack` says otherwise); the same `seed` gives the same batches, in the same order.
    `num_epochs=None` repeats forever; the last partial batch is dropped. `try_in_mem_cache`
    must be False under `tfds.testing.mock_data`."""
    task = get_task(task)
    pack = is_pretraining(task) if pack is None else pack
    dataset = task.get_dataset(feature_lengths, split=split, shuffle=shuffle, seed=seed if shuffle else None,
                               num_epochs=num_epochs, try_in_mem_cache=try_in_mem_cache)
    dataset = seqio.EncDecFeatureConverter(pack=pack)(dataset, task_feature_lengths=feature_lengths)
    return dataset.batch(batch_size, drop_remainder=True)


class BatchIterator:
    """An endless (or `num_epochs`-long) iterator of numpy batches that can resume.

    `state()` is a small JSON-able dict: the settings plus how many batches were consumed.
    `from_state(state)` rebuilds the same deterministic pipeline and skips that many batches.
    """

    def __init__(self, task, feature_lengths: dict, batch_size: int, *, split: str = "train",
                 pack: bool | None = None, shuffle: bool = True, seed: int = 0,
                 num_epochs: int | None = None, try_in_mem_cache: bool = True, batches: int = 0):
        self.task = get_task(task)
        self.settings = dict(task=self.task.name, feature_lengths=dict(feature_lengths), batch_size=batch_size,
                             split=split, pack=is_pretraining(self.task) if pack is None else pack,
                             shuffle=shuffle, seed=seed, num_epochs=num_epochs, try_in_mem_cache=try_in_mem_cache)
        self._dataset = get_dataset(self.task, **{k: v for k, v in self.settings.items() if k != "task"})
        self._seek(batches)

    def _seek(self, batches: int) -> None:
        self.batches = batches
        self._iterator = self._dataset.skip(batches).prefetch(2).as_numpy_iterator()

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        batch = next(self._iterator)
        self.batches += 1
        return batch

    def state(self) -> dict:
        """Everything needed to resume: settings and the number of batches consumed."""
        return {**self.settings, "batches": self.batches}

    def set_state(self, state: dict) -> None:
        """Move to the position `state()` recorded (a training run resuming from a checkpoint)."""
        settings = {k: v for k, v in state.items() if k != "batches"}
        if settings != json.loads(json.dumps(self.settings)):
            raise ValueError(f"the checkpoint's data settings {settings} differ from this iterator's {self.settings}")
        self._seek(state["batches"])

    @classmethod
    def from_state(cls, state: dict) -> "BatchIterator":
        """The iterator `state()` was taken from, positioned where it was."""
        settings = dict(state)
        return cls(settings.pop("task"), settings.pop("feature_lengths"), settings.pop("batch_size"), **settings)


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


def _text(value) -> str | list:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if hasattr(value, "tolist"):
        return _text(value.tolist())
    return [_text(v) for v in value] if isinstance(value, list) else value


def preview(task, feature_lengths: dict | None = None, split: str = "train", index: int = 0) -> Preview:
    """Example `index` of `split`: raw -> preprocessed -> token ids -> pieces."""
    task = get_task(task)
    feature_lengths = feature_lengths or {"inputs": 128, "targets": 32}
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
    return Preview({k: _text(v) for k, v in raw.items()}, preprocessed, ids, pieces)

"""Deterministic shuffling, packing and a batch iterator that resumes where it stopped."""
import json
import warnings

import numpy as np
import pytest

import t5nb.tasks as tasks

LENGTHS = {"inputs": 64, "targets": 16}


def _take(iterator, count):
    return [next(iterator) for _ in range(count)]


def _same(batches_a, batches_b):
    return all(a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a) for a, b in zip(batches_a, batches_b))


def test_same_seed_same_batches_other_seed_other_batches():
    first = _take(tasks.BatchIterator("facts_qa", LENGTHS, 8, seed=1), 2)
    assert _same(first, _take(tasks.BatchIterator("facts_qa", LENGTHS, 8, seed=1), 2))
    assert not _same(first, _take(tasks.BatchIterator("facts_qa", LENGTHS, 8, seed=2), 2))


@pytest.mark.parametrize("task, pack, seed", [("facts_span_corruption", True, 3), ("facts_pretraining", True, 0),
                                              ("facts_qa", False, 1), ("facts_qa", True, 2)])
def test_every_form_of_a_saved_position_resumes_with_exactly_the_next_batches(tmp_path, task, pack, seed):
    """A task and a mixture, packed and not, other seeds: `set_state` on the same iterator (seqio
    reshuffles a dataset iterated twice), `from_state`, and the saved input pipeline."""
    iterator = tasks.BatchIterator(task, LENGTHS, 4, pack=pack, seed=seed)
    _take(iterator, 3)
    state = json.loads(json.dumps(iterator.state()))  # small and JSON-able
    assert state["batches"] == 3 and state["pack"] is pack
    iterator.save_pipeline(tmp_path)
    expected = _take(iterator, 2)
    iterator.set_state(state)
    assert _same(_take(iterator, 2), expected) and iterator.state()["batches"] == 5
    resumed = tasks.BatchIterator.from_state(state)
    assert _same(_take(resumed, 2), expected) and resumed.state()["batches"] == 5
    restored = tasks.BatchIterator(task, LENGTHS, 4, pack=pack, seed=seed)
    restored.restore_pipeline(tmp_path, state)
    assert _same(_take(restored, 2), expected) and restored.state()["batches"] == 5
    positioned = tasks.BatchIterator.from_state(state)  # built at batch 3, then restored: no replay
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a pipeline that cannot be restored warns, and replays
        positioned.restore_pipeline(tmp_path, state)
    assert _same(_take(positioned, 2), expected) and positioned.state()["batches"] == 5


def test_a_damaged_pipeline_checkpoint_falls_back_to_replaying(tmp_path):
    iterator = tasks.BatchIterator("facts_span_corruption", LENGTHS, 4, seed=3)
    _take(iterator, 2)
    state = iterator.state()
    iterator.save_pipeline(tmp_path)
    expected = _take(iterator, 1)
    for path in tmp_path.iterdir():
        path.write_bytes(path.read_bytes()[:100])
    restored = tasks.BatchIterator("facts_span_corruption", LENGTHS, 4, seed=3)
    with pytest.warns(UserWarning, match="could not restore the input pipeline .* replaying 2 batches"):
        restored.restore_pipeline(tmp_path, state)
    assert _same(_take(restored, 1), expected)


def test_a_position_in_a_data_file_that_changed_since_is_refused(tmp_path):
    """A task read from a file, registered again (a new process) after the file changed: the saved
    position would fall on other examples, so resuming is refused, saying why; the same file
    resumes. A position saved before examples were hashed still resumes."""
    import seqio

    path = tmp_path / "qa.tsv"

    def register(rows):
        path.write_text("q\ta\n" + "".join(f"question {i}?\t{i}\n" for i in rows))
        seqio.TaskRegistry.remove("changing_qa")
        return tasks.register_task("changing_qa", path, fields={"inputs": "q", "targets": "a"}, vocabulary="byte")

    register(range(20))
    iterator = tasks.BatchIterator("changing_qa", LENGTHS, 4)
    _take(iterator, 2)
    state = iterator.state()
    expected = _take(iterator, 1)
    register(range(20))
    assert _same(_take(tasks.BatchIterator.from_state(state), 1), expected)
    register([*range(19), 99])
    with pytest.raises(ValueError, match=r"task 'changing_qa' holds other examples than when this checkpoint was saved "
                                         r"\(its data file changed\): resuming would read other examples from batch 2 on"):
        tasks.BatchIterator.from_state(state)
    older = {k: v for k, v in state.items() if k != "examples_digest"}
    assert tasks.BatchIterator.from_state(older).state()["batches"] == 2
    seqio.TaskRegistry.remove("changing_qa")


def test_a_position_from_other_settings_is_refused():
    state = tasks.BatchIterator("facts_qa", LENGTHS, 4, seed=1).state()
    with pytest.raises(ValueError, match=r"seed 1 in the checkpoint, 2 here"):
        tasks.BatchIterator("facts_qa", LENGTHS, 4, seed=2).set_state(state)


def test_packed_batches_carry_segment_ids_and_positions():
    batch = next(tasks.BatchIterator("facts_span_corruption", {"inputs": 128, "targets": 32}, 2))
    segments, positions = batch["encoder_segment_ids"], batch["encoder_positions"]
    assert segments.max() >= 1 and set(np.unique(batch["decoder_segment_ids"])) >= {1}
    starts = np.diff(segments, axis=1, prepend=0) != 0  # every new segment restarts its positions
    assert np.all(positions[starts & (segments > 0)] == 0)
    assert np.all(batch["decoder_loss_weights"] == (batch["decoder_target_tokens"] > 0))


def test_unpacked_supervised_batches_for_one_epoch():
    batches = list(tasks.BatchIterator("facts_fact_check", LENGTHS, 500, split="validation", num_epochs=1, shuffle=False))
    assert len(batches) == 4  # 2000 examples
    vocab = tasks.get_vocabulary("facts")
    labels = [vocab.decode(row[:1].tolist()) for batch in batches for row in batch["decoder_target_tokens"]]
    assert labels.count("true") == labels.count("false") == 1000


def test_preview_shows_raw_preprocessed_ids_and_pieces():
    shown = tasks.preview("facts_qa", LENGTHS)
    text = str(shown)
    assert shown.raw["inputs"] in shown.preprocessed["inputs"]
    assert len(shown.ids["inputs"]) == len(shown.pieces["inputs"]) and shown.pieces["inputs"][:2] == ["trivia", "question"]
    assert "raw:" in text and "pieces:" in text


@pytest.mark.parametrize("task", ["facts_span_corruption", "facts_qa", "world"])
def test_a_small_task_kept_tokenized_in_memory_yields_seqios_examples_in_its_order(task):
    """Over three epochs, shuffled: the examples seqio's `Task.get_dataset` yields, in its order,
    span corruption's noise included, from tokens kept in memory instead of text tokenized again
    each epoch."""
    from t5nb.tasks import batching

    task = tasks.get_task(tasks.register_world_task(20) if task == "world" else task)
    assert batching.keeps_tokens(task, "train")
    count = 3 * task.source.num_input_examples("train")
    kept = batching._tokens_kept_in_memory(task, LENGTHS, "train", True, 5, None).take(count)
    seqios = task.get_dataset(LENGTHS, split="train", shuffle=True, seed=5, num_epochs=None).take(count)
    pairs = list(zip(kept.as_numpy_iterator(), seqios.as_numpy_iterator(), strict=True))
    assert len(pairs) == count
    assert all(a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a) for a, b in pairs)


def test_a_mixture_of_tasks_kept_in_memory_yields_seqios_examples_in_its_order():
    """facts_pretraining, its span corruption and salient span masking each kept tokenized: over
    three epochs of the larger task, the examples of seqio's own `Mixture.get_dataset`, in its
    order, the noise of span corruption included."""
    from t5nb.tasks import batching

    mixture = tasks.get_task("facts_pretraining")
    assert all(batching.keeps_tokens(task, "train") for task in mixture.tasks)
    count = 3 * max(task.source.num_input_examples("train") for task in mixture.tasks)
    kept = batching._mixture_of_tokens_kept(mixture, LENGTHS, "train", True, 6, None).take(count)
    seqios = mixture.get_dataset(LENGTHS, split="train", shuffle=True, seed=6, num_epochs=None).take(count)
    pairs = list(zip(kept.as_numpy_iterator(), seqios.as_numpy_iterator(), strict=True))
    assert len(pairs) == count
    assert all(a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a) for a, b in pairs)


@pytest.mark.parametrize("task, pack", [("facts_span_corruption", True), ("facts_qa", True), ("facts_qa", False),
                                        ("facts_pretraining", True)])
def test_get_dataset_asks_once_whether_each_task_keeps_its_tokens(monkeypatch, task, pack):
    """A task packed or not, and a mixture and each of its tasks: `keeps_tokens` asked once each."""
    from t5nb.tasks import batching

    asked, keeps_tokens = [], batching.keeps_tokens
    monkeypatch.setattr(batching, "keeps_tokens", lambda task, split: asked.append(task.name) or keeps_tokens(task, split))
    monkeypatch.setattr(batching.kept_pipelines, "folder", lambda: None)  # built, not loaded
    batching.get_dataset(task, LENGTHS, 4, pack=pack)
    task = tasks.get_task(task)
    assert sorted(asked) == sorted([task.name, *(sub.name for sub in getattr(task, "tasks", []))])


@pytest.mark.parametrize("task, shuffle, num_epochs", [("facts_qa", True, None), ("world20", True, 3),
                                                       ("world20", False, 1), ("world400", True, 2)])
def test_an_unpacked_task_kept_in_memory_is_served_from_arrays_as_seqios_batches_in_its_order(task, shuffle,
                                                                                              num_epochs):
    """Examples the same every epoch (no span corruption after the cache) are converted once and
    gathered by shuffled index: over two or three epochs, the batches of seqio's own
    `Task.get_dataset` through the feature converter, in its order; a task with noise after the
    cache is not. A world of 400 people (12,000 sentences) is more than seqio keeps in memory: it
    reads it again each epoch."""
    from t5nb.tasks import batching

    task = tasks.get_task(tasks.register_world_task(int(task[5:])) if task.startswith("world") else task)
    assert batching.keeps_tokens(task, "train")
    assert batching._fixed_after_cache(task) and not batching._fixed_after_cache(tasks.get_task("facts_span_corruption"))
    batch_size = 8
    count = (num_epochs or 3) * task.source.num_input_examples("train") // batch_size if num_epochs != 1 else None
    served = batching.get_dataset(task, LENGTHS, batch_size, pack=False, shuffle=shuffle, seed=4, num_epochs=num_epochs)
    seqios = batching._converted(task.get_dataset(LENGTHS, split="train", shuffle=shuffle, seed=4, num_epochs=num_epochs,
                                                  try_in_mem_cache=False), LENGTHS, pack=False)
    seqios = seqios.batch(batch_size, drop_remainder=True)
    if count:
        served, seqios = served.take(count), seqios.take(count)
    pairs = list(zip(served.as_numpy_iterator(), seqios.as_numpy_iterator(), strict=True))
    assert len(pairs) == (count or task.source.num_input_examples("train") // batch_size)
    assert all(a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a) for a, b in pairs)

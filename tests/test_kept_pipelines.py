"""Input pipelines kept as graphs (`t5nb.tasks.kept_pipelines`): loaded, they yield what a built
one yields and resume from its checkpoints; their names change with whatever they are built
from; a task with a preprocessor of its user's is never kept; a damaged entry is built again.
Token lengths and validation batches are kept as arrays the same way."""
import json

import numpy as np
import pytest
import seqio

import t5nb.tasks as tasks
from t5nb.tasks import batching, custom, kept_pipelines

LENGTHS = {"inputs": 64, "targets": 16}


@pytest.fixture
def kept(tmp_path, monkeypatch):
    """Pipelines kept in a folder of the test's own; `built` counts the pipelines built."""
    monkeypatch.setattr(kept_pipelines, "folder", lambda: tmp_path)
    built = []
    preprocess = seqio.Task.preprocess_precache  # a task's pipeline built, through seqio's or `batching`'s steps

    def counted(task, *args, **kwargs):
        built.append(task.name)
        return preprocess(task, *args, **kwargs)

    monkeypatch.setattr(seqio.Task, "preprocess_precache", counted)
    return tmp_path, built


def _batches(iterator, count):
    return [next(iterator) for _ in range(count)]


def _same(a, b):
    return all(x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("task", ["facts_pretraining", "facts_qa"])  # a packed mixture; a supervised task
def test_a_kept_pipeline_is_loaded_not_built_and_yields_the_built_ones_batches(kept, task):
    folder, built = kept
    first = tasks.BatchIterator(task, LENGTHS, 4, seed=3)
    assert built and len(list(folder.glob("*.pipeline"))) == 1
    expected = _batches(first, 3)
    built.clear()
    loaded = tasks.BatchIterator(task, LENGTHS, 4, seed=3)
    assert built == []  # no seqio task was asked for its dataset
    assert _same(_batches(loaded, 3), expected)


def test_a_built_and_a_loaded_pipeline_resume_from_each_others_checkpoints(kept, tmp_path_factory):
    folder, built = kept
    built_one = tasks.BatchIterator("facts_span_corruption", LENGTHS, 4, seed=5)
    _batches(built_one, 2)
    saved = tmp_path_factory.mktemp("built")
    built_one.save_pipeline(saved)
    expected = _batches(built_one, 2)
    loaded = tasks.BatchIterator("facts_span_corruption", LENGTHS, 4, seed=5)
    loaded.restore_pipeline(saved, {**built_one.state(), "batches": 2})
    assert _same(_batches(loaded, 2), expected)
    saved_loaded = tmp_path_factory.mktemp("loaded")
    loaded.save_pipeline(saved_loaded)
    after = _batches(loaded, 1)
    folder.joinpath(next(folder.iterdir()).name).unlink()  # built again from here on
    rebuilt = tasks.BatchIterator("facts_span_corruption", LENGTHS, 4, seed=5)
    rebuilt.restore_pipeline(saved_loaded, loaded.state() | {"batches": 4})
    assert _same(_batches(rebuilt, 1), after) and built.count("facts_span_corruption") == 2


def test_a_name_changes_with_the_settings_and_the_examples(kept, tmp_path):
    settings = dict(feature_lengths=LENGTHS, batch_size=4, split="train", pack=False, shuffle=True, seed=0,
                    num_epochs=None, try_in_mem_cache=True)
    task = tasks.get_task("facts_qa")
    names = {kept_pipelines.key(task, settings), kept_pipelines.key(task, {**settings, "seed": 1}),
             kept_pipelines.key(task, {**settings, "feature_lengths": {"inputs": 32, "targets": 16}}),
             kept_pipelines.key(tasks.get_task("facts_fact_check"), settings)}
    path = tmp_path / "qa.tsv"
    for rows in (range(10), [*range(9), 99]):
        path.write_text("q\ta\n" + "".join(f"question {i}?\t{i}\n" for i in rows))
        names.add(kept_pipelines.key(tasks.register_task("kept_qa", path, fields={"inputs": "q", "targets": "a"}),
                                     settings))
        seqio.TaskRegistry.remove("kept_qa")
    assert None not in names and len(names) == 6


def test_a_task_with_a_preprocessor_of_its_users_is_built_each_time(kept):
    folder, built = kept

    import tensorflow as tf

    def shout(dataset):
        return dataset.map(lambda example: {**example, "targets": tf.strings.upper(example["targets"])})

    source = custom.in_memory_source({"train": [{"inputs": f"q {i}", "targets": f"a {i}"} for i in range(16)]})
    seqio.TaskRegistry.add("shouting_qa", source=source, output_features=tasks.get_task("facts_qa").output_features,
                           preprocessors=[shout, seqio.preprocessors.tokenize,
                                          seqio.preprocessors.append_eos_after_trim])
    try:
        for _ in range(2):
            batching.get_dataset("shouting_qa", LENGTHS, 4)
        assert built == ["shouting_qa"] * 2 and not list(folder.iterdir())
    finally:
        seqio.TaskRegistry.remove("shouting_qa")


def test_a_damaged_entry_is_built_again_and_replaced(kept):
    folder, built = kept
    expected = _batches(tasks.BatchIterator("facts_qa", LENGTHS, 4), 2)
    [entry] = folder.glob("*.pipeline")
    header = entry.read_bytes().split(b"\n", 1)[0]
    assert sorted(json.loads(header)) == sorted(expected[0])  # the features' shapes and types, then the graph
    entry.write_bytes(entry.read_bytes()[:1000])
    with pytest.warns(UserWarning, match=rf"{entry.name}: not a pipeline \(.*\), built again"):
        again = tasks.BatchIterator("facts_qa", LENGTHS, 4)
    assert _same(_batches(again, 2), expected) and built == ["facts_qa", "facts_qa"]
    built.clear()
    assert _same(_batches(tasks.BatchIterator("facts_qa", LENGTHS, 4), 2), expected) and built == []


def test_without_a_folder_for_compiled_programs_nothing_is_kept():
    import jax

    folder = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        assert kept_pipelines.folder() is None
        assert kept_pipelines.key(tasks.get_task("facts_qa"), {}) is None
    finally:
        jax.config.update("jax_compilation_cache_dir", folder)


def test_token_lengths_and_validation_batches_are_computed_once_and_loaded_after(kept):
    folder, built = kept
    lengths = tasks.token_lengths("facts_qa", "validation", None, 50)
    [lengths_entry] = folder.glob("*.arrays")
    batches = tasks.validation_batches("facts_span_corruption", LENGTHS, 4, 3)
    [batches_entry] = set(folder.glob("*.arrays")) - {lengths_entry}
    assert len(batches) == 3
    built.clear()
    again = tasks.token_lengths("facts_qa", "validation", None, 50)
    assert again.keys() == lengths.keys() == {"inputs", "targets"} and len(again["inputs"]) == 50
    assert all(np.array_equal(again[k], lengths[k]) and again[k].dtype == lengths[k].dtype for k in lengths)
    assert _same(tasks.validation_batches("facts_span_corruption", LENGTHS, 4, 3), batches)
    assert built == []  # both loaded
    assert len(tasks.token_lengths("facts_qa", "validation", None, 20)["inputs"]) == 20 and built == ["facts_qa"]
    batches_entry.write_bytes(batches_entry.read_bytes()[:100])
    with pytest.warns(UserWarning, match=rf"{batches_entry.name}: not kept arrays \(.*\), computed again"):
        assert _same(tasks.validation_batches("facts_span_corruption", LENGTHS, 4, 3), batches)
    built.clear()
    assert _same(tasks.validation_batches("facts_span_corruption", LENGTHS, 4, 3), batches) and built == []

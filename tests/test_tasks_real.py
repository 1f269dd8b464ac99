"""T5's real tasks read through stand-ins of their remote sources, and the real JSONL/text files
in $T5NB_DATA_DIR."""
import urllib.error

import numpy as np
import pytest

import t5nb.tasks as tasks
from t5nb import remote
from t5nb.paths import REPO_ROOT
from t5nb.tasks import real, vocab
from t5nb.tasks.real import read_triviaqa_jsonl
from standins import write_standins

LENGTHS = {"inputs": 64, "targets": 16}
DATA = tasks.shared_data_dir()
needs_data = pytest.mark.skipif(not (DATA / "vocab").is_dir(), reason=f"no real data files at {DATA} (set T5NB_DATA_DIR)")


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    return write_standins(tmp_path_factory.mktemp("standins"))


@pytest.fixture
def use_standins(standins, monkeypatch):
    monkeypatch.setenv(remote.STANDINS_ENV, str(standins))
    return standins


@pytest.mark.parametrize("name, split", [
    ("c4_span_corruption_byte", "train"), ("wmt14_ende_byte", "validation"), ("nq_open_byte", "validation"),
    ("triviaqa_nocontext_byte", "validation"), ("closed_book_qa_byte", "train"),
])
def test_real_tasks_yield_declared_shapes_from_their_standins(use_standins, name, split):
    batch = next(tasks.BatchIterator(name, LENGTHS, 2, split=split, shuffle=False, try_in_mem_cache=False))
    assert {k: (v.shape, v.dtype) for k, v in batch.items() if k.startswith("encoder_input")} == {
        "encoder_input_tokens": ((2, 64), np.int32)}
    assert batch["decoder_target_tokens"].shape == (2, 16)
    assert ("encoder_segment_ids" in batch) == name.startswith("c4")


def test_real_sources_keep_every_answer_and_the_recipes(use_standins):
    shown = tasks.preview("triviaqa_nocontext_byte", LENGTHS, split="validation")
    assert shown.raw["targets"] in shown.raw["answers"] and shown.preprocessed["inputs"].startswith("trivia question: ")
    wmt = tasks.preview("wmt14_ende_byte", LENGTHS, split="validation").preprocessed
    assert wmt["inputs"].startswith("translate English to German: ") and tasks.get_task("wmt14_ende").metric_fns[0].__name__ == "bleu"
    assert [t.name for t in tasks.get_task("closed_book_qa").tasks] == ["nq_open", "triviaqa_nocontext"]
    rates = {t.name: tasks.get_task("closed_book_qa").get_rate(t) for t in tasks.get_task("closed_book_qa").tasks}
    assert rates == {name: tasks.get_task(name).num_input_examples("train") for name in rates}  # by size


def test_remote_rows_are_kept_by_their_splits_digest_up_to_a_bound_and_c4_never(use_standins, tmp_path, monkeypatch):
    from t5nb.tasks import kept_pipelines

    monkeypatch.setattr(kept_pipelines, "folder", lambda: tmp_path)
    qa = tasks.get_task("closed_book_qa_byte")
    assert kept_pipelines.key(qa, {"split": "validation"}) not in (None, kept_pipelines.key(qa, {"split": "train"}))
    expected = next(tasks.BatchIterator(qa, LENGTHS, 2, seed=1))
    assert len(list(tmp_path.glob("*.pipeline"))) == 1
    assert all(np.array_equal(v, expected[k]) for k, v in next(tasks.BatchIterator(qa, LENGTHS, 2, seed=1)).items())
    assert kept_pipelines.key(tasks.get_task("c4_span_corruption_byte"), {"split": "train"}) is None  # no digest
    monkeypatch.setattr(kept_pipelines, "MAX_EXAMPLES_BYTES", 100)
    assert kept_pipelines.key(qa, {"split": "validation"}) is None  # too large to hold in a kept graph


# every preprocessor t5nb runs without AutoGraph (tasks.pieces.without_autograph): each objective
# (SSM, a prefix, span corruption), the real tasks' own (rekey, translate), a mixture, and seqio's
# feature converter packed and not
EVERY_BUILT_IN_PREPROCESSOR = ["facts_salient_span_masking", "facts_qa", "c4_span_corruption_byte", "wmt14_ende_byte",
                               "closed_book_qa_byte"]


@pytest.mark.parametrize("name", EVERY_BUILT_IN_PREPROCESSOR)
def test_built_in_tasks_batch_the_same_without_autograph_as_with_it(use_standins, monkeypatch, name):
    """seqio's and T5's functions that t5nb's objectives map over branch and loop on no tensor,
    so traced as written they yield what AutoGraph's rewrite of them yields, batch for batch."""
    import tensorflow as tf

    from t5nb.tasks import batching, kept_pipelines

    monkeypatch.setattr(kept_pipelines, "folder", lambda: None)  # built both times, never loaded

    def batches():
        dataset = batching.get_dataset(name, LENGTHS, 4, seed=5, try_in_mem_cache=False)
        return [{k: v.numpy() for k, v in batch.items()} for batch in dataset.take(3)]

    without = batches()
    converted = []  # what t5nb traced as written in `without`, now left to AutoGraph
    monkeypatch.setattr(tf.autograph.experimental, "do_not_convert", lambda fn: converted.append(fn) or fn)
    with_autograph = batches()
    assert converted and len(without) == len(with_autograph) == 3
    for ours, autographs in zip(without, with_autograph):
        assert ours.keys() == autographs.keys() and all(np.array_equal(ours[k], autographs[k]) for k in ours)


def test_a_preprocessor_of_yours_keeps_autograph():
    """A Python `if` on a tensor, which only AutoGraph turns into graph control flow."""
    import seqio
    import tensorflow as tf

    from t5nb.tasks import custom, pieces

    @seqio.map_over_dataset
    def shout_long_answers(example):
        if tf.strings.length(example["targets"]) > 3:
            example = {**example, "targets": tf.strings.upper(example["targets"])}
        return example

    source = custom.in_memory_source({"train": [{"inputs": "q", "targets": answer} for answer in ("yes", "maybe")]})
    task = pieces.add_task("shouting_long_answers", source, objective="supervised", vocabulary="byte",
                           extra_preprocessors=[shout_long_answers])
    try:
        examples = list(task.get_dataset(None, shuffle=False, num_epochs=1).as_numpy_iterator())
        assert [e["targets_pretokenized"] for e in examples] == [b"yes", b"MAYBE"]
    finally:
        seqio.TaskRegistry.remove("shouting_long_answers")


def test_missing_standin_names_the_url_and_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv(remote.STANDINS_ENV, str(tmp_path))
    with pytest.raises(remote.SourceUnreachable, match=r"hf://datasets/wmt/wmt14/de-en/validation-00000-of-00001.parquet: "
                                                       r"no stand-in file at .*python tests/standins.py"):
        tasks.BatchIterator("wmt14_ende_byte", LENGTHS, 2, split="validation")


def test_unreachable_source_stops_with_one_message(tmp_path, monkeypatch):
    """No network: the error names the URL and what to do; nothing else is read instead."""
    import huggingface_hub

    def offline(*args, **kwargs):
        raise huggingface_hub.errors.LocalEntryNotFoundError("Cannot reach the Hub: connection refused")

    def no_web(*args, **kwargs):
        raise urllib.error.URLError("Temporary failure in name resolution")

    monkeypatch.delenv(remote.STANDINS_ENV, raising=False)
    monkeypatch.setenv("T5NB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    monkeypatch.setattr(remote.urllib.request, "urlopen", no_web)
    with pytest.raises(remote.SourceUnreachable, match=r"could not download hf://datasets/mandarjoshi/trivia_qa/"
                                                       r".*Cannot reach the Hub.*internet access"):
        remote.fetch(real.TRIVIAQA["validation"][0])
    with pytest.raises(remote.SourceUnreachable, match=r"could not download https://raw.githubusercontent.com/.*"
                                                       r"NQ-open.dev.jsonl: .*name resolution"):
        remote.fetch(real.NQ_OPEN["validation"][0])
    assert not list(tmp_path.rglob("*.jsonl"))  # no partial file left under the real name


@needs_data
def test_official_vocabulary_golden_ids():
    vocab = tasks.get_vocabulary("t5")
    assert vocab.encode("translate English to German: The house is wonderful.") == [
        13959, 1566, 12, 2968, 10, 37, 629, 19, 1627, 5]
    assert vocab.vocab_size == 32100 and vocab.encode("<extra_id_0>") == [32099]


@needs_data
def test_nq_open_dev_through_the_closed_book_task():
    task = tasks.register_nq_open_jsonl("nq_open_dev_jsonl", DATA / "nq_open" / "NQ-open.dev.jsonl")
    assert task.num_input_examples("validation") == 3610
    shown = tasks.preview(task, LENGTHS, split="validation")
    assert shown.preprocessed["inputs"] == "trivia question: when was the last time anyone was on the moon"
    assert shown.raw["answers"] == ["14 December 1972 UTC", "December 1972"] and shown.pieces["inputs"][0] == "trivia"
    batch = next(tasks.BatchIterator(task, LENGTHS, 8, split="validation"))
    assert batch["encoder_input_tokens"].shape == (8, 64)
    (squad,) = task.metric_fns
    assert squad([shown.raw["answers"]], ["december 1972"])["em"] == 100.0  # any answer, T5's normalisation


@needs_data
def test_triviaqa_jsonl_accepts_every_alias():
    examples = read_triviaqa_jsonl(DATA / "triviaqa" / "triviaqa_sm_sub.jsonl")
    assert len(examples) == 3000
    first = examples[0]
    assert first["inputs"] == "Brunswick, Lancastrian and Pearl Pickler are types of which vegetable?"
    assert first["targets"] == "Onion" and "Allium cepa" in first["answers"]
    task = tasks.register_triviaqa_jsonl("triviaqa_sm_jsonl", DATA / "triviaqa" / "triviaqa_sm_sub.jsonl")
    assert task.metric_fns[0]([first["answers"]], ["allium cepa"]) == {"em": 100.0, "f1": 100.0}


@needs_data
def test_gutenberg_through_span_corruption_with_the_official_vocabulary():
    task = tasks.register_task("gutenberg_blake", DATA / "gutenberg" / "blake-poems.txt", vocabulary="t5")
    batch = next(tasks.BatchIterator(task, {"inputs": 512, "targets": 114}, 2))
    assert batch["encoder_input_tokens"].shape == (2, 512) and batch["decoder_target_tokens"].shape == (2, 114)
    assert batch["encoder_input_tokens"].max() >= 32000  # sentinels <extra_id_n> from the top of the vocab
    assert batch["encoder_segment_ids"].max() >= 1


def test_make_test_rehearses_where_the_official_vocabulary_is_where_t5nb_reads_it():
    rehearsal_needs = "$${T5NB_DATA_DIR:-../shared/data}/" + vocab.OFFICIAL_SPM_NAME  # the Makefile's shell words
    assert f"OFFICIAL_VOCABULARY := {rehearsal_needs}\n" in (REPO_ROOT / "Makefile").read_text()

"""T5's real tasks offline: TFDS mock data, and the real JSONL/text files in $T5NB_DATA_DIR."""
import numpy as np
import pytest
import seqio
import tensorflow_datasets as tfds

import t5nb.tasks as tasks
from t5nb.tasks.real import read_triviaqa_jsonl

LENGTHS = {"inputs": 64, "targets": 16}
DATA = tasks.shared_data_dir()
needs_data = pytest.mark.skipif(not (DATA / "vocab").is_dir(), reason=f"no real data files at {DATA} (set T5NB_DATA_DIR)")


@pytest.fixture
def mock_tfds(monkeypatch):
    """Random TFDS examples; mock builders have no split sizes, which mixture rates need."""
    monkeypatch.setattr(seqio.TfdsDataSource, "splits", property(lambda self: ("train", "validation")))
    monkeypatch.setattr(seqio.TfdsDataSource, "num_input_examples", lambda self, split: 3)
    with tfds.testing.mock_data(num_examples=3):
        yield


@pytest.mark.parametrize("name, split", [
    ("c4_span_corruption_byte", "train"), ("wmt14_ende_byte", "validation"), ("nq_open_byte", "validation"),
    ("triviaqa_nocontext_byte", "validation"), ("closed_book_qa_byte", "train"),
])
def test_real_tasks_yield_declared_shapes_on_mock_data(mock_tfds, name, split):
    batch = next(tasks.BatchIterator(name, LENGTHS, 2, split=split, shuffle=False, try_in_mem_cache=False))
    assert {k: (v.shape, v.dtype) for k, v in batch.items() if k.startswith("encoder_input")} == {
        "encoder_input_tokens": ((2, 64), np.int32)}
    assert batch["decoder_target_tokens"].shape == (2, 16)
    assert ("encoder_segment_ids" in batch) == name.startswith("c4")


def test_real_recipes():
    wmt = tasks.get_task("wmt14_ende")
    assert wmt.source.tfds_dataset.name == "wmt_t2t_translate/de-en:1.0.0" and wmt.metric_fns[0].__name__ == "bleu"
    assert tasks.get_task("c4_span_corruption").source.tfds_dataset.name == "c4/en:2.2.0"
    assert [t.name for t in tasks.get_task("closed_book_qa").tasks] == ["nq_open", "triviaqa_nocontext"]


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

"""The facts world in data/: its shape, its by-entity QA split, its vocabulary, its tasks."""
import collections
import json

import numpy as np
import pytest
import seqio
import tensorflow as tf

import t5nb.tasks as tasks
from t5nb.tasks import world
from t5nb.tasks.pieces import salient_span_masking
from t5nb.tasks.vocab import DATA_DIR, EXTRA_IDS, FACTS_VOCAB_SIZE, get_vocabulary, train_vocabulary

LENGTHS = {"inputs": 64, "targets": 16}


def _jsonl(name):
    return [json.loads(line) for line in (DATA_DIR / name).read_text(encoding="utf-8").splitlines()]


def test_fact_table_has_enough_facts_relations_and_entities():
    facts = _jsonl("facts.jsonl")
    assert len(facts) == 2000 and len({f["relation"] for f in facts}) == 5
    assert len({f["entity"] for f in facts}) == world.NUM_PEOPLE
    assert all(len(templates) >= 5 for _, templates, _ in world.RELATIONS.values())


def test_qa_split_shares_no_entity_and_heldout_facts_are_in_the_corpus():
    train, validation = _jsonl("facts_qa_train.jsonl"), _jsonl("facts_qa_validation.jsonl")
    train_entities, validation_entities = {r["entity"] for r in train}, {r["entity"] for r in validation}
    assert not train_entities & validation_entities
    assert len(train_entities) == len(validation_entities) == 200
    corpus = (DATA_DIR / "facts_corpus.txt").read_text(encoding="utf-8")
    assert all(r["entity"] in corpus and r["answer"] in corpus for r in validation)
    fact_check = {json.loads(line)["statement"] for line in (DATA_DIR / "facts_fact_check_train.jsonl").open()}
    assert not any(entity in statement for entity in validation_entities for statement in fact_check)


def test_corpus_varies_paraphrase_and_order():
    paragraphs = (DATA_DIR / "facts_corpus.txt").read_text(encoding="utf-8").splitlines()
    assert len(paragraphs) == world.NUM_PEOPLE * world.PARAGRAPHS_PER_PERSON
    first = world.make_people()[0].name
    about_first = [p for p in paragraphs if p.startswith(first) or f" {first}" in p]
    assert len(set(about_first)) == world.PARAGRAPHS_PER_PERSON  # six different renderings


def test_validation_paragraphs_are_new_but_two_thirds_of_their_sentences_are_not():
    """What 02 and world's docstring say of the validation text: 1,367 of its 2,000 sentences
    occur word for word in training paragraphs; no paragraph does."""
    read = lambda name: (DATA_DIR / name).read_text(encoding="utf-8").splitlines()
    training, validation = read("facts_corpus.txt"), read("facts_corpus_validation.txt")
    seen = {sentence for paragraph in training for sentence in world.sentences(paragraph)}
    sentences = [sentence for paragraph in validation for sentence in world.sentences(paragraph)]
    assert not set(validation) & set(training)
    assert (sum(sentence in seen for sentence in sentences), len(sentences)) == (1367, 2000)


def test_answers_are_balanced_so_guessing_scores_low():
    counts = collections.Counter(r["answer"] for r in _jsonl("facts_qa_validation.jsonl") if r["relation"] == "birth_city")
    assert max(counts.values()) / sum(counts.values()) < 0.1


def test_generation_is_deterministic(tmp_path):
    paths = world.write_world(tmp_path)
    for path in paths.values():
        assert path.read_bytes() == (DATA_DIR / path.name).read_bytes(), path.name


def test_vocabulary_is_reproduced_byte_for_byte(tmp_path):
    paths = {name: DATA_DIR / path.name for name, path in world.write_world(tmp_path).items()}
    model = train_vocabulary(world.vocabulary_texts(paths), tmp_path / "new_folder" / "facts_spm")  # made if absent
    assert model.read_bytes() == (DATA_DIR / "facts_spm.model").read_bytes()
    assert (tmp_path / "new_folder" / "facts_spm.vocab").read_bytes() == (DATA_DIR / "facts_spm.vocab").read_bytes()


def test_vocabularies():
    facts = get_vocabulary("facts")
    assert facts.vocab_size == FACTS_VOCAB_SIZE + EXTRA_IDS and facts.eos_id == 1 and facts.pad_id == 0
    assert facts.decode(facts.encode("Sydney")) == "Sydney" and len(facts.encode(" 1977")) == 1
    byte = get_vocabulary("byte")
    assert isinstance(byte, seqio.ByteVocabulary) and byte.encode("ab") == [100, 101]
    with pytest.raises(FileNotFoundError, match="no/such.model"):
        get_vocabulary("no/such.model")


def test_importing_again_registers_nothing_twice():
    assert tasks.register_facts_tasks() == [
        "facts_span_corruption", "facts_salient_span_masking", "facts_qa", "facts_fact_check", "facts_slot_filling",
        "facts_pretraining", "facts_span_corruption_byte", "facts_salient_span_masking_byte", "facts_qa_byte",
        "facts_fact_check_byte", "facts_slot_filling_byte", "facts_pretraining_byte",
    ]


@pytest.mark.parametrize("name", ["facts_span_corruption", "facts_pretraining", "facts_qa", "facts_fact_check_byte"])
def test_offline_tasks_yield_declared_shapes(name):
    batch = next(tasks.BatchIterator(name, LENGTHS, batch_size=4))
    for key, value in batch.items():
        assert value.dtype == np.int32
        assert value.shape == (4, LENGTHS["inputs" if key.startswith("encoder") else "targets"])
    assert ("encoder_segment_ids" in batch) == (name in ("facts_span_corruption", "facts_pretraining"))  # pretraining packs


def test_qa_and_fact_check_text():
    qa = tasks.preview("facts_qa", LENGTHS, split="validation")
    assert qa.preprocessed["inputs"].startswith("trivia question: ") and qa.raw["answers"] == [qa.raw["targets"]]
    check = tasks.preview("facts_fact_check", LENGTHS)
    assert check.preprocessed["inputs"].startswith("fact check: ") and check.preprocessed["targets"] in ("true", "false")
    assert check.ids["targets"][-1] == 1 and len(check.ids["targets"]) == 2  # one class token, EOS


def test_span_corruption_noise_and_sentinels():
    example = tasks.preview("facts_span_corruption", {"inputs": 128, "targets": 32})
    vocab = get_vocabulary("facts")
    sentinel = vocab.vocab_size - 1  # <extra_id_0>
    assert example.ids["inputs"].count(sentinel) == 1 and example.ids["targets"][0] == sentinel
    noise = len(example.ids["targets"]) - 1 - sum(i >= FACTS_VOCAB_SIZE for i in example.ids["targets"])
    assert 0.10 < noise / (noise + len(example.ids["inputs"]) - 1) < 0.20  # 15% noise density


def test_qa_metric_is_squad_em_and_f1():
    task = tasks.get_task("facts_qa")
    (metric,) = task.metric_fns
    scores = metric([["Sydney"], ["Lisbon", "Lisboa"]], ["sydney", "Lisboa."])
    assert scores == {"em": 100.0, "f1": 100.0}
    assert task.postprocess_fn("x", example={"answers": [b"a", b"b"]}, is_target=True) == ["a", "b"]


def test_salient_span_masking_hides_each_sentence_fact_value():
    facts = {(row["entity"], row["value"]) for row in map(json.loads, (DATA_DIR / "facts.jsonl").open())}
    dataset = tasks.get_task("facts_salient_span_masking").get_dataset(None, shuffle=False)
    examples = list(dataset.take(200).as_numpy_iterator())
    assert len(examples) == 200
    for example in examples:
        inputs, targets = example["inputs_pretokenized"].decode(), example["targets_pretokenized"].decode()
        assert inputs.count("<extra_id_0>") == 1 and targets.startswith("<extra_id_0> ")
        value = targets.removeprefix("<extra_id_0> ")
        entity = next(name for name, v in facts if name in inputs)
        assert (entity, value) in facts  # the masked span is this person's value, nothing more
        assert example["targets"][0] == get_vocabulary("facts").vocab_size - 1


def test_salient_span_masking_drops_texts_without_a_span():
    texts = tf.data.Dataset.from_tensor_slices({"targets": ["Ann was born in Oslo in 1950.", "No facts here.",
                                                            "Oslovia is not Oslo."]})
    out = [{k: v.decode() for k, v in x.items()} for x in salient_span_masking(texts, "Oslo|1950").as_numpy_iterator()]
    assert out == [{"inputs": "Ann was born in <extra_id_0> in 1950.", "targets": "<extra_id_0> Oslo"},
                   {"inputs": "Oslovia is not <extra_id_0>.", "targets": "<extra_id_0> Oslo"}]


def test_a_uniform_guess_is_the_chance_of_the_tasks_that_ask_for_a_value_and_of_no_other():
    assert tasks.uniform_guess_accuracy(tasks.SLOT_FILLING) == tasks.uniform_guess_accuracy("facts_qa_byte") \
        == pytest.approx(100 * (1 / 30 + 1 / 20 + 1 / 60 + 1 / 20 + 1 / 15) / 5)  # 4.33%: five relations' value sets
    assert tasks.uniform_guess_accuracy(tasks.FACT_CHECK) is None and tasks.uniform_guess_accuracy("wmt14_ende") is None


def test_slot_filling_asks_every_fact_of_its_split_once_from_the_shipped_fact_table():
    people = world.read_people(DATA_DIR / "facts.jsonl")
    assert people == world.make_people()  # the fact table reads back as the world that wrote it
    for split in ("train", "heldout"):
        examples = world.slot_filling_examples(people, split)
        expected = {(f"{p.name}, {world.SLOT_NAMES[r]}", v) for p in people if p.split == split for r, v in p.facts.items()}
        assert len(examples) == len(expected) == 1000 and {(e["slot"], e["value"]) for e in examples} == expected
    first = world.slot_filling_examples(people, "train")[:50]  # shuffled: a curve's first N cover many people
    assert len({e["slot"].split(", ")[0] for e in first}) > 40 and len({e["slot"].split(", ")[1] for e in first}) == 5
    preview = tasks.preview(tasks.SLOT_FILLING, split="validation")
    assert preview.preprocessed["inputs"].startswith(world.SLOT_FILLING_PREFIX)
    vocabulary = tasks.get_vocabulary("facts")  # every character of every input has a piece: no unknown (id 2)
    slots = [world.SLOT_FILLING_PREFIX + e["slot"] for split in ("train", "heldout")
             for e in world.slot_filling_examples(people, split)]
    assert not any(vocabulary.unk_id in vocabulary.encode(slot) for slot in slots)


def test_first_examples_trains_on_the_first_n_and_keeps_the_rest_whole():
    name = tasks.first_examples(tasks.SLOT_FILLING, 7)
    assert name == f"{tasks.SLOT_FILLING}_first7" and tasks.first_examples(tasks.SLOT_FILLING, 7) == name
    subset, whole = tasks.get_task(name), tasks.get_task(tasks.SLOT_FILLING)
    rows = [e["inputs"] for e in subset.source.get_dataset(split="train").as_numpy_iterator()]
    assert rows == [e["inputs"] for e in whole.source.get_dataset(split="train").take(7).as_numpy_iterator()]
    assert sum(1 for _ in subset.source.get_dataset(split="validation")) == 1000
    assert subset.metric_fns == whole.metric_fns


def test_with_sentinels_writes_span_corruption_as_the_paper_does():
    vocabulary = tasks.get_vocabulary("facts")
    sentinel = vocabulary.vocab_size - 1  # <extra_id_0>; the next one down is <extra_id_1>
    ids = [*vocabulary.encode("Ada Klimberg was born in"), sentinel, *vocabulary.encode("."), sentinel - 1,
           vocabulary.eos_id, *vocabulary.encode("after EOS"), 0]
    assert tasks.with_sentinels(vocabulary, ids) == "Ada Klimberg was born in <extra_id_0> . <extra_id_1>"
    assert tasks.with_sentinels(vocabulary, [0, 0]) == ""

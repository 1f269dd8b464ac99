"""Notebook 06's measurements: a world's bits, the bits a model's losses say it holds, and the
worlds made in memory whose facts the probe asks about, in order."""
import json
import math

import pytest

from t5nb import capacity, evaluate, tasks
from t5nb.tasks import world


def _losses(num_people: int, bits_of) -> dict:
    """Per relation, every person's loss in nats, `bits_of(relation)` bits each."""
    return {relation: [bits_of(relation) * math.log(2)] * num_people for relation in world.RELATIONS}


def test_a_world_holds_log2_of_each_relations_values_per_person():
    per_person = math.log2(30) + math.log2(20) + math.log2(60) + math.log2(20) + math.log2(15)
    assert capacity.world_bits(1) == pytest.approx(per_person) == pytest.approx(23.364, abs=1e-3)
    assert capacity.world_bits(400) == pytest.approx(400 * per_person)


def test_a_certain_model_holds_the_whole_world_and_one_that_predicts_the_prior_holds_nothing():
    certain = capacity.stored_bits(_losses(50, lambda relation: 0.0))
    assert sum(certain.values()) == pytest.approx(capacity.world_bits(50))
    prior = capacity.stored_bits(_losses(50, capacity.value_bits))
    assert sum(prior.values()) == pytest.approx(0.0, abs=1e-9)
    worse = capacity.stored_bits(_losses(50, lambda relation: 2 * capacity.value_bits(relation)))
    assert sum(worse.values()) == 0.0  # worse than the prior counts nothing, not less than nothing
    half = capacity.stored_bits(_losses(50, lambda relation: capacity.value_bits(relation) / 2))
    assert sum(half.values()) == pytest.approx(capacity.world_bits(50) / 2)


def test_the_bound_uses_each_relations_mean_loss():
    """Allen-Zhu and Li's N (log2 |V| - mean loss): one person known, one at the prior -> half."""
    losses = {"birth_year": [0.0, math.log(60)]}
    assert capacity.stored_bits(losses)["birth_year"] == pytest.approx(2 * math.log2(60) / 2)


def test_a_world_in_memory_is_made_for_any_number_of_people_and_the_probe_asks_each_fact_in_order():
    people = world.make_people(30)
    assert len({person.name for person in people}) == 30
    task = tasks.register_world_task(30)
    assert tasks.register_world_task(30) == task == "facts_world30"  # registered once
    vocabulary = tasks.get_vocabulary("facts")
    probes = evaluate.task_examples(task, capacity.FACT_LENGTHS)
    expected = [(person.name, person.facts[relation]) for person in people for relation in world.RELATIONS]
    assert len(probes) == len(expected) == 150
    for probe, (name, value) in zip(probes, expected):
        question, answer = vocabulary.decode(probe["inputs"].tolist()), vocabulary.decode(probe["targets"].tolist())
        assert name in question and "<extra_id_0>" in question and value not in question
        assert answer == f"<extra_id_0> {value}"


def test_write_world_takes_the_number_of_people(tmp_path):
    paths = world.write_world(tmp_path, num_people=12)
    facts = [json.loads(line) for line in paths["facts"].read_text().splitlines()]
    assert len(facts) == 12 * len(world.RELATIONS) and len({row["entity"] for row in facts}) == 12


def test_a_tied_model_counts_its_one_embedding():
    """T5 1.0 reuses the embedding as its output layer: one embedding matrix, not two."""
    from t5nb.config import get_config

    tied, untied = get_config("t5-small"), get_config("t5-small", logits_via_embedding=False)
    counts = capacity.parameter_counts(tied)
    embedding = tied.vocab_size * tied.emb_dim
    assert counts["parameters"] - counts["non_embedding"] == embedding
    assert capacity.parameter_counts(untied)["parameters"] == counts["parameters"] + embedding

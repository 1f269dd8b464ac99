"""Notebook 06's measurements: a world's bits, the bits a model's losses say it holds, and the
worlds made in memory whose facts the probe asks about, in order."""
import json
import math
import pathlib

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


def test_a_certain_model_holds_all_but_the_frequencies_and_one_that_predicts_them_holds_nothing():
    people = world.make_people(50)
    frequencies = capacity.frequency_bits(people)
    beyond = 50 * sum(frequencies.values())
    assert 0 < beyond < capacity.world_bits(50)
    certain = capacity.stored_bits(_losses(50, lambda relation: 0.0), frequencies)
    assert sum(certain.values()) == pytest.approx(beyond)
    prior = capacity.stored_bits(_losses(50, frequencies.get), frequencies)
    assert sum(prior.values()) == pytest.approx(0.0, abs=1e-9)
    worse = capacity.stored_bits(_losses(50, lambda relation: 2 * frequencies[relation]), frequencies)
    assert sum(worse.values()) == 0.0  # worse than the frequencies counts nothing, not less than nothing
    half = capacity.stored_bits(_losses(50, lambda relation: frequencies[relation] / 2), frequencies)
    assert sum(half.values()) == pytest.approx(beyond / 2)


def test_a_model_that_learnt_only_how_often_each_value_occurs_is_credited_with_nothing():
    """Each person's loss is -log of their value's share among the people: the frequencies, not
    who has which value. Against log2 |V| instead, a world of 100 people would credit it 119 bits."""
    people = world.make_people(100)
    losses = {}
    for relation in world.RELATIONS:
        values = [person.facts[relation] for person in people]
        losses[relation] = [-math.log(values.count(value) / len(values)) for value in values]
    assert sum(capacity.stored_bits(losses, capacity.frequency_bits(people)).values()) == pytest.approx(0.0, abs=1e-9)
    uniform = {relation: capacity.value_bits(relation) for relation in world.RELATIONS}
    assert sum(capacity.stored_bits(losses, uniform).values()) == pytest.approx(119.3, abs=0.05)
    assert capacity.frequency_bits(people)["birth_year"] < capacity.value_bits("birth_year")


def test_the_bound_uses_each_relations_mean_loss():
    """Allen-Zhu and Li's N (H - mean loss): one person known, one at the frequencies -> half."""
    losses = {"birth_year": [0.0, math.log(60)]}
    assert capacity.stored_bits(losses, {"birth_year": math.log2(60)})["birth_year"] == pytest.approx(math.log2(60))


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


def _em(em: float, examples: int = 2000, **row) -> dict:
    return {"em": em, "examples": examples, **row}


def test_a_gain_counts_only_beyond_twice_its_standard_error_and_chance_is_shown():
    """SSM's gain and each size step: "yes" beyond twice the difference's standard error,
    "not resolved" or "in part" within it; the uniform guess stands beside the EMs."""
    clear = {"span corruption": _em(6.0, width=32, steps=1000), "span corruption + SSM": _em(20.45, width=32, steps=1000)}
    finding = capacity.ssm_finding(clear)
    assert finding["agree"] == "yes" and "+14.4 ± 1.0 points" in finding["ours"]
    assert f"a uniform guess gets {world.uniform_guess_accuracy():.1f}%" in finding["ours"]
    close = {**clear, "span corruption": _em(19.5, width=32, steps=1000)}
    assert capacity.ssm_finding(close)["agree"].startswith("not resolved")
    assert capacity.standard_error(_em(50.0, examples=100)) == pytest.approx(5.0)
    sizes = {16: _em(6.35, parameters=64016), 32: _em(20.45, parameters=183200), 128: _em(86.25, parameters=2059520)}
    assert capacity.size_finding(sizes)["agree"] == "yes"
    sizes[32] = _em(7.0, parameters=183200)
    assert capacity.size_finding(sizes)["agree"].startswith("in part")


def test_the_runs_06_shows_in_tensorboard_are_its_own(monkeypatch, tmp_path):
    """Its pretrainings and their fine-tunings, not notebook 02's run that its width 128 reuses,
    and the memorisation runs' folder, where memorisation_recipe puts them."""
    from t5nb.profiles import PROFILES

    monkeypatch.setenv("T5NB_RUNS_DIR", str(tmp_path))
    cpu = PROFILES["cpu"]
    names = [path.name for path in capacity.run_dirs(cpu)]
    assert names == ["pretraining_facts_span_corruption_w32", "finetune_facts_qa_facts_span_corruption_w32",
                     "pretraining_facts_pretraining_w32", "finetune_facts_qa_facts_pretraining_w32",
                     "pretraining_facts_pretraining_w16", "finetune_facts_qa_facts_pretraining_w16", "capacity"]
    recipe = capacity.memorisation_recipe(cpu, 100, 4)
    assert pathlib.Path(recipe.run.model_dir).parent == capacity.run_dirs(cpu)[-1]

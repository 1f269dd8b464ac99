"""Notebook 06's measurements: a world's bits, the bits a model's losses say it holds, and the
worlds made in memory whose facts the probe asks about, in order."""
import json
import math
import pathlib

import jax
import numpy as np
import pandas as pd
import pytest

from t5nb import analysis, capacity, evaluate, tasks
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


def test_each_relations_probe_is_a_paraphrase_no_other_relation_has():
    for relation, (_, paraphrases, _) in world.RELATIONS.items():
        others = {p for other, (_, ps, _) in world.RELATIONS.items() if other != relation for p in ps}
        assert world.probe_paraphrase(relation) in paraphrases and world.probe_paraphrase(relation) not in others
    assert world.probe_paraphrase("birth_city") == "{name} came into the world in {value}."  # not "was born in"
    person = world.make_people(1)[0]
    assert world.probe_statements([person])[0] == f"{person.name} came into the world in {person.facts['birth_city']}."


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


def _row(right: list, questions: int = 10, **row) -> dict:
    """A row of `pretraining_comparison` or `size_sweep` whose person i got right[i] of `questions` right."""
    return {"em": 100 * sum(right) / (questions * len(right)), "examples": questions * len(right),
            "by_person": {f"Person {i}": [r, questions] for i, r in enumerate(right)}, **row}


def _predictions(examples: list, right: list) -> pd.DataFrame:
    """Answers to facts-world `examples` (10 per person, person by person): of person i's, the
    first right[i] right (or, right[i] < 0, the last -right[i]), the rest wrong."""
    rows = []
    for position, example in enumerate(examples):
        person, index = divmod(position, 10)
        correct = index < right[person] if right[person] >= 0 else index >= 10 + right[person]
        rows.append({"input": world.QA_PREFIX + example["question"], "target": example["answer"],
                     "prediction": example["answer"] if correct else "nobody knows", "score": 0.0})
    return pd.DataFrame(rows)


def test_a_rows_error_is_clustered_by_person_and_a_gain_is_paired_over_the_same_questions():
    """4 held-out people x 10 questions. The worse model gets 2, 4, 0, 2 right (the last ones of
    each), the better 6, 8, 2, 8 (the first ones): the per-question differences (-1, 0 or 1)
    sum per person to 4, 4, 2, 6, mean 16/40, residuals 0, 0, -2, 2, so the paired error is
    sqrt(4/3 * 8) / 40 = 8.2 points, where taking the models as independent would give
    hypot(8.2, 14.1) = 16.3 (worse: residuals 0, 2, -2, 0; better: 0, 2, -4, 2)."""
    examples = world.qa_examples(world.make_people(), "heldout")[:40]
    assert len({example["entity"] for example in examples}) == 4
    worse_predictions = _predictions(examples, [-2, -4, 0, -2])
    better_predictions = _predictions(examples, [6, 8, 2, 8])
    worse, better = ({"em": 100 * analysis.with_correctness(predictions)["correct"].mean(),
                      "by_person": capacity.correct_by_person(predictions)}
                     for predictions in (worse_predictions, better_predictions))
    assert sorted(worse["by_person"].values()) == [[0, 10], [2, 10], [2, 10], [4, 10]]
    assert worse["em"] == pytest.approx(20.0) and better["em"] == pytest.approx(60.0)
    assert capacity.standard_error(worse) == pytest.approx(100 * math.sqrt(4 / 3 * 8) / 40)
    assert capacity.standard_error(better) == pytest.approx(100 * math.sqrt(4 / 3 * 24) / 40)
    differences = (analysis.with_correctness(better_predictions)["correct"].astype(int)
                   - analysis.with_correctness(worse_predictions)["correct"].astype(int))
    assert sorted(differences.unique()) == [-1, 0, 1]
    gain, error = capacity._gain(better, worse)
    assert gain == pytest.approx(40.0) and error == pytest.approx(100 * math.sqrt(4 / 3 * 8) / 40)
    assert error == pytest.approx(8.165, abs=1e-3)
    assert math.hypot(capacity.standard_error(better), capacity.standard_error(worse)) == pytest.approx(16.33, abs=0.01)
    other = {**worse, "by_person": {**worse["by_person"], "Somebody Else": [1, 10]}}
    with pytest.raises(ValueError, match="same questions"):
        capacity._gain(better, other)


def test_the_headline_keeps_a_rows_error_not_its_counts_per_person():
    row = _row([10, 0], width=32, steps=1000)  # 2 people, all right and all wrong: sqrt(2 * 50) / 20 = 50 points
    assert capacity.summary(row) == {"em": 50.0, "examples": 20, "width": 32, "steps": 1000,
                                     "standard_error": pytest.approx(50.0)}
    table = capacity.em_table({"span corruption": row})
    assert list(table.columns) == ["em", "examples", "width", "steps", "standard_error"]
    assert table.loc["span corruption", "width"] == 32


BASE = [k % 9 for k in range(200)]  # questions right of 200 people x 10: 793 of 2,000, 39.65%
SPREAD = [r + (k % 10 == 0) for k, r in enumerate(BASE)]  # 20 people one question more: +1.0 points
CONCENTRATED = [r + 5 * (k < 2) for k, r in enumerate(BASE)]  # 2 people five more: +0.5 points
ALL = [r + 1 for r in BASE]  # every person one more: +10.0 points


def test_a_gain_counts_only_beyond_twice_its_paired_standard_error_and_chance_is_shown():
    """SSM's gain and each size step: "yes" beyond twice the paired difference's standard error,
    "not resolved" or "in part" within it; the uniform guess stands beside the EMs."""
    clear = {"span corruption": _row(BASE, width=32, steps=1000), "span corruption + SSM": _row(SPREAD, width=32, steps=1000)}
    finding = capacity.ssm_finding(clear)
    # 20 people's one more: residuals 0.9 (x 20) and -0.1 (x 180), sqrt(200/199 * 18) / 2000 = 0.21 points
    assert finding["agree"] == "yes" and "+1.0 ± 0.2 points, standard error paired and clustered by person" in finding["ours"]
    assert capacity._gain(clear["span corruption + SSM"], clear["span corruption"])[1] == pytest.approx(
        100 * math.sqrt(200 / 199 * 18) / 2000)
    assert f"a uniform guess gets {world.uniform_guess_accuracy():.1f}%" in finding["ours"]
    # taken as independent, the two models' errors (1.8 points each) would leave +1.0 unresolved
    assert math.hypot(*(capacity.standard_error(row) for row in clear.values())) == pytest.approx(2.60, abs=0.01)
    # half the gain, all of it in two people: 5 right more each, sqrt(200/199 * 49.5) / 2000 = 0.35 points
    close = {**clear, "span corruption + SSM": _row(CONCENTRATED, width=32, steps=1000)}
    assert capacity._gain(close["span corruption + SSM"], close["span corruption"]) == pytest.approx(
        (0.5, 100 * math.sqrt(200 / 199 * 49.5) / 2000))
    assert capacity.ssm_finding(close)["agree"].startswith("not resolved")
    assert capacity.standard_error(_row([10, 0])) == pytest.approx(50.0)
    sizes = {16: _row(BASE, parameters=64016), 32: _row(SPREAD, parameters=183200), 128: _row(ALL, parameters=2059520)}
    finding = capacity.size_finding(sizes)
    assert finding["agree"] == "yes" and "each step up +1.0 ± 0.2, +9.0 ± " in finding["ours"]  # each gain it judges
    assert capacity.size_finding({16: sizes[16]})["ours"].endswith(f"parameters (one seed each; a uniform guess gets "
                                                                    f"{world.uniform_guess_accuracy():.1f}%)")
    sizes[32] = _row(CONCENTRATED, parameters=183200)
    assert capacity.size_finding(sizes)["agree"].startswith("in part")
    sizes[16] = _row(ALL, parameters=64016)
    assert capacity.size_finding(sizes)["agree"].startswith("no: EM fell")


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


def test_stacked_models_train_as_each_would_alone():
    """`Trainer.stacked_train_steps`: two models of different seeds, two steps in one program,
    end where `train_step` takes each of them, on the same batches."""
    from t5nb.profiles import PROFILES
    from t5nb.recipe import make_trainer

    trainer = make_trainer(capacity.memorisation_recipe(PROFILES["ci"], 20, 4))
    examples = capacity.fact_examples(tasks.register_world_task(20), "train")
    batches = capacity.memorisation_batches(examples, capacity.example_orders(len(examples["inputs"]), 2, 8, seeds=[0, 1]))
    states = [trainer.init_state(trainer.init_params(seed)) for seed in (0, 1)]
    stacked = capacity.initial_states(trainer, (0, 1))
    stacked, sums = trainer.stacked_train_steps(stacked, jax.device_put(batches))
    assert np.asarray(sums["loss"]).shape == (2, 2)
    for model, state in enumerate(states):
        for step in range(2):
            state, step_sums = trainer.train_step(state, trainer.shard_batch(
                {name: array[step, model] for name, array in batches.items()}))
            assert float(sums["loss"][step, model]) == pytest.approx(float(step_sums["loss"]), rel=1e-5)
        alone = jax.tree.leaves(jax.device_get(state.params))
        together = [leaf[model] for leaf in jax.tree.leaves(jax.device_get(stacked.params))]
        assert all(np.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(alone, together))


def test_each_seed_sees_every_example_as_often_as_every_other_in_an_order_of_its_own():
    orders = capacity.example_orders(count=10, steps=7, batch=4, seeds=range(3))  # 2.8 passes
    assert orders.shape == (7, 3, 4)
    for seed in range(3):
        counts = np.bincount(orders[:, seed].ravel(), minlength=10)
        assert counts.max() - counts.min() <= 1 and counts.sum() == 28
    assert not np.array_equal(orders[:, 0], orders[:, 1])


def test_an_example_longer_than_the_fact_lengths_is_refused_not_cut(monkeypatch):
    monkeypatch.setattr(capacity, "FACT_LENGTHS", {"inputs": 6, "targets": 4})
    with pytest.raises(ValueError, match=r"facts_world20 \(train\): an example's inputs has \d+ tokens, more than "
                                         r"capacity.FACT_LENGTHS' 6"):
        capacity.fact_examples(tasks.register_world_task(20), "train")


def test_the_grid_row_counts_each_seeds_bits_and_is_read_back_not_trained_again(monkeypatch, tmp_path):
    from t5nb.profiles import PROFILES

    monkeypatch.setenv("T5NB_RUNS_DIR", str(tmp_path))
    ci = PROFILES["ci"]  # 20 people, width 4, 2 seeds
    row = capacity.knowledge_bits(ci, 20, 4)
    assert row["seeds"] == len(row["stored_by_seed"]) == 2
    assert row["stored_bits"] == pytest.approx(np.mean(row["stored_by_seed"]))
    assert row["steps"] == capacity.MEMORISATION_CHUNK and row["exposures"] == pytest.approx(25 * 128 / 100)
    assert row["law_bits"] == 0  # below 100 exposures the paper states no capacity
    monkeypatch.setattr(capacity, "memorise", lambda *args: pytest.fail("trained again"))
    assert capacity.knowledge_bits(ci, 20, 4) == row


def _grid_row(people, bits, sd, width=4, parameters=10_916, exposures=100.0):
    return {"people": people, "width": width, "parameters": parameters, "non_embedding": 1_924, "seeds": 3,
            "stored_bits": bits, "stored_bits_sd": sd, "bits_per_parameter": bits / parameters,
            "bits_per_non_embedding": bits / 1_924, "beyond_frequencies": 22.5 * people, "exposures": exposures}


def test_a_width_saturates_when_its_largest_world_adds_no_more_than_twice_the_seeds_error():
    growing = [_grid_row(120, 200.0, 90.0), _grid_row(480, 1_000.0, 130.0)]
    found = capacity.saturation(growing)
    assert not found["saturated"] and found["gain"] == 800.0
    assert found["error"] == pytest.approx(math.hypot(90, 130) / math.sqrt(3))
    finding = capacity.capacity_finding(growing)
    assert "width 4 (10,916 parameters) did not saturate" in finding["ours"]
    assert finding["agree"].startswith("not resolved")
    level = [_grid_row(120, 1_000.0, 90.0), _grid_row(480, 1_100.0, 130.0)]
    assert capacity.saturation(level)["saturated"] and capacity.saturation(level)["ceiling"]["people"] == 480
    agree = capacity.capacity_finding(level)["agree"]
    assert agree.startswith("below the law: saturated at 0.101 bits per parameter, 10% of the paper's 1 at 100")
    assert capacity.capacity_finding([_grid_row(120, 10_000.0, 9.0), _grid_row(480, 10_000.0, 9.0)])["agree"].startswith("yes")
    short = [_grid_row(120, 1_000.0, 90.0, exposures=40.0), _grid_row(480, 1_100.0, 130.0, exposures=40.0)]
    assert capacity.capacity_finding(short)["agree"].startswith("not comparable")

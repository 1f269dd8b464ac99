"""Error analysis: correctness as T5's SQuAD EM counts it, groups, the score's reliability, and
how often each person appears in the training batches."""
import math

import numpy as np
import pandas as pd
import pytest
from t5.evaluation import metrics as t5_metrics

from t5nb import analysis, tasks
from t5nb.tasks import world

PREDICTIONS = pd.DataFrame({
    "input": ["trivia question: Where was Ada Klimberg born?", "trivia question: Who employs Ada Klimberg?",
              "trivia question: When was Ida Brelmov born?", "who wrote the iliad?"],
    "target": [["Havana"], ["Glimora"], ["1950"], ["Homer", "homer (poet)"]],
    "prediction": ["havana.", "Strativ", "1950", "Homer"],
    "score": [-0.1, -2.0, -0.3, -0.5],
})


def test_correct_is_squad_exact_match_per_question():
    scored = analysis.with_correctness(PREDICTIONS)
    assert scored["correct"].tolist() == [True, False, True, True]
    squad = t5_metrics.squad(PREDICTIONS["target"].tolist(), PREDICTIONS["prediction"].tolist())
    assert 100 * scored["correct"].mean() == pytest.approx(squad["em"])


def test_facts_questions_give_relation_and_person_and_others_nothing():
    scored = analysis.with_question_facts(analysis.with_correctness(PREDICTIONS))
    assert scored["relation"].fillna("-").tolist() == ["birth_city", "employer", "birth_year", "-"]
    assert scored["person"].fillna("-").tolist() == ["Ada Klimberg", "Ada Klimberg", "Ida Brelmov", "-"]
    by_relation = analysis.accuracy_by(scored, "relation")
    assert by_relation[["questions", "em"]].to_dict("index") == {"birth_city": {"questions": 1, "em": 100.0},
                                                                 "birth_year": {"questions": 1, "em": 100.0},
                                                                 "employer": {"questions": 1, "em": 0.0}}
    assert by_relation["standard_error"].isna().all()  # one person each: clustered by person, no error to give


def test_accuracy_by_group_without_people_takes_the_questions_as_independent():
    """NQ's or TriviaQA's questions name no person: sqrt(p (1 - p) / n), with a person column or without."""
    scored = pd.DataFrame({"group": ["a"] * 100 + ["b"] * 400, "correct": [True, False] * 50 + [True] * 360 + [False] * 40})
    for frame in (scored, scored.assign(person=None)):
        table = analysis.accuracy_by(frame, "group")
        assert table.loc["a"].tolist() == [100, 50.0, 5.0]  # sqrt(0.5 * 0.5 / 100)
        assert table.loc["b"].tolist() == [400, 90.0, 1.5]  # sqrt(0.9 * 0.1 / 400)


def test_the_clustered_standard_error_by_hand():
    """2 people x 2 questions, one all right, one all wrong: m = 2/4, residuals 2 - 1 = 1 and
    0 - 1 = -1, sqrt(2 / 1 * 2) / 4 = 0.5, twice sqrt(0.5 * 0.5 / 4) = 0.25 of independent questions."""
    assert analysis.clustered_standard_error([2, 0], [2, 2]) == pytest.approx(0.5)
    # the same 2 of 4 right, one of each person's: the people do not differ, nor do their sums
    assert analysis.clustered_standard_error([1, 1], [2, 2]) == 0.0
    # 3 people of 1, 2 and 3 questions, 1, 0 and 3 right: m = 4/6, residuals 1/3, -4/3, 1
    assert analysis.clustered_standard_error([1, 0, 3], [1, 2, 3]) == pytest.approx(
        (3 / 2 * (1 / 9 + 16 / 9 + 1)) ** 0.5 / 6) == pytest.approx(0.3469, abs=1e-4)
    # independent questions, each its own person: sqrt(n / (n - 1) * p (1 - p) / n)
    assert analysis.clustered_standard_error([1] * 90 + [0] * 10, [1] * 100) == pytest.approx((0.09 / 99) ** 0.5)
    assert math.isnan(analysis.clustered_standard_error([3], [5]))  # one person: nothing to compare


def test_accuracy_by_clusters_the_error_by_person_where_the_questions_name_one():
    """Group a: 2 people x 2 questions, each all right or all wrong: 50.0 points, not the 25.0 of
    4 independent questions. Group b: 4 people of one question each (a question without a person
    counts as a person of its own): sqrt(4 / 3 * 4 * 0.25) / 4 = 28.9 points."""
    scored = pd.DataFrame({"group": ["a"] * 4 + ["b"] * 4, "person": ["Ada", "Ada", "Ida", "Ida", "Ada", "Ida", "Una", None],
                           "correct": [True, True, False, False, True, False, True, False]})
    table = analysis.accuracy_by(scored, "group")
    assert table.to_dict("index") == {"a": {"questions": 4, "em": 50.0, "standard_error": 50.0},
                                      "b": {"questions": 4, "em": 50.0, "standard_error": 28.9}}
    assert analysis.accuracy_by(scored.drop(columns="person"), "group")["standard_error"].tolist() == [25.0, 25.0]
    quantiles = analysis.accuracy_by_quantiles(scored.assign(mentions=[1, 1, 2, 2, 3, 4, 5, 6]), "mentions", bins=2)
    assert quantiles["standard_error"].tolist() == [50.0, 28.9]  # the same groups, by a Series


def test_every_question_form_of_the_world_parses_back():
    for relation, (_, _, forms) in world.RELATIONS.items():
        for form in forms:
            assert world.parse_question(world.QA_PREFIX + form.format(name="Nela Tassett")) == (relation, "Nela Tassett")


def test_reliability_bins_are_equal_and_ordered_by_score():
    scored = pd.DataFrame({"score": np.linspace(-4, 0, 40), "correct": np.linspace(-4, 0, 40) > -1})
    table = analysis.reliability(scored, bins=4)
    assert table["questions"].tolist() == [10] * 4
    assert table["mean_score"].is_monotonic_increasing and table["em"].tolist() == [0.0, 0.0, 0.0, 100.0]


def test_mention_counts_count_rows_of_the_very_batches_that_mention_each_name():
    lengths, vocabulary = {"inputs": 64, "targets": 16}, tasks.get_vocabulary("facts")
    names = ["Nela Tassett", "Yara Fexwick", "Nobody Atall"]
    counts = analysis.mention_counts(tasks.BatchIterator("facts_pretraining", lengths, 4), vocabulary, names, 5)
    expected = dict.fromkeys(names, 0)
    batches = tasks.BatchIterator("facts_pretraining", lengths, 4)
    for _ in range(5):
        batch = next(batches)
        for row in range(4):
            text = " ".join(vocabulary.decode(batch[k][row].tolist()) for k in ("encoder_input_tokens", "decoder_target_tokens"))
            for name in names:
                expected[name] += name in text
    assert counts.to_dict() == expected and counts["Nobody Atall"] == 0
    assert analysis.mention_counts(iter(()), vocabulary, [], 1000).empty  # no names: no batch is read


def test_answer_relations_count_answers_of_the_relation_asked_of_another_and_of_none():
    predictions = pd.DataFrame({"target": ["Havana", "1950", "violin", "banker"],
                                "prediction": ["Lisbon", "pilot", "cello", "a banker"]})
    counts = analysis.answer_relations(predictions)
    assert counts.to_dict() == {"of the relation asked": 2, "of another relation": 1, "no relation's value": 1}
    assert world.relation_of_value("Havana") == "birth_city" and world.relation_of_value("Atlantis") is None

"""The exercises' checks (t5nb.exercises), without the notebooks: what they accept, what they
refuse, and what they say."""
import math
import re

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from t5nb import analysis, capacity
from t5nb.config import get_config
from t5nb.exercises import EXERCISES, Solved, check
from t5nb.tasks import world


def _printed():
    """Per numeric exercise: (the answer a learner works out from the values as the notebook
    prints them, rounded; the check's context), on values like a run's."""
    rng = np.random.default_rng(0)
    score = rng.normal(-1.0, 0.5, 800)
    scored = pd.DataFrame({"score": score, "correct": rng.random(800) < 1 / (1 + np.exp(-3 * (score + 1.2)))})
    bins = analysis.reliability(scored).round(2)  # 04 prints it so: 8 bins of 100, the top 6 are 75%
    per_example = {"facts_salient_span_masking": 18.4321, "facts_span_corruption": 190.0456}  # 01 prints them to 0.1
    decoded = {"em": 86.8166}  # 05 prints it to 2 places
    log_z = math.log(math.exp(1) + math.exp(2) + math.exp(3))
    one_person = sum(round(math.log2(len(values)), 2) for values, _, _ in world.RELATIONS.values())  # 06's table
    chance = [round(100 / len(values), 1) for values, _, _ in world.RELATIONS.values()]  # 04's "(3.3% by chance)"
    return {
        "00.2": (77.0e6 * 4 / 1e9, {}),  # 00's presets: 77.0 M parameters
        "01.2": (round(per_example["facts_salient_span_masking"], 1) / sum(round(n, 1) for n in per_example.values()),
                 {"per_example": per_example}),
        "02.1": (round(log_z, 2) - 1, {}),  # log Z to 2 places, minus the target's logit
        "02.4": (1e-4 * 3.408**2, {}),  # log Z as the solution cell's comment prints it
        "03.2": (sum(chance) / len(chance), {}),
        "04.1": (50, {}),  # precision 1/3, recall 1
        "04.2": (bins["em"].iloc[2:].mean(), {"scored": scored}),
        "05.1": (-1.5 / ((5 + 3) / 6) ** 0.6, {}),
        "05.2": ((round(decoded["em"], 2) + 100) / 2, {"decoded": decoded}),
        "05.3": (2.718 / (2.718 + 3), {}),  # softmax of the logits halved: e^1, e^0 three times
        "06.1": (1000 * (round(one_person, 2) + 1), {}),  # "one person: 23.36 bits", and one bit more a year
        "06.2": (2 * 10916 / (round(capacity.world_bits(300), 3) / 300),  # the grid's table, rounded to 3 places
                 {"grid": [{"people": 100, "parameters": 10916, "world_bits": capacity.world_bits(100)},
                           {"people": 300, "parameters": 20000, "world_bits": capacity.world_bits(300)}]}),
    }


PRINTED = _printed()
NUMERIC = sorted(name for name, exercise in EXERCISES.items() if exercise.precision)


def test_every_numeric_exercise_has_printed_values_to_work_from():
    assert sorted(PRINTED) == NUMERIC


@pytest.mark.parametrize("name", NUMERIC)
def test_the_answer_from_printed_values_is_right_and_one_twice_the_tolerance_off_is_not(name, capsys):
    """Each exercise's own tolerance: wide enough for the answer worked out from the printed
    values, rounded to the precision the exercise asks for, and no wider than that by half."""
    answer, context = PRINTED[name]
    exercise = EXERCISES[name]
    check(name, answer, **context)
    precision = exercise.precision
    digits = (precision.figures - 1 - math.floor(math.log10(abs(answer)))) if precision.figures else precision.places
    check(name, round(answer, digits), **context)  # as asked: rounded to the figures the exercise states
    expected = exercise.expected(**context)
    tolerance = precision.tolerance(expected)
    assert tolerance > 0
    for wrong in (expected - 2 * tolerance, expected + 2 * tolerance):
        with pytest.raises(AssertionError, match=rf"exercise {name}: "):
            check(name, wrong, **context)


@pytest.mark.parametrize("kind", [float, np.float64, np.float32, jnp.float32, lambda x: np.array(x), jnp.array])
def test_any_real_number_is_accepted(kind, capsys):
    """A right answer as Python's float, numpy's or JAX's scalar, or a 0-d array."""
    check("00.2", kind(0.308))
    assert "is 0.308" in capsys.readouterr().out


@pytest.mark.parametrize("kind", [int, np.int64, np.int32, jnp.int32, lambda x: np.array(x)])
def test_a_whole_number_is_accepted_in_any_integer_type(kind, capsys):
    check("01.1", kind(1024))
    assert "is 1024" in capsys.readouterr().out


@pytest.mark.parametrize("answer", [True, "0.308", [0.308], np.array([0.308, 0.308]), None])
def test_what_is_not_a_real_number_is_refused(answer):
    with pytest.raises(AssertionError, match=r"exercise 00\.2: .* is not the GB"):
        check("00.2", answer)


def test_a_list_answer_may_hold_numpy_integers():
    """02.2's steps, as a numpy array or a list of numpy ints (here against a folder of checkpoints)."""
    import pathlib
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        for step in (500, 750, 1000):
            (pathlib.Path(folder) / "checkpoints" / str(step)).mkdir(parents=True)
        context = {"model_dir": pathlib.Path(folder)}
        check("02.2", [500, 750, 1000], **context)
        check("02.2", np.array([500, 750, 1000]), **context)
        check("02.2", [np.int64(500), np.int64(750), np.int64(1000)], **context)
        with pytest.raises(AssertionError, match=r"\[750, 1000\] is not the list of steps"):
            check("02.2", [750, 1000], **context)


def _context(name: str, tmp_path) -> dict:
    """What each check needs from its notebook, where the printed values do not give it."""
    if name in PRINTED:
        return PRINTED[name][1]
    (tmp_path / "checkpoints" / "8").mkdir(parents=True, exist_ok=True)
    return {"02.2": {"model_dir": tmp_path}, "02.3": {"config": get_config("t5.1.1-small")},
            "03.1": {"config": get_config("t5.1.1-mini")}}.get(name, {})


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_messages_read_as_sentences(name, tmp_path):
    """Each question is a noun phrase with its own article ("the the" nowhere), a numeric one
    says its precision, and a number is shown as digits, never as numpy's repr."""
    exercise = EXERCISES[name]
    assert exercise.question.startswith("the ") and not exercise.question.startswith("the the ")
    with pytest.raises(AssertionError) as refused:
        check(name, np.float64(-12345.678), **_context(name, tmp_path))
    message = str(refused.value)
    assert message.startswith(f"exercise {name}: -12345.7 is not the "), message
    assert " the the " not in message and "np." not in message, message
    if exercise.precision:
        assert message.endswith(f"{exercise.precision.text}; try again, or expand the solution cell above"), message
    with pytest.raises(AssertionError, match=re.escape(f"replace `...` with your answer: {exercise.question}")):
        check(name, ...)


def test_a_check_refuses_a_wrong_answer_and_names_the_question():
    with pytest.raises(AssertionError, match=r"00\.2: 0\.5 is not the GB .* to 2 significant figures"):
        check("00.2", 0.5)
    with pytest.raises(AssertionError, match=r"00\.2: 95\.5333 is not"):
        check("00.2", np.float64(95.533333))


def test_a_check_says_when_it_checked_the_solution_cells_answer_without_saying_it(capsys):
    check("00.2", Solved(np.float64(0.307844608)))
    out = capsys.readouterr().out
    assert "exercise 00.2: the solution cell's answer passed, not yours" in out
    assert "0.3" not in out and "GB" not in out  # run top to bottom, no check gives its answer away
    check("00.2", 0.31)
    assert "right, the GB" in capsys.readouterr().out
    with pytest.raises(AssertionError, match=r"00\.2: 0\.5 is not"):
        check("00.2", Solved(0.5))


def test_an_answer_a_unit_off_in_the_last_figure_is_refused(capsys):
    """0.3078 GB is 0.31 to 2 significant figures: 0.30, 0.78 of a unit from it, is refused."""
    with pytest.raises(AssertionError, match=r"00\.2: 0\.3 is not the GB"):
        check("00.2", 0.30)
    with pytest.raises(AssertionError, match=r"05\.3: 0\.46 is not"):
        check("05.3", 0.46)
    check("00.2", 0.31)
    assert "right, the GB" in capsys.readouterr().out


def test_an_answer_within_three_quarters_of_a_unit_is_accepted_and_one_farther_is_refused(capsys):
    """Half a unit (rounding) and the quarter of slack: where the share is 0.306 (0.31 to 2
    significant figures), 0.30 and 0.2986, 0.6 and 0.74 of a unit off, are accepted and told
    0.31; 0.2984 and 0.314, 0.76 and 0.8 off, are refused."""
    per_example = {"facts_salient_span_masking": 30.6, "facts_span_corruption": 69.4}
    for near in (0.30, 0.2986):
        check("01.2", near, per_example=per_example)
    said = capsys.readouterr().out
    assert said.count("accepted, the share") == 2 and said.count("to 2 significant figures it is 0.31") == 2
    for far in (0.2984, 0.314):
        with pytest.raises(AssertionError, match=re.escape(f"01.2: {far} is not the share")):
            check("01.2", far, per_example=per_example)


def test_an_answer_whose_last_figure_only_rounding_moved_is_accepted_and_told_the_value(capsys):
    """0.4754 is 0.48 to 2 significant figures; 0.47, within a quarter unit of the rounding
    boundary's reach (as printed values can move it), is accepted, not called right."""
    check("05.3", 0.47)
    said = capsys.readouterr().out
    assert "accepted, the probability" in said and "to 2 significant figures it is 0.48" in said
    assert "right" not in said


@pytest.mark.parametrize("answer", [0.0884, 8.84, np.float64(8.8), 0.088])
def test_a_share_may_be_a_fraction_or_a_percentage(answer, capsys):
    per_example = PRINTED["01.2"][1]["per_example"]
    check("01.2", answer, per_example=per_example)
    assert "right, the share" in capsys.readouterr().out


def test_a_share_refused_says_both_forms_are_taken():
    with pytest.raises(AssertionError, match=r"01\.2: 7\.7% is not the share .* \(a fraction or a percentage\)"):
        check("01.2", 7.7, **PRINTED["01.2"][1])


def test_a_known_misreading_is_named():
    """05.1's answer at length 4 (EOS counted again) is refused, saying why."""
    with pytest.raises(AssertionError, match=r"05\.1: -1\.17.* \(that is the score at length 4: the answer's 3 tokens "
                                             r"already include its EOS\); try again"):
        check("05.1", -1.176)
    check("05.1", -1.26)

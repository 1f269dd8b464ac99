"""The course's exercises: `check(name, answer, **context)` compares a reader's answer with the
value computed here from the notebook's own objects (`context`), so the check cell does not
give the solution away. Each notebook's solutions sit in collapsed cells that fill `answer` only
where the reader left it as `...`; CI runs them, so every check is exercised."""
import dataclasses
import math
import numbers
from typing import Callable

import jax
import numpy as np

from t5nb import capacity, checkpoints, config, decode, model, tasks
from t5nb.tasks import world
from t5.data import preprocessors  # noqa: I001  (after t5nb.tasks, which imports TensorFlow with accelerators hidden)
from t5.evaluation import metrics


def _parameters(preset: str, **changes) -> int:
    return capacity.parameter_counts(config.get_config(preset, **changes))["parameters"]


def _span_corruption_target(text: str, hidden: set) -> str:
    """The target T5's span corruption writes for `text` with the words at positions `hidden`
    cut out (t5.data.preprocessors' own function, on the facts vocabulary's pieces)."""
    vocabulary = tasks.get_vocabulary("facts")
    ids, noise = [], []
    for position, word in enumerate(text.split()):
        pieces = vocabulary.encode(word)
        ids += pieces
        noise += [position in hidden] * len(pieces)
    targets = preprocessors.nonnoise_span_to_unique_sentinel(np.array(ids), np.array(noise), vocabulary, ())
    return tasks.with_sentinels(vocabulary, np.asarray(targets))


def _lora_parameters(c: config.T5Config, rank: int, targets: tuple) -> int:
    lora = c.replace(lora_rank=rank, lora_targets=targets)
    return sum(int(np.prod(p.shape)) for name, p in checkpoints.abstract_params(lora).items() if "/lora_" in name)


def _ssm_token_share_at_equal_rates(per_example: dict) -> float:
    """Salient span masking's share of the tokens if the mixture drew its tasks equally often
    (`per_example`: task name -> tokens per example, inputs and targets)."""
    return per_example["facts_salient_span_masking"] / sum(per_example.values())


def _squad_f1(target: str, prediction: str) -> float:
    return float(metrics.squad([[target]], [prediction])["f1"])


@dataclasses.dataclass(frozen=True)
class Precision:
    """How precisely a numeric exercise asks for its answer: `figures` significant figures, or
    `places` decimal places. An answer is right when it rounds to the same last figure as the
    value computed here. One that does not, but lies within `slack` units of the last figure
    beyond the half unit a correctly rounded answer is off, is accepted and told the value to
    those figures: working from values as the notebook prints them (rounded) moves an answer by
    up to a quarter of a unit (tests/test_exercises.py holds every exercise to this, with the
    printed values), which near a rounding boundary can change the last figure. One farther off
    than that, three quarters of a unit at the default slack, is refused: where the value is
    0.306 (0.31 to 2 significant figures), 0.30 (0.6 of a unit off) is accepted; where it is
    0.3078, 0.30 (0.78 off) is refused."""
    figures: int | None = None
    places: int | None = None
    slack: float = 0.25  # in units of the last figure asked for

    @property
    def text(self) -> str:
        """As each exercise states it: "to 3 significant figures"."""
        if self.figures is not None:
            return f"to {self.figures} significant figure{'s' * (self.figures > 1)}"
        return f"to {self.places} decimal place{'s' * (self.places != 1)}" if self.places else "to a whole number"

    def unit(self, expected: float) -> float:
        """One unit of the last figure asked for, at `expected`'s magnitude."""
        if self.figures is None:
            return 10.0 ** -self.places
        return 10.0 ** (math.floor(math.log10(abs(expected))) - self.figures + 1) if expected else 0.0

    def tolerance(self, expected: float) -> float:
        """The farthest from `expected` an accepted answer may be: half a unit, and the slack."""
        return (0.5 + self.slack) * self.unit(expected)

    def same_last_figure(self, answer: float, expected: float) -> bool:
        """Whether `answer` rounds to the same last figure as `expected`."""
        unit = self.unit(expected)
        return round(answer / unit) == round(expected / unit) if unit else answer == expected

    def rounded(self, expected: float) -> str:
        """`expected` to the figures asked for, as digits."""
        unit = self.unit(expected)
        decimals = max(0, -math.floor(math.log10(unit))) if unit else 0
        return f"{round(expected / unit) * unit if unit else expected:.{decimals}f}"


def figures(n: int) -> Precision:
    return Precision(figures=n)


def places(n: int) -> Precision:
    return Precision(places=n)


@dataclasses.dataclass(frozen=True)
class Exercise:
    question: str  # a noun phrase with its article, as the check's messages use it
    expected: Callable  # expected(**context): the right answer, from the notebook's own objects
    precision: Precision | None = None  # None: the answer must equal it exactly
    share: bool = False  # a share of a whole: a fraction (0.25), or a percentage (25) where above 1
    # (expected(**context) -> value, what to say): a known misreading, named where an answer is it
    misreadings: tuple = ()


EXERCISES = {
    "00.1": Exercise("the number of parameters in one encoder layer of T5.1.1-small",
                     lambda: sum(int(np.prod(p.shape)) for name, p in checkpoints.abstract_params(
                         config.get_config("t5.1.1-small")).items() if name.startswith("encoder/layers_0/"))),
    "00.2": Exercise("the GB (1e9 bytes) that T5.1.1-small's float32 parameters take",
                     lambda: _parameters("t5.1.1-small") * 4 / 1e9, figures(2)),
    "00.3": Exercise("the number of parameters T5.1.1-small has fewer with the facts vocabulary than with T5's",
                     lambda: _parameters("t5.1.1-small") - _parameters(
                         "t5.1.1-small", vocab_size=tasks.get_vocabulary("facts").vocab_size)),
    "01.1": Exercise("the id of <extra_id_99> in the facts vocabulary",
                     lambda: int(tasks.get_vocabulary("facts").encode("<extra_id_99>")[0])),
    "01.2": Exercise("the share of the tokens salient span masking would have if the mixture drew both tasks equally "
                     "often", _ssm_token_share_at_equal_rates, figures(2), share=True),
    "01.3": Exercise("the target span corruption makes of 'Ada plays the mandolin .' with 'plays' and 'mandolin .' cut "
                     "out", lambda: _span_corruption_target("Ada plays the mandolin .", {1, 3, 4})),
    "02.1": Exercise("the cross-entropy at one position whose logits are [1, 2, 3] and target 0, without z-loss",
                     lambda: -float(jax.nn.log_softmax(np.array([1.0, 2.0, 3.0]))[0]), figures(3)),
    "02.2": Exercise("the list of steps at which the pretraining run keeps checkpoints",
                     lambda model_dir: sorted(int(p.name) for p in (model_dir / "checkpoints").iterdir()
                                              if p.name.isdigit())),
    "02.3": Exercise("the encoder's relative position bucket for a key 20 positions before its query",
                     lambda config: int(model.relative_position_bucket(
                         np.array(-20), True, config.relative_attention_num_buckets,
                         config.relative_attention_max_distance))),
    "02.4": Exercise("the z-loss term at one position whose logits are [1, 2, 3], with z_loss 1e-4",
                     lambda: 1e-4 * float(jax.nn.logsumexp(np.array([1.0, 2.0, 3.0]))) ** 2, figures(3)),
    "03.1": Exercise("the number of parameters LoRA trains at rank 4 on the query, value and MLP `wo` kernels",
                     lambda config: _lora_parameters(config, 4, ("query", "value", "wo"))),
    "03.2": Exercise("the accuracy (%) of a uniform guess among the asked relation's values of the facts world",
                     world.uniform_guess_accuracy, figures(2)),
    "03.3": Exercise("the shortest inputs length that cuts none of facts_slot_filling's first 1,000 training inputs",
                     lambda: int(tasks.token_lengths("facts_slot_filling", "train", None, 1000)["inputs"].max())),
    "04.1": Exercise("the F1 (%) of the answer 'a player of the violin' where 'violin' is the accepted answer",
                     lambda: _squad_f1("violin", "a player of the violin"), places(0)),
    "04.2": Exercise("the EM (%) on the 75% of questions with the highest score",
                     lambda scored: 100 * float(scored.nlargest(math.ceil(0.75 * len(scored)), "score")["correct"].mean()),
                     places(1)),
    "05.1": Exercise("the score beam search (alpha 0.6) gives a finished answer of length 3, its EOS included, whose "
                     "log-probability is -1.5", lambda: -1.5 / float(decode.brevity_penalty(0.6, 3)), figures(3),
                     misreadings=((lambda: -1.5 / float(decode.brevity_penalty(0.6, 4)),
                                   "that is the score at length 4: the answer's 3 tokens already include its EOS"),)),
    "05.2": Exercise("the token accuracy (%) that the decoded EM would give if every answer were one token and its EOS",
                     lambda decoded: (decoded["em"] + 100) / 2, places(1)),
    "05.3": Exercise("the probability sampling at temperature 2 gives the first token when the logits are [2, 0, 0, 0]",
                     lambda: float(jax.nn.softmax(np.array([2.0, 0.0, 0.0, 0.0]) / 2)[0]), figures(2)),
    "06.1": Exercise("the number of bits in the facts of 1,000 people whose birth years span 120 years instead of 60",
                     lambda: capacity.world_bits(1000) + 1000 * math.log2(120 / 60), figures(3)),
    "06.2": Exercise("the number of people whose facts hold 2 bits per parameter of the grid's smallest model",
                     lambda grid: 2 * min(row["parameters"] for row in grid) / capacity.world_bits(1), figures(3)),
}


class Solved:
    """An answer a solution cell filled in (`answer = Solved(answer)`), so that `check` says it
    checked the solution's answer, not the reader's."""

    def __init__(self, value):
        self.value = value


def real(answer) -> float | None:
    """`answer` as a float where it is a real number (Python's, numpy's or JAX's scalars, a 0-d
    array), else None (a bool, a string, a list, an array of several numbers)."""
    if isinstance(answer, (bool, np.bool_)):
        return None
    if isinstance(answer, numbers.Real):
        return float(answer)
    dtype, shape = getattr(answer, "dtype", None), getattr(answer, "shape", None)
    if shape == () and dtype is not None and np.dtype(dtype).kind in "iuf":
        return float(answer)
    return None


def _equal(answer, expected) -> bool:
    if isinstance(expected, (list, tuple)):
        items = np.asarray(answer).tolist() if hasattr(answer, "shape") else answer
        return isinstance(items, (list, tuple)) and len(items) == len(expected) and all(
            _equal(a, e) for a, e in zip(items, expected))
    if isinstance(expected, numbers.Real):
        return real(answer) == expected
    return type(answer) is type(expected) and answer == expected


def shown(answer) -> str:
    """An answer as a message shows it: a number as digits (never `np.float64(...)`)."""
    number = real(answer)
    if number is None:
        return repr(answer)
    return f"{number:.6g}" if isinstance(answer, (float, np.floating)) or not number.is_integer() else str(int(number))


def check(name: str, answer, **context) -> None:
    """Print a tick if `answer` is right, saying whether it was the reader's or the solution
    cell's (`Solved`: then without the value, so that a notebook run top to bottom does not print
    the answers), and the value to the figures asked for where the reader's last figure is not
    that (`Precision`); otherwise raise AssertionError saying what was asked, and what a
    known misreading of the question gives where the answer is that."""
    exercise = EXERCISES[name]
    asked = (exercise.question + (" (a fraction or a percentage)" if exercise.share else "")
             + (f", {exercise.precision.text}" if exercise.precision else ""))
    if answer is ...:
        raise AssertionError(f"exercise {name}: replace `...` with your answer: {asked}")
    solved = isinstance(answer, Solved)
    answer = answer.value if solved else answer
    expected = exercise.expected(**context)
    said, note = shown(answer), ""
    if exercise.precision is None:
        right = _equal(answer, expected)
    else:
        precision, number = exercise.precision, real(answer)
        if number is not None and exercise.share and number > 1:  # a percentage
            number, said = number / 100, f"{said}%"
        right = number is not None and abs(number - expected) <= precision.tolerance(expected)
        if right and not precision.same_last_figure(number, expected):
            note = (f", though {precision.text} it is {precision.rounded(expected)} (working from the printed, "
                    "rounded values can move the last figure by one)")
    if not right:
        misread = next((text for value, text in exercise.misreadings if exercise.precision and real(answer) is not None
                        and abs(real(answer) - value()) <= exercise.precision.tolerance(value())), None)
        raise AssertionError(f"exercise {name}: {said} is not {asked}" + (f" ({misread})" if misread else "")
                             + "; try again, or expand the solution cell above")
    if solved:  # the value is not said: run top to bottom, the check must not answer before the reader does
        print(f"✓ exercise {name}: the solution cell's answer passed, not yours; it stays in the collapsed "
              "cell above until you open it (write yours in place of `...` and run the check again)")
    else:
        print(f"✓ exercise {name}: {'accepted' if note else 'right'}, {exercise.question} is {said}{note}")

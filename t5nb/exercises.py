"""The course's exercises: `check(name, answer, **context)` compares a reader's answer with the
value computed here from the notebook's own objects (`context`), so the check cell does not
give the solution away. Each notebook's solutions sit in collapsed cells that fill `answer` only
where the reader left it as `...`; CI runs them, so every check is exercised."""
import math

import jax
import numpy as np

from t5nb import capacity, checkpoints, config, model, tasks
from t5.data import preprocessors  # noqa: I001  (after t5nb.tasks, which imports TensorFlow with accelerators hidden)


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


def _weakest_relation_right(scored) -> int | None:
    """Right answers to the questions of the relation with the lowest EM (None: no relations)."""
    if scored["relation"].isna().all():
        return None
    weakest = scored.groupby("relation")["correct"].mean().idxmin()
    return int(scored.loc[scored["relation"] == weakest, "correct"].sum())


def _rows_like(reference, *others) -> list[int]:
    """For each of `others`, how many rows (answers) equal `reference`'s."""
    return [int(np.all(np.asarray(reference) == np.asarray(other), axis=1).sum()) for other in others]


# A numeric answer is worked out from values the notebook prints, rounded. It is right when it is
# within RELATIVE of the exact value (rounding inputs to 3 or 4 figures moves a product or quotient
# by less), or within `abs_tol`, the sum of half a unit of each printed input's last digit, where
# the answer is a difference of such inputs (tests/test_notebooks.py holds every one to this).
RELATIVE = 0.005


def within(abs_tol: float = 0.0) -> dict:
    return {"rel_tol": RELATIVE, "abs_tol": abs_tol}


# name -> (question, expected(**context), tolerance: None for equality, else `within(...)`)
EXERCISES = {
    "00.1": ("parameters of T5.1.1-base with the facts vocabulary",
             lambda: _parameters("t5.1.1-base", vocab_size=tasks.get_vocabulary("facts").vocab_size), within()),
    "00.2": ("GB (1e9 bytes) of T5.1.1-small's float32 parameters",
             lambda: _parameters("t5.1.1-small") * 4 / 1e9, within()),
    "00.3": ("how many parameters fewer T5.1.1-small has with the facts vocabulary than with T5's",
             lambda: _parameters("t5.1.1-small") - _parameters("t5.1.1-small",
                                                              vocab_size=tasks.get_vocabulary("facts").vocab_size),
             None),
    "01.1": ("pieces of 'Ada Klimberg plays the mandolin.' in the facts vocabulary, without EOS",
             lambda: len(tasks.get_vocabulary("facts").encode("Ada Klimberg plays the mandolin.")), None),
    "01.2": ("fraction of facts_pretraining's examples that come from salient span masking",
             lambda: (lambda m: m.get_rate(tasks.get_task("facts_salient_span_masking")) / m.total_rate)(
                 tasks.get_task("facts_pretraining")), within()),
    "01.3": ("span corruption's target for 'Ada plays the mandolin .' with 'plays' and 'mandolin' cut out",
             lambda: _span_corruption_target("Ada plays the mandolin .", {1, 3}), None),
    "02.1": ("cross-entropy at one position, logits [1, 2, 3], target 0, no z-loss",
             lambda: -float(jax.nn.log_softmax(np.array([1.0, 2.0, 3.0]))[0]), within()),
    "02.2": ("steps at which the pretraining run keeps checkpoints, ascending",
             lambda model_dir: sorted(int(p.name) for p in (model_dir / "checkpoints").iterdir() if p.name.isdigit()),
             None),
    "02.3": ("the encoder's relative position bucket for a key 20 positions before its query",
             lambda config: int(model.relative_position_bucket(
                 np.array(-20), True, config.relative_attention_num_buckets, config.relative_attention_max_distance)),
             None),
    "02.4": ("z-loss term at one position whose logits are [1, 2, 3], z_loss 1e-4",
             lambda: 1e-4 * float(jax.nn.logsumexp(np.array([1.0, 2.0, 3.0]))) ** 2, within()),
    "03.1": ("number of parameters LoRA trains at rank 4 on the query, value and MLP `wo` kernels",
             lambda config: _lora_parameters(config, 4, ("query", "value", "wo")), None),
    "03.2": ("the run ('pretrained' or 'scratch') whose final validation loss exceeds its final training loss more",
             lambda runs: max(runs, key=lambda name: runs[name].train_eval[-1][1]["loss"] - runs[name].history[-1]["loss"]),
             None),
    "03.3": ("shortest inputs length that cuts none of facts_slot_filling's first 1,000 training inputs",
             lambda: int(tasks.token_lengths("facts_slot_filling", "train", None, 1000)["inputs"].max()), None),
    "04.1": ("number of right answers to the relation with the lowest EM (None where the questions have no relation)",
             _weakest_relation_right, None),
    "04.2": ("EM (%) on the 75% of questions with the highest score",
             lambda scored: 100 * float(scored.nlargest(math.ceil(0.75 * len(scored)), "score")["correct"].mean()),
             within()),
    "05.1": ("numbers of questions on which beam search with num_decodes=1 and with 4 answers as greedy does",
             lambda greedy, beam_1, beam_4: _rows_like(greedy, beam_1, beam_4), None),
    "05.2": ("points by which teacher-forced token accuracy (%) exceeds decoded EM",
             lambda forced, decoded: 100 * forced["accuracy"] - decoded["em"], within(abs_tol=0.01)),  # both to 2 places
    "05.3": ("numbers of questions on which sampling with top_k=1 answers as greedy does, at temperatures 0.5, 1, 2",
             lambda greedy, top_1: _rows_like(greedy, *top_1), None),
    "06.1": ("number of bits in the facts of a world of 1,000 people", lambda: capacity.world_bits(1000), within()),
    "06.2": ("number of bits held about 100 people's birth years at a mean loss of 2 bits",
             lambda: capacity.stored_bits({"birth_year": [2 * math.log(2)] * 100})["birth_year"], within()),
}


class Solved:
    """An answer a solution cell filled in (`answer = Solved(answer)`), so that `check` says it
    checked the solution's answer, not the reader's."""

    def __init__(self, value):
        self.value = value


def check(name: str, answer, **context) -> None:
    """Print a tick if `answer` is right, saying whether it was the reader's or the solution
    cell's (`Solved`); otherwise raise AssertionError saying what was asked."""
    question, expected, tolerance = EXERCISES[name]
    if answer is ...:
        raise AssertionError(f"exercise {name}: replace `...` with your answer ({question})")
    solved = isinstance(answer, Solved)
    answer = answer.value if solved else answer
    expected = expected(**context)
    right = answer == expected if tolerance is None else (
        isinstance(answer, (int, float)) and not isinstance(answer, bool) and math.isclose(answer, expected, **tolerance))
    if not right:
        raise AssertionError(f"exercise {name}: {answer!r} is not the {question}; try again, or expand the "
                             f"solution cell above")
    if solved:
        print(f"✓ exercise {name}: checked the solution cell's answer, not yours: the {question} is {answer!r} "
              "(write yours in place of `...` and run the check again)")
    else:
        print(f"✓ exercise {name}: right, the {question} is {answer!r}")

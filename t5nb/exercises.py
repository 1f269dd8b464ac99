"""The course's exercises: `check(name, answer, **context)` compares a reader's answer with the
value computed here from the notebook's own objects (`context`), so the check cell does not
give the solution away. Each notebook's solutions sit in collapsed cells that fill `answer` only
where the reader left it as `...`; CI runs them, so every check is exercised."""
import math

import jax
import numpy as np

from t5nb import capacity, config, model, tasks
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


# name -> (question, expected(**context), tolerance: None for equality, else absolute)
EXERCISES = {
    "00.1": ("parameters of T5.1.1-base with the facts vocabulary",
             lambda: _parameters("t5.1.1-base", vocab_size=tasks.get_vocabulary("facts").vocab_size), None),
    "00.2": ("GB (1e9 bytes) of T5.1.1-small's float32 parameters",
             lambda: _parameters("t5.1.1-small") * 4 / 1e9, 1e-3),
    "00.3": ("how many parameters fewer T5.1.1-small has with the facts vocabulary than with T5's",
             lambda: _parameters("t5.1.1-small") - _parameters("t5.1.1-small",
                                                              vocab_size=tasks.get_vocabulary("facts").vocab_size),
             None),
    "01.1": ("pieces of 'Ada Klimberg plays the mandolin.' in the facts vocabulary, without EOS",
             lambda: len(tasks.get_vocabulary("facts").encode("Ada Klimberg plays the mandolin.")), None),
    "01.2": ("fraction of facts_pretraining's examples that come from salient span masking",
             lambda: (lambda m: m.get_rate(tasks.get_task("facts_salient_span_masking")) / m.total_rate)(
                 tasks.get_task("facts_pretraining")), 1e-6),
    "01.3": ("span corruption's target for 'Ada plays the mandolin .' with 'plays' and 'mandolin' cut out",
             lambda: _span_corruption_target("Ada plays the mandolin .", {1, 3}), None),
    "02.1": ("cross-entropy at one position, logits [1, 2, 3], target 0, no z-loss",
             lambda: -float(jax.nn.log_softmax(np.array([1.0, 2.0, 3.0]))[0]), 1e-4),
    "02.2": ("steps at which the pretraining run keeps checkpoints, ascending",
             lambda model_dir: sorted(int(p.name) for p in (model_dir / "checkpoints").iterdir() if p.name.isdigit()),
             None),
    "02.3": ("the encoder's relative position bucket for a key 20 positions before its query",
             lambda config: int(model.relative_position_bucket(
                 np.array(-20), True, config.relative_attention_num_buckets, config.relative_attention_max_distance)),
             None),
    "02.4": ("z-loss term at one position whose logits are [1, 2, 3], z_loss 1e-4",
             lambda: 1e-4 * float(jax.nn.logsumexp(np.array([1.0, 2.0, 3.0]))) ** 2, 1e-7),
    "03.1": ("the number of parameters the LoRA run trains",
             lambda methods: methods["lora"]["trained_parameters"], None),
    "03.2": ("the run ('pretrained' or 'scratch') whose final validation loss exceeds its final training loss more",
             lambda runs: max(runs, key=lambda name: runs[name].train_eval[-1][1]["loss"] - runs[name].history[-1]["loss"]),
             None),
    "03.3": ("number of facts_slot_filling's first 1,000 training inputs longer than 8 tokens",
             lambda: int((tasks.token_lengths("facts_slot_filling", "train", None, 1000)["inputs"] > 8).sum()), None),
    "04.1": ("the relation with the lowest EM (None where the questions have no relation)",
             lambda by_relation: by_relation["em"].idxmin() if len(by_relation) else None, None),
    "04.2": ("EM (%) on the 75% of questions with the highest score",
             lambda scored: 100 * float(scored.nlargest(math.ceil(0.75 * len(scored)), "score")["correct"].mean()),
             1e-6),
    "05.1": ("whether beam search with num_decodes=1 gives the greedy answers (True or False)",
             lambda greedy, beam_of_one: bool(np.array_equal(np.asarray(greedy), np.asarray(beam_of_one))), None),
    "05.2": ("points by which teacher-forced token accuracy (%) exceeds decoded EM",
             lambda forced, decoded: 100 * forced["accuracy"] - decoded["em"], 1e-6),
    "05.3": ("whether sampling with top_k=1 gives greedy's sequences at any temperature (True or False)",
             lambda greedy, top_1: bool(np.array_equal(np.asarray(greedy), np.asarray(top_1))), None),
    "06.1": ("number of bits in the facts of a world of 1,000 people", lambda: capacity.world_bits(1000), 0.01),
    "06.2": ("number of bits held about 100 people's birth years at a mean loss of 2 bits",
             lambda: capacity.stored_bits({"birth_year": [2 * math.log(2)] * 100})["birth_year"], 0.01),
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
        isinstance(answer, (int, float)) and math.isclose(answer, expected, rel_tol=0, abs_tol=tolerance))
    if not right:
        raise AssertionError(f"exercise {name}: {answer!r} is not the {question}; try again, or expand the "
                             f"solution cell above")
    if solved:
        print(f"✓ exercise {name}: checked the solution cell's answer, not yours: the {question} is {answer!r} "
              "(write yours in place of `...` and run the check again)")
    else:
        print(f"✓ exercise {name}: right, the {question} is {answer!r}")

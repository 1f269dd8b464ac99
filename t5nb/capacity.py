"""How much knowledge fits in the parameters: notebook 06's measurements on the facts world.

Roberts, Raffel and Shazeer (2020) ask how much knowledge a language model packs into its
parameters: closed-book QA improves with model size and with salient span masking (SSM) in
pretraining. Allen-Zhu and Li (Physics of Language Models, Part 3.3, 2024) count it in bits on
synthetic people whose facts are drawn uniformly, as the facts world's are: a fact whose value is
one of |V| equally likely values holds log2 |V| bits, and a model holds, of a relation known
about N people, at least

    N * (H - L / ln 2) bits,

where L is its mean loss (nats) on the value given the rest of the sentence and H the entropy
(bits) of how often each value occurs among the N (`stored_bits`; a relation it predicts worse
than those frequencies counts 0). Their worlds are large enough for H to be log2 |V|; in a world
of 100 people it is less (100 draws of 60 years leave some drawn thrice, many never), and
measured against log2 |V| a model that learnt only the frequencies would be credited with the
difference, 119 bits there. They find about 2 bits per parameter once each fact has been seen
about 1,000 times (about 1 bit at 100 exposures).

- `pretraining_comparison`: pretraining with span corruption alone and with SSM, the same
  steps, then the same closed-book fine-tuning: held-out-people exact match of each, with the
  questions right per person, from which `standard_error` (clustered by person) and `_gain`
  (paired: both models answer the same questions) come.
- `size_sweep`: the same for models of several widths.
- `capacity_grid`: models of several widths memorise worlds of several sizes by SSM, a fixed
  number of exposures per fact, several seeds of a width trained together (`memorise`); the bits
  each holds (`knowledge_bits`), and whether a width's stopped growing with the world
  (`saturation`): a capacity shows only where the world holds more than the model can.
"""
import collections
import json
import math
import pathlib
import time

import jax
import numpy as np
import pandas as pd
from clu import metric_writers

from t5nb import analysis, decode, evaluate, tasks
from t5nb.checkpoints import abstract_params
from t5nb.files import write_atomically
from t5nb.recipe import Data, Recipe, Run, make_trainer
from t5nb.tasks import world
from t5nb.tasks.offline import PRETRAINING, QA, SPAN_CORRUPTION
from t5nb.train import run_recipe
from t5nb.trainer import TrainConfig
from t5nb.workflow import (finetune_and_evaluate, finetune_dir, pretrained_checkpoint, pretraining_dir,
                           pretraining_recipe, record_headline, runs_dir)

# The models of 06 are T5.1.1-mini's shape (3 + 3 layers, 2 heads, gated-GELU MLP) at another
# width: mini is width 128.
WIDTH_BASE = "t5.1.1-mini"
# SSM examples of the facts world are one short sentence each (at most 14 tokens with EOS in a
# world of 3,000; the value with its sentinel and EOS 4): unpacked, one exposure of a fact per
# example. `fact_examples` refuses a longer one.
FACT_LENGTHS = {"inputs": 16, "targets": 4}
# Memorising: 128 facts a step at a constant 3e-2 (a width-16 model, a world of 250, 40
# exposures: 65% of the world's bits, where T5's 1e-2 stored 42% and 1e-1 12%).
# (The models of 06's grid are far too small to fill even a CPU: `memorise` trains a width's
# seeds as one program, `MEMORISATION_CHUNK` steps a call, and jax.nn.dot_product_attention
# was 10% faster than the einsums at width 4.)
MEMORISATION_BATCH = 128
MEMORISATION_LEARNING_RATE = 3e-2
MEMORISATION_CHUNK = 25
PRETRAINING_OBJECTIVES = {"span corruption": SPAN_CORRUPTION, "span corruption + SSM": PRETRAINING}


def width_model(width: int) -> dict:
    """The model changes that make `WIDTH_BASE` `width` wide (emb_dim; heads of width/2, MLP 4x)."""
    return {"preset": WIDTH_BASE, "emb_dim": width, "head_dim": max(1, width // 2), "mlp_dim": 4 * width}


EMBEDDINGS = ("token_embedder/embedding", "decoder/logits_dense/kernel")  # T5.1.1's two, untied; T5 1.0 ties them


def parameter_counts(config) -> dict:
    """A model's parameters, all of them and those outside the two embeddings."""
    shapes = abstract_params(config)
    total = sum(shape.size for shape in shapes.values())
    embeddings = sum(shapes[name].size for name in EMBEDDINGS if name in shapes)
    return {"parameters": total, "non_embedding": total - embeddings}


# -- bits ----------------------------------------------------------------------------------------
def value_bits(relation: str) -> float:
    """The information in one fact of `relation`: log2 of its number of (uniform) values."""
    return math.log2(len(world.RELATIONS[relation][0]))


def world_bits(num_people: int) -> float:
    """The information in a world's facts: every person's five values, each uniform."""
    return num_people * sum(value_bits(relation) for relation in world.RELATIONS)


def frequency_bits(people: list) -> dict:
    """Per relation, the entropy (bits a fact) of how often each value occurs among `people`: the
    loss of a model that knows those frequencies and nothing of who has which value."""
    bits = {}
    for relation in world.RELATIONS:
        counts = np.array(list(collections.Counter(person.facts[relation] for person in people).values()))
        shares = counts / len(people)
        bits[relation] = float(-(shares * np.log2(shares)).sum())
    return bits


def stored_bits(losses: dict, frequencies: dict) -> dict:
    """Bits held per relation (Allen-Zhu and Li's bound, counted beyond the values' frequencies):
    for each relation, its losses (nats, one per person) and `frequency_bits` -> N * max(0,
    H - mean loss / ln 2)."""
    return {relation: len(loss) * max(0.0, frequencies[relation] - float(np.mean(loss)) / math.log(2))
            for relation, loss in losses.items()}


def fact_losses(model, probes: dict, batch_size: int = 512) -> dict:
    """The model's loss (nats) on every fact of a `register_world_task` world, by relation: the
    value's tokens (with the sentinel before and EOS after) given the sentence that hides it,
    `probes` (`fact_examples` of its validation split, read once for every model scored)."""
    inputs, targets = probes["inputs"], probes["targets"]
    scores = np.concatenate([np.asarray(decode.score(model, inputs[i:i + batch_size], targets[i:i + batch_size]))
                             for i in range(0, len(inputs), batch_size)])
    relations = list(world.RELATIONS)
    return {relation: -scores[index::len(relations)] for index, relation in enumerate(relations)}


# -- the three measurements ----------------------------------------------------------------------
def _closed_book_em(profile, init, name: str) -> dict:
    """Held-out-people exact match of `init` fine-tuned on the facts world's training questions:
    {"em", "examples": the questions it is on, "by_person": {person: [questions right, questions]}}."""
    _, result, metrics = finetune_and_evaluate(profile, QA, init, name=name, record=False, progress=False)
    print(f"{name}: fine-tuned on {QA} for {result.history[-1]['step']:,} steps; held-out-people EM {metrics['em']:.1f}%")
    predictions = evaluate.read_predictions(result.model_dir, QA, int(result.state.step))
    return {"em": metrics["em"], "examples": len(predictions), "by_person": correct_by_person(predictions)}


def correct_by_person(predictions: pd.DataFrame) -> dict:
    """{person: [questions right, questions]} of facts-world `predictions` (`evaluate.read_predictions`),
    what a standard error clustered by person needs (and, for two models on the same questions,
    a paired one: see `_gain`), 200 pairs where the 2,000 questions are."""
    scored = analysis.with_question_facts(analysis.with_correctness(predictions))
    counts = scored.groupby("person")["correct"].agg(["sum", "size"])
    return {person: [int(right), int(questions)] for person, (right, questions) in counts.iterrows()}


def em_table(table: dict) -> pd.DataFrame:
    """`pretraining_comparison`'s or `size_sweep`'s table, a row each as `summary` gives it, EM
    and its standard error to two decimals."""
    rows = pd.DataFrame.from_dict({name: summary(row) for name, row in table.items()}, orient="index")
    return rows.round({"em": 2, "standard_error": 2})


def summary(row: dict) -> dict:
    """A row of `pretraining_comparison` or `size_sweep` with its EM's `standard_error` in place
    of its questions right per person (as the headlines record it: results.json stays small)."""
    return {**{key: value for key, value in row.items() if key != "by_person"}, "standard_error": standard_error(row)}


def _pretraining_recipe(profile, task: str, width: int):
    """`profile.knowledge_steps` of pretraining on `task` at `width`: its recipe, the name of its
    run and closed-book fine-tuning, and whether it is notebook 02's run."""
    name = f"{task}_w{width}"
    recipe = pretraining_recipe(profile, profile.knowledge_steps, task=task, model=width_model(width), name=name)
    base = pretraining_recipe(profile)
    return recipe, name, (recipe.model_config(), recipe.data, recipe.run.steps) == (
        base.model_config(), base.data, base.run.steps)


def _pretraining(profile, task: str, width: int):
    """`profile.knowledge_steps` of pretraining on `task` at `width`: its run directory, the name
    of its closed-book fine-tuning and its model's configuration; notebook 02's run where that is
    the same run, else one of 06's own."""
    recipe, name, notebook_02s = _pretraining_recipe(profile, task, width)
    if notebook_02s:
        return pretrained_checkpoint(profile), "pretrained", recipe.model_config()  # 04's fine-tuning of it too
    _, result = run_recipe(recipe, progress=False)  # a line when done, not a bar in the saved notebook
    print(f"{name}: pretrained for {result.history[-1]['step']:,} steps, final loss {result.history[-1]['loss']:.3f}")
    return pretraining_dir(profile, name), name, recipe.model_config()


def pretraining_comparison(profile) -> dict:
    """Closed-book EM after span corruption alone and after span corruption + SSM, the same
    steps at `profile.ssm_width`: {label: width, steps, "em", its "examples" and "by_person"};
    recorded (as `summary` gives each row) as the headline `ssm`."""
    width, table = profile.ssm_width, {}
    for label, task in PRETRAINING_OBJECTIVES.items():
        run, name, _ = _pretraining(profile, task, width)
        table[label] = {"width": width, "steps": profile.knowledge_steps, **_closed_book_em(profile, run, name)}
    record_headline(ssm={label: summary(row) for label, row in table.items()})
    return table


def size_sweep(profile) -> dict:
    """Closed-book EM after the same span corruption + SSM pretraining, for each width of
    `profile.knowledge_widths`: {width: parameter counts, "em", its "examples" and "by_person"};
    recorded (as `summary` gives each row) as the headline `sizes`."""
    table = {}
    for width in profile.knowledge_widths:
        run, name, config = _pretraining(profile, PRETRAINING, width)
        table[width] = {**parameter_counts(config), **_closed_book_em(profile, run, name)}
    record_headline(sizes={width: summary(row) for width, row in table.items()})
    return table


def run_dirs(profile) -> list:
    """The folders of the runs 06 trains itself, for TensorBoard: each pretraining of
    `pretraining_comparison` and `size_sweep` and its closed-book fine-tuning (not notebook 02's
    run or 04's fine-tuning of it, which a width may reuse), and the memorisation runs' folder."""
    folders = []
    for _, name, notebook_02s in _pretraining_recipes(profile):
        if not notebook_02s:
            folders += [pretraining_dir(profile, name), finetune_dir(profile, QA, name)]
    return folders + [memorisation_dir(profile)]


def reuses_notebook_02s_run(profile) -> bool:
    """Whether one of 06's pretrainings is notebook 02's run (`cpu`: width 128 is T5.1.1-mini),
    which `workflow.pretrained_checkpoint` then finds, or runs first."""
    return any(notebook_02s for *_, notebook_02s in _pretraining_recipes(profile))


def _pretraining_recipes(profile) -> list:
    """`_pretraining_recipe` of each pretraining of `pretraining_comparison` and `size_sweep`, once each."""
    pretrainings = dict.fromkeys([*((task, profile.ssm_width) for task in PRETRAINING_OBJECTIVES.values()),
                                  *((PRETRAINING, width) for width in profile.knowledge_widths)])
    return [_pretraining_recipe(profile, task, width) for task, width in pretrainings]


def memorisation_dir(profile):
    """The folder of the memorisation runs, one per world size and width (its seeds inside)."""
    return runs_dir() / profile.name / "capacity"


def memorisation_recipe(profile, num_people: int, width: int) -> Recipe:
    """SSM on a world of `num_people` until each fact has been seen `profile.capacity_exposures`
    times (unpacked: one fact per example), at `width`; Adafactor at `MEMORISATION_LEARNING_RATE`.
    `memorise` trains `profile.capacity_seeds` of it together."""
    task = tasks.register_world_task(num_people)
    batch = MEMORISATION_BATCH
    chunks = math.ceil(profile.capacity_exposures * num_people * len(world.RELATIONS) / batch / MEMORISATION_CHUNK)
    steps = chunks * MEMORISATION_CHUNK  # whole chunks: one compiled program for every world
    return Recipe(model={**width_model(width), "dropout_rate": 0.0, "attention": "dot_product_attention"},
                  data=Data(task, FACT_LENGTHS["inputs"], FACT_LENGTHS["targets"], batch, pack=False),
                  optimizer=TrainConfig(learning_rate=MEMORISATION_LEARNING_RATE),
                  run=Run(str(memorisation_dir(profile) / f"{num_people}_people_w{width}"), steps,
                          checkpoint_every=steps, keep_checkpoints=1),
                  source=f"capacity.memorisation_recipe({profile.name!r}, {num_people}, {width})")


def fact_examples(task: str, split: str) -> dict:
    """A `register_world_task` world's examples of `split` as arrays padded to `FACT_LENGTHS`
    ({"inputs", "targets"}, in order); a ValueError if one is longer (they would be cut)."""
    examples = evaluate.task_examples(task, {key: 4 * length for key, length in FACT_LENGTHS.items()}, split)
    arrays = {}
    for key, length in FACT_LENGTHS.items():
        longest = max(len(example[key]) for example in examples)
        if longest > length:
            raise ValueError(f"{task} ({split}): an example's {key} has {longest} tokens, "
                             f"more than capacity.FACT_LENGTHS' {length}")
        arrays[key] = np.stack([np.pad(example[key], (0, length - len(example[key]))) for example in examples])
    return arrays


def memorisation_batches(examples: dict, indices: np.ndarray) -> dict:
    """The train steps' batches of `examples` at `indices` [steps, models, rows]: unpacked, the
    decoder fed the targets shifted right."""
    targets = examples["targets"][indices]
    decoder_inputs = np.concatenate([np.zeros_like(targets[..., :1]), targets[..., :-1]], axis=-1)
    return {"encoder_input_tokens": examples["inputs"][indices], "decoder_input_tokens": decoder_inputs,
            "decoder_target_tokens": targets}


def example_orders(count: int, steps: int, batch: int, seeds) -> np.ndarray:
    """Which of `count` examples each step of each seed's model trains on, [steps, seeds, batch]:
    pass after pass over all of them, each pass in an order of the seed's own, so that every
    example is seen as often as every other, to within one."""
    passes = -(-steps * batch // count)
    return np.stack([np.concatenate([rng.permutation(count) for _ in range(passes)])[:steps * batch].reshape(steps, batch)
                     for rng in map(np.random.default_rng, seeds)], axis=1)


def initial_states(trainer, seeds):
    """A freshly initialised model of each of `seeds`, with its optimizer state, stacked on a
    leading axis on one device (small models): what `Trainer.stacked_train_steps` starts from."""
    return jax.device_put(jax.tree.map(lambda *leaves: np.stack(leaves), *(
        jax.device_get(trainer.init_state(trainer.init_params(seed))) for seed in seeds)))


def memorise(profile, num_people: int, width: int) -> list:
    """Train `profile.capacity_seeds` models of `memorisation_recipe` together (one program,
    `Trainer.stacked_train_steps`), each on its own order of the world's sentences (every
    sentence as often as every other, to within one pass), `MEMORISATION_CHUNK` steps a call;
    their mean losses logged to TensorBoard. Returns each seed's model."""
    recipe = memorisation_recipe(profile, num_people, width)
    trainer, seeds = make_trainer(recipe), range(profile.capacity_seeds)
    examples, steps = fact_examples(recipe.data.task, "train"), recipe.run.steps
    indices = example_orders(len(examples["inputs"]), steps, recipe.data.batch_size, seeds)
    states = initial_states(trainer, seeds)
    writer = metric_writers.create_default_writer(pathlib.Path(recipe.run.model_dir) / "train", asynchronous=False)
    for start in range(0, steps, MEMORISATION_CHUNK):
        chunk = jax.device_put(memorisation_batches(examples, indices[start:start + MEMORISATION_CHUNK]))
        states, sums = trainer.stacked_train_steps(states, chunk)
        loss = np.asarray(sums["loss"]).sum(0) / np.asarray(sums["weight"]).sum(0)
        writer.write_scalars(start + MEMORISATION_CHUNK, {f"loss/seed{seed}": loss[seed] for seed in seeds})
    writer.close()
    return [trainer.model(jax.tree.map(lambda leaf: leaf[seed], states.params)) for seed in seeds]


def knowledge_bits(profile, num_people: int, width: int) -> dict:
    """The bits each of `memorise`'s models holds of its world, beside the world's and the law's:
    the row of `capacity_grid`. Kept in the run's folder, and read from there while the recipe
    and seeds are the same (a notebook run again trains nothing)."""
    recipe = memorisation_recipe(profile, num_people, width)
    saved = pathlib.Path(recipe.run.model_dir) / "knowledge_bits.json"
    settings = {"recipe": repr(recipe), "seeds": profile.capacity_seeds}
    if saved.exists() and (kept := json.loads(saved.read_text()))["settings"] == settings:
        return kept["row"]
    start = time.perf_counter()
    frequencies = frequency_bits(world.make_people(num_people))
    probes = fact_examples(recipe.data.task, "validation")
    stored = [sum(stored_bits(fact_losses(model, probes), frequencies).values())
              for model in memorise(profile, num_people, width)]
    counts, facts = parameter_counts(recipe.model_config()), num_people * len(world.RELATIONS)
    exposures = recipe.run.steps * recipe.data.batch_size / facts
    row = {"people": num_people, "width": width, **counts, "world_bits": world_bits(num_people),
           "beyond_frequencies": num_people * sum(frequencies.values()),
           "law_bits": law_bits_per_parameter(exposures) * counts["parameters"],
           "steps": recipe.run.steps, "exposures": exposures, "seeds": len(stored),
           "stored_bits": float(np.mean(stored)), "stored_bits_sd": float(np.std(stored, ddof=1)) if len(stored) > 1 else 0.0,
           "stored_by_seed": stored, "bits_per_parameter": float(np.mean(stored)) / counts["parameters"],
           "bits_per_non_embedding": float(np.mean(stored)) / counts["non_embedding"]}
    print(f"{num_people:,} people, width {width}: {len(stored)} seeds of {recipe.run.steps:,} steps "
          f"({exposures:.0f} exposures) in {time.perf_counter() - start:.0f} s; hold "
          f"{row['stored_bits']:,.0f} ± {row['stored_bits_sd']:,.0f} of the world's {row['beyond_frequencies']:,.0f} "
          f"bits beyond its values' frequencies (the law's: {row['law_bits']:,.0f})")
    write_atomically(saved, json.dumps({"settings": settings, "row": row}, indent=1))
    return row


def capacity_grid(profile) -> list[dict]:
    """`knowledge_bits` for every world size of `profile.capacity_people` and width of
    `profile.capacity_widths`; recorded as the headline `capacity`."""
    rows = [knowledge_bits(profile, people, width)
            for width in profile.capacity_widths for people in profile.capacity_people]
    record_headline(capacity=rows)
    return rows


# -- beside the papers ---------------------------------------------------------------------------
PAPERS = {
    "ssm": "Roberts et al. (2020): salient span masking improves closed-book QA on Natural Questions, "
           "WebQuestions and TriviaQA",
    "sizes": "Roberts et al. (2020): closed-book accuracy grows with model size, T5-Base to T5-11B",
    "capacity": "Allen-Zhu and Li (2024): about 2 bits per parameter at 1,000 exposures per fact, about 1 at 100",
}


def standard_error(row: dict) -> float:
    """The standard error (points) of a row's EM over its questions, clustered by person
    (`analysis.clustered_standard_error` of its `by_person` counts): a person's questions are
    right or wrong together. It is the noise of asking these people rather than others; one
    seed leaves training's noise out, so the true noise is larger."""
    right, questions = zip(*row["by_person"].values())
    return 100 * analysis.clustered_standard_error(right, questions)


def _gain(better: dict, worse: dict) -> tuple[float, float]:
    """`better`'s EM minus `worse`'s (points), and that difference's standard error, paired: both
    models answered the same questions, so it is the error of the mean per-question difference
    (right minus right: -1, 0 or 1), clustered by person, whose sums per person are the
    differences of the two rows' `by_person` counts. Where both models know the same people it
    is smaller than the two errors' hypot, which takes them as independent. One seed each:
    training's noise is left out."""
    people = better["by_person"].keys()
    if people != worse["by_person"].keys() or any(better["by_person"][p][1] != worse["by_person"][p][1] for p in people):
        raise ValueError("a paired gain needs two rows on the same questions: their people or questions per person differ")
    differences = [better["by_person"][person][0] - worse["by_person"][person][0] for person in people]
    questions = [better["by_person"][person][1] for person in people]
    return better["em"] - worse["em"], 100 * analysis.clustered_standard_error(differences, questions)


def ssm_finding(ssm: dict) -> dict:
    """`pretraining_comparison`'s result beside Roberts et al.'s, and whether they agree: SSM's
    gain counts where it exceeds twice its standard error (`_gain`: paired, clustered by person;
    one seed each, so that is a floor)."""
    with_ssm, without = ssm["span corruption + SSM"], ssm["span corruption"]
    gain, error = _gain(with_ssm, without)
    return {"result": "salient span masking", "paper": PAPERS["ssm"],
            "ours": (f"held-out-people EM {with_ssm['em']:.1f}% after span corruption + SSM, "
                     f"{without['em']:.1f}% after span corruption alone ({gain:+.1f} ± {error:.1f} points, "
                     f"standard error paired and clustered by person, one seed; "
                     f"a uniform guess gets {world.uniform_guess_accuracy():.1f}%; width {with_ssm['width']}, "
                     f"{with_ssm['steps']:,} steps)"),
            "agree": ("yes" if gain > 2 * error else "no: SSM did worse at this width and length"
                      if gain < -2 * error else "not resolved: the difference is within twice its standard error")}


def size_finding(sizes: dict) -> dict:
    """`size_sweep`'s result beside Roberts et al.'s, and whether they agree: each step up in
    size judged as `ssm_finding` judges SSM's gain (paired, clustered by person, one seed each)."""
    rows = sorted(sizes.values(), key=lambda row: row["parameters"])
    steps = [_gain(larger, smaller) for smaller, larger in zip(rows, rows[1:])]
    gains = ", ".join(f"{gain:+.1f} ± {error:.1f}" for gain, error in steps)
    judged = f"each step up {gains} points, standard errors paired and clustered by person; " if steps else ""
    return {"result": "model size", "paper": PAPERS["sizes"],
            "ours": "held-out-people EM " + ", ".join(f"{row['em']:.1f}% at {row['parameters']:,} parameters"
                                                      for row in rows)
                    + f" ({judged}one seed each; a uniform guess gets {world.uniform_guess_accuracy():.1f}%)",
            "agree": ("one size only: nothing to compare" if len(rows) < 2
                      else "yes" if all(gain > 2 * error for gain, error in steps)
                      else "no: EM fell by more than twice its standard error with a size step"
                      if any(gain < -2 * error for gain, error in steps)
                      else "in part: EM rose, but not by twice its standard error at every size step")}


def law_bits_per_parameter(exposures: float) -> float:
    """Allen-Zhu and Li's capacity at `exposures` per fact: 2 bits per parameter from 1,000, 1
    from 100; below 100 the paper states none, and 0 stands for that."""
    return 2.0 if exposures >= 1000 else 1.0 if exposures >= 100 else 0.0


def saturation(rows: list) -> dict:
    """One width's rows of `capacity_grid`, worlds growing: whether the bits it holds stopped
    growing with the world (the largest world's mean gain over the next smaller one within twice
    its standard error over the seeds, or a loss), and the most it held: {"saturated", "gain",
    "error", "ceiling" (the row holding the most)}."""
    rows = sorted(rows, key=lambda row: row["people"])
    ceiling = max(rows, key=lambda row: row["stored_bits"])
    if len(rows) < 2:
        return {"saturated": False, "gain": math.nan, "error": math.nan, "ceiling": ceiling}
    smaller, largest = rows[-2], rows[-1]
    gain = largest["stored_bits"] - smaller["stored_bits"]
    error = math.hypot(smaller["stored_bits_sd"] / math.sqrt(smaller["seeds"]),
                       largest["stored_bits_sd"] / math.sqrt(largest["seeds"]))
    return {"saturated": gain <= 2 * error, "gain": gain, "error": error, "ceiling": ceiling}


def capacity_finding(grid: list) -> dict:
    """`capacity_grid`'s result beside Allen-Zhu and Li's law, width by width: where a width's
    bits stopped growing with the world (`saturation`), the bits per parameter it held, against
    the law's for the exposures used; where they did not, the most it held, a floor of its capacity."""
    exposures = min(row["exposures"] for row in grid)
    law = law_bits_per_parameter(exposures)
    widths, saturated = [], []
    for width in sorted({row["width"] for row in grid}):
        rows = [row for row in grid if row["width"] == width]
        found, top = saturation(rows), max(row["beyond_frequencies"] for row in rows)
        ceiling = found["ceiling"]
        held = (f"{ceiling['stored_bits']:,.0f} ± {ceiling['stored_bits_sd']:,.0f} bits, "
                f"{ceiling['bits_per_parameter']:.3f} per parameter ({ceiling['bits_per_non_embedding']:.3f} "
                f"per non-embedding parameter)")
        if found["saturated"]:
            saturated.append(ceiling)
            widths.append(f"width {width} ({ceiling['parameters']:,} parameters) saturated at {held}: its largest "
                          f"world added {found['gain']:+,.0f} ± {found['error']:,.0f} bits")
        else:
            widths.append(f"width {width} ({ceiling['parameters']:,} parameters) did not saturate: {held} at most, "
                          f"still {found['gain']:+,.0f} ± {found['error']:,.0f} bits from its largest world "
                          f"({top:,.0f} bits), so its capacity is more")
    seeds = min(row["seeds"] for row in grid)
    ours = "; ".join(widths) + f" ({exposures:.0f} exposures per fact, {seeds} seeds, mean ± standard deviation)"
    if not law:
        agree = f"not comparable: the paper states no capacity below 100 exposures, and these are {exposures:.0f}"
    elif not saturated:
        agree = ("not resolved: no width saturated, so each figure is a floor of its capacity; a larger world "
                 "(more people) would be needed")
    else:
        best = max(saturated, key=lambda row: row["bits_per_parameter"])
        rate = best["bits_per_parameter"]
        agree = (f"yes: saturated at {rate:.3f} bits per parameter, within a factor of two of the paper's {law:.0f}"
                 if rate >= law / 2 else
                 f"below the law: saturated at {rate:.3f} bits per parameter, {rate / law:.0%} of the paper's "
                 f"{law:.0f} at {exposures:.0f} exposures ({best['bits_per_non_embedding'] / law:.0%} counting "
                 "parameters outside the embeddings)")
    return {"result": "bits per parameter", "paper": PAPERS["capacity"], "ours": ours, "agree": agree}


def say(finding: dict) -> str:
    """A finding in three lines: ours, the paper's, whether they agree."""
    return f"Here: {finding['ours']}.\n{finding['paper']}.\nAgree: {finding['agree']}."


def findings(ssm: dict, sizes: dict, grid: list) -> list[dict]:
    """The three results beside the papers' (each: result, ours, paper, agree); recorded as the
    headline `findings`, which the README's table shows."""
    rows = [ssm_finding(ssm), size_finding(sizes), capacity_finding(grid)]
    record_headline(findings=rows)
    return rows

"""The offline tasks over the facts world in `data/`, registered for each vocabulary.

| task | objective |
|---|---|
| `facts_span_corruption` | span corruption on the corpus; validation = one unseen paragraph per person |
| `facts_salient_span_masking` | each corpus sentence with its fact's value masked (same splits) |
| `facts_pretraining` | mixture: span corruption + salient span masking, 1 : 8 by examples (salient span masking's share of the tokens: 40% at the `cpu` profile's lengths, 57% at `ci`'s; notebook 01 counts it) |
| `facts_qa` | `trivia question: <question>` -> answer; validation = held-out people; EM/F1 |
| `facts_fact_check` | `fact check: <statement>` -> `true`/`false`; validation = held-out people |
| `facts_slot_filling` | `slot filling: <name>, <relation>` -> the value (KILT's slot filling); validation = held-out people; accuracy |
| `facts_world<N>` | (`register_world_task(N)`) salient span masking over a world of N people made in memory; validation = every fact once, the probe of `t5nb.capacity` |

With the byte vocabulary the names end in `_byte` (`facts_qa_byte`, ...).
"""
from t5nb.tasks import world
from t5nb.tasks.custom import in_memory_source, read_examples
from t5nb.tasks.pieces import add_mixture, add_task, is_registered
from t5nb.tasks.vocab import DATA_DIR

VOCABULARY_SUFFIXES = {"facts": "", "byte": "_byte"}
SPAN_CORRUPTION = "facts_span_corruption"
SALIENT_SPAN_MASKING = "facts_salient_span_masking"
PRETRAINING = "facts_pretraining"
# Mixing rates by examples: a span-corruption example fills the inputs length (128 + 32 at the
# cpu profile's lengths: 155 tokens on average with its targets), a salient span one is a
# sentence (13 tokens with its target), so 1 : 8 spends 40% of the tokens on salient span
# masking there (57% at ci's 64 + 16); notebook 01 counts it at the profile's lengths.
PRETRAINING_RATES = {SPAN_CORRUPTION: 1.0, SALIENT_SPAN_MASKING: 8.0}
QA = "facts_qa"
FACT_CHECK = "facts_fact_check"
SLOT_FILLING = "facts_slot_filling"


def _splits(stem: str, fields: dict) -> dict:
    return {split: read_examples(DATA_DIR / f"{stem}_{split}.jsonl", fields) for split in ("train", "validation")}


def uniform_guess_accuracy(task: str) -> float | None:
    """The accuracy (%) of a uniform guess on a facts task that asks for one of a relation's values
    (slot filling and closed-book QA, in either vocabulary): the chance line of its plots; None
    for any other task."""
    asks_values = {name + suffix for name in (QA, SLOT_FILLING) for suffix in VOCABULARY_SUFFIXES.values()}
    return world.uniform_guess_accuracy() if task in asks_values else None


def register_facts_tasks() -> list[str]:
    """Register the five facts tasks and the pretraining mixture for every vocabulary (again: a
    no-op); return the names."""
    corpus = {"train": read_examples(DATA_DIR / "facts_corpus.txt"),
              "validation": read_examples(DATA_DIR / "facts_corpus_validation.txt")}
    corpus_sentences = {split: [{"targets": sentence} for example in paragraphs
                                for sentence in world.sentences(example["targets"])]
                        for split, paragraphs in corpus.items()}
    qa = _splits("facts_qa", {"inputs": "question", "targets": "answer"})
    fact_check = _splits("facts_fact_check", {"inputs": "statement", "targets": "label"})
    people = world.read_people(DATA_DIR / "facts.jsonl")
    slots = {split: [{"inputs": row["slot"], "targets": row["value"]} for row in world.slot_filling_examples(people, name)]
             for split, name in (("train", "train"), ("validation", "heldout"))}
    names = []
    for vocabulary, suffix in VOCABULARY_SUFFIXES.items():
        for name, examples, kwargs in (
            (SPAN_CORRUPTION, corpus, dict(objective="span_corruption")),
            (SALIENT_SPAN_MASKING, corpus_sentences,
             dict(objective="salient_span_masking", salient_spans=world.salient_spans_pattern())),
            (QA, qa, dict(objective="supervised", prefix=world.QA_PREFIX, metric="squad")),
            (FACT_CHECK, fact_check, dict(objective="supervised", prefix=world.FACT_CHECK_PREFIX, metric="accuracy")),
            (SLOT_FILLING, slots, dict(objective="supervised", prefix=world.SLOT_FILLING_PREFIX, metric="accuracy")),
        ):
            add_task(name + suffix, in_memory_source(examples), vocabulary=vocabulary, exist_ok=True, **kwargs)
            names.append(name + suffix)
        add_mixture(PRETRAINING + suffix, [(task + suffix, rate) for task, rate in PRETRAINING_RATES.items()])
        names.append(PRETRAINING + suffix)
    return names


def register_world_task(num_people: int) -> str:
    """Register (once) and name `facts_world<num_people>`: salient span masking on the corpus of a
    world of `num_people` people made in memory (`world.make_people`, deterministic; `data/`'s
    world is the one of 400), every sentence an example. Its validation split states every fact
    once (`world.probe_statements`), in order: what `t5nb.capacity` scores."""
    name = f"facts_world{num_people}"
    if is_registered(name):
        return name
    people = world.make_people(num_people)
    sentences = [{"targets": sentence} for paragraph in world.corpus(people) for sentence in world.sentences(paragraph)]
    probes = [{"targets": sentence} for sentence in world.probe_statements(people)]
    add_task(name, in_memory_source({"train": sentences, "validation": probes}), objective="salient_span_masking",
             vocabulary="facts", salient_spans=world.salient_spans_pattern())
    return name

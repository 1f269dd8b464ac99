"""The facts world: synthetic people with five facts each, rendered into the files in `data/`.

Every person gets a made-up name and a birth city, employer, birth year, profession and
instrument drawn uniformly from closed sets, so no question can be answered from surface
patterns: the only way to answer "Where was Varo Tessmid born?" is to have read it.

The pretraining corpus describes each person in several paragraphs, each with its own
paraphrase of every fact and its own sentence order. Its validation split, for the pretraining
validation curve, is one more paragraph per person: never trained on as a paragraph, though
about two thirds of its sentences occur in training paragraphs (the paraphrases are few). Closed-book QA is split *by person*:
training questions ask about the `train` people, validation questions only about the
`heldout` people, whose facts the model can only have seen in the pretraining corpus. So is
fact checking, and slot filling (`slot_filling_examples`), which is built from `facts.jsonl`
when its task is registered, not written as a file of its own.

Regenerate everything in `data/` (deterministic, byte for byte):

    python -m t5nb.tasks --out data

A world of another size (`make_people(N)`, `--people N`) is drawn by the same generator;
notebook 06 makes several in memory (`tasks.register_world_task`).
"""
import argparse
import dataclasses
import json
import pathlib
import random
import re

from t5nb.tasks.vocab import train_vocabulary

SEED = 5
NUM_PEOPLE = 400
PARAGRAPHS_PER_PERSON = 6
HELDOUT_FRACTION = 0.5
QA_PREFIX = "trivia question: "
FACT_CHECK_PREFIX = "fact check: "
SLOT_FILLING_PREFIX = "slot filling: "

FIRST_NAMES = (
    "Ada Bran Cato Dara Elin Faro Gida Hale Iren Jory Kael Lira Moro Nela Orin Pella Quin Rosa "
    "Sami Tova Ulla Varo Wren Xeno Yara Zeph Anik Bela Corin Dunya"
).split()
SURNAME_ONSETS = "b br d dr f g gr k kl l m n p pr r s st t tr v z sh".split()
SURNAME_VOWELS = "a e i o u".split()
SURNAME_CODAS = "n l r s m th nd rk ss x".split()
SURNAME_ENDINGS = "ov ian ett ard ing ski wick berg mid dor".split()

CITIES = (
    "Lisbon Oslo Vienna Dublin Prague Madrid Berlin Athens Cairo Lima Quito Tokyo Seoul Hanoi "
    "Delhi Dakar Nairobi Accra Havana Bogota Santiago Toronto Boston Denver Chicago Sydney Perth "
    "Manila Jakarta Tehran"
).split()
COMPANIES = (
    "Norbex Calvira Zentrix Halvane Orbiton Pellucid Quorra Strativ Tessaline Umbrix Veltora "
    "Wyncrest Axiora Brontel Corvane Dynalith Evergate Fennix Glimora Hexwell"
).split()
YEARS = [str(year) for year in range(1940, 2000)]
PROFESSIONS = (
    "baker pilot nurse lawyer farmer chemist painter teacher mason dentist sailor "
    "journalist librarian carpenter surgeon tailor plumber geologist gardener banker"
).split()
INSTRUMENTS = (
    "violin cello piano flute guitar trumpet harp drums clarinet oboe banjo accordion "
    "saxophone trombone mandolin"
).split()

# relation -> (answer set, statement paraphrases, question forms); {name} and {value} are filled in.
RELATIONS = {
    "birth_city": (
        CITIES,
        [
            "{name} was born in {value}.",
            "{name} came into the world in {value}.",
            "The birthplace of {name} is {value}.",
            "{name} is a native of {value}.",
            "{value} is the city where {name} was born.",
            "{name} was born in the city of {value}.",
        ],
        ["Where was {name} born?", "In which city was {name} born?"],
    ),
    "employer": (
        COMPANIES,
        [
            "{name} works for {value}.",
            "{name} is employed by {value}.",
            "The employer of {name} is {value}.",
            "{value} employs {name}.",
            "{name} has a job at {value}.",
            "{name} earns a living at {value}.",
        ],
        ["Which company does {name} work for?", "Who employs {name}?"],
    ),
    "birth_year": (
        YEARS,
        [
            "{name} was born in the year {value}.",
            "{name} was born in {value}.",
            "The birth year of {name} is {value}.",
            "{value} is the year {name} was born.",
            "{name} was born back in {value}.",
            "{name} arrived in {value}.",
        ],
        ["In what year was {name} born?", "When was {name} born?"],
    ),
    "profession": (
        PROFESSIONS,
        [
            "{name} works as a {value}.",
            "{name} is a {value} by profession.",
            "The profession of {name} is {value}.",
            "By trade, {name} is a {value}.",
            "{name} has a career as a {value}.",
            "{name} makes a living as a {value}.",
        ],
        ["What is the profession of {name}?", "What does {name} do for a living?"],
    ),
    "instrument": (
        INSTRUMENTS,
        [
            "{name} plays the {value}.",
            "{name} is a player of the {value}.",
            "The instrument of {name} is the {value}.",
            "In the evenings {name} practises the {value}.",
            "{name} learned to play the {value}.",
            "The {value} is the instrument {name} plays.",
        ],
        ["Which instrument does {name} play?", "What instrument does {name} play?"],
    ),
}


def uniform_guess_accuracy() -> float:
    """Accuracy (%) of a uniform guess among the asked relation's values, the five relations
    asked equally often (as the facts world's slots and questions are: the same number per
    person each): the chance level of slot filling and closed-book QA on held-out people."""
    return 100 * sum(1 / len(values) for values, _, _ in RELATIONS.values()) / len(RELATIONS)


def salient_spans_pattern() -> str:
    """A regex matching every fact value: the salient spans that salient span masking hides; the
    longest first, the same text in every process (a kept pipeline's key holds it)."""
    values = sorted({value for values, _, _ in RELATIONS.values() for value in values}, key=lambda v: (-len(v), v))
    return "|".join(re.escape(value) for value in values)


def sentences(paragraph: str) -> list[str]:
    """A corpus paragraph's sentences (each states one fact)."""
    return re.split(r"(?<=\.) ", paragraph)


@dataclasses.dataclass(frozen=True)
class Person:
    """One entity of the world, its facts (relation -> value) and its QA split."""

    name: str
    facts: dict
    split: str  # "train" (QA fine-tuning questions) or "heldout" (pretraining corpus only)


def _surnames(rng: random.Random, count: int) -> list[str]:
    """`count` distinct made-up surnames such as `Brelmov` or `Tessmid`."""
    names: set[str] = set()
    while len(names) < count:
        parts = (rng.choice(SURNAME_ONSETS), rng.choice(SURNAME_VOWELS), rng.choice(SURNAME_CODAS),
                 rng.choice(SURNAME_ENDINGS))
        names.add("".join(parts).capitalize())
    return sorted(names)


def make_people(num_people: int = NUM_PEOPLE, seed: int = SEED) -> list[Person]:
    """The world's people: unique names, uniform random facts, half of them held out."""
    rng = random.Random(seed)
    surnames = _surnames(rng, num_people)
    rng.shuffle(surnames)
    num_heldout = int(num_people * HELDOUT_FRACTION)
    people = []
    for index, surname in enumerate(surnames):
        facts = {relation: rng.choice(values) for relation, (values, _, _) in RELATIONS.items()}
        split = "heldout" if index < num_heldout else "train"
        people.append(Person(f"{rng.choice(FIRST_NAMES)} {surname}", facts, split))
    return people


def statement(person: Person, relation: str, value: str, rng: random.Random) -> str:
    """One sentence saying that `person`'s `relation` is `value`, in a random paraphrase."""
    return rng.choice(RELATIONS[relation][1]).format(name=person.name, value=value)


def probe_paraphrase(relation: str) -> str:
    """The first of `relation`'s paraphrases that no other relation has, so that with its value
    hidden only that relation's values fit it: birth_city's first, "{name} was born in {value}.",
    is also one of birth_year's, and the corpus fills it with a city or a year."""
    others = {paraphrase for other, (_, paraphrases, _) in RELATIONS.items() if other != relation
              for paraphrase in paraphrases}
    return next(paraphrase for paraphrase in RELATIONS[relation][1] if paraphrase not in others)


def probe_statements(people: list[Person]) -> list[str]:
    """Every fact of `people` stated once, in its relation's `probe_paraphrase`: person by person,
    relation by relation (`RELATIONS`' order). What a knowledge probe asks about."""
    return [probe_paraphrase(relation).format(name=person.name, value=person.facts[relation])
            for person in people for relation in RELATIONS]


def corpus(people: list[Person], seed: int | str = SEED, paragraphs_per_person: int = PARAGRAPHS_PER_PERSON) -> list[str]:
    """Pretraining paragraphs: each person several times, shuffled facts and paraphrases."""
    rng = random.Random(seed)
    paragraphs = []
    for person in people:
        for _ in range(paragraphs_per_person):
            relations = list(RELATIONS)
            rng.shuffle(relations)
            paragraphs.append(" ".join(statement(person, r, person.facts[r], rng) for r in relations))
    rng.shuffle(paragraphs)
    return paragraphs


def qa_examples(people: list[Person], split: str) -> list[dict]:
    """Closed-book questions about the people of one split, every question form of every fact."""
    return [
        {"question": form.format(name=person.name), "answer": person.facts[relation],
         "entity": person.name, "relation": relation}
        for person in people if person.split == split
        for relation, (_, _, forms) in RELATIONS.items()
        for form in forms
    ]


def parse_question(question: str) -> tuple[str, str] | None:
    """(relation, person) of a question in one of the world's forms (with or without the QA
    prefix); None for any other question."""
    question = question.removeprefix(QA_PREFIX)
    for relation, (_, _, forms) in RELATIONS.items():
        for form in forms:
            before, after = form.split("{name}")
            if question.startswith(before) and question.endswith(after) and len(question) > len(before + after):
                return relation, question[len(before):len(question) - len(after)]
    return None


def relation_of_value(value: str) -> str | None:
    """The relation whose answer set holds `value` (the sets do not overlap); None for any other text."""
    return next((relation for relation, (values, _, _) in RELATIONS.items() if value in values), None)


def fact_check_examples(people: list[Person], split: str, seed: int = SEED) -> list[dict]:
    """One true and one false statement per fact of the people of one split."""
    rng = random.Random(f"{seed}-fact-check-{split}")
    examples = []
    for person in people:
        if person.split != split:
            continue
        for relation, (values, _, _) in RELATIONS.items():
            true_value = person.facts[relation]
            false_value = rng.choice([v for v in values if v != true_value])
            examples.append({"statement": statement(person, relation, true_value, rng), "label": "true"})
            examples.append({"statement": statement(person, relation, false_value, rng), "label": "false"})
    rng.shuffle(examples)
    return examples


SLOT_NAMES = {"birth_city": "birthplace", "employer": "employer", "birth_year": "birth year",
              "profession": "profession", "instrument": "instrument"}  # words the corpus uses


def slot_filling_examples(people: list[Person], split: str, seed: int = SEED) -> list[dict]:
    """KILT-style slot filling: "<name>, <relation>" -> the value (a comma, which the facts
    vocabulary has, between subject and relation), every fact of the people of one split,
    shuffled (so the first N of them cover many people and every relation)."""
    examples = [{"slot": f"{person.name}, {SLOT_NAMES[relation]}", "value": value}
                for person in people if person.split == split for relation, value in person.facts.items()]
    random.Random(f"{seed}-slots-{split}").shuffle(examples)
    return examples


def read_people(path) -> list[Person]:
    """The people of a `facts.jsonl` that `write_world` wrote, in its order."""
    people: dict[str, Person] = {}
    for row in _read_jsonl(pathlib.Path(path)):
        person = people.setdefault(row["entity"], Person(row["entity"], {}, row["split"]))
        person.facts[row["relation"]] = row["value"]
    return list(people.values())


def vocabulary_texts(paths: dict) -> list[str]:
    """What the vocabulary is trained on: the corpus and every task input and target."""
    texts = paths["corpus"].read_text(encoding="utf-8").splitlines()
    for split in ("train", "validation"):
        for row in _read_jsonl(paths[f"qa_{split}"]):
            texts += [QA_PREFIX + row["question"], row["answer"]]
        for row in _read_jsonl(paths[f"fact_check_{split}"]):
            texts += [FACT_CHECK_PREFIX + row["statement"], row["label"]]
    return texts


def _read_jsonl(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _write_jsonl(path: pathlib.Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def write_world(out: str | pathlib.Path, num_people: int = NUM_PEOPLE) -> dict:
    """Write facts, corpus, QA and fact-check splits of a world of `num_people` to `out`; return
    their paths by name."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    people = make_people(num_people)
    paths = {
        "facts": out / "facts.jsonl",
        "corpus": out / "facts_corpus.txt",
        "corpus_validation": out / "facts_corpus_validation.txt",
        "qa_train": out / "facts_qa_train.jsonl",
        "qa_validation": out / "facts_qa_validation.jsonl",
        "fact_check_train": out / "facts_fact_check_train.jsonl",
        "fact_check_validation": out / "facts_fact_check_validation.jsonl",
    }
    _write_jsonl(paths["facts"], [
        {"entity": p.name, "relation": r, "value": v, "split": p.split} for p in people for r, v in p.facts.items()
    ])
    paths["corpus"].write_text("".join(line + "\n" for line in corpus(people)), encoding="utf-8")
    validation = corpus(people, seed=f"{SEED}-validation", paragraphs_per_person=1)
    paths["corpus_validation"].write_text("".join(line + "\n" for line in validation), encoding="utf-8")
    _write_jsonl(paths["qa_train"], qa_examples(people, "train"))
    _write_jsonl(paths["qa_validation"], qa_examples(people, "heldout"))
    _write_jsonl(paths["fact_check_train"], fact_check_examples(people, "train"))
    _write_jsonl(paths["fact_check_validation"], fact_check_examples(people, "heldout"))
    return paths


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Regenerate the facts world and its vocabulary.")
    parser.add_argument("--out", default="data", help="folder to write (default: data)")
    parser.add_argument("--people", type=int, default=NUM_PEOPLE, help=f"people in the world (default: {NUM_PEOPLE})")
    args = parser.parse_args(argv)
    paths = write_world(args.out, args.people)
    train_vocabulary(vocabulary_texts(paths), pathlib.Path(args.out) / "facts_spm")
    for path in sorted(pathlib.Path(args.out).iterdir()):
        print(f"{path}  {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()

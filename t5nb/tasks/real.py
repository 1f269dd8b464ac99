"""T5's real tasks, with a vocabulary of your choice, and loaders for the same data as JSONL.

| task | recipe |
|---|---|
| `c4_span_corruption` | `c4_v220_span_corruption`: C4 `text`, span corruption (use inputs 512 / targets 114) |
| `wmt14_ende` | `wmt_t2t_ende_v003`: `translate English to German: ...`, BLEU |
| `nq_open` | Natural Questions open, `trivia question: ...`, EM/F1 over every answer |
| `triviaqa_nocontext` | TriviaQA unfiltered no-context, `trivia question: ...`, EM/F1 over every alias |
| `closed_book_qa` | mixture of the two QA tasks, by number of examples |

`register_real_tasks()` registers them with the official T5 vocabulary (on import) and
`register_real_tasks("byte", suffix="_byte")` with any other. JSONL copies (the formats of
`nq_open/NQ-open.dev.jsonl` and `triviaqa/triviaqa_sm_sub.jsonl`) go through
`register_nq_open_jsonl` and `register_triviaqa_jsonl`: the same closed-book recipe.
"""
import functools

import seqio
import t5.data

from t5nb.tasks.custom import in_memory_source, read_examples
from t5nb.tasks.recipes import add_mixture, add_task
from t5nb.tasks.world import QA_PREFIX

C4 = "c4/en:2.2.0"
WMT_ENDE = "wmt_t2t_translate/de-en:1.0.0"
NQ_OPEN = "natural_questions_open:1.0.0"
TRIVIAQA = "trivia_qa/unfiltered.nocontext:1.1.0"


@seqio.map_over_dataset
def _nq_open_example(example):
    return {"inputs": example["question"], "targets": example["answer"][0], "answers": example["answer"]}


@seqio.map_over_dataset
def _triviaqa_example(example):
    answer = example["answer"]
    return {"inputs": example["question"], "targets": answer["value"], "answers": answer["aliases"]}


def register_real_tasks(vocabulary: str = "t5", suffix: str = "") -> list[str]:
    """Register the real tasks and their mixture with `vocabulary` (names end in `suffix`)."""
    specs = [
        ("c4_span_corruption", C4, "span_corruption", None,
         functools.partial(t5.data.preprocessors.rekey, key_map={"inputs": None, "targets": "text"})),
        ("wmt14_ende", WMT_ENDE, "supervised", "bleu",
         functools.partial(t5.data.preprocessors.translate, source_language="en", target_language="de")),
        ("nq_open", NQ_OPEN, "supervised", "squad", _nq_open_example),
        ("triviaqa_nocontext", TRIVIAQA, "supervised", "squad", _triviaqa_example),
    ]
    for name, tfds_name, objective, metric, preprocessor in specs:
        prefix = QA_PREFIX if metric == "squad" else ""
        add_task(name + suffix, seqio.TfdsDataSource(tfds_name), objective=objective, vocabulary=vocabulary,
                 prefix=prefix, metric=metric, extra_preprocessors=[preprocessor], exist_ok=True)
    mixture = "closed_book_qa" + suffix
    add_mixture(mixture, ["nq_open" + suffix, "triviaqa_nocontext" + suffix],
                default_rate=seqio.mixing_rate_num_examples)
    return [name + suffix for name, *_ in specs] + [mixture]


def read_triviaqa_jsonl(path) -> list[dict]:
    """`{"context": "Question: ...\\nAnswer:", "answer", "aliases"}` rows as closed-book examples."""
    examples = read_examples(path, {"inputs": "context", "targets": "answer", "answers": "aliases"}, "jsonl")
    for example in examples:
        example["inputs"] = example["inputs"].removeprefix("Question:").removesuffix("Answer:").strip()
    return examples


def _register_closed_book(name, files, vocabulary, read) -> seqio.Task:
    paths = files if isinstance(files, dict) else {"validation": files}
    examples = {split: read(path) for split, path in paths.items()}
    return add_task(name, in_memory_source(examples), objective="supervised", vocabulary=vocabulary,
                    prefix=QA_PREFIX, metric="squad")


def register_nq_open_jsonl(name: str, files, vocabulary: str = "t5") -> seqio.Task:
    """NQ-open JSONL (`{"question", "answer": [...]}`) as a closed-book task; one path is the
    `validation` split, or pass `{split: path}`."""
    fields = {"inputs": "question", "targets": "answer", "answers": "answer"}
    return _register_closed_book(name, files, vocabulary, functools.partial(read_examples, fields=fields))


def register_triviaqa_jsonl(name: str, files, vocabulary: str = "t5") -> seqio.Task:
    """TriviaQA JSONL (`{"context", "answer", "aliases"}`) as a closed-book task, as above."""
    return _register_closed_book(name, files, vocabulary, read_triviaqa_jsonl)

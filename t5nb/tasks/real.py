"""T5's real tasks, read from sources a free Colab runtime reaches anonymously in minutes.

| task | recipe | source (see `t5nb.remote`; `T5NB_STANDINS` swaps in local copies) |
|---|---|---|
| `c4_span_corruption` | `c4_v220_span_corruption`: C4 `text`, span corruption (inputs 512 / targets 114) | the first `C4_TRAIN_FILES` of the 1,024 `allenai/c4` `en` files on the Hub (~1.4 M documents, ~1.3 GB) |
| `wmt14_ende` | `translate English to German: ...`, BLEU | `wmt/wmt14` `de-en` on the Hub: the first of three training files (~1.5 M pairs), newstest2013 / newstest2014 |
| `nq_open` | Natural Questions open, `trivia question: ...`, EM/F1 over every answer | `NQ-open.{train,dev}.jsonl` from the natural-questions GitHub repository |
| `triviaqa_nocontext` | TriviaQA unfiltered, no context, `trivia question: ...`, EM/F1 over every alias | `mandarjoshi/trivia_qa` `unfiltered.nocontext` on the Hub |
| `closed_book_qa` | mixture of the two QA tasks, by number of examples | |

Files are fetched when a task's data is first read, never at import; a source that cannot be
reached stops with `remote.SourceUnreachable`. `register_real_tasks()` registers them with the
official T5 vocabulary (on import) and `register_real_tasks("byte", suffix="_byte")` with any
other. Local JSONL copies (the formats of `nq_open/NQ-open.dev.jsonl` and
`triviaqa/triviaqa_sm_sub.jsonl`) go through `register_nq_open_jsonl` and
`register_triviaqa_jsonl`: the same closed-book recipe.
"""
import functools
import json

import seqio
import t5.data
import tensorflow as tf

from t5nb import remote
from t5nb.tasks import kept_pipelines
from t5nb.tasks.custom import in_memory_source, read_examples
from t5nb.tasks.pieces import add_mixture, add_task, without_autograph
from t5nb.tasks.world import QA_PREFIX

C4_TRAIN_FILES = 4  # of 1,024: more than the accelerator profile's pretraining reads (2,000 x 64 examples)
C4 = {"train": [f"hf://datasets/allenai/c4/en/c4-train.{i:05d}-of-01024.json.gz" for i in range(C4_TRAIN_FILES)],
      "validation": ["hf://datasets/allenai/c4/en/c4-validation.00000-of-00008.json.gz"]}
WMT14_ENDE = {split: [f"hf://datasets/wmt/wmt14/de-en/{split}-00000-of-{n:05d}.parquet"]
              for split, n in (("train", 3), ("validation", 1), ("test", 1))}
NQ_OPEN = {split: ["https://raw.githubusercontent.com/google-research-datasets/natural-questions/master/"
                   f"nq_open/NQ-open.{name}.jsonl"] for split, name in (("train", "train"), ("validation", "dev"))}
TRIVIAQA = {split: [f"hf://datasets/mandarjoshi/trivia_qa/unfiltered.nocontext/{split}-00000-of-00001.parquet"]
            for split in ("train", "validation")}


class RemoteFilesSource(seqio.DataSource):
    """A seqio source over remote files, `{split: [url, ...]}`, one shard a file."""

    def __init__(self, urls: dict):
        super().__init__(splits=list(urls))
        self.urls = urls

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return False

    def list_shards(self, split: str) -> list[str]:
        return self.urls[split]


class RemoteRowsSource(RemoteFilesSource):
    """Examples read from remote files on first use, then kept in memory: `read(local_path) ->
    [example dict]` turns each fetched file into examples."""

    def __init__(self, urls: dict, read):
        super().__init__(urls)
        self.read = read

    def examples(self, split: str) -> list[dict]:
        """The split's examples, its files fetched and read once (once more if the stand-ins change)."""
        return self._examples(split, remote.standins_dir())

    @functools.cache
    def _examples(self, split: str, standins) -> list[dict]:
        return [example for url in self.urls[split] for example in self.read(remote.fetch(url))]

    def split_digest(self, split: str) -> str | None:
        """What the split's examples hash to, so that the pipelines reading them are kept
        (`kept_pipelines`); None where they are too large to keep in a pipeline's graph."""
        source = self._source(split, remote.standins_dir())
        return source.examples_digest if source.examples_bytes <= kept_pipelines.MAX_EXAMPLES_BYTES else None

    @functools.cache
    def _source(self, split: str, standins):
        return in_memory_source({split: self._examples(split, standins)})

    def num_input_examples(self, split: str) -> int:
        return len(self.examples(split))

    def get_dataset(self, split="train", shuffle=True, seed=None, shard_info=None, **unused):
        dataset = self._source(split, remote.standins_dir()).get_dataset(split, shuffle=False)
        if shard_info:
            dataset = dataset.shard(shard_info.num_shards, shard_info.index)
        return dataset.shuffle(min(len(self.examples(split)), 100_000), seed=seed) if shuffle else dataset


class RemoteTextSource(RemoteFilesSource):
    """Documents `{"text"}` streamed from remote JSON-lines `.json.gz` files (C4's form), the
    files fetched when the split is first read."""

    def get_dataset(self, split="train", shuffle=True, seed=None, shard_info=None, **unused):
        files = [remote.fetch(url) for url in self.urls[split]]
        dataset = tf.data.Dataset.from_tensor_slices(files)
        if shard_info:
            dataset = dataset.shard(shard_info.num_shards, shard_info.index)
        if shuffle:
            dataset = dataset.shuffle(len(files), seed=seed)
        lines = dataset.interleave(lambda f: tf.data.TextLineDataset(f, compression_type="GZIP"),
                                   cycle_length=len(files))
        if shuffle:
            lines = lines.shuffle(10_000, seed=seed)
        options = tf.data.Options()  # json.loads keeps no state: checkpoints of the iterator may skip it
        options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
        return lines.map(_json_text, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).with_options(options)


def _json_text(line):
    text = tf.py_function(lambda raw: json.loads(raw.numpy())["text"], [line], tf.string)
    text.set_shape([])
    return {"text": text}


def read_parquet(path, columns: list[str]) -> list[dict]:
    """The rows of a Parquet file (only `columns`) as dicts."""
    import pyarrow.parquet  # only the Hub's Parquet sources need it

    return pyarrow.parquet.read_table(path, columns=columns).to_pylist()


def _nq_open_rows(path) -> list[dict]:
    return read_examples(path, {"inputs": "question", "targets": "answer", "answers": "answer"}, "jsonl")


def _triviaqa_rows(path) -> list[dict]:
    return [{"inputs": row["question"], "targets": row["answer"]["value"], "answers": row["answer"]["aliases"]}
            for row in read_parquet(path, ["question", "answer"])]


def _wmt_rows(path) -> list[dict]:
    return [row["translation"] for row in read_parquet(path, ["translation"])]


def register_real_tasks(vocabulary: str = "t5", suffix: str = "") -> list[str]:
    """Register the real tasks and their mixture with `vocabulary` (names end in `suffix`)."""
    specs = [
        ("c4_span_corruption", RemoteTextSource(C4), "span_corruption", None,
         [functools.partial(without_autograph(t5.data.preprocessors.rekey),
                            key_map={"inputs": None, "targets": "text"})]),
        ("wmt14_ende", RemoteRowsSource(WMT14_ENDE, _wmt_rows), "supervised", "bleu",
         [functools.partial(without_autograph(t5.data.preprocessors.translate),
                            source_language="en", target_language="de")]),
        ("nq_open", RemoteRowsSource(NQ_OPEN, _nq_open_rows), "supervised", "squad", []),
        ("triviaqa_nocontext", RemoteRowsSource(TRIVIAQA, _triviaqa_rows), "supervised", "squad", []),
    ]
    for name, source, objective, metric, preprocessors in specs:
        prefix = QA_PREFIX if metric == "squad" else ""
        add_task(name + suffix, source, objective=objective, vocabulary=vocabulary, prefix=prefix, metric=metric,
                 extra_preprocessors=preprocessors, exist_ok=True)
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
    return _register_closed_book(name, files, vocabulary, _nq_open_rows)


def register_triviaqa_jsonl(name: str, files, vocabulary: str = "t5") -> seqio.Task:
    """TriviaQA JSONL (`{"context", "answer", "aliases"}`) as a closed-book task, as above."""
    return _register_closed_book(name, files, vocabulary, read_triviaqa_jsonl)

"""Vocabularies: the facts world's own SentencePiece model, bytes, and the official T5 one.

`get_vocabulary(name)` takes `"facts"` (trained by t5nb on the corpus in `data/`), `"byte"`
(no file), `"t5"` (the official `cc_all.32000` model: `$T5NB_DATA_DIR` if it has a copy,
else `OFFICIAL_SPM_URL` on the Hub, fetched on first use) or a path to any SentencePiece `.model` file.
`EMBEDDING_MULTIPLE`: how T5 pads the embedding table beyond a vocabulary's ids.
"""
import io
import os
import pathlib

import seqio
import sentencepiece

from t5nb import remote
from t5nb.paths import REPO_ROOT

DATA_DIR = REPO_ROOT / "data"
FACTS_SPM_PATH = DATA_DIR / "facts_spm.model"
FACTS_VOCAB_SIZE = 1024  # pieces; seqio adds EXTRA_IDS sentinels on top
EXTRA_IDS = 100
PUNCTUATION = ".,?:"  # always pieces of their own
OFFICIAL_SPM_NAME = "vocab/cc_all.32000.sentencepiece.model"
OFFICIAL_SPM_URL = "hf://google/t5-v1_1-small/spiece.model"  # the same file as gs://t5-data/vocabs/cc_all.32000
EMBEDDING_MULTIPLE = 128  # T5 pads its embedding table: 32100 ids in 32128 rows


def shared_data_dir() -> pathlib.Path:
    """`$T5NB_DATA_DIR`, else `../shared/data` beside the repository (may not exist)."""
    return pathlib.Path(os.environ.get("T5NB_DATA_DIR") or REPO_ROOT.parent / "shared" / "data")


def train_vocabulary(texts, model_prefix, vocab_size: int = FACTS_VOCAB_SIZE) -> pathlib.Path:
    """Train a BPE SentencePiece model on `texts`, deterministically (one thread, every
    sentence, no shuffling); write `<model_prefix>.model` and `.vocab`; return the model path.

    T5's conventions: pad 0, EOS 1, UNK 2, no BOS; `PUNCTUATION` never merges into words.
    """
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size, model_type="bpe",
        character_coverage=1.0, input_sentence_size=0, shuffle_input_sentence=False, num_threads=1,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2,
        user_defined_symbols=list(PUNCTUATION),  # "1941." must end in the same "1941" the answer is
    )
    model_path = pathlib.Path(f"{model_prefix}.model")
    model_path.parent.mkdir(parents=True, exist_ok=True)
    model_path.write_bytes(model.getvalue())
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    pieces = (f"{processor.id_to_piece(i)}\t{processor.get_score(i):g}\n" for i in range(processor.get_piece_size()))
    pathlib.Path(f"{model_prefix}.vocab").write_text("".join(pieces), encoding="utf-8")
    return model_path


def official_spm_path() -> str:
    """The official T5 SentencePiece model: the local copy in `$T5NB_DATA_DIR` if present (and
    no stand-ins replace remote sources), else its Hub URL."""
    local = shared_data_dir() / OFFICIAL_SPM_NAME
    return str(local) if local.exists() and remote.standins_dir() is None else OFFICIAL_SPM_URL


class FetchedVocabulary(seqio.SentencePieceVocabulary):
    """A SentencePiece model named by a remote URL (`url`): fetched when first used, never at import."""

    def __init__(self, url: str, **kwargs):
        super().__init__(url, **kwargs)
        self.url = url

    def _model_context(self):
        if self._model is None and "://" in self._sentencepiece_model_file:
            self._sentencepiece_model_file = remote.fetch(self._sentencepiece_model_file)
        return super()._model_context()


def get_vocabulary(name: str = "facts") -> seqio.Vocabulary:
    """A seqio vocabulary by name (`facts`, `byte`, `t5`) or SentencePiece model path."""
    name = os.fspath(name)
    if name == "byte":
        return seqio.ByteVocabulary()  # ByT5's: sentinels are the top ids, never valid UTF-8
    path = {"facts": str(FACTS_SPM_PATH), "t5": None}.get(name, name)
    path = path or official_spm_path()
    if "://" in path:
        return FetchedVocabulary(path, extra_ids=EXTRA_IDS)
    if not pathlib.Path(path).is_file():
        raise FileNotFoundError(f"vocabulary {name!r}: no SentencePiece model file {path!r}; use 'facts', "
                                "'byte', 't5' or the path of a .model file")
    return seqio.SentencePieceVocabulary(path, extra_ids=EXTRA_IDS)


def with_sentinels(vocabulary: seqio.Vocabulary, ids) -> str:
    """Token ids as text up to EOS, each sentinel written `<extra_id_N>` as T5's papers write it
    (a vocabulary decodes sentinels as nothing): span corruption's inputs and targets, readable."""
    first_sentinel = vocabulary.vocab_size - vocabulary.extra_ids
    parts, run = [], []
    for i in map(int, ids):
        if i == vocabulary.eos_id:
            break
        if i >= first_sentinel:
            parts += [vocabulary.decode(run), f"<extra_id_{vocabulary.vocab_size - 1 - i}>"]
            run = []
        elif i != vocabulary.pad_id:
            run.append(i)
    return " ".join(part for part in [*parts, vocabulary.decode(run)] if part)


def is_official(vocabulary: seqio.Vocabulary) -> bool:
    """Whether `vocabulary` is T5's own (`get_vocabulary("t5")`: the local copy or the Hub's)."""
    source = getattr(vocabulary, "url", getattr(vocabulary, "sentencepiece_model_file", None))
    return source in (OFFICIAL_SPM_URL, str(shared_data_dir() / OFFICIAL_SPM_NAME))


def describe_vocabulary(vocabulary: seqio.Vocabulary) -> str:
    """Kind and size, e.g. "SentencePiece facts_spm.model (1124 ids)" or "byte (259 ids)"."""
    if isinstance(vocabulary, seqio.ByteVocabulary):
        kind = "byte"
    elif isinstance(vocabulary, seqio.SentencePieceVocabulary):
        kind = f"SentencePiece {pathlib.PurePath(vocabulary.sentencepiece_model_file).name}"
    else:
        kind = type(vocabulary).__name__
    return f"{kind} ({vocabulary.vocab_size} ids)"

"""SeqIO tasks for t5nb: the offline facts world, T5's real tasks, your own, and batching.

Importing registers the facts tasks and the real tasks (idempotently):

- `facts_span_corruption`, `facts_salient_span_masking`, `facts_qa`, `facts_fact_check`,
  `facts_slot_filling` and the mixture `facts_pretraining` (and `..._byte`): see `offline`;
- `c4_span_corruption`, `wmt14_ende`, `nq_open`, `triviaqa_nocontext`, mixture
  `closed_book_qa` (and `..._byte`): see `real`.
"""
from t5nb import _tensorflow  # noqa: F401, I001  (first: TensorFlow for tf.data only, accelerators hidden)
from t5nb.tasks.batching import (BatchIterator, Preview, Previews, as_text, get_dataset, preview,
                                 validation_batches)
from t5nb.tasks.custom import (TaskDataError, describe, read_examples, read_rows, register_task, token_lengths,
                               warn_if_cut)
from t5nb.tasks.offline import (FACT_CHECK, QA, SLOT_FILLING, SPAN_CORRUPTION, register_facts_tasks,
                                register_world_task, uniform_guess_accuracy)
from t5nb.tasks.real import register_nq_open_jsonl, register_real_tasks, register_triviaqa_jsonl
from t5nb.tasks.pieces import (TaskNameError, check_vocabulary, first_examples, get_task, is_registered,
                               remove_task)
from t5nb.tasks.vocab import (FACTS_SPM_PATH, describe_vocabulary, get_vocabulary,
                             shared_data_dir, with_sentinels)

if FACTS_SPM_PATH.exists():  # absent only while `python -m t5nb.tasks --out data` regenerates it
    register_facts_tasks()
register_real_tasks("t5")
register_real_tasks("byte", suffix="_byte")

__all__ = [
    "BatchIterator", "FACTS_SPM_PATH", "FACT_CHECK", "Preview", "Previews", "QA", "SLOT_FILLING", "SPAN_CORRUPTION",
    "TaskDataError", "TaskNameError", "as_text", "check_vocabulary", "describe", "describe_vocabulary",
    "first_examples", "get_dataset", "get_task",
    "get_vocabulary", "is_registered", "preview", "read_examples", "read_rows", "register_facts_tasks", "register_nq_open_jsonl",
    "register_real_tasks", "register_task", "register_world_task", "register_triviaqa_jsonl", "remove_task", "shared_data_dir", "token_lengths",
    "uniform_guess_accuracy", "validation_batches", "warn_if_cut", "with_sentinels",
]

"""Error analysis of decoded predictions (`evaluate.read_predictions`): which answers are wrong,
where the errors cluster, and whether the model's own score tells right answers from wrong."""
import collections
import math

import numpy as np
import pandas as pd
from t5.evaluation import qa_utils

from t5nb.tasks import world


def with_correctness(predictions: pd.DataFrame) -> pd.DataFrame:
    """`predictions` plus `correct`: the prediction equals one of the accepted answers after
    T5's SQuAD normalisation (per question, the exact match `t5.evaluation.metrics.squad` averages)."""
    answers = predictions["target"].map(lambda target: target if isinstance(target, list) else [target])
    correct = [any(qa_utils.normalize_squad(prediction) == qa_utils.normalize_squad(answer) for answer in accepted)
               for prediction, accepted in zip(predictions["prediction"], answers)]
    return predictions.assign(correct=correct)


def with_question_facts(predictions: pd.DataFrame) -> pd.DataFrame:
    """`predictions` plus `relation` and `person` of each facts-world question (missing for
    questions in other forms, such as NQ's or TriviaQA's)."""
    parsed = [world.parse_question(question) or (None, None) for question in predictions["input"]]
    return predictions.assign(relation=[relation for relation, _ in parsed], person=[person for _, person in parsed])


def answer_relations(predictions: pd.DataFrame) -> pd.Series:
    """How many facts-world `predictions` answer with a value of the relation asked (the one
    whose answer set holds the target), of another relation, or of none."""
    asked = predictions["target"].map(world.relation_of_value)
    answered = predictions["prediction"].map(world.relation_of_value)
    kinds = ["of the relation asked", "of another relation", "no relation's value"]
    kind = [kinds[2] if pd.isna(a) else kinds[0] if a == q else kinds[1] for a, q in zip(answered, asked)]
    return pd.Series(kind, dtype=object).value_counts().reindex(kinds, fill_value=0)


def clustered_standard_error(sums, sizes) -> float:
    """The standard error of a mean over N questions that come in G clusters (the facts world's
    people: a person's questions are right or wrong together), from each cluster's sum of the
    per-question values (questions right; or, for two models on the same questions, the
    per-question differences) and its number of questions. The cluster-robust estimate: with
    m = sum(sums) / N,

        sqrt(G / (G - 1) * sum_g (sums_g - m sizes_g)^2) / N;

    NaN for one cluster, which says nothing of how much clusters differ. Questions that are
    independent, each its own cluster, give about sqrt(m (1 - m) / N)."""
    sums, sizes = np.asarray(sums, dtype=float), np.asarray(sizes, dtype=float)
    clusters, questions = len(sums), sizes.sum()
    if clusters < 2:
        return math.nan
    residuals = sums - sums.sum() / questions * sizes
    return math.sqrt(clusters / (clusters - 1) * (residuals**2).sum()) / questions


def accuracy_by(scored: pd.DataFrame, by) -> pd.DataFrame:
    """Questions, exact match (%) and its standard error (points) per group of `by` (a column
    name or a Series). Where the questions name a person (a `person` column from
    `with_question_facts`: the facts world's), the error is clustered by person
    (`clustered_standard_error`; a question without one counts as a person of its own), since a
    person's questions are right or wrong together and a group of n questions about few people
    varies by chance more than n independent ones. Elsewhere (NQ's or TriviaQA's questions) the
    questions are taken as independent: sqrt(p (1 - p) / n) at EM p."""
    keys = scored[by] if isinstance(by, str) else by
    table = scored.groupby(keys, observed=True)["correct"].agg(questions="size", em=lambda c: round(100 * c.mean(), 1))
    if "person" in scored and scored["person"].notna().any():
        own = pd.Series([f"question {position}" for position in range(len(scored))], index=scored.index)
        clusters = scored["person"].fillna(own)
        counts = scored.groupby([keys, clusters], observed=True)["correct"].agg(["sum", "size"])
        errors = counts.groupby(level=0, observed=True).apply(
            lambda group: clustered_standard_error(group["sum"], group["size"]))
    else:
        errors = scored.groupby(keys, observed=True)["correct"].agg(lambda c: math.sqrt(c.mean() * (1 - c.mean()) / len(c)))
    return table.assign(standard_error=(100 * errors).round(1))


def reliability(scored: pd.DataFrame, bins: int = 8) -> pd.DataFrame:
    """Exact match per bin of sequence score (the log-likelihood of the decoded answer), bins
    of equal size from least to most confident: if the score tells right from wrong, the
    exact match rises from bin to bin."""
    bin_of = pd.qcut(scored["score"].rank(method="first"), bins, labels=False)
    return scored.groupby(bin_of).agg(mean_score=("score", "mean"), em=("correct", lambda c: 100 * c.mean()),
                                      questions=("correct", "size"))


def mention_counts(batches, vocabulary, names, num_batches: int) -> pd.Series:
    """How many rows of the first `num_batches` of `batches` (a fresh iterator over a run's
    training data, so the very batches it trained on) mention each of `names`, in their
    decoded inputs and targets. No names: nothing is read."""
    counts, rows = collections.Counter({name: 0 for name in names}), 0
    for _ in range(num_batches if counts else 0):  # a line when done, not a bar left in a saved notebook
        batch = next(batches)
        for inputs, targets in zip(batch["encoder_input_tokens"], batch["decoder_target_tokens"]):
            text = vocabulary.decode(inputs.tolist()) + " " + vocabulary.decode(targets.tolist())
            counts.update([name for name in counts if name in text])
            rows += 1
    if counts:
        print(f"read {num_batches:,} training batches ({rows:,} rows) for {len(counts):,} names")
    return pd.Series(counts, name="mentions", dtype=int)


def accuracy_by_quantiles(scored: pd.DataFrame, column: str, bins: int = 4) -> pd.DataFrame:
    """Exact match per quantile bin of a numeric `column` (rows where it is missing left out)."""
    known = scored.dropna(subset=[column])
    groups = pd.qcut(known[column], bins, duplicates="drop") if len(known) else known[column]
    return accuracy_by(known, groups)

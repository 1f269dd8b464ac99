"""Scalars read back from the TensorBoard event files a run wrote (clu's metric writers): what
`evaluate.results_table` tabulates, and the curve a resumed `train()` returns and redraws."""
import pathlib

from t5nb._tensorflow import tf  # TensorFlow for tf.data only, accelerators hidden


def _events(path):
    """The events of one TensorBoard events file, up to a record cut short (a killed writer)."""
    records = iter(tf.data.TFRecordDataset(str(path)))
    while True:
        try:
            record = next(records)
        except (StopIteration, tf.errors.DataLossError):
            return
        yield tf.compat.v1.Event.FromString(record.numpy())


def _event_scalars(path):
    """(step, tag, value) of every scalar in one TensorBoard events file (TF1 or TF2 summaries)."""
    for event in _events(path):
        for value in event.summary.value:
            if value.HasField("simple_value"):
                yield event.step, value.tag, float(value.simple_value)
            elif value.HasField("tensor") and not value.tensor.tensor_shape.dim:
                yield event.step, value.tag, float(tf.make_ndarray(value.tensor))


def logged_steps(directory, upto: int | None = None) -> list[tuple[int, dict]]:
    """[(step, {tag: value})] by step from the events files directly in `directory` (none: []),
    steps after `upto` left out. Files are read oldest first, so a step logged twice (a run
    resumed from a checkpoint before it) keeps its newest values."""
    values = {}
    for events in sorted(pathlib.Path(directory).glob("events.out.tfevents.*")):
        for step, tag, value in _event_scalars(events):
            if upto is None or step <= upto:
                values.setdefault(step, {})[tag] = value
    return sorted(values.items())

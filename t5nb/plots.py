"""Notebook plots: a live training plot (d2l's Animator, redrawn only at the loop's log points), the
scalars runs logged (TensorBoard's still), 02's
look inside T5 (position buckets, attention masks), 03's sample-efficiency curve and its comparison of
fine-tuning methods, 06's knowledge against model size."""
import itertools
import math
import pathlib

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch

from t5nb.model import relative_position_bucket
from t5nb.train import DECODED, VALIDATION

# the y-axes of LivePlot's panels: a token accuracy is a fraction, the decoded metrics percentages
LIVE_AXES = {"loss": "loss per target token", "accuracy": "token accuracy (0 to 1)", "decoded": "task's metric (%)"}


class LivePlot:
    """Curves of chosen metrics against step, training and validation on the same axes; pass
    it as `train(..., on_log=plot)`. With `decoded` (True, or the sample's size, which its title
    then gives: `profile.decoded_sample`), one more panel holds the task's own metrics on the
    decoded validation sample (`train()`'s `decoded_eval`), whatever they are.

    The training loop calls it every `log_every` steps, and after each evaluation, with metrics
    already on the host, so plotting never adds a device sync. In a notebook the figure updates
    in place.
    """

    def __init__(self, metrics=("loss", "accuracy"), title: str | None = None, decoded: bool | int = False,
                 figsize_per_plot=(4.2, 3.0)):
        self.metrics = tuple(metrics)
        self.curves = {f"{prefix}{name}": ([], []) for name in self.metrics for prefix in ("", VALIDATION)}
        self.decoded = bool(decoded)  # its curves are added as their metrics first arrive
        self.decoded_title = ("decoded validation sample" if decoded is True or not decoded else
                              f"decoded validation sample of {decoded:,}")
        panels = self.metrics + (("decoded",) if decoded else ())
        self.figure, axes = plt.subplots(1, len(panels), squeeze=False,
                                         figsize=(figsize_per_plot[0] * len(panels), figsize_per_plot[1]))
        self.axes = dict(zip(panels, axes[0]))
        if title:
            self.figure.suptitle(title)
        self._handle = None
        plt.close(self.figure)  # shown through the display handle only, not twice

    def __call__(self, step: int, metrics: dict) -> None:
        for name in metrics:  # a mixture's per-task metrics (`<task>/<metric>`) are left out
            if self.decoded and name.startswith(VALIDATION + DECODED) and "/" not in name[len(VALIDATION + DECODED):]:
                self.curves.setdefault(name, ([], []))
        for name, (steps, values) in self.curves.items():
            if name in metrics:
                steps.append(step)
                values.append(metrics[name])
        self.redraw()

    def _lines(self, panel: str) -> list[tuple[str, str]]:
        """(label, curve name) of each line in `panel`."""
        if panel == "decoded":
            return [(name[len(VALIDATION + DECODED):], name) for name in self.curves
                    if name.startswith(VALIDATION + DECODED)]
        return [("training", panel), ("validation", VALIDATION + panel)]

    def redraw(self) -> None:
        for panel, ax in self.axes.items():
            ax.clear()
            lines = [(label, *self.curves[name]) for label, name in self._lines(panel) if self.curves[name][0]]
            for label, steps, values in lines:
                ax.plot(steps, values, marker="." if len(steps) < 30 else None, label=label)
            if len(lines) > 1 or panel == "decoded" and lines:
                ax.legend()
            ax.set_xlabel("step")
            ax.set_ylabel(LIVE_AXES.get(panel, panel))
            ax.set_title(self.decoded_title if panel == "decoded" else panel)
            ax.grid(alpha=0.3)
        self.figure.tight_layout()
        self._show()

    def _show(self) -> None:
        try:
            from IPython import get_ipython  # optional: shown only in a notebook
            from IPython.display import display
        except ImportError:
            return
        if get_ipython() is None:  # a script: keep the figure, show nothing
            return
        if self._handle is None:
            self._handle = display(self.figure, display_id=True)
        else:
            self._handle.update(self.figure)


def logged_scalars(runs: dict, metrics=("loss", "accuracy"), most_labelled: int = 24, title: str | None = None):
    """The scalars runs logged, as TensorBoard plots them: one panel per metric, one line per
    events folder, each folder the same colour and line in every panel. `runs`: {label: [(step, {tag:
    value})]} (`event_logs.logged_steps`). What a final evaluation logged under `inference_eval`
    (the task's metric on decoded answers, in %) gets panels of its own, beside the curves'
    (a token accuracy from 0 to 1), so that neither flattens the other. One legend under the
    panels, never over the curves, where at most `most_labelled` folders are drawn; else the
    count in each title."""
    decoded = {label for label in runs if "inference_eval" in pathlib.PurePath(label).parts}
    panels = [(metric, False) for metric in metrics] + [
        (metric, True) for metric in metrics if any(metric in values for label in decoded for _, values in runs[label])]
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]  # past its colours, dashed, then dotted lines
    styles = dict(zip(runs, ({"color": colour, "linestyle": line} for line in itertools.cycle(("-", "--", ":"))
                             for colour in palette)))
    figure, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.2), squeeze=False, layout="constrained")
    if title:
        figure.suptitle(title)
    drawn = {}
    for axis, (metric, of_decoded) in zip(axes[0], panels):
        lines = 0
        for label, steps in runs.items():
            points = [(step, values[metric]) for step, values in steps if metric in values]
            if points and (label in decoded) == of_decoded:
                marker = "o" if len(points) == 1 else "." if len(points) < 30 else None
                drawn[label], = axis.plot(*zip(*points), marker=marker, label=label, **styles[label])
                lines += 1
        name = f"{metric} of decoded answers (%)" if of_decoded else metric
        axis.set(xlabel="step", ylabel=name, title=name if len(runs) <= most_labelled else f"{name} ({lines} runs)")
        axis.grid(alpha=0.3)
    if 0 < len(drawn) <= most_labelled:
        labels = [label for label in runs if label in drawn]  # in the runs' order
        fits = int(figure.get_figwidth() * 13 / (max(map(len, labels)) + 6))  # columns of small text that fit
        columns = max(1, min(3, len(labels), fits))
        figure.set_figheight(figure.get_figheight() + 0.2 * math.ceil(len(labels) / columns))  # the panels keep theirs
        figure.legend([drawn[label] for label in labels], labels, loc="outside lower center", ncol=columns,
                      fontsize="small")
    plt.close(figure)
    return figure


def token_lengths(measured: dict, lengths: dict, title: str):
    """`tasks.token_lengths`' histograms, one panel per feature, the x-axis fitted to the
    lengths measured; each feature length a red line where it falls among them, else named
    under the axis as beyond the longest. The titles give the number of examples."""
    figure, axes = plt.subplots(1, len(measured), figsize=(4.5 * len(measured), 3.0), squeeze=False)
    for axis, (feature, values) in zip(axes[0], measured.items()):
        shortest, longest, length = int(values.min()), int(values.max()), lengths[feature]
        axis.hist(values, bins=np.arange(shortest, longest + 2) - 0.5)
        xlabel, within = "tokens", length <= longest + 1
        if within:
            axis.axvline(length, color="red", label=f"feature length {length}")
            axis.legend(fontsize="small")
        else:
            xlabel += f" (feature length {length}: beyond the longest, {longest})"
        axis.set(xlim=(shortest - 1.5, (max(longest, length) if within else longest) + 1.5), xlabel=xlabel,
                 ylabel="examples", title=f"{title}: {feature}, {len(values):,} examples")
    figure.tight_layout()
    plt.close(figure)
    return figure


def chance_line(axis, chance: float | None) -> None:
    """A dashed line at a uniform guess's score, where the task has one, labelled for the legend."""
    if chance is not None:
        axis.axhline(chance, color="gray", linestyle="--", linewidth=1, label="uniform guess")


def sample_efficiency(curve: dict, title: str | None = None):
    """`workflow.sample_efficiency`'s curve: the task's metric against the number of training
    examples (log scale), one line from the pretrained model and one from random initialisation,
    and a uniform guess's where the curve has one."""
    figure, axis = plt.subplots(figsize=(5.0, 3.4))
    sizes = sorted(curve["runs"], key=int)
    for start in ("pretrained", "scratch"):
        axis.plot([int(n) for n in sizes], [curve["runs"][n][start] for n in sizes], marker="o", label=f"from {start}")
    chance_line(axis, curve.get("chance"))
    held_out = (f"{curve['steps']:,} steps a run, " if "steps" in curve else "") + (
        f"each point on {curve['examples']:,} held-out examples" if "examples" in curve else "")
    axis.set(xscale="log", xlabel="training examples", ylabel=f"held-out {curve['metric']} (%)",
             title="\n".join(part for part in (title, held_out) if part) or None)
    axis.legend()
    plt.close(figure)
    return figure


def metrics_by_checkpoint(table, questions: int | None = None):
    """`evaluate.evaluate_checkpoints`' table: the decoded metrics in percent (EM, F1, accuracy)
    against the fine-tuning step of each checkpoint, on 0 to 100, named as papers name them;
    `questions`: how many each is on (None: the whole split)."""
    figure, axis = plt.subplots(figsize=(6.0, 3.0))
    names = {"em": "EM", "f1": "F1", "accuracy": "accuracy"}
    for column in table.columns:
        metric = column.rsplit("/", 1)[-1]
        if column.startswith("inference_eval/") and metric in names:
            scores = table[column].dropna()
            axis.plot(scores.index, scores.values, marker="o", label=names[metric])
    axis.set(xlabel="fine-tuning step", ylabel="%", ylim=(0, 100),
             title=f"held-out QA by checkpoint ({f'{questions:,}' if questions else 'all'} questions)")
    axis.legend()
    plt.close(figure)
    return figure


def fine_tuning_methods(table: dict, metric: str):
    """`workflow.compare_fine_tuning`'s table: the task's metric against the parameters each
    method trains (log scale)."""
    figure, axis = plt.subplots(figsize=(5.0, 3.4))
    for method, row in table.items():
        axis.scatter(row["trained_parameters"], row[metric], s=60)
        axis.annotate(method, (row["trained_parameters"], row[metric]), textcoords="offset points", xytext=(6, 4))
    axis.set(xscale="log", xlabel="parameters trained", ylabel=f"held-out {metric} (%)", ylim=(0, None),
             title="full fine-tuning, LoRA, prompt tuning")
    plt.close(figure)
    return figure


def em_against_parameters(sizes: dict, chance: float | None = None):
    """`capacity.size_sweep`'s table: held-out-people EM against the model's parameters (log
    scale), from 0, with a uniform guess's EM (`chance`) where given."""
    figure, axis = plt.subplots(figsize=(5.0, 3.4))
    rows = sorted(sizes.values(), key=lambda row: row["parameters"])
    axis.plot([row["parameters"] for row in rows], [row["em"] for row in rows], marker="o", label="fine-tuned")
    chance_line(axis, chance)
    questions = f" ({rows[0]['examples']:,} held-out questions)" if "examples" in rows[0] else ""
    axis.set(xscale="log", xlabel="parameters", ylabel="held-out-people EM (%)", ylim=(0, None),
             title=f"closed-book QA by model size{questions}")
    axis.legend()
    plt.close(figure)
    return figure


def bits_against_world(rows: list):
    """`capacity.capacity_grid`'s rows: the bits each width holds (mean over its seeds, bars one
    standard deviation) against the bits its world holds beyond its values' frequencies, one line
    per width; dotted, all of a world (what a model that memorised it perfectly holds); dashed,
    each width's law (`law_bits`: Allen-Zhu and Li's bits per parameter at these exposures). A
    line that levels off below the dotted one has saturated."""
    figure, axis = plt.subplots(figsize=(5.6, 3.8))
    worlds = sorted({row["beyond_frequencies"] for row in rows})
    axis.plot([0, worlds[-1]], [0, worlds[-1]], color="grey", linestyle=":", label="all the world holds")
    for width in sorted({row["width"] for row in rows}):
        own = sorted((row for row in rows if row["width"] == width), key=lambda row: row["people"])
        bars = axis.errorbar([row["beyond_frequencies"] for row in own], [row["stored_bits"] for row in own],
                             yerr=[row["stored_bits_sd"] for row in own], marker="o", capsize=3,
                             label=f"width {width} ({own[0]['parameters']:,} parameters)")
        if own[0]["law_bits"]:
            axis.axhline(own[0]["law_bits"], color=bars[0].get_color(), linestyle="--", linewidth=1,
                         label=f"width {width}: the law's bits")
    exposures = sorted({round(row["exposures"]) for row in rows})
    axis.set_ylim(0)
    axis.set(xlabel="bits the world holds (beyond its values' frequencies)", ylabel="bits the model holds",
             title=f"knowledge held after {', '.join(map(str, exposures))} exposures per fact\n"
                   f"({rows[0]['seeds']} seeds each: mean, one standard deviation)")
    axis.legend(fontsize="small")
    figure.tight_layout()
    plt.close(figure)
    return figure


def relative_position_buckets(config, span: int = 160):
    """The bucket of each offset key - query in [-span, span]: the encoder's (both directions)
    and the decoder's (the past only), as `config` sorts them."""
    offsets = np.arange(-span, span + 1)
    figure, axis = plt.subplots(figsize=(6.4, 3.2))
    for bidirectional, label in ((True, "encoder"), (False, "decoder")):
        buckets = relative_position_bucket(offsets, bidirectional, config.relative_attention_num_buckets,
                                           config.relative_attention_max_distance)
        axis.step(offsets, np.asarray(buckets), where="mid", label=label)
    axis.axvline(0, color="grey", linewidth=0.5)
    axis.set(xlabel="key position - query position", ylabel="bucket", title="relative position buckets")
    axis.legend(fontsize="small")
    plt.close(figure)
    return figure


def attention_masks(masks: dict):
    """Boolean masks [query, key] side by side, black where a query may attend to a key, white
    where it may not (on a fixed scale: a mask that allows everything is black all over), with
    a key to the two under the panels."""
    figure, axes = plt.subplots(1, len(masks), figsize=(4.0 * len(masks), 4.0), layout="constrained")
    for axis, (name, mask) in zip(np.atleast_1d(axes), masks.items()):
        axis.imshow(np.asarray(mask, dtype=float), cmap="Greys", vmin=0, vmax=1, interpolation="nearest", aspect="auto")
        axis.set(title=name, xlabel="key position", ylabel="query position")
    figure.legend([Patch(facecolor="black"), Patch(facecolor="white", edgecolor="grey")],
                  ["may attend (adds 0)", "masked (adds -1e10)"], loc="outside lower center", ncol=2, fontsize="small")
    plt.close(figure)
    return figure

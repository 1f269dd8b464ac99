import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from t5nb import plots  # noqa: E402
from t5nb.plots import LivePlot  # noqa: E402


def test_live_plot_keeps_every_logged_point_and_draws_each_metric():
    plot = LivePlot(("loss", "accuracy"), title="pretraining")
    for step, loss in ((50, 4.0), (100, 3.0), (150, 2.5)):
        plot(step, {"loss": loss, "accuracy": 1 / loss, "grad_norm": 1.0})
    assert plot.curves["loss"] == ([50, 100, 150], [4.0, 3.0, 2.5])
    x, y = plot.axes["loss"].lines[0].get_data()
    assert list(x) == [50, 100, 150] and list(y) == [4.0, 3.0, 2.5]
    assert plot.axes["accuracy"].get_title() == "accuracy"
    assert plot.axes["loss"].get_legend() is None  # one curve: no legend


def test_validation_metrics_draw_a_second_curve_on_the_same_axes():
    plot = LivePlot(("loss",))
    plot(50, {"loss": 4.0})
    plot(100, {"loss": 3.0})
    plot(100, {"validation/loss": 3.5, "validation/accuracy": 0.2})
    (train_x, train_y), (valid_x, valid_y) = (line.get_data() for line in plot.axes["loss"].lines)
    assert list(train_x) == [50, 100] and list(train_y) == [4.0, 3.0]
    assert list(valid_x) == [100] and list(valid_y) == [3.5]
    assert [text.get_text() for text in plot.axes["loss"].get_legend().get_texts()] == ["training", "validation"]


def test_the_decoded_panel_draws_each_task_metric_of_the_sample():
    plot = LivePlot(("loss",), decoded=True)
    plot(50, {"loss": 4.0})
    plot(50, {"validation/loss": 3.5, "validation/decoded/em": 10.0, "validation/decoded/f1": 12.0,
              "validation/decoded/nq/em": 9.0})  # a mixture's per-task metric: not drawn
    plot(100, {"validation/loss": 3.0, "validation/decoded/em": 40.0, "validation/decoded/f1": 45.0})
    lines = plot.axes["decoded"].lines
    assert [line.get_label() for line in lines] == ["em", "f1"]
    assert [list(line.get_data()[1]) for line in lines] == [[10.0, 40.0], [12.0, 45.0]]
    assert plot.axes["decoded"].get_title() == "decoded validation sample"
    sized = LivePlot(("loss",), decoded=64)
    sized(50, {"validation/decoded/em": 10.0})
    assert sized.axes["decoded"].get_title() == "decoded validation sample of 64"
    assert [text.get_text() for text in plot.axes["loss"].get_legend().get_texts()] == ["training", "validation"]


def test_attention_masks_are_drawn_on_a_fixed_scale_so_a_full_mask_is_dark():
    full, causal = np.ones((4, 4), bool), np.tri(4, dtype=bool)
    figure = plots.attention_masks({"full": full, "causal": causal})
    for axis, mask in zip(figure.axes, (full, causal)):
        image = axis.images[0]
        shade = image.to_rgba(image.get_array())[..., :3].mean(axis=-1)  # 0 black, 1 white
        assert (shade[mask] < 0.05).all() and (shade[~mask] > 0.95).all(), axis.get_title()


def test_token_length_histograms_fit_the_lengths_and_count_the_examples():
    """A feature length far beyond every example does not stretch the axis; it is named instead."""
    measured = {"inputs": np.array([10, 12, 12, 14]), "targets": np.array([2, 3, 2, 2])}
    figure = plots.token_lengths(measured, {"inputs": 128, "targets": 3}, "facts_qa")
    inputs, targets = figure.axes
    assert inputs.get_xlim() == (8.5, 15.5) and inputs.get_title() == "facts_qa: inputs, 4 examples"
    assert inputs.get_xlabel() == "tokens (feature length 128: beyond the longest, 14)" and not inputs.lines
    assert [line.get_xdata()[0] for line in targets.lines] == [3]  # within the lengths: drawn where it falls


def test_the_bits_plot_draws_each_width_against_its_worlds_beside_the_whole_world_and_its_law():
    rows = [{"people": people, "width": width, "parameters": parameters, "stored_bits": bits, "stored_bits_sd": 10.0,
             "beyond_frequencies": 22.2 * people, "law_bits": float(parameters), "exposures": 100.0, "seeds": 3}
            for width, parameters, people, bits in ((4, 10_916, 120, 200.0), (4, 10_916, 480, 1_000.0),
                                                    (8, 25_000, 120, 900.0), (8, 25_000, 480, 2_000.0))]
    axis = plots.bits_against_world(rows).axes[0]
    assert axis.get_ylim()[0] == 0
    labels = axis.get_legend_handles_labels()[1]
    assert labels == ["all the world holds", "width 4: the law's bits", "width 8: the law's bits",
                      "width 4 (10,916 parameters)", "width 8 (25,000 parameters)"]
    dashed = [line.get_ydata()[0] for line in axis.lines if line.get_linestyle() == "--"]
    assert dashed == [10_916, 25_000]  # 1 bit per parameter at 100 exposures
    assert axis.get_title() == "knowledge held after 100 exposures per fact\n(3 seeds each: mean, one standard deviation)"


def test_the_held_out_curves_say_how_many_examples_and_steps_each_point_is_on_beside_a_uniform_guess():
    curve = {"metric": "accuracy", "runs": {"50": {"pretrained": 30.0, "scratch": 2.0},
                                            "200": {"pretrained": 60.0, "scratch": 3.0}}, "examples": 1_200,
             "steps": 200, "chance": 3.7}
    axis = plots.sample_efficiency(curve, title="facts_slot_filling").axes[0]
    assert axis.get_title() == "facts_slot_filling\n200 steps a run, each point on 1,200 held-out examples"
    assert [list(line.get_xdata()) for line in axis.lines[:2]] == [[50, 200]] * 2
    assert list(axis.lines[2].get_ydata()) == [3.7, 3.7] and axis.get_legend_handles_labels()[1][2] == "uniform guess"
    assert len(plots.sample_efficiency({**curve, "chance": None}).axes[0].lines) == 2  # a task without one: no line
    sizes = {16: {"parameters": 100_000, "em": 5.0, "examples": 300}, 32: {"parameters": 300_000, "em": 20.0,
                                                                         "examples": 300}}
    axis = plots.em_against_parameters(sizes, chance=3.7).axes[0]
    assert axis.get_title() == "closed-book QA by model size (300 held-out questions)"
    assert list(axis.lines[0].get_ydata()) == [5.0, 20.0] and list(axis.lines[1].get_ydata()) == [3.7, 3.7]
    assert axis.get_ylim()[0] == 0


def test_the_tensorboard_still_puts_decoded_percentages_in_panels_of_their_own_with_one_legend_below():
    """A final inference_eval's accuracy (%) beside the curves' token accuracy (0 to 1) would
    flatten them: it gets its own panel; each run keeps its colour; the legend is the figure's."""
    runs = {"pretrained/train": [(25, {"loss": 2.0, "accuracy": 0.5}), (50, {"loss": 1.0, "accuracy": 0.8})],
            "pretrained/inference_eval/slots": [(50, {"accuracy": 87.5})],
            "scratch/train": [(25, {"loss": 2.5, "accuracy": 0.4}), (50, {"loss": 2.0, "accuracy": 0.5})]}
    figure = plots.logged_scalars(runs)
    loss, accuracy, decoded = figure.axes
    assert [axis.get_title() for axis in figure.axes] == ["loss", "accuracy", "accuracy of decoded answers (%)"]
    assert [line.get_label() for line in accuracy.get_lines()] == ["pretrained/train", "scratch/train"]
    assert [list(line.get_ydata()) for line in decoded.get_lines()] == [[87.5]]
    assert all(axis.get_legend() is None for axis in figure.axes) and len(figure.legends) == 1
    assert loss.get_lines()[1].get_color() == accuracy.get_lines()[1].get_color()
    assert [text.get_text() for text in figure.legends[0].get_texts()] == list(runs)
    assert len(plots.logged_scalars({"train": runs["scratch/train"]}).axes) == 2  # nothing decoded: no third panel


def test_the_attention_masks_say_which_shade_may_attend():
    figure = plots.attention_masks({"encoder": np.eye(4, dtype=bool)})
    assert [text.get_text() for text in figure.legends[0].get_texts()] == ["may attend (adds 0)", "masked (adds -1e10)"]


def test_metrics_by_checkpoint_are_drawn_on_0_to_100_named_as_papers_name_them():
    table = pd.DataFrame({"inference_eval/facts_qa/em": [86.0, 88.0], "inference_eval/facts_qa/f1": [87.0, 89.0],
                          "training_eval/facts_qa/loss": [0.5, 0.4]}, index=[100, 200])
    axis = plots.metrics_by_checkpoint(table, questions=2_000).axes[0]
    assert axis.get_legend_handles_labels()[1] == ["EM", "F1"] and axis.get_ylim() == (0, 100)
    assert list(axis.lines[0].get_xdata()) == [100, 200] and list(axis.lines[1].get_ydata()) == [87.0, 89.0]
    assert axis.get_title() == "held-out QA by checkpoint (2,000 questions)"
    assert plots.metrics_by_checkpoint(table).axes[0].get_title() == "held-out QA by checkpoint (all questions)"

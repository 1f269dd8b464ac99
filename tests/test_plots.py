import matplotlib

matplotlib.use("Agg")

from t5nb.plots import LivePlot  # noqa: E402


def test_live_plot_keeps_every_logged_point_and_draws_each_metric():
    plot = LivePlot(("loss", "accuracy"), title="pretraining")
    for step, loss in ((50, 4.0), (100, 3.0), (150, 2.5)):
        plot(step, {"loss": loss, "accuracy": 1 / loss, "grad_norm": 1.0})
    assert plot.steps == [50, 100, 150] and plot.values["loss"] == [4.0, 3.0, 2.5]
    x, y = plot.axes["loss"].lines[0].get_data()
    assert list(x) == [50, 100, 150] and list(y) == [4.0, 3.0, 2.5]
    assert plot.axes["accuracy"].get_title() == "accuracy"

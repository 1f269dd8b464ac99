"""A live training plot for notebooks (d2l's Animator, redrawn only at the loop's log points)."""
import matplotlib.pyplot as plt

from t5nb.train import VALIDATION


class LivePlot:
    """Curves of chosen metrics against step, training and validation on the same axes; pass
    it as `train(..., on_log=plot)`.

    The training loop calls it every `log_every` steps, and after each evaluation, with metrics
    already on the host, so plotting never adds a device sync. In a notebook the figure updates
    in place.
    """

    def __init__(self, metrics=("loss", "accuracy"), title: str | None = None, figsize_per_plot=(4.2, 3.0)):
        self.metrics = tuple(metrics)
        self.curves = {f"{prefix}{name}": ([], []) for name in self.metrics for prefix in ("", VALIDATION)}
        self.figure, axes = plt.subplots(1, len(self.metrics), squeeze=False,
                                         figsize=(figsize_per_plot[0] * len(self.metrics), figsize_per_plot[1]))
        self.axes = dict(zip(self.metrics, axes[0]))
        if title:
            self.figure.suptitle(title)
        self._handle = None
        plt.close(self.figure)  # shown through the display handle only, not twice

    def __call__(self, step: int, metrics: dict) -> None:
        for name, (steps, values) in self.curves.items():
            if name in metrics:
                steps.append(step)
                values.append(metrics[name])
        self.redraw()

    def redraw(self) -> None:
        for name, ax in self.axes.items():
            ax.clear()
            for label, prefix in (("training", ""), ("validation", VALIDATION)):
                steps, values = self.curves[prefix + name]
                if steps:
                    ax.plot(steps, values, marker="." if len(steps) < 30 else None, label=label)
            if self.curves[VALIDATION + name][0]:
                ax.legend()
            ax.set_xlabel("step")
            ax.set_title(name)
            ax.grid(alpha=0.3)
        self.figure.tight_layout()
        self._show()

    def _show(self) -> None:
        try:
            from IPython import get_ipython
            from IPython.display import display
        except ImportError:
            return
        if get_ipython() is None:  # a script: keep the figure, show nothing
            return
        if self._handle is None:
            self._handle = display(self.figure, display_id=True)
        else:
            self._handle.update(self.figure)

"""Notebook widgets: ask a trained model a question; TensorBoard inline."""
import atexit
import contextlib
import io
import os
import pathlib
import signal
import sys

import ipywidgets as widgets


class AskWidget:
    """A text box and a button; the answer of `predict([question])[0]` appears below.

    `predict` is any strings-in, strings-out callable, e.g. a `t5nb.decode.Predictor`.
    """

    def __init__(self, predict, placeholder: str = "Where was Ada Klimberg born?"):
        self.predict = predict
        self.question = widgets.Text(placeholder=placeholder, description="Question:",
                                     layout=widgets.Layout(width="32em"))
        self.button = widgets.Button(description="Ask", button_style="primary")
        self.answer = widgets.HTML()
        self.button.on_click(lambda _: self.ask())
        self.view = widgets.VBox([widgets.HBox([self.question, self.button]), self.answer])
        self.last, self.shown = None, None  # the last (question, answer); the display showing the widget

    def ask(self, question: str | None = None) -> str:
        """Answer `question` (default: the text box), show it and return it."""
        question = self.question.value if question is None else question
        self.question.value = question
        answer = self.predict([question or self.question.placeholder])[0]
        self.answer.value = f"<b>Answer:</b> {answer}"
        self.last = (question or self.question.placeholder, answer)
        if self.shown is not None:
            self.shown.update(self.mimebundle(), raw=True)
        return answer

    def mimebundle(self) -> dict:
        """The widget's view, and as text what it shows (the last question and its answer): a
        saved notebook without the widgets' state (GitHub, nbviewer) shows the text instead.
        The view is the widget message protocol's own reference to the model (version 2, which
        ipywidgets 7 and 8 both speak), not ipywidgets' `_repr_mimebundle_`, which 7 lacks."""
        text = "Question: {}\nAnswer: {}".format(*self.last) if self.last else "(a question box; nothing asked yet)"
        view = {"version_major": 2, "version_minor": 0, "model_id": self.view.model_id}
        return {"application/vnd.jupyter.widget-view+json": view, "text/plain": text}

    def _ipython_display_(self):
        from IPython.display import display  # optional: shown only in a notebook

        self.shown = display(self.mimebundle(), raw=True, display_id=True)


OFF = "T5NB_TENSORBOARD"  # "0": `tensorboard` starts no server


def tensorboard(*logdirs, height: int = 560) -> None:
    """TensorBoard inline on one or more run directories (runs named by their folder), in
    Colab and in Jupyter. Start it before training: its server rereads the logs every 5 s, even
    of runs that do not exist yet, and its page shows what they held when it loaded, until its
    ⟳ button (or "Reload data" in its settings) brings in the rest (TensorBoard 2.21, in
    Chromium); the still under it is redrawn after each cell that logs (the last call's only:
    any later call, a rerun of this cell or another cell's, takes over the redraw, and the
    earlier still keeps what it last showed). A server this call starts stops when the kernel
    exits; one already serving the same runs is reused.

    Where no one sees the notebook (headless runs: `make test` runs every notebook twice),
    `T5NB_TENSORBOARD=0` starts no server and prints the command that shows the runs: a server
    imports TensorFlow, 8 CPU s of a 2-core AMD EPYC, and the cell waits for it to listen."""
    paths = [pathlib.Path(logdir) for logdir in logdirs]
    where = (["--logdir", str(paths[0])] if len(paths) == 1 else
             ["--logdir_spec", ",".join(f"{path.name}:{path}" for path in paths)])
    command = " ".join(["tensorboard", *where])  # the same server, from a terminal
    if os.environ.get(OFF, "1") == "0":  # a run a line (a shell joins lines ended by a backslash)
        print(f"TensorBoard not started ({OFF}=0); this command shows these runs:\n"
              + command.replace(" --logdir_spec ", " --logdir_spec \\\n").replace(",", ",\\\n"))
        return
    from tensorboard import manager, notebook  # heavy, and only inline TensorBoard needs it

    tensorboard_command = pathlib.Path(sys.executable).with_name("tensorboard")  # the kernel's own
    if tensorboard_command.exists():
        os.environ.setdefault("TENSORBOARD_BINARY", str(tensorboard_command))
    forget_stopped_servers(manager)
    started = manager.start([*where, "--reload_interval", "5"])
    if not hasattr(started, "info"):  # failed or timed out: say why, the run goes on
        print(f"TensorBoard did not start ({type(started).__name__}: {started}); "
              f"run `{command}` in a terminal")
        return
    launched = isinstance(started, manager.StartLaunched)
    if launched:
        atexit.register(_stop, started.info.pid)
    with contextlib.redirect_stdout(io.StringIO()):  # TensorBoard's own line names every run's path in one
        notebook.display(port=started.info.port, height=height)
    print(f"TensorBoard on port {started.info.port} ({'started now' if launched else 'already serving them'}), "
          "its runs:" + "".join(f"\n  {path.name}" for path in paths))
    from IPython import get_ipython  # only a notebook shows the still

    if get_ipython() is not None:
        still = LoggedScalars(paths)
        still.place()
        _redraw_after_each_cell(get_ipython().events, still)


_REDRAWN = []  # the still whose redraw `tensorboard` registered last


def _redraw_after_each_cell(events, still) -> None:
    """`still` redrawn after each cell (IPython's `post_run_cell`), in place of the still of the
    call before, whichever cell made it."""
    for earlier in _REDRAWN:
        if earlier in events.callbacks["post_run_cell"]:
            events.unregister("post_run_cell", earlier)
    _REDRAWN[:] = [still]
    events.register("post_run_cell", still)


class LoggedScalars:
    """A still of TensorBoard's scalars under its frame: the frame stays blank in a saved notebook
    (or on GitHub) once its server has stopped with the kernel; this image of the runs' loss and
    accuracy is saved with it. Redrawn after each cell that wrote to the runs' events files
    (IPython's `post_run_cell`); a cell that wrote none costs a look at their sizes."""

    def __init__(self, logdirs: list):
        self.logdirs, self.seen, self.shown = [pathlib.Path(logdir) for logdir in logdirs], None, None

    def events_files(self) -> dict:
        """{events file: its size} under the runs, which grow as the runs log."""
        return {path: path.stat().st_size for logdir in self.logdirs
                for path in sorted(logdir.glob("**/events.out.tfevents.*"))}

    def runs(self) -> dict:
        """{label: [(step, {tag: value})]} of each folder of events files, labelled by its path
        under its run (TensorBoard's run names)."""
        from t5nb.event_logs import logged_steps  # imports TensorFlow: only once a run has logged

        folders = sorted({path.parent for path in self.seen})
        root = {folder: next(logdir for logdir in self.logdirs if folder.is_relative_to(logdir)) for folder in folders}
        label = {folder: str(folder.relative_to(root[folder].parent if len(self.logdirs) > 1 else root[folder]))
                 for folder in folders}
        return {label[folder]: logged_steps(folder) for folder in folders}

    def place(self) -> None:
        """Its place, under the frame: empty until a run has logged, then drawn there (a later
        cell's hook updates this display; one made there would land under that cell)."""
        from IPython.display import display  # in a notebook only

        self.shown = display({"text/plain": ""}, raw=True, display_id=True)
        self()

    def __call__(self, *_) -> None:
        files = self.events_files()
        if not files or files == self.seen:
            return
        from t5nb.plots import logged_scalars  # matplotlib and the training loop: only once a run has logged

        self.seen = files
        title = "TensorBoard's scalars as last logged (a still of the frame)"
        self.shown.update(logged_scalars(self.runs(), title=title))


def forget_stopped_servers(manager) -> None:
    """Remove the records TensorBoard keeps of servers whose process is gone (one killed with
    its kernel leaves its record behind): `manager.start` reuses any server its record says ran
    with the same arguments, without asking whether it still runs (TensorBoard 2.21), so a
    notebook run again would show a page no server serves."""
    for info in manager.get_all():
        try:
            os.kill(info.pid, 0)
        except ProcessLookupError:
            pathlib.Path(manager._get_info_dir(), f"pid-{info.pid}.info").unlink(missing_ok=True)
        except PermissionError:  # another user's server, running
            pass


def _stop(pid: int) -> None:
    """Stop a server this kernel started and wait for it to exit: TensorBoard tears TensorFlow
    down on its way out (2 s on an idle 2-core AMD EPYC, 6 s on a busy one), so the kernel
    leaves no server behind, however busy the machine. The kernel started it: it is its child."""
    try:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):  # gone already, or reaped by subprocess
        pass

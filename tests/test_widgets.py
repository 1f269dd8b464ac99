import os
import pathlib
import subprocess
import sys
import types

import pytest

from t5nb import widgets


def test_ask_widget_shows_the_answer_of_the_predictor():
    asked = []

    def predict(questions):
        asked.extend(questions)
        return [q.upper() for q in questions]

    widget = widgets.AskWidget(predict, placeholder="who?")
    assert widget.ask("where was ada born?") == "WHERE WAS ADA BORN?"
    assert "WHERE WAS ADA BORN?" in widget.answer.value
    widget.question.value = ""
    widget.button.click()  # an empty box asks the placeholder question
    assert asked == ["where was ada born?", "who?"] and "WHO?" in widget.answer.value


def test_ask_widget_is_saved_with_its_last_answer_as_text(monkeypatch):
    """A saved notebook without the widgets' state shows the text beside the widget's view."""
    from IPython import display

    shown = []

    class Handle:
        def update(self, bundle, raw):
            shown.append(bundle)

    monkeypatch.setattr(display, "display", lambda bundle, raw, display_id: shown.append(bundle) or Handle())
    widget = widgets.AskWidget(lambda questions: [q.upper() for q in questions], placeholder="who?")
    widget._ipython_display_()
    widget.ask("where was ada born?")
    assert [bundle["text/plain"] for bundle in shown] == [
        "(a question box; nothing asked yet)", "Question: where was ada born?\nAnswer: WHERE WAS ADA BORN?"]
    assert shown[-1]["application/vnd.jupyter.widget-view+json"]["model_id"] == widget.view.model_id


def test_tensorboards_still_plots_the_runs_logged_scalars_and_redraws_only_when_they_change(tmp_path, monkeypatch):
    """The image saved under TensorBoard's frame: placed there empty, each events folder a line,
    named as TensorBoard names its run; drawn when a run has logged, again only after its events
    files grew."""
    from IPython import display

    from t5nb.train import metric_writers  # clu's, TensorFlow imported first with accelerators hidden

    def log(folder, step, loss):
        writer = metric_writers.create_default_writer(str(folder))
        writer.write_scalars(step, {"loss": loss, "accuracy": 1 - loss})
        writer.flush()

    placed, shown = [], []

    class Handle:
        def update(self, figure):
            shown.append(figure)

    monkeypatch.setattr(display, "display", lambda bundle, raw, display_id: placed.append(bundle) or Handle())
    still = widgets.LoggedScalars([tmp_path / "pretrained", tmp_path / "scratch"])
    still.place()  # under TensorBoard's frame, where later cells' updates draw
    assert placed == [{"text/plain": ""}] and shown == []  # nothing logged yet
    log(tmp_path / "pretrained" / "train", 10, 0.5)
    log(tmp_path / "scratch" / "train", 10, 0.9)
    still()
    still()  # nothing new: not drawn again
    log(tmp_path / "pretrained" / "training_eval" / "qa", 20, 0.4)
    still()
    assert len(shown) == 2
    loss = shown[-1].axes[0]
    assert loss.get_title() == "loss" and [line.get_label() for line in loss.get_lines()] == [
        "pretrained/train", "pretrained/training_eval/qa", "scratch/train"]
    assert [list(line.get_ydata()) for line in loss.get_lines()] == [[0.5], [pytest.approx(0.4)], [pytest.approx(0.9)]]


def test_tensorboard_serves_the_run_and_stops_with_the_kernel(tmp_path):
    """In a process standing in for the kernel: the server it starts and shows answers for
    `logdir`, and is gone once that process has exited, which waits for the server's exit. Other
    servers may start meanwhile (the rehearsal's notebooks run beside the tests), so the server
    is the one on the shown port."""
    script = ("import json, urllib.request\nfrom tensorboard import manager, notebook\nfrom t5nb import widgets\n"
              "shown = []\nnotebook.display = lambda port, height: shown.append(port)  # the port it shows\n"
              f"widgets.tensorboard({str(tmp_path / 'a')!r}, {str(tmp_path / 'b')!r})\n"
              "info = next(info for info in manager.get_all() if info.port == shown[0])\n"
              "runs = json.load(urllib.request.urlopen(f'http://localhost:{info.port}/data/environment'))\n"
              "print(info.pid, runs['data_location'])\n")
    env = {name: value for name, value in os.environ.items() if name != widgets.OFF}  # `make test` sets it
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    pid, served = result.stdout.split()[-2:]
    assert served == f"a:{tmp_path / 'a'},b:{tmp_path / 'b'}"  # both runs, named by folder
    assert not pathlib.Path(f"/proc/{pid}").exists(), f"TensorBoard (pid {pid}) outlived its kernel"


def test_a_second_tensorboard_call_replaces_the_still_redrawn_after_each_cell(tmp_path, monkeypatch, capsys):
    """After two calls (the cell run again, or another cell's call), IPython's `post_run_cell`
    holds one still's redraw: the second call's, which draws where that call placed it; a hook
    of the user's stays. Each call says which runs the server shows, a run a line, in place of
    TensorBoard's own line of every path."""
    import IPython
    import tensorboard.notebook  # the module, where `from tensorboard import notebook` gives a lazy stand-in before
    from IPython import display
    from IPython.core.events import EventManager, available_events
    from tensorboard import manager

    def own(result):
        pass

    events = EventManager(shell=None, available_events=available_events)
    events.register("post_run_cell", own)
    monkeypatch.setattr(IPython, "get_ipython", lambda: types.SimpleNamespace(events=events))
    monkeypatch.delenv(widgets.OFF, raising=False)  # `make test` sets it
    monkeypatch.setenv("TENSORBOARD_BINARY", "tensorboard")  # what the call would otherwise set for the kernel
    monkeypatch.setattr(manager, "start", lambda *_: manager.StartReused(info=types.SimpleNamespace(port=6006)))
    monkeypatch.setattr(tensorboard.notebook, "display", lambda port, height: print("Selecting TensorBoard with ..."))
    placed = []
    monkeypatch.setattr(display, "display", lambda bundle, raw, display_id: placed.append(object()) or placed[-1])
    for _ in range(2):
        widgets.tensorboard(tmp_path / "run")
    stills = [hook for hook in events.callbacks["post_run_cell"] if isinstance(hook, widgets.LoggedScalars)]
    assert len(placed) == 2 and len(stills) == 1 and stills[0].shown is placed[1]
    assert own in events.callbacks["post_run_cell"]
    assert capsys.readouterr().out == "TensorBoard on port 6006 (already serving them), its runs:\n  run\n" * 2


def test_tensorboard_off_starts_no_server_and_prints_the_command_that_shows_the_runs(tmp_path, monkeypatch, capsys):
    from tensorboard import manager

    monkeypatch.setenv(widgets.OFF, "0")
    monkeypatch.setattr(manager, "start", lambda *args, **kwargs: pytest.fail("a server was started"))
    widgets.tensorboard(tmp_path / "a", tmp_path / "b")
    printed = capsys.readouterr().out
    assert printed == (f"TensorBoard not started (T5NB_TENSORBOARD=0); this command shows these runs:\n"
                       f"tensorboard --logdir_spec \\\na:{tmp_path / 'a'},\\\nb:{tmp_path / 'b'}\n")
    command = printed.split("\n", 1)[1]  # as a shell reads it, one line per run: the command the server gets
    assert subprocess.run(["bash", "-c", f"printf '%s|' {command}"], capture_output=True, text=True).stdout == \
        f"tensorboard|--logdir_spec|a:{tmp_path / 'a'},b:{tmp_path / 'b'}|"
    widgets.tensorboard(tmp_path / "a")
    assert capsys.readouterr().out.endswith(f"shows these runs:\ntensorboard --logdir {tmp_path / 'a'}\n")


def test_a_server_whose_process_is_gone_is_forgotten_before_starting_so_it_is_never_reused(tmp_path, monkeypatch):
    """TensorBoard reuses any server its records say ran with the same arguments; a record left
    by a server killed with its kernel would make a notebook run again show a page nobody serves."""
    from tensorboard import manager

    monkeypatch.setattr(manager, "_get_info_dir", lambda: str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    records = {}
    for pid in (int(gone.stdout), os.getpid()):  # a process that has exited, and one that runs
        info = manager.TensorBoardInfo(version="2.21.0", start_time=0, port=6006, pid=pid, path_prefix="",
                                       logdir=str(tmp_path / "run"), db="", cache_key="same arguments")
        records[pid] = tmp_path / f"pid-{pid}.info"
        records[pid].write_text(manager._info_to_string(info))
    widgets.forget_stopped_servers(manager)
    assert not records[int(gone.stdout)].exists() and records[os.getpid()].exists()
    assert [info.pid for info in manager.get_all()] == [os.getpid()]

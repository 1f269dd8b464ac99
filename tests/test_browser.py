"""The course as a learner sees it: JupyterLab from .venv (`make lab`, the README's command) and a
headless Chromium from the system's packages (Debian's `chromium`, driven by Playwright through
its executable path: no browser is downloaded). 02, 03 and 04 run under the `ci` profile through
the page, each by JupyterLab's own "Run All", and the page is checked as a person would look at
it: no error output; every progress bar drawn as a widget that ends full; each live training plot
an image that changes while it trains; TensorBoard's frame listing the runs' scalars once its ⟳
is clicked (04, with a server) or the command that shows them (02 and 03,
`T5NB_TENSORBOARD=0`); 04's question box answering a question typed into it; the outputs nbval
compares, as recorded. Screenshots of the checked cells go to runs/browser/<notebook>/.

Each notebook runs in run folders of its own, training what it needs, as when opened alone. Where
Chromium is installed, `make test` runs these in place of nbval's `ci` runs of the same
notebooks."""
import importlib.util
import json
import os
import pathlib
import re
import shutil
import time

import pytest

from t5nb.course import NOTEBOOKS
from local_server import jupyter_lab  # noqa: I001  (tests/local_server.py)

ROOT = NOTEBOOKS.parent
_spec = importlib.util.spec_from_file_location("record_outputs", ROOT / "scripts" / "record_outputs.py")
record_outputs = importlib.util.module_from_spec(_spec)  # which cells' outputs nbval compares
_spec.loader.exec_module(record_outputs)
CHROMIUM = pathlib.Path(os.environ.get("T5NB_CHROMIUM", "/usr/bin/chromium"))
# Chromium as root, in a closed network: no sandbox, no GPU, and none of its own connections
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
IN_BROWSER = ("02_pretraining", "03_finetuning", "04_closed_book_qa")
WITH_TENSORBOARD = "04_closed_book_qa"  # one notebook with a TensorBoard server; the others print its command
BAR_LINE = re.compile(r"(\d+)%\|.*\|\s*(\d+)/(\d+)")  # a closed bar's last line, as text: "train: 100%|███| 20/20 [..."

# What the page records as it runs: each progress bar's states (width and style, as drawn), each
# image output's successive pictures (a hash of each), by cell index, and the image outputs given a
# picture unlike their first while their cell ran (JupyterLab's execution state of the cell). A
# MutationObserver sees every change the widgets and JupyterLab make, however short-lived.
RECORDER = """() => {
  const cells = () => window.jupyterapp.shell.currentWidget.content.widgets;
  const cellOf = (el) => { const node = el.closest('.jp-Cell'); return cells().findIndex(c => c.node === node); };
  const ids = new WeakMap(); let next = 0;
  const id = (el) => { if (!ids.has(el)) ids.set(el, next++); return ids.get(el); };
  const hash = (text) => {
    let h = 0;
    for (let i = 0; i < text.length; i++) h = (h * 31 + text.charCodeAt(i)) | 0;
    return h;
  };
  const seen = window.t5nbSeen = {bars: {}, images: {}, redrawnRunning: {}};
  const scan = () => {
    for (const bar of document.querySelectorAll('.jp-Notebook .jp-OutputArea-output .progress-bar')) {
      const entry = seen.bars[id(bar)] ??= {cell: cellOf(bar), states: []};
      const state = [bar.style.width, bar.classList.contains('progress-bar-success')];
      if (JSON.stringify(entry.states.at(-1)) !== JSON.stringify(state)) entry.states.push(state);
    }
    for (const img of document.querySelectorAll('.jp-Notebook .jp-OutputArea-output img')) {
      const child = img.closest('.jp-OutputArea-child');
      const cell = cellOf(img);
      const key = cell + '/' + Array.from(child.parentNode.children).indexOf(child);
      const pictures = seen.images[key] ??= [];
      const picture = hash(img.src);
      if (pictures.at(-1) === picture) continue;
      pictures.push(picture);
      if (picture !== pictures[0] && cells()[cell]?.model.executionState === 'running') seen.redrawnRunning[key] = true;
    }
  };
  new MutationObserver(scan).observe(document.body, {subtree: true, childList: true, attributes: true,
                                                     attributeFilter: ['style', 'class', 'src']});
}"""
# Outputs cleared and counts reset, so that "every code cell has run" means this run.
CLEAR = """() => { for (const cell of window.jupyterapp.shell.currentWidget.content.widgets)
  if (cell.model.type === 'code') { cell.model.outputs.clear(); cell.model.executionCount = null; } }"""
PROGRESS = """() => { const panel = window.jupyterapp.shell.currentWidget;
  const code = panel.content.widgets.filter(c => c.model.type === 'code');
  const errors = code.flatMap(c => c.model.sharedModel.toJSON().outputs.filter(o => o.output_type === 'error')
                                      .map(o => `${o.ename}: ${o.evalue}`));
  const redrawn = Object.keys(window.t5nbSeen.redrawnRunning).map(key => parseInt(key));
  return {idle: panel.sessionContext.kernelDisplayStatus === 'idle', errors, redrawn,
          ran: code.filter(c => c.model.executionCount !== null).length, cells: code.length}; }"""
OUTPUTS = """() => window.jupyterapp.shell.currentWidget.content.widgets.map(c => ({
  type: c.model.type, source: c.model.sharedModel.getSource(),
  outputs: c.model.type === 'code' ? c.model.sharedModel.toJSON().outputs : []}))"""


@pytest.fixture
def browser():
    """Chromium, headless, from the system's packages, driven by Playwright; skipped where either
    is missing, except in CI, whose .ci/run installs Chromium and whose `make test` leaves 02-04 to
    this test wherever Chromium is installed."""
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"no Chromium at {CHROMIUM}: .ci/run installs Debian's chromium")
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium; or set T5NB_CHROMIUM)")
    try:
        from playwright import sync_api
    except ImportError as error:
        missing = (f"Chromium at {CHROMIUM} but no Playwright ({error}; requirements/test.lock installs it): "
                   "`make test` leaves 02-04 to this test, so they run nowhere")
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)
    with sync_api.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def run_in_page(browser, url: str, token: str, notebook: str, shots: pathlib.Path, timeout_s: int = 900):
    """Open `notebook` on the server at `url` (`token`), run all its cells through the page and wait
    for the last (a screenshot of the first plot redrawn while its cell ran, taken while the kernel
    still runs, in `shots`); returns the page, what it recorded and the notebook's cells as the page
    holds them."""
    page = browser.new_page(viewport={"width": 1100, "height": 1400})
    problems = []
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.goto(f"{url}/lab/tree/{notebook}.ipynb?token={token}&reset")
    page.wait_for_function("() => window.jupyterapp?.shell.currentWidget?.sessionContext?.kernelDisplayStatus"
                           " === 'idle'", timeout=180_000)
    page.evaluate("() => window.jupyterapp.shell.collapseLeft()")  # the notebook over the page's width
    page.evaluate(CLEAR)
    page.evaluate(RECORDER)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")  # not awaited: watched
    start, mid_training = time.monotonic(), None
    while True:
        state = page.evaluate(PROGRESS)
        assert not state["errors"], f"{notebook}: error output on the page: {state['errors']}"
        if state["idle"] and state["ran"] == state["cells"]:
            break
        if mid_training is None and state["redrawn"] and not state["idle"]:  # the first plot redrawn while it ran
            mid_training = state["redrawn"][0]
            shoot(page, mid_training, shots, "live_plot_while_training")
        assert time.monotonic() - start < timeout_s, f"{notebook}: {state['ran']} of {state['cells']} cells ran"
        page.wait_for_timeout(500)
    assert not problems, problems
    return page, page.evaluate("() => window.t5nbSeen"), page.evaluate(OUTPUTS)


def shoot(page, index: int, shots: pathlib.Path, name: str) -> None:
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.scroll_into_view_if_needed()
    cell.screenshot(path=str(shots / f"{index:02d}_{name}.png"))


def text_of(output: dict) -> str:
    if output["output_type"] == "stream":
        return "".join(output["text"])
    return "".join(output.get("data", {}).get("text/plain", ""))


def bars_drawn_as_widgets_ending_full(seen: dict, cells: list) -> dict:
    """{cell: its bars' last lines}: each bar the notebook closed (its display's last line, as
    text) was drawn as a widget in its cell while it ran, and the widget's last state was full,
    as the line says; asserts it, naming the cell."""
    bars = {}
    for index, cell in enumerate(cells):
        lines = [text_of(output) for output in cell["outputs"] if BAR_LINE.search(text_of(output))]
        if not lines:
            continue
        drawn = [entry["states"] for entry in seen["bars"].values() if entry["cell"] == index]
        assert len(drawn) >= len(lines), f"cell {index}: {len(lines)} bars closed, {len(drawn)} drawn as widgets"
        for line in lines:
            percent, done, total = map(int, BAR_LINE.search(line).groups())
            assert percent == 100 and done == total, f"cell {index}: a bar ended at {line!r}"
        for states in drawn:
            assert states[-1] == ["100%", True], f"cell {index}: a bar's widget ended at {states[-1]}, not full"
        bars[index] = lines
    assert bars, "no progress bar on the page"
    return bars


def plots_redrawn(seen: dict, cells: list) -> list:
    """The cells that made a live plot; in each, one image output was given a picture unlike its
    first while the cell still ran."""
    live = [index for index, cell in enumerate(cells) if "LivePlot(" in cell["source"]]
    assert live, "no live plot in the notebook"
    for index in live:
        drawn = [len(pictures) for key, pictures in seen["images"].items() if key.startswith(f"{index}/")]
        assert any(count > 1 for count in drawn), f"cell {index}: the live plot's pictures, {drawn}, never redrawn"
        assert any(key.startswith(f"{index}/") for key in seen["redrawnRunning"]), (
            f"cell {index}: the live plot's pictures, {drawn}, redrawn only once its cell had run")
    return live


@pytest.mark.parametrize("notebook", IN_BROWSER)
def test_notebook_in_a_browser_shows_what_it_promises(notebook, browser, tmp_path):
    runs = pathlib.Path(os.environ.get("T5NB_RUNS_DIR") or tmp_path) / "browser" / notebook  # its own, fresh:
    shutil.rmtree(runs, ignore_errors=True)  # it trains what it needs, as when opened alone
    env = {**os.environ, "T5NB_PROFILE": "ci", "T5NB_RUNS_DIR": str(runs), "HOME": str(tmp_path),
           "T5NB_TENSORBOARD": "1" if notebook == WITH_TENSORBOARD else "0"}
    shots = ROOT / "runs" / "browser" / notebook
    shutil.rmtree(shots, ignore_errors=True)
    shots.mkdir(parents=True)
    committed = (NOTEBOOKS / f"{notebook}.ipynb").read_bytes()
    with jupyter_lab(tmp_path, env) as (url, token):
        page, seen, cells = run_in_page(browser, url, token, notebook, shots)
        live = plots_redrawn(seen, cells)
        for index in bars_drawn_as_widgets_ending_full(seen, cells):
            shoot(page, index, shots, "live_plot" if index in live else "progress")
        board = next(index for index, cell in enumerate(cells) if "tensorboard(" in cell["source"])
        if notebook == WITH_TENSORBOARD:
            check_tensorboard_frame(page, board, shots)
        else:
            assert "this command shows these runs:\ntensorboard --logdir" in text_of(cells[board]["outputs"][0])
            shoot(page, board, shots, "tensorboard_command")
        if notebook == "04_closed_book_qa":
            check_ask_widget(page, cells, shots)
    for index, (cell, ran) in enumerate(zip(json.loads(committed)["cells"], cells)):
        if record_outputs.is_checked(cell):
            assert "".join(map(text_of, ran["outputs"])) == "".join(map(text_of, cell["outputs"])), f"cell {index}"
    assert (NOTEBOOKS / f"{notebook}.ipynb").read_bytes() == committed, "the page saved over the notebook"


def check_tensorboard_frame(page, index: int, shots: pathlib.Path) -> None:
    """TensorBoard's frame in cell `index` loaded and, once reloaded as a learner would (its ⟳
    button: the page shows the logs as they were when it loaded, here before any run had logged),
    lists the runs' scalars: a card for each of the training loop's loss and accuracy."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.scroll_into_view_if_needed()
    frame = cell.frame_locator("iframe")
    frame.get_by_text("TensorBoard", exact=True).first.wait_for(timeout=120_000)
    frame.locator("button[title^='Last Updated']").click()
    for tag in ("loss", "accuracy"):
        frame.get_by_text(tag, exact=True).first.wait_for(state="attached", timeout=120_000)
    shoot(page, index, shots, "tensorboard")


def check_ask_widget(page, cells: list, shots: pathlib.Path) -> None:
    """04's question box: one of the questions its cell asked, typed and sent with the button,
    shows the answer the cell printed for it, and the kernel heard it (the display's text)."""
    index = next(index for index, cell in enumerate(cells) if "AskWidget(" in cell["source"])
    printed = dict(line.rsplit(" -> ", 1) for line in text_of(cells[index]["outputs"][0]).splitlines()
                   if " -> " in line)
    question, answer = next(iter(printed.items()))
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".widget-text input").fill(question)
    cell.locator("button", has_text="Ask").click()
    expected = f"Question: {question}\nAnswer: {answer}"
    page.wait_for_function("([index, expected]) => window.jupyterapp.shell.currentWidget.content.widgets[index].model"
                           ".sharedModel.toJSON().outputs.some(o => o.data?.['text/plain'] === expected)",
                           arg=[index, expected], timeout=120_000)
    assert cell.locator(".widget-html").inner_text().strip() == f"Answer: {answer}".strip()
    shoot(page, index, shots, "ask")


def test_the_checks_fail_without_the_widgets_front_end_and_for_a_plot_never_redrawn(browser, tmp_path):
    """The same checks on a page that breaks both promises: JupyterLab with the widgets' front end
    disabled (`@jupyter-widgets/jupyterlab-manager`, as if jupyterlab_widgets were not installed),
    and a live plot whose display is not updated after its first picture."""
    probe = tmp_path / "notebooks"
    probe.mkdir()
    sources = ["from t5nb.train import progress_bar\nbar = progress_bar(total=3, desc='train')\n"
               "for _ in range(3):\n    bar.update(1)\nbar.close()",
               "from t5nb.plots import LivePlot\nplot = LivePlot(('loss',))\nplot(1, {'loss': 2.0})\n"
               "plot._handle.update = lambda figure: None  # the picture stays as first drawn\nplot(2, {'loss': 1.0})"]
    (probe / "probe.ipynb").write_text(json.dumps({
        "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": source, "outputs": [],
                   "execution_count": None} for i, source in enumerate(sources)],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}))
    config = tmp_path / "config" / "labconfig"
    config.mkdir(parents=True)
    (config / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyter-widgets/jupyterlab-manager": True}}))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config.parent), "HOME": str(tmp_path)}
    with jupyter_lab(tmp_path, env, root=probe) as (url, token):
        page, seen, cells = run_in_page(browser, url, token, "probe", tmp_path)
    with pytest.raises(AssertionError, match="1 bars closed, 0 drawn as widgets"):
        bars_drawn_as_widgets_ending_full(seen, cells)
    with pytest.raises(AssertionError, match="never redrawn"):
        plots_redrawn(seen, cells)


def test_make_test_leaves_to_the_browser_exactly_these_notebooks():
    """Where Chromium is installed, `make test` runs nbval on the other notebooks only."""
    listed = re.search(r"foreach notebook,([^,]+),", (ROOT / "Makefile").read_text()).group(1).split()
    assert tuple(listed) == IN_BROWSER

"""The course notebooks: each with its own Open-in-Colab badge, committed without outputs except
the deterministic ones nbval compares."""
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import nbformat
import pytest

from t5nb.course import NOTEBOOKS, run_course

_spec = importlib.util.spec_from_file_location("record_outputs", NOTEBOOKS.parent / "scripts" / "record_outputs.py")
record_outputs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record_outputs)

PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))


def test_the_course_starts_with_setup():
    assert PATHS and PATHS[0].name == "00_setup.ipynb"


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_notebook_has_colab_badge_and_outputs_only_where_nbval_checks_them(path):
    nb = json.loads(path.read_text())
    badge = f"colab.research.google.com/github/t5nb/t5nb/blob/main/notebooks/{path.name}"
    assert badge in "".join(nb["cells"][0]["source"])
    for index, cell in enumerate(nb["cells"]):
        assert cell.get("id"), f"{path.name} cell {index} has no id"
        if cell["cell_type"] != "code":
            continue
        if record_outputs.is_checked(cell):  # run by scripts/record_outputs.py: a reference to compare
            assert cell["outputs"] and cell["execution_count"], f"{path.name} cell {index}: record its outputs"
        else:
            assert cell["outputs"] == [] and cell["execution_count"] is None, f"{path.name} cell {index}"


def test_at_least_ten_cells_have_outputs_that_nbval_compares():
    checked = [cell for path in PATHS for cell in json.loads(path.read_text())["cells"] if record_outputs.is_checked(cell)]
    assert len(checked) >= 10


def test_a_changed_output_fails_nbval(tmp_path):
    """The committed outputs are a reference: nbval fails a notebook whose checked cell prints
    something else (here 00_setup's model sizes, with one digit changed)."""
    nb = json.loads((NOTEBOOKS / "00_setup.ipynb").read_text())
    cell = next(cell for cell in nb["cells"] if record_outputs.is_checked(cell) and "PRESETS" in "".join(cell["source"]))
    lines = cell["outputs"][0]["text"]
    lines[1] = lines[1].replace("60.5 M", "60.6 M")
    (tmp_path / "00_setup.ipynb").write_text(json.dumps(nb, indent=1))
    env = {**os.environ, "T5NB_PROFILE": "ci", "T5NB_RUNS_DIR": str(tmp_path / "runs")}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                             "--nbval-current-env", tmp_path / "00_setup.ipynb"],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "1 failed" in result.stdout and "60.6 M" in result.stdout and "60.5 M" in result.stdout


def test_run_course_writes_notebook_log_and_results_even_on_failure(tmp_path, capfd):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("print('hello from the kernel')"),
        nbformat.v4.new_code_cell("raise RuntimeError('boom')"),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    (tmp_path / "nb").mkdir()
    nbformat.write(nb, tmp_path / "nb" / "00_demo.ipynb")
    results = run_course(tmp_path / "runs", notebooks_dir=tmp_path / "nb")
    assert results["00_demo"]["ok"] is False and "boom" in results["00_demo"]["error"]
    assert "hello from the kernel" in (tmp_path / "runs" / "00_demo.log").read_text()
    assert json.loads((tmp_path / "runs" / "results.json").read_text()) == results
    assert (tmp_path / "runs" / "00_demo.ipynb").exists()
    printed = capfd.readouterr()
    assert "WARNING" not in printed.out + printed.err, printed  # the kernel starts quietly (no unencrypted-TCP warning)
    assert not _kernels_of(os.getpid())  # and is shut down when its notebook ends


def test_a_training_bar_is_saved_as_it_ended_showing_the_steps_over_the_time_they_took(tmp_path):
    """tqdm's widget is saved in the state it was first shown in unless its display is updated:
    `train`'s bar is updated when it closes, so the notebook and its log keep its last line. The
    loop's steps return at dispatch and it waits at log points: a bar updated in bursts that way
    ends showing within 20% of steps / elapsed (tqdm's default smoothing, a moving average that
    the saved line kept, showed 24% above it here, and 2 to 5 times the true rate in the course)."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import time\nfrom t5nb.train import progress_bar\n"
        "bar, start = progress_bar(total=100, initial=0, desc='train', unit='step'), time.perf_counter()\n"
        "for step in range(1, 101):\n    time.sleep(0.01)  # dispatching a step\n    bar.update(1)\n"
        "    if step % 25 == 0:\n        time.sleep(1.5)  # the log point waits for the device\n"
        "bar.close()\nprint(f'true rate {100 / (time.perf_counter() - start):.3f}')")],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    (tmp_path / "nb").mkdir()
    nbformat.write(nb, tmp_path / "nb" / "00_bar.ipynb")
    assert run_course(tmp_path / "runs", notebooks_dir=tmp_path / "nb")["00_bar"]["ok"]
    log = (tmp_path / "runs" / "00_bar.log").read_text()
    assert "train: 100%" in log and " 0%" not in log, log
    shown = float(re.findall(r"train: 100%.*?([\d.]+)step/s", log)[-1])
    true = float(re.search(r"true rate ([\d.]+)", log).group(1))
    assert abs(shown / true - 1) <= 0.2, log


def _kernels_of(pid: int) -> list[str]:
    """The ipykernel processes whose parent is `pid` (from /proc)."""
    kernels = []
    for process in pathlib.Path("/proc").glob("[0-9]*"):
        try:
            status, command = (process / "status").read_text(), (process / "cmdline").read_bytes()
        except OSError:  # ended meanwhile
            continue
        if f"PPid:\t{pid}\n" in status and b"ipykernel" in command:
            kernels.append(process.name)
    return kernels


def test_every_notebook_has_exercises_with_a_hidden_solution_and_a_check():
    from t5nb.exercises import EXERCISES

    checked, predicted = [], []
    for path in PATHS:
        cells = [cell for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "code"]
        sources = ["".join(cell["source"]) for cell in cells]
        names = re.findall(r'check\("(\d\d\.\d)"', "\n".join(sources))
        assert len(names) >= 2 and all(name.startswith(path.name[:2]) for name in names), path.name
        for name in names:
            at = next(i for i, source in enumerate(sources) if f'check("{name}"' in source)
            assert sources[at - 2].startswith(f"# Exercise {name}:") and sources[at - 2].endswith("answer = ...")
            assert cells[at - 1]["metadata"] == {"cellView": "form", "jupyter": {"source_hidden": True}}
            assert "if answer is ...:" in sources[at - 1]  # the solution: CI runs it, a reader's answer stays
            if EXERCISES[name].precision:  # a numeric exercise says how precise an answer it wants
                asked = re.sub(r"\n#\s*", " ", sources[at - 2])  # the comment's lines as one
                assert EXERCISES[name].precision.text in asked, (name, EXERCISES[name].precision.text)
        checked += names
        predicted += [name for name in names if f"# Exercise {name}: Predict, then verify" in "\n".join(sources)]
    assert sorted(checked) == sorted(EXERCISES)
    assert len(predicted) >= 8, predicted  # predict, then verify: most of the course's exercises


# Prose true under every profile. Notebooks 02 to 05 train on the profile's world: the facts
# world (`cpu`, `ci`) or real data (`accelerator`, `fp32-gpu`). A paragraph about one world
# starts with its label, naming the profiles it holds for; a cell with one world's paragraph
# holds the other's too. (01 and 06 show the facts world under every profile.)
WORLD_LABELS = {"facts": "**Facts world**", "real": "**Real data**"}
FACTS_PHRASES = re.compile(r"facts world|made-up|corruption and salient span masking|fact hidden in|facts\.jsonl|held-out people|held-out person|training people|slot filling|"
                           r"birth (city|year)|\bperson\b|\bpeople\b|" + "|".join(sorted({
                               json.loads(line)["entity"] for line in (NOTEBOOKS.parent / "data" / "facts.jsonl")
                               .read_text().splitlines()})), re.IGNORECASE)
TRAINING_ON_THE_PROFILE = [p for p in PATHS if p.name[:2] in ("02", "03", "04", "05")]


def world_label(world: str) -> str:
    """`**Facts world** (`cpu`, `ci`):`: the label and the setup cell's choices of that world."""
    from t5nb.profiles import CHOICES, PROFILES

    names = [n for n in CHOICES if n in PROFILES and (PROFILES[n].vocabulary == "facts") == (world == "facts")]
    return f"{WORLD_LABELS[world]} ({', '.join(f'`{n}`' for n in names)}):"


@pytest.mark.parametrize("path", TRAINING_ON_THE_PROFILE, ids=[p.stem for p in TRAINING_ON_THE_PROFILE])
def test_prose_about_one_world_is_labelled_and_has_a_version_for_the_other(path):
    labels = {world: world_label(world) for world in WORLD_LABELS}
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", "".join(cell["source"])) if p.strip()]
        worlds = set()
        for paragraph in paragraphs:
            world = next((w for w, label in labels.items() if paragraph.startswith(label)), None)
            if world is None:
                for w, bold in WORLD_LABELS.items():
                    assert not paragraph.startswith(bold), (
                        f"{path.name} cell {index}: label it exactly {labels[w]!r}: {paragraph[:80]!r}")
                claim = FACTS_PHRASES.search(paragraph)
                assert claim is None, (f"{path.name} cell {index}: {claim[0]!r} is about the facts world; start "
                                       f"the paragraph with {labels['facts']!r}: {paragraph[:100]!r}")
            worlds.add(world)
        if "facts" in worlds or "real" in worlds:
            assert {"facts", "real"} <= worlds, f"{path.name} cell {index}: a version for each world"

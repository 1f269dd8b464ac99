"""The course notebooks: committed clean, each with its own Open-in-Colab badge."""
import json
import pathlib

import nbformat
import pytest

from t5nb.course import NOTEBOOKS, run_course

PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))


def test_the_course_starts_with_setup():
    assert PATHS and PATHS[0].name == "00_setup.ipynb"


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_notebook_has_colab_badge_and_no_outputs(path):
    nb = json.loads(path.read_text())
    badge = f"colab.research.google.com/github/t5nb/t5nb/blob/main/notebooks/{path.name}"
    assert badge in "".join(nb["cells"][0]["source"])
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, path.name


def test_run_course_writes_notebook_log_and_results_even_on_failure(tmp_path):
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

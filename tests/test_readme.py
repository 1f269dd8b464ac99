"""The README's course numbers are those of the last measured `make course` (docs/course_results.json)."""
import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("course_table", ROOT / "scripts" / "course_table.py")
course_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(course_table)


def test_readme_course_table_is_the_recorded_course():
    results = json.loads(course_table.RECORD.read_text())
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme == course_table.render(readme, results), \
        "README.md's course table differs from docs/course_results.json: run `python scripts/course_table.py`"
    assert all(entry["ok"] for entry in results.values()), "the recorded course has a failed notebook"
    assert set(results) == {path.stem for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}


def test_the_table_reads_every_number_from_the_results():
    results = json.loads(course_table.RECORD.read_text())
    results["04_closed_book_qa"]["pretrained"]["em"] = 12.34
    results["02_pretraining"]["wall_s"] += 60
    rows = course_table.table(results)
    assert "**12.3%** from the pretrained model" in rows
    assert f"| `02_pretraining` | {results['02_pretraining']['wall_s']:.0f} s |" in rows

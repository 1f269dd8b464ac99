"""`t5nb course`'s results file: a run of some notebooks updates theirs and keeps the others'."""
import json

from t5nb import course


def test_running_one_notebook_again_updates_its_results_and_keeps_the_others(tmp_path, monkeypatch):
    names = ["00_setup", "01_data", "05_evaluation", "06_capacity"]
    (tmp_path / "nb").mkdir()
    for name in names:
        (tmp_path / "nb" / f"{name}.ipynb").write_text("{}")
    runs = iter(range(1, 100))
    monkeypatch.setattr(course, "run_notebook", lambda path, out_dir: {"wall_s": float(next(runs)), "ok": True, "error": None})

    everything = course.run_course(tmp_path / "runs", notebooks_dir=tmp_path / "nb")
    assert [row["wall_s"] for row in everything.values()] == [1.0, 2.0, 3.0, 4.0]
    again = course.run_course(tmp_path / "runs", names=["05_evaluation"], notebooks_dir=tmp_path / "nb")
    assert again == {"05_evaluation": {"wall_s": 5.0, "ok": True, "error": None}}  # what this run ran
    results = json.loads((tmp_path / "runs" / "results.json").read_text())
    assert list(results) == names  # every notebook, in the course's order
    assert results == {**everything, **again}


def test_merged_results_take_the_latest_of_each_notebook_in_course_order():
    earlier = {"00_setup": {"wall_s": 1}, "03_finetune": {"wall_s": 3}}
    assert course.merged_results(earlier, {"01_data": {"wall_s": 2}, "03_finetune": {"wall_s": 4}}) == {
        "00_setup": {"wall_s": 1}, "01_data": {"wall_s": 2}, "03_finetune": {"wall_s": 4}}
    assert list(course.merged_results(earlier, {"01_data": {}})) == ["00_setup", "01_data", "03_finetune"]

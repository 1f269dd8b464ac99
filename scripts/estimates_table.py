"""The accelerator course's estimated times and memory, from bench/accelerator_estimates.py's result.

    python scripts/estimates_table.py    # after bench/accelerator_estimates.py

rewrites, from bench/results/accelerator_estimates.json, the table between the `estimates-table`
markers of docs/accelerators.md (every setup, by notebook) and the one between the `chip-table`
markers of README.md (each setup's profile and course time). tests/test_readme.py fails when a
table and the JSON disagree. It reads only each setup's `profile`, `dtype`,
`minutes`, `with_02s_run`, `compile_minutes`, `memory_gb`, `fits_in_memory` and its notebooks'
`minutes`. The minutes are each notebook's in a
runtime of its own, as Colab and Kaggle open them (no run of notebook 02 found); `with_02s_run`,
the course's with 02's run found, as in one runtime or with runs kept on Drive.
"""
import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORD = ROOT / "bench" / "results" / "accelerator_estimates.json"


def _notebooks(result: dict) -> list[str]:
    """The notebooks the estimate covers, in order (e.g. 02_pretraining ... 05_evaluation)."""
    return list(next(iter(result["setups"].values()))["notebooks"])


def span(result: dict) -> str:
    """`00-06`: the first and last notebook the estimate covers."""
    names = _notebooks(result)
    return f"{names[0][:2]}-{names[-1][:2]}"


def table(result: dict) -> str:
    """docs/accelerators.md's table: a row per setup, minutes per notebook."""
    names = _notebooks(result)
    lines = ["| setup | profile | dtype | " + " | ".join(f"{name[:2]} min" for name in names)
             + " | **course min** | of it compiling | course min, 02's run found | GB per chip |",
             "|---|---|---|" + "---:|" * len(names) + "---:|---:|---:|---:|"]
    for name, row in result["setups"].items():
        minutes = " | ".join(f"{row['notebooks'][notebook]['minutes']:.1f}" for notebook in names)
        lines.append(f"| {name} | `{row['profile']}` | {row['dtype']} | {minutes} | "
                     f"**{row['minutes']:.0f}** | {row['compile_minutes']:.0f} | {row['with_02s_run']:.0f} | "
                     f"{row['memory_gb']:.1f}{'' if row['fits_in_memory'] else ' (too much)'} |")
    return "\n".join(lines)


def chip_table(result: dict) -> str:
    """README.md's table: a row per setup, its profile, estimated course time, its longest notebook
    and, of the course, the first run's compiling."""
    lines = [f"| setup | profile | compute dtype | notebooks {span(result)}, each in a runtime of its own | "
             "longest notebook | of it compiling | 02's run found |",
             "|---|---|---|---:|---:|---:|---:|"]
    for name, row in result["setups"].items():
        longest = max(row["notebooks"], key=lambda notebook: row["notebooks"][notebook]["minutes"])
        lines.append(f"| {name} | `{row['profile']}` | {row['dtype']} | {row['minutes']:.0f} min, estimated"
                     f"{'' if row['fits_in_memory'] else ' (does not fit its memory)'} | "
                     f"{longest[:2]}: {row['notebooks'][longest]['minutes']:.0f} min | "
                     f"{row['compile_minutes']:.0f} min | {row['with_02s_run']:.0f} min |")
    return "\n".join(lines)


# file -> (marker name, what writes its table)
BLOCKS = {"docs/accelerators.md": ("estimates-table", table), "README.md": ("chip-table", chip_table)}


def render(text: str, marker: str, body: str) -> str:
    """`text` with what stands between its `marker` comments replaced by `body`."""
    start, end = f"<!-- {marker}: written by scripts/estimates_table.py -->", f"<!-- /{marker} -->"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"no {start} ... {end} block")
    return pattern.sub(lambda _: f"{start}\n{body}\n{end}", text)


def rendered(root: pathlib.Path = ROOT, result: dict | None = None) -> dict[pathlib.Path, str]:
    """{file: its text with its table written from `result` (default: the committed JSON)}."""
    result = result or json.loads(RECORD.read_text())
    return {root / name: render((root / name).read_text(encoding="utf-8"), marker, write(result))
            for name, (marker, write) in BLOCKS.items()}


if __name__ == "__main__":
    for path, text in rendered().items():
        if path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"updated {path.relative_to(ROOT)}")

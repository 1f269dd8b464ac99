"""Store the outputs nbval compares: run the notebooks with the `ci` profile and keep the outputs
of the cells tagged `nbval-check-output` only (a cell tag, which nbval reads and a learner
does not see); every other cell stays without outputs.

    python scripts/record_outputs.py [NOTEBOOK ...]    # default: every notebook

Tag only cells whose output is the same on every machine and under every profile (the CI runs
nbval under `ci` and under `rehearsal`): vocabulary pieces, shapes, parameter counts, previews
of the facts tasks. Run this after changing a tagged cell and read the diff: it is what CI will
hold the notebook to (tests/test_notebooks.py checks that every tagged cell has an output).
"""
import json
import os
import pathlib
import sys
import tempfile

import nbclient
import nbformat

from t5nb.course import quiet_kernel

ROOT = pathlib.Path(__file__).resolve().parents[1]
TAG = "nbval-check-output"


def is_checked(cell: dict) -> bool:
    return cell["cell_type"] == "code" and TAG in cell.get("metadata", {}).get("tags", [])


def _plain(outputs) -> list[dict]:
    """nbformat outputs as notebook JSON, consecutive streams of one name joined, no counters."""
    plain = []
    for output in json.loads(json.dumps(outputs)):
        if output.get("output_type") == "execute_result":
            output["execution_count"] = None
        if plain and output["output_type"] == "stream" and plain[-1]["output_type"] == "stream" \
                and plain[-1]["name"] == output["name"]:
            plain[-1]["text"] += output["text"]
        else:
            plain.append(output)
    for output in plain:
        if output["output_type"] == "stream":
            output["text"] = output["text"].splitlines(keepends=True)
    return plain


def record(path: pathlib.Path) -> None:
    executed = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as runs:
        os.environ.update(T5NB_PROFILE="ci", T5NB_RUNS_DIR=runs)  # the kernel inherits them
        with quiet_kernel() as kernel:
            nbclient.NotebookClient(executed, km=kernel, timeout=1800,
                                    resources={"metadata": {"path": str(path.parent)}}).execute()
    notebook = json.loads(path.read_text(encoding="utf-8"))
    for cell, ran in zip(notebook["cells"], executed.cells):
        if cell["cell_type"] == "code":  # nbval compares a cell with outputs only if it was run
            checked = is_checked(cell)
            cell["outputs"] = _plain(ran.outputs) if checked else []
            cell["execution_count"] = ran.execution_count if checked else None
    path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    paths = [pathlib.Path(p).resolve() for p in sys.argv[1:]] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    for path in paths:
        record(path)
        print(f"recorded {path.name}")

"""Run the course headless: execute each notebook in a fresh kernel, save it and its log."""
import contextlib
import json
import os
import pathlib
import shutil
import tempfile
import time

import nbclient
import nbformat
from jupyter_client.manager import KernelManager
from tqdm.auto import tqdm

from t5nb.files import write_atomically
from t5nb.paths import REPO_ROOT
from t5nb.profiles import get_profile

NOTEBOOKS = REPO_ROOT / "notebooks"


def notebook_log(nb) -> str:
    """The text a reader would see: every stream, result and error output, cell by cell."""
    lines = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                lines.append(output.text)
            elif output.output_type in ("execute_result", "display_data"):
                lines.append(output.get("data", {}).get("text/plain", "") + "\n")
            elif output.output_type == "error":
                lines.append(f"[cell {index}] {output.ename}: {output.evalue}\n")
    return "".join(lines)


@contextlib.contextmanager
def quiet_kernel():
    """A python3 kernel's manager over local sockets (ipc): over TCP, nbclient's default, every
    kernel warns that its traffic is unencrypted. The kernel a client starts with it is shut
    down on leaving (nbclient shuts down only the kernels of managers it made)."""
    with tempfile.TemporaryDirectory(prefix="t5nb-kernel-") as sockets:
        kernel = KernelManager(kernel_name="python3", transport="ipc", ip=str(pathlib.Path(sockets) / "kernel"))
        try:
            yield kernel
        finally:
            if kernel.has_kernel:
                kernel.shutdown_kernel(now=True)


def run_notebook(path: pathlib.Path, out_dir: pathlib.Path, timeout: int = 3600) -> dict:
    """Execute one notebook; write `<out_dir>/<name>.ipynb` and `.log` even when it fails."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    error = None
    with quiet_kernel() as kernel:
        client = nbclient.NotebookClient(nb, km=kernel, timeout=timeout,
                                         resources={"metadata": {"path": str(path.parent)}})
        try:
            client.execute()
        except nbclient.exceptions.CellExecutionError as exc:
            error = str(exc).strip().splitlines()[-1]
    wall_s = time.perf_counter() - start
    nbformat.write(nb, out_dir / path.name)
    (out_dir / path.with_suffix(".log").name).write_text(notebook_log(nb))
    return {"wall_s": round(wall_s, 1), "ok": error is None, "error": error}


def merged_results(earlier: dict, latest: dict) -> dict:
    """`results.json` after a run: the notebooks it ran with their latest results, the others
    with those they had, in the course's order."""
    return dict(sorted({**earlier, **latest}.items()))


def run_course(out_dir="runs", names=None, notebooks_dir=NOTEBOOKS, fresh: bool = False) -> dict:
    """Run every notebook (or those in `names`) in order; returns their results, which update
    `<out_dir>/results.json` (a notebook not run keeps its entry there).

    The notebooks' training runs go to `<out_dir>/<profile>/` too; `fresh` deletes that folder
    first, so the course trains from scratch instead of reusing finished runs.
    """
    out_dir = pathlib.Path(out_dir).resolve()
    os.environ["T5NB_RUNS_DIR"] = str(out_dir)  # the kernels inherit it (t5nb.workflow.runs_dir)
    if fresh:
        shutil.rmtree(out_dir / get_profile().name, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = sorted(pathlib.Path(notebooks_dir).glob("[0-9][0-9]_*.ipynb"))
    if names:
        paths = [p for p in paths if p.stem in names or p.name in names]
    results_file = out_dir / "results.json"
    earlier = json.loads(results_file.read_text()) if results_file.exists() else {}
    results = {}
    for path in tqdm(paths, desc="course", unit="notebook"):
        headline = out_dir / "headlines" / f"{path.stem}.json"  # system.record_headline writes it
        headline.unlink(missing_ok=True)
        os.environ["T5NB_NOTEBOOK"] = path.stem  # the kernel's workflow calls record its headline
        results[path.stem] = run_notebook(path, out_dir)
        if headline.exists():
            results[path.stem].update(json.loads(headline.read_text()))
        status = "ok" if results[path.stem]["ok"] else f"FAILED: {results[path.stem]['error']}"
        tqdm.write(f"{path.stem}: {results[path.stem]['wall_s']} s, {status}")
        write_atomically(results_file, json.dumps(merged_results(earlier, results), indent=2) + "\n")
    return results

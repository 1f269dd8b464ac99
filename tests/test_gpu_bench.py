"""bench/gpu.py's plan, dry: its phases in order (t5nb first, each transformers phase after the
t5nb one it compares with, `torch.compile` last), the headline's first phases sure to fit the
deadline, and a call past its deadline skipping each phase, saying so. Nothing is compiled and
neither torch nor transformers is needed: the plan runs nothing."""
import json
import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"
HEADLINE = ["train-small", "hf-train-small", "decode", "hf-decode"]  # sure to run, in this order


@pytest.fixture
def gpu(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu

    return gpu


@pytest.mark.parametrize("quick", [False, True])
def test_the_plan_runs_t5nb_first_and_torch_compile_last(gpu, quick):
    from programs import PROGRAMS

    phases = gpu.plan(quick, with_torch_compile=True)
    names = [phase.name for phase in phases]
    assert names[:len(HEADLINE)] == HEADLINE and phases[0].framework == "t5nb"
    for i, phase in enumerate(phases):
        if phase.framework == "transformers":  # what it is compared with ran before it
            assert phase.needs in names[:i] and phases[names.index(phase.needs)].framework == "t5nb", phase.name
    assert names[-1] == "hf-compile-small" and "hf-compile-small" not in [p.name for p in gpu.plan(quick)]
    caps = [phase.settings["program"] for phase in phases if phase.kind == "cap"]
    assert caps == list(PROGRAMS) * (1 if quick else 2)
    assert [phase.name for phase in phases if phase.keep_freed_memory] == ["train-small-freed-memory-kept"]


@pytest.mark.parametrize("quick, minutes", [(False, 8), (True, 3)])
def test_the_headline_fits_the_deadline(gpu, quick, minutes):
    deadline = gpu.DEADLINE_S[quick]
    assert deadline <= minutes * 60
    rows = gpu.schedule(gpu.plan(quick), deadline)
    assert [phase.name for phase, _, sure in rows if sure][:len(HEADLINE)] == HEADLINE
    assert all(phase.timeout_s <= deadline for phase, _, _ in rows)
    assert [end for _, end, _ in rows] == sorted(end for _, end, _ in rows)


def test_the_dry_run_prints_the_plan_and_starts_nothing():
    script = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import gpu; gpu.main(['--dry-run']); "
              "from jax._src import xla_bridge; "
              "assert 'torch' not in sys.modules and 'transformers' not in sys.modules and not xla_bridge._backends")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0].split()[1] == "train-small" and "(sure)" in lines[0]
    assert lines[-1].startswith("deadline 470 s: the first 5 phases fit it")


def test_a_call_past_its_deadline_skips_every_phase_saying_so(tmp_path):
    out = subprocess.run([sys.executable, str(BENCH / "gpu.py"), "--quick", "--deadline", "5", "--out", str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert "-- train-small: skipped: needs up to" in out
    [path] = tmp_path.glob("gpu-*-quick.json")
    results = json.loads(path.read_text())
    assert results["deadline_s"] == 5 and len(results["plan"]) == len(results["phases"])
    assert all(phase["status"].startswith("skipped") for phase in results["phases"].values())

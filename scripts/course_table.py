"""The README's course numbers, from the results of a `make course` run.

    python scripts/course_table.py [RESULTS]    # RESULTS: default runs/results.json

copies RESULTS to docs/course_results.json, the committed record of the last measured course;
keeps its wall times in docs/course_times.json under the CPU it ran on, which each notebook's
setup cell recorded in RESULTS (`system.cpu_description`; the entries of other CPUs stay), the
times the setup cell tells a learner on a CPU (`profiles.course_minutes`); and rewrites from the
record the README's course table (between its `course-table` markers), which names that CPU,
and the course's total time (between its `course-time` markers).
tests/test_readme.py fails when the README and the record disagree.
"""
import datetime
import json
import pathlib
import re
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "course_results.json"
TIMES = ROOT / "docs" / "course_times.json"  # t5nb.profiles.COURSE_TIMES
START, END = "<!-- course-table: written by scripts/course_table.py -->", "<!-- /course-table -->"
TIME_START, TIME_END = "<!-- course-time: written by scripts/course_table.py -->", "<!-- /course-time -->"


def headlines(r: dict) -> dict[str, str]:
    """One line per training notebook, each number read from `r` (results.json)."""
    pre, fc, qa, ev = r["02_pretraining"]["pretraining"], r["03_finetuning"], r["04_closed_book_qa"], r["05_evaluation"]
    return {
        "02_pretraining": f"{pre['steps']:,} steps on span corruption + salient span masking; final loss "
                          f"{pre['final_loss']:.2f}, token accuracy {pre['final_accuracy']:.2f}",
        "03_finetuning": f"slot filling on held-out people: {fc['pretrained']['accuracy']:.1f}% from pretrained, "
                         f"{fc['scratch']['accuracy']:.1f}% from scratch; from the first N training slots, "
                         + ", ".join(f"N={n}: **{runs['pretrained']:.1f}%** vs {runs['scratch']:.1f}%"
                                     for n, runs in fc["transfer"]["runs"].items()),
        "04_closed_book_qa": f"held-out-people EM **{qa['pretrained']['em']:.1f}%** from the pretrained model, "
                             f"**{qa['scratch']['em']:.1f}%** from random init ({qa['pretrained']['examples']:,} questions)",
        "05_evaluation": f"teacher-forced token accuracy {ev['teacher_forced']['accuracy']:.2f}; decoded EM "
                         f"{ev['decoded']['em']:.1f}%",
        "06_knowledge_capacity": knowledge(r["06_knowledge_capacity"]),
    }


def knowledge(kc: dict) -> str:
    """06's three results in a line."""
    ssm, best = kc["ssm"], max(kc["capacity"], key=lambda row: row["bits_per_parameter"])
    sizes = sorted(kc["sizes"].values(), key=lambda row: row["parameters"])
    return (f"held-out EM **{ssm['span corruption + SSM']['em']:.1f}%** with SSM, {ssm['span corruption']['em']:.1f}% "
            f"without; by size " + ", ".join(f"{row['em']:.1f}% ({row['parameters'] / 1e6:.2f} M)" for row in sizes)
            + f"; at most **{best['bits_per_parameter']:.3f} bits per parameter** ({best['seeds']} seeds) after "
            f"{min(row['exposures'] for row in kc['capacity']):.0f} exposures")


def findings(r: dict) -> list[str]:
    """06's results beside the papers', one row each, as the notebook recorded them."""
    return ["| 06: result | here | the paper | agree |", "|---|---|---|---|",
            *(f"| {row['result']} | {row['ours']} | {row['paper']} | {row['agree']} |"
              for row in r["06_knowledge_capacity"]["findings"])]


def methods(r: dict) -> list[str]:
    """03's comparison of full fine-tuning, LoRA and prompt tuning, one row per method."""
    rows = r["03_finetuning"]["fine_tuning_methods"]
    return ["| 03: method | parameters trained | checkpoint | step | train step memory | held-out accuracy |",
            "|---|---:|---:|---:|---:|---:|",
            *(f"| {method} | {row['trained_parameters']:,} | {row['checkpoint_mb']:.2f} MB | {row['step_ms']:.0f} ms "
              f"| {row['step_memory_mb']:.0f} MB | {row['accuracy']:.1f}% |" for method, row in rows.items())]


def total_time(results: dict) -> str:
    """`32 min 36 s`: the whole course's wall time."""
    total = sum(entry["wall_s"] for entry in results.values())
    return f"{int(total // 60)} min {total % 60:.0f} s"


def machine(results: dict) -> str:
    """The CPU the course of `results` ran on, as each notebook's setup cell recorded it; a
    ValueError where a notebook recorded none (not the `cpu` profile on a CPU) or they differ
    (results.json keeps a notebook's entry from an earlier run: run the whole course again)."""
    cpus = {entry.get("cpu") for entry in results.values()}
    if len(cpus) != 1 or None in cpus:
        recorded = {name: entry.get("cpu") for name, entry in results.items()}
        raise ValueError(f"the results name no one CPU ({recorded}): run the whole course, `make course`, with the "
                         "cpu profile on one machine")
    return cpus.pop()


def times(results: dict, measured: str) -> dict:
    """The entry of docs/course_times.json for the CPU of `results` (`machine`), `measured` the
    day its course ran: each notebook's wall time, and the float32 matmul speed its setup cells
    measured, on average. A ValueError where a notebook failed: its time is not what it takes."""
    failed = [name for name, entry in results.items() if not entry.get("ok", True)]
    if failed:
        raise ValueError(f"{', '.join(failed)} failed: run the course again, its times are not what it takes")
    speeds = [entry["matmul_gflops"] for entry in results.values() if "matmul_gflops" in entry]
    return {"measured": measured, "matmul_gflops": round(sum(speeds) / len(speeds), 1) if speeds else None,
            "notebooks": {name: entry["wall_s"] for name, entry in results.items()}}


def updated_times(kept: dict, results: dict, measured: str) -> dict:
    """docs/course_times.json's `kept` entries, that of the CPU of `results` written anew (kept as
    it is where it holds those very times: rewriting the README from the record changes nothing)."""
    cpu, entry = machine(results), times(results, measured)
    if kept.get(cpu, {}).get("notebooks") == entry["notebooks"]:
        return kept
    return {**kept, cpu: entry}


def table(results: dict) -> str:
    """The markdown between the markers: total wall time, one row per training notebook, 03's
    fine-tuning methods and 06's results beside the papers'."""
    rows = [f"| `{name}` | {results[name]['wall_s']:.0f} s | {line} |" for name, line in headlines(results).items()]
    return "\n".join([f"`make course` took {total_time(results)} in all on {machine(results)} "
                      "(`docs/course_results.json` holds its numbers):", "",
                      "| notebook | wall | headline |", "|---|---:|---|", *rows, "", *methods(results), "",
                      *findings(results)])


def render(readme: str, results: dict) -> str:
    """`readme` with its course table and total time replaced by those `results` gives."""
    for start, end, text in ((START, END, f"\n{table(results)}\n"), (TIME_START, TIME_END, total_time(results))):
        pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
        if not pattern.search(readme):
            raise ValueError(f"README.md has no {start} ... {end} block")
        readme = pattern.sub(lambda _: f"{start}{text}{end}", readme)
    return readme


if __name__ == "__main__":
    source = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "runs" / "results.json"
    results, readme = json.loads(source.read_text()), ROOT / "README.md"
    day = datetime.date.fromtimestamp(source.stat().st_mtime).isoformat()  # results.json's last write: the course's end
    kept = json.loads(TIMES.read_text()) if TIMES.is_file() else {}
    course_times, text = updated_times(kept, results, day), render(readme.read_text(encoding="utf-8"), results)
    TIMES.write_text(json.dumps(course_times, indent=2) + "\n")
    if source.resolve() != RECORD.resolve():
        shutil.copy(source, RECORD)
    readme.write_text(text, encoding="utf-8")
    print(f"{RECORD.relative_to(ROOT)}, {TIMES.relative_to(ROOT)}'s entry for {machine(results)} and README.md's "
          f"course table and time updated from {source}")

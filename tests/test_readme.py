"""The README and docs/: their generated tables are those of their JSON (the course's numbers, of
the last measured `make course`, docs/course_results.json; the accelerator estimates,
bench/results/accelerator_estimates.json), and every command they show names paths, flags and
recipe keys that exist."""
import argparse
import importlib.util
import json
import pathlib
import re
import shlex

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


course_table, estimates_table = _script("course_table"), _script("estimates_table")
# every Markdown file whose commands are checked: the README and docs/
MARKDOWN = ["README.md", *sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "docs").glob("*.md"))]


def test_readme_course_table_is_the_recorded_course():
    results = json.loads(course_table.RECORD.read_text())
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme == course_table.render(readme, results), \
        "README.md's course table differs from docs/course_results.json: run `python scripts/course_table.py`"
    assert all(entry["ok"] for entry in results.values()), "the recorded course has a failed notebook"
    assert set(results) == {path.stem for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}


def test_the_readmes_table_names_the_cpu_of_the_record_whose_times_the_setup_cell_tells():
    from t5nb.profiles import COURSE_TIMES

    results = json.loads(course_table.RECORD.read_text())
    cpu = course_table.machine(results)
    assert " ".join((ROOT / "README.md").read_text(encoding="utf-8").split()).count(f"on {cpu}") == 1
    assert course_table.TIMES == COURSE_TIMES
    kept = json.loads(COURSE_TIMES.read_text())
    assert kept[cpu]["notebooks"] == {name: entry["wall_s"] for name, entry in results.items()}
    assert course_table.updated_times(kept, results, "today") == kept  # the record's CPU as on record


def test_the_course_times_keep_each_cpus_entry_and_write_that_of_the_results():
    """A course on another CPU adds its entry beside the kept one; run again there, it replaces
    its own; results with a failed notebook, or that name no one CPU (a notebook of an earlier
    run on another machine, or none recorded), are refused."""
    slow = "2 cores of an AMD EPYC without AVX-512"
    kept = {"2 cores of an AMD EPYC with AVX-512": {"measured": "then", "matmul_gflops": 214.3,
                                                    "notebooks": {"00_setup": 9.1, "02_pretraining": 502.6}}}
    results = {"00_setup": {"wall_s": 20.0, "ok": True, "cpu": slow, "matmul_gflops": 97.0},
               "02_pretraining": {"wall_s": 1200.0, "ok": True, "cpu": slow, "matmul_gflops": 99.0}}
    added = course_table.updated_times(kept, results, "now")
    assert added == {**kept, slow: {"measured": "now", "matmul_gflops": 98.0,
                                    "notebooks": {"00_setup": 20.0, "02_pretraining": 1200.0}}}
    results["02_pretraining"]["wall_s"] = 1100.0
    again = course_table.updated_times(added, results, "later")
    assert list(again) == list(added) and again[slow]["notebooks"]["02_pretraining"] == 1100.0
    assert course_table.machine(results) == slow
    results["02_pretraining"]["ok"] = False
    with pytest.raises(ValueError, match="02_pretraining failed"):
        course_table.updated_times(kept, results, "now")
    results["02_pretraining"]["ok"] = True
    for cpu in ("2 cores of an AMD EPYC with AVX-512", None):
        results["00_setup"]["cpu"] = cpu
        with pytest.raises(ValueError, match="no one CPU"):
            course_table.updated_times(kept, results, "now")


def test_the_table_reads_every_number_from_the_results():
    results = json.loads(course_table.RECORD.read_text())
    results["04_closed_book_qa"]["pretrained"]["em"] = 12.34
    results["02_pretraining"]["wall_s"] += 60
    rows = course_table.table(results)
    assert "**12.3%** from the pretrained model" in rows
    assert f"| `02_pretraining` | {results['02_pretraining']['wall_s']:.0f} s |" in rows
    readme = course_table.render((ROOT / "README.md").read_text(encoding="utf-8"), results)
    assert f"{course_table.TIME_START}{course_table.total_time(results)}{course_table.TIME_END}" in readme


def test_the_estimates_tables_are_the_committed_estimates():
    for path, text in estimates_table.rendered().items():
        assert path.read_text(encoding="utf-8") == text, \
            f"{path.relative_to(ROOT)}'s estimates table differs from {estimates_table.RECORD.relative_to(ROOT)}: " \
            "run `python scripts/estimates_table.py`"


def test_the_estimates_tables_read_only_what_every_estimate_has():
    """The fields the tables read, and nothing else: an estimate with other fields beside them
    still makes both tables, every number from the estimate."""
    notebooks = {name: {"minutes": minutes, "compile_s": 1.0} for name, minutes in
                 (("02_pretraining", 12.3), ("03_finetuning", 4.0), ("04_closed_book_qa", 2.0), ("05_evaluation", 1.0))}
    tpu = {"profile": "accelerator", "dtype": "bfloat16", "minutes": 19.3, "with_02s_run": 21.1, "compile_minutes": 2.6,
           "memory_gb": 20.0, "fits_in_memory": False, "seconds_per_run": {"pretrain_step": 0.25},
           "notebooks": notebooks}
    gpu = {**tpu, "fits_in_memory": True}
    result = {"setups": {"Some TPU": tpu, "Some GPU": gpu}}
    assert estimates_table.table(result).splitlines()[2:] == [
        "| Some TPU | `accelerator` | bfloat16 | 12.3 | 4.0 | 2.0 | 1.0 | **19** | 3 | 21 | 20.0 (too much) |",
        "| Some GPU | `accelerator` | bfloat16 | 12.3 | 4.0 | 2.0 | 1.0 | **19** | 3 | 21 | 20.0 |"]
    assert estimates_table.chip_table(result).splitlines() == [
        "| setup | profile | compute dtype | notebooks 02-05, each in a runtime of its own | longest notebook | "
        "of it compiling | 02's run found |",
        "|---|---|---|---:|---:|---:|---:|",
        "| Some TPU | `accelerator` | bfloat16 | 19 min, estimated (does not fit its memory) | 02: 12 min | 3 min "
        "| 21 min |",
        "| Some GPU | `accelerator` | bfloat16 | 19 min, estimated | 02: 12 min | 3 min | 21 min |"]


# -- the commands of the README and docs/ -------------------------------------------------------
COMMAND = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S+ )*(?:make|t5nb|\.venv/bin/t5nb|\.venv/bin/python|python|bash|\.venv/bin/pip|pip) ")
SCRIPT_SUFFIXES = (".py", ".sh")


def readme_commands(text: str) -> list[str]:
    """Every shell command a Markdown file shows: the lines of its code blocks, and inline code that
    starts with a command (`make`, `t5nb`, `python`, `bash`, `pip`), joined where it wraps."""
    commands = []
    for block in re.findall(r"^```(?:bash)?\n(.*?)^```", text, flags=re.S | re.M):
        commands += [line.strip() for line in block.splitlines() if COMMAND.match(line.strip())]
    for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", text):
        span = " ".join(span.split())
        if COMMAND.match(span + " "):
            commands.append(span)
    return commands


def _is_placeholder(word: str) -> bool:
    """RUN_DIR, T, F, <this file>, ...: what the reader fills in."""
    return word.strip("[]<>.") == "" or word.strip("[]").isupper() or word.startswith("<") or word == "..."


def _run_dirs(text: str) -> set:
    """The run directories a reader can have: every shipped recipe's, and each that a command of
    `text` or of another Markdown file (the README and docs/ are read together) sets with
    run.model_dir."""
    from t5nb.recipe import load_recipe

    dirs = {load_recipe(path).run.model_dir for path in (ROOT / "recipes").rglob("*.toml")}
    shown = "\n".join([text, *((ROOT / name).read_text(encoding="utf-8") for name in MARKDOWN)])
    return dirs | set(re.findall(r"run\.model_dir=(\S+)", shown))


def _path_problem(word: str, run_dirs: set) -> str | None:
    """A repository path that does not exist, or a run directory nothing makes."""
    word = word.split("=", 1)[-1]  # --set run.model_dir=runs/x, --option=path
    if "/" not in word or "://" in word or word.startswith(("/", "$", "-")) or _is_placeholder(word):
        return None
    if word.startswith("runs/") and word.rstrip("/") != "runs":
        if not any(word == run or word.startswith(run + "/") for run in run_dirs):
            return f"{word}: no recipe or command in the README or docs/ makes this run directory"
        return None
    return None if (ROOT / word).exists() else f"{word}: no such file or folder in the repository"


def command_problems(command: str, run_dirs: set) -> list[str]:
    """What is wrong in one shown command: a path, make target, t5nb subcommand, flag, recipe
    key or notebook that does not exist."""
    from t5nb import cli
    from t5nb.recipe import RecipeError, load_recipe

    words = shlex.split(command, comments=True)
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):  # VARIABLE=value before the command
        words.pop(0)
    problems = [problem for word in words for problem in [_path_problem(word, run_dirs)] if problem]
    program, arguments = words[0], words[1:]
    if program in ("pip", ".venv/bin/pip"):  # needs the network: its paths are checked, nothing runs
        return problems
    if program in ("python", ".venv/bin/python") and arguments[:2] == ["-m", "t5nb"]:
        program, arguments = "t5nb", arguments[2:]
    if program == "make":
        targets = set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
        for word in arguments:
            name, equals, value = word.partition("=")
            if equals and name == "BENCH_ARGS":
                problems += command_problems(f"python bench/run.py {value}", run_dirs)
            elif not equals and word not in targets:
                problems.append(f"make {word}: no such target in the Makefile")
        return problems
    if program in ("python", ".venv/bin/python", "bash"):
        script = next((word for word in arguments if word.endswith(SCRIPT_SUFFIXES)), None)
        if script and (ROOT / script).is_file():
            source = (ROOT / script).read_text()
            problems += [f"{script} {word}: the script has no such option" for word in arguments
                         if word.startswith("--") and word.split("=")[0] not in source]
        return problems
    if program in ("t5nb", ".venv/bin/t5nb"):
        if not arguments or _is_placeholder(arguments[0]):
            return problems
        subcommands = next(action.choices for action in cli.build_parser()._actions
                           if isinstance(action, argparse._SubParsersAction))
        if arguments[0] not in subcommands:
            return problems + [f"t5nb {arguments[0]}: no such command"]
        options, positional, sets, words = subcommands[arguments[0]]._option_string_actions, [], [], arguments[1:]
        while words:
            word = words.pop(0).strip("[]")
            if not word.startswith("-"):
                positional.append(word)
            elif word.split("=")[0] not in options:
                problems.append(f"t5nb {arguments[0]} {word.split('=')[0]}: no such option")
            elif options[word].nargs != 0 and "=" not in word and words:  # its value
                value = words.pop(0).strip("[]")
                sets += [value] if word == "--set" else []
        if arguments[0] == "course":
            problems += [f"t5nb course {name}: no such notebook" for name in positional if not _is_placeholder(name)
                         and not (ROOT / "notebooks" / f"{name.removesuffix('.ipynb')}.ipynb").is_file()]
        if arguments[0] == "train" and positional and (ROOT / positional[0]).is_file():
            try:
                load_recipe(ROOT / positional[0]).with_overrides(sets)
            except RecipeError as error:
                problems.append(f"{command}: {error}")
        return problems
    return problems + [f"{program}: not a command this check knows"]


def readme_problems(text: str) -> list[str]:
    run_dirs = _run_dirs(text)
    return [problem for command in readme_commands(text) for problem in command_problems(command, run_dirs)]


def test_the_readme_shows_the_two_commands_and_training_on_your_own_data():
    commands = readme_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    for expected in ("make test", "make course",  # make test: what .ci/run runs
                     "t5nb train recipes/finetune_file.toml --set data.train_file=my_qa.csv --set run.model_dir=runs/my_qa",
                     "t5nb eval runs/my_qa --task my_qa"):
        assert expected in commands
    assert "make bench BENCH_ARGS=--quick" in readme_commands((ROOT / "docs" / "benchmarks.md").read_text())


@pytest.mark.parametrize("name", MARKDOWN)
def test_every_command_names_paths_flags_and_recipes_that_exist(name):
    text = (ROOT / name).read_text(encoding="utf-8")
    assert readme_problems(text) == []


@pytest.mark.parametrize("name, old, new, problem", [
    ("docs/benchmarks.md", "make bench BENCH_ARGS=--quick", "make bench BENCH_ARGS=--quik",
     "bench/run.py --quik: the script has no such option"),
    ("README.md", "make course ", "make courses ", "make courses: no such target in the Makefile"),
    ("docs/runs.md", "t5nb eval RUN_DIR --task T", "t5nb eval RUN_DIR --tasks T", "t5nb eval --tasks: no such option"),
    ("README.md", "recipes/finetune_file.toml --set data.train_file", "recipes/finetune.toml --set data.train_file",
     "recipes/finetune.toml: no such file or folder in the repository"),
    ("README.md", "--set data.train_file=my_qa.csv", "--set data.training_file=my_qa.csv",
     "[data] has no key 'training_file'"),
    ("docs/runs.md", "t5nb train runs/cpu/pretraining/recipe.toml", "t5nb train runs/cpu/pretrain/recipe.toml",
     "runs/cpu/pretrain/recipe.toml: no recipe or command in the README or docs/ makes this run directory"),
    ("README.md", "python -m t5nb course 00_setup", "python -m t5nb course 00_start",
     "t5nb course 00_start: no such notebook"),
    ("docs/accelerators.md", "python bench/accelerator_estimates.py", "python bench/accelerator_estimate.py",
     "bench/accelerator_estimate.py: no such file or folder in the repository"),
    ("docs/benchmarks.md", "bench/memory.py --only-compile", "bench/memory.py --compile-only",
     "bench/memory.py --compile-only: the script has no such option"),
])
def test_a_renamed_path_flag_or_recipe_key_in_a_command_is_caught(name, old, new, problem):
    text = (ROOT / name).read_text(encoding="utf-8")
    assert old in text
    problems = readme_problems(text.replace(old, new, 1))
    assert len(problems) == 1 and problem in problems[0], problems


# -- links between the README and docs/ ------------------------------------------------------------
def _anchors(text: str) -> set:
    """GitHub's anchors of a Markdown file: each heading's slug, and each `<a id="...">`."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M), flags=re.M)
    slugs = {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}
    return slugs | set(re.findall(r'<a id="([^"]+)"', text))


def link_problems(name: str) -> list[str]:
    """The relative links of a Markdown file whose file, or anchor in it, does not exist."""
    source = ROOT / name
    text = source.read_text(encoding="utf-8")
    problems = []
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (source.parent / path).resolve() if path else source
        if not target.exists():
            problems.append(f"{name}: {link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target.read_text(encoding="utf-8")):
            problems.append(f"{name}: {link}: no such heading")
    return problems


@pytest.mark.parametrize("name", MARKDOWN)
def test_every_link_between_the_readme_and_docs_leads_somewhere(name):
    assert link_problems(name) == []


def test_a_moved_heading_is_caught():
    assert _anchors("# A's title: the rest\n## Memory\n<a id=\"x\"></a>") == {"as-title-the-rest", "memory", "x"}
    assert "docs/testing.md" in MARKDOWN and "without-tensorflow-or-the-notebook-packages-a-gpu-machine" in _anchors((ROOT / "docs" / "testing.md").read_text())

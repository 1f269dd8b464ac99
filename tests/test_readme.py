"""The README: its course numbers are those of the last measured `make course`
(docs/course_results.json), and every command it shows names paths, flags and recipe keys that exist."""
import argparse
import importlib.util
import json
import pathlib
import re
import shlex

import pytest

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


# -- the README's commands --------------------------------------------------------------------
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+ )*(?:make|t5nb|\.venv/bin/t5nb|\.venv/bin/python|python|bash|\.venv/bin/pip|pip) ")
SCRIPT_SUFFIXES = (".py", ".sh")


def readme_commands(text: str) -> list[str]:
    """Every shell command the README shows: the lines of its code blocks, and inline code that
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
    """The run directories a reader can have: every shipped recipe's, and each the README's
    commands set with run.model_dir."""
    from t5nb.recipe import load_recipe

    dirs = {load_recipe(path).run.model_dir for path in (ROOT / "recipes").rglob("*.toml")}
    return dirs | set(re.findall(r"run\.model_dir=(\S+)", text))


def _path_problem(word: str, run_dirs: set) -> str | None:
    """A repository path that does not exist, or a run directory nothing makes."""
    word = word.split("=", 1)[-1]  # --set run.model_dir=runs/x, --option=path
    if "/" not in word or "://" in word or word.startswith(("/", "$", "-")) or _is_placeholder(word):
        return None
    if word.startswith("runs/") and word.rstrip("/") != "runs":
        if not any(word == run or word.startswith(run + "/") for run in run_dirs):
            return f"{word}: no recipe or README command makes this run directory"
        return None
    return None if (ROOT / word).exists() else f"{word}: no such file or folder in the repository"


def command_problems(command: str, run_dirs: set) -> list[str]:
    """What is wrong in one README command: a path, make target, t5nb subcommand, flag, recipe
    key or notebook that does not exist."""
    from t5nb import cli
    from t5nb.recipe import RecipeError, load_recipe

    words = shlex.split(command, comments=True)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VARIABLE=value before the command
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
    return problems + [f"{program}: not a command the README's check knows"]


def readme_problems(text: str) -> list[str]:
    run_dirs = _run_dirs(text)
    return [problem for command in readme_commands(text) for problem in command_problems(command, run_dirs)]


def test_every_readme_command_names_paths_flags_and_recipes_that_exist():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = readme_commands(text)
    for expected in ("make test", "make course", "make bench BENCH_ARGS=--quick",
                     "t5nb train recipes/finetune_file.toml --set data.train_file=my_qa.csv --set run.model_dir=runs/my_qa"):
        assert expected in commands
    assert readme_problems(text) == []


@pytest.mark.parametrize("old, new, problem", [
    ("make bench BENCH_ARGS=--quick", "make bench BENCH_ARGS=--quik", "bench/run.py --quik: the script has no such option"),
    ("make course ", "make courses ", "make courses: no such target in the Makefile"),
    ("t5nb eval RUN_DIR --task T", "t5nb eval RUN_DIR --tasks T", "t5nb eval --tasks: no such option"),
    ("recipes/finetune_file.toml --set data.train_file", "recipes/finetune.toml --set data.train_file",
     "recipes/finetune.toml: no such file or folder in the repository"),
    ("--set data.train_file=my_qa.csv", "--set data.training_file=my_qa.csv", "[data] has no key 'training_file'"),
    ("t5nb train runs/cpu/pretraining/recipe.toml", "t5nb train runs/cpu/pretrain/recipe.toml",
     "runs/cpu/pretrain/recipe.toml: no recipe or README command makes this run directory"),
    ("python -m t5nb course 00_setup", "python -m t5nb course 00_start", "t5nb course 00_start: no such notebook"),
])
def test_a_renamed_path_flag_or_recipe_key_in_a_readme_command_is_caught(old, new, problem):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert old in text
    problems = readme_problems(text.replace(old, new))
    assert len(problems) == 1 and problem in problems[0], problems

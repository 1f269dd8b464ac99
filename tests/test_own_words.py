"""The project speaks only of itself: no text file of the repository (README, docs, comments,
tests, notebooks) names the machines or arrangement it was developed on. Colab's own name for
its runtime, and its request to restart it, are Colab's words and allowed."""
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORDS = re.compile(r"workplace|\bsessions?\b|\blent\b", re.I)
COLABS_WORDING = re.compile(r"runtime sessions?|restart the session", re.I)


def text_files() -> dict[str, str]:
    """{path: text} of every file git tracks or would track (not ignored), text only."""
    names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.splitlines()
    files = {}
    for name in names:
        try:
            files[name] = (ROOT / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
    return files


def lines_with_the_words(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each line that holds one of WORDS outside Colab's wording."""
    return [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1)
            if WORDS.search(COLABS_WORDING.sub("", line))]


def test_no_file_speaks_of_where_the_project_was_developed():
    this_file = pathlib.Path(__file__).relative_to(ROOT).as_posix()
    hits = []
    for name, text in text_files().items():
        if name == this_file:  # its patterns are the only place the words may stand
            text = text.replace(WORDS.pattern, "").replace(COLABS_WORDING.pattern, "")
        hits += [f"{name}:{number}: {line[:120]}" for number, line in lines_with_the_words(text)]
    assert not hits, ("state the fact itself (\"on a machine that sets ...\"), or drop it:\n" + "\n".join(hits))


def test_the_check_finds_each_word_and_passes_colabs_wording():
    words = ["work" + "place", "a " + "sess" + "ion", "two " + "sess" + "ions", "le" + "nt by Colab"]
    assert all(lines_with_the_words(word.upper()) for word in words)
    colab = ["the " + "runtime " + "sess" + "ion ends", "re" + "start the " + "sess" + "ion (kernel)"]
    assert not any(lines_with_the_words(line) for line in colab)
    assert not lines_with_the_words("silently, a sessional, relentless")

"""Write every notebook's Colab badge and setup cell, and the README's badges, from the one
place that names the repository: `Repository` in pyproject.toml's [project.urls].

    python scripts/sync_notebooks.py [ROOT]    # ROOT: the repository's root, default this one

Run it after changing that URL (publishing or forking the project); tests/test_colab_path.py
fails until the files agree with it. Everything else in the notebooks is left byte for byte.
"""
import json
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
COLAB = "https://colab.research.google.com/github/"
BADGE_LINK = re.compile(re.escape(COLAB) + r"[^/\s]+/[^/\s]+/blob/[^/\s]+/")
SETUP = """\
# Setup. On Colab this fetches and installs t5nb (a few minutes); locally `make setup` did it.
KEEP_RUNS_ON_DRIVE = False  # Colab: True keeps runs/ in your Google Drive, for later sessions and notebooks
import sys
if "google.colab" in sys.modules:
    !test -d /content/t5nb || git clone -q --depth 1 -b {branch} https://github.com/{repo} /content/t5nb
    !bash /content/t5nb/scripts/colab_setup.sh
    import google.protobuf, importlib.metadata
    if google.protobuf.__version__ != importlib.metadata.version("protobuf"):  # imported before the upgrade
        raise SystemExit("protobuf was upgraded: Runtime > Restart session, then run this cell again")
    sys.path.insert(0, "/content/t5nb")
import t5nb
t5nb.tune_host()  # first: keep freed host memory for XLA:CPU's step buffers (see t5nb.host)
if KEEP_RUNS_ON_DRIVE:
    t5nb.system.keep_runs_on_drive()"""


def repository(root=ROOT) -> tuple[str, str]:
    """(owner/name, branch) from pyproject.toml's `Repository = "https://github.com/O/N/tree/B"`."""
    url = tomllib.loads((root / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    match = re.fullmatch(r"https://github\.com/([^/]+/[^/]+)/tree/(.+)", url)
    if not match:
        raise ValueError(f"pyproject.toml: Repository is {url}, not https://github.com/OWNER/NAME/tree/BRANCH")
    return match[1], match[2]


def badge(notebook: str, root=ROOT) -> str:
    """The Open-in-Colab badge, in Markdown, of notebooks/<notebook>."""
    repo, branch = repository(root)
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"({COLAB}{repo}/blob/{branch}/notebooks/{notebook})")


def setup_cell(root=ROOT) -> list[str]:
    """The setup cell's source, as notebook JSON keeps it: a list of lines."""
    repo, branch = repository(root)
    return SETUP.format(repo=repo, branch=branch).splitlines(keepends=True)


def sync(root=ROOT) -> list[pathlib.Path]:
    """Rewrite cell 0's badge line and code cell 1 of every notebook, and the README's badge
    links; return the files that changed."""
    changed = []
    repo, branch = repository(root)
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        first, setup = nb["cells"][:2]
        if setup["cell_type"] != "code":
            raise ValueError(f"{path}: cell 1 is not the setup code cell")
        if first["source"] and first["source"][0].startswith("[![Open In Colab]"):
            first["source"][0] = badge(path.name, root) + "\n"
        else:
            first["source"][:0] = [badge(path.name, root) + "\n", "\n"]
        setup["source"] = setup_cell(root)
        changed += _write(path, json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    readme = root / "README.md"
    changed += _write(readme, BADGE_LINK.sub(f"{COLAB}{repo}/blob/{branch}/", readme.read_text(encoding="utf-8")))
    return changed


def _write(path: pathlib.Path, text: str) -> list[pathlib.Path]:
    """Write text to path if it differs; [path] if it did."""
    if path.read_text(encoding="utf-8") == text:
        return []
    path.write_text(text, encoding="utf-8")
    return [path]


if __name__ == "__main__":
    root = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    for path in sync(root):
        print(f"updated {path}")

"""Write every notebook's Colab and Kaggle badges and setup cell, and the README's badges, from
the one place that names the repository: `Repository` in pyproject.toml's [project.urls].

    python scripts/sync_notebooks.py [ROOT]    # ROOT: the repository's root, default this one

Run it after changing that URL (publishing or forking the project); tests/test_hosted_path.py
fails until the files agree with it. Everything else in the notebooks is left byte for byte.
"""
import json
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
COLAB = "https://colab.research.google.com/github/"
KAGGLE = "https://kaggle.com/kernels/welcome?src=https://github.com/"
BADGE_LINK = re.compile(f"({re.escape(COLAB)}|{re.escape(KAGGLE)})" + r"[^/\s]+/[^/\s]+/blob/[^/\s]+/")
BADGES = "[![Open In Colab]"
SETUP = """\
# Setup. On Colab or Kaggle this fetches and installs t5nb (a few minutes; on Kaggle turn
# Settings > Internet on first); locally `make setup` did it. PROFILE sizes the course: "detected"
# picks it from this machine's chip (00_setup shows them all). KEEP_RUNS_ON_DRIVE (Colab): keep
# runs/ in your Google Drive, for later runtimes and the other notebooks.
PROFILE = "detected"  #@param ["detected", "cpu", "accelerator", "fp32-gpu", "ci"]
KEEP_RUNS_ON_DRIVE = False  #@param {{type:"boolean"}}
import os, sys
HOSTED = "/content" if "google.colab" in sys.modules else "/kaggle" if "KAGGLE_KERNEL_RUN_TYPE" in os.environ else ""
if HOSTED:
    !test -d {{HOSTED}}/t5nb || git clone -q --depth 1 -b {branch} https://github.com/{repo} {{HOSTED}}/t5nb
    !bash {{HOSTED}}/t5nb/scripts/hosted_setup.sh
    import google.protobuf, importlib.metadata
    if google.protobuf.__version__ != importlib.metadata.version("protobuf"):  # imported before the upgrade
        raise SystemExit("protobuf was upgraded: restart the session (kernel), then run this cell again")
    sys.path.insert(0, f"{{HOSTED}}/t5nb")
import t5nb
t5nb.tune_host()  # first: keep freed host memory for XLA:CPU's step buffers (see t5nb.host)
if KEEP_RUNS_ON_DRIVE:
    t5nb.system.keep_runs_on_drive()
profile = t5nb.choose_profile(PROFILE, "{notebook}")  # prints what it runs, how long this notebook takes here"""


def repository(root=ROOT) -> tuple[str, str]:
    """(owner/name, branch) from pyproject.toml's `Repository = "https://github.com/O/N/tree/B"`."""
    url = tomllib.loads((root / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    match = re.fullmatch(r"https://github\.com/([^/]+/[^/]+)/tree/(.+)", url)
    if not match:
        raise ValueError(f"pyproject.toml: Repository is {url}, not https://github.com/OWNER/NAME/tree/BRANCH")
    return match[1], match[2]


def badge(notebook: str, root=ROOT) -> str:
    """The Open-in-Colab and Open-in-Kaggle badges, in Markdown, of notebooks/<notebook>."""
    repo, branch = repository(root)
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"({COLAB}{repo}/blob/{branch}/notebooks/{notebook}) "
            f"[![Open In Kaggle](https://kaggle.com/static/images/open-in-kaggle.svg)]"
            f"({KAGGLE}{repo}/blob/{branch}/notebooks/{notebook})")


def setup_cell(notebook: str, root=ROOT) -> list[str]:
    """The setup cell's source of notebooks/<notebook>.ipynb, as notebook JSON keeps it: a list of lines."""
    repo, branch = repository(root)
    return SETUP.format(repo=repo, branch=branch, notebook=notebook).splitlines(keepends=True)


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
        if first["source"] and first["source"][0].startswith(BADGES):
            first["source"][0] = badge(path.name, root) + "\n"
        else:
            first["source"][:0] = [badge(path.name, root) + "\n", "\n"]
        setup["source"] = setup_cell(path.stem, root)
        changed += _write(path, json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    readme = root / "README.md"
    text = BADGE_LINK.sub(lambda link: f"{link[1]}{repo}/blob/{branch}/", readme.read_text(encoding="utf-8"))
    changed += _write(readme, text)
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

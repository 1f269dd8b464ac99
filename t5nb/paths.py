"""Where t5nb's own files are: the repository it runs from (`notebooks/`, `data/`, `runs/`)."""
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent

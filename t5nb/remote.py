"""Remote files by URL, each read from its real source or from a local stand-in.

Every file t5nb reads from elsewhere is named by one URL:

| URL | source |
|---|---|
| `hf://<org>/<repo>/<file>` | a model repository on the Hugging Face Hub |
| `hf://datasets/<org>/<repo>/<file>` | a dataset repository on the Hub |
| `https://<host>/<path>` | a web server (e.g. raw.githubusercontent.com) |
| `gs://<bucket>/<path>` | Google Cloud Storage (T5X's checkpoints), read by tensorstore, not `fetch` |

`fetch(url)` returns a local path: the Hub's cache or t5nb's download cache (`T5NB_CACHE_DIR`,
default `~/.cache/t5nb`), each file downloaded once, anonymously. A source that cannot be
reached (no network, a rate limit, a renamed file) raises `SourceUnreachable`, which names the
URL and what to do: t5nb never falls back to other data. `list_files("hf://<org>/<repo>")`
lists a Hub repository's files (to pick among the forms a checkpoint is published in).

**Stand-ins.** With `T5NB_STANDINS=<dir>`, every URL is read from `<dir>/<scheme>/<rest>`
instead (`hf://datasets/allenai/c4/en/x.json.gz` -> `<dir>/hf/datasets/allenai/c4/en/x.json.gz`),
a local copy with the real source's layout and names: how CI rehearses the Colab path offline
(`tests/standins.py` writes one).
"""
import os
import pathlib
import shutil
import urllib.error
import urllib.request

STANDINS_ENV = "T5NB_STANDINS"


class SourceUnreachable(RuntimeError):
    """A remote source (or its stand-in) could not be read; the message says what to do."""


def standins_dir() -> pathlib.Path | None:
    """`$T5NB_STANDINS` when set: remote URLs are read from there."""
    value = os.environ.get(STANDINS_ENV, "").strip()
    return pathlib.Path(value) if value else None


def _split(url: str) -> tuple[str, str]:
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("hf", "https", "gs") or not rest:
        raise ValueError(f"{url!r}: not a remote URL t5nb reads (hf://..., https://..., gs://...)")
    return scheme, rest


def standin_path(url: str) -> pathlib.Path:
    """Where the stand-in of `url` lives under `$T5NB_STANDINS`."""
    scheme, rest = _split(url)
    return standins_dir() / scheme / rest


def _hub_parts(rest: str) -> tuple[str, str, str]:
    """(repo_type, repo_id, filename) of an `hf://` URL's rest."""
    parts = rest.split("/")
    repo_type = "dataset" if parts[0] == "datasets" else "model"
    parts = parts[1:] if repo_type == "dataset" else parts
    if len(parts) < 3:
        raise ValueError(f"hf://{rest}: expected hf://[datasets/]<org>/<repo>/<file>")
    return repo_type, "/".join(parts[:2]), "/".join(parts[2:])


def cache_dir() -> pathlib.Path:
    """Where `https://` downloads are kept: `$T5NB_CACHE_DIR`, else `~/.cache/t5nb`."""
    return pathlib.Path(os.environ.get("T5NB_CACHE_DIR") or pathlib.Path.home() / ".cache" / "t5nb")


def _download(url: str, path: pathlib.Path) -> None:
    """`url` to `path`, atomically (a partial file never takes the name)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with urllib.request.urlopen(url, timeout=60) as response, partial.open("wb") as f:
        shutil.copyfileobj(response, f, length=1 << 20)
    partial.replace(path)


def _standin(url: str, holds, kind: str) -> pathlib.Path:
    """`url`'s stand-in where `holds(path)` (a file or a directory: `kind`); else refused, saying
    how to write the stand-ins."""
    path = standin_path(url)
    if not holds(path):
        raise SourceUnreachable(f"{url}: no stand-in {kind} at {path} ({STANDINS_ENV}={standins_dir()}); "
                                f"write the stand-ins (python tests/standins.py DIR) or unset {STANDINS_ENV}")
    return path


def fetch(url: str) -> str:
    """A local path holding the file `url` names (see the module docstring)."""
    scheme, rest = _split(url)
    if scheme == "gs":
        raise ValueError(f"{url!r}: gs:// files are read in place through tensorstore (t5nb.checkpoints.t5x)")
    if standins_dir() is not None:
        return str(_standin(url, pathlib.Path.is_file, "file"))
    try:
        if scheme == "hf":
            import huggingface_hub  # only a hf:// path fetched for real needs it

            repo_type, repo_id, filename = _hub_parts(rest)
            return huggingface_hub.hf_hub_download(repo_id, filename, repo_type=repo_type)
        path = cache_dir() / rest
        if not path.is_file():
            _download(url, path)
        return str(path)
    except (OSError, urllib.error.URLError, ImportError) as error:
        raise _unreachable(url, error) from error
    except Exception as error:  # huggingface_hub's HTTP and repository errors
        if type(error).__module__.startswith("huggingface_hub"):
            raise _unreachable(url, error) from error
        raise


def list_files(repo_url: str) -> list[str]:
    """The files of the Hub repository `hf://[datasets/]<org>/<repo>`, by their paths in it, sorted:
    huggingface_hub's `list_repo_files`, or the files under the stand-in's directory."""
    scheme, rest = _split(repo_url)
    if scheme != "hf":
        raise ValueError(f"{repo_url!r}: not a Hub repository (hf://<org>/<repo>)")
    if standins_dir() is not None:
        root = _standin(repo_url, pathlib.Path.is_dir, "directory")
        return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())
    repo_type, repo_id, _ = _hub_parts(rest.rstrip("/") + "/")  # no file: the repository itself
    try:
        import huggingface_hub  # only a hf:// listing for real needs it

        return sorted(huggingface_hub.list_repo_files(repo_id, repo_type=repo_type))
    except Exception as error:  # no network (httpx), a rate limit or no such repository (huggingface_hub)
        if isinstance(error, (OSError, ImportError)) or type(error).__module__.startswith(("huggingface_hub", "httpx")):
            raise _unreachable(repo_url, error) from error
        raise


def _unreachable(url: str, error: Exception) -> SourceUnreachable:
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return SourceUnreachable(
        f"could not download {url}: {reason}. Check that this runtime has internet access (on Colab: "
        "Runtime > Restart, then run the cell again); a rate limit passes after a few minutes (or log in "
        "with `huggingface-cli login`); a renamed file needs the new name in t5nb/tasks/real.py")

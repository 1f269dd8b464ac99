"""Files written whole or not at all: each is written under a temporary name beside its own and
renamed over it when complete (`os.replace`, atomic within a filesystem), so a process killed
in the middle leaves the previous file, or none, never a truncated one. Every small file a run,
an evaluation or an export writes outside orbax goes through here."""
import contextlib
import os
import pathlib


@contextlib.contextmanager
def replacing(path):
    """A temporary path beside `path` to write to; renamed to `path` when the block ends, removed
    if it raises."""
    path = pathlib.Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_atomically(path, content: str | bytes) -> None:
    """`path` holding `content` (text as UTF-8), all of it or, if interrupted, what it held before."""
    with replacing(path) as temporary:
        temporary.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)

"""Small files are written whole or not at all (`t5nb.files`), even when the writer is killed."""
import signal
import subprocess
import sys
import time

import pytest

from t5nb.files import replacing, write_atomically


def test_a_write_replaces_the_file_whole_and_leaves_nothing_beside_it(tmp_path):
    path = tmp_path / "recipe.toml"
    write_atomically(path, "old")
    write_atomically(path, "new é")
    assert path.read_text(encoding="utf-8") == "new é" and list(tmp_path.iterdir()) == [path]


def test_a_write_that_fails_midway_leaves_the_previous_file(tmp_path):
    path = tmp_path / "config.json"
    write_atomically(path, '{"model": "old"}')
    with pytest.raises(OSError), replacing(path) as temporary:
        temporary.write_text('{"mod')
        raise OSError(28, "No space left on device")
    assert path.read_text() == '{"model": "old"}' and list(tmp_path.iterdir()) == [path]


def test_a_writer_killed_midway_leaves_the_previous_file(tmp_path):
    path = tmp_path / "results.csv"
    write_atomically(path, "step,em\n10,0.5\n")
    writer = subprocess.Popen([sys.executable, "-c", f"""
import time
from t5nb.files import replacing
with replacing({str(path)!r}) as temporary:
    with open(temporary, "w") as f:
        f.write("step,em\\n")
        f.flush()
        time.sleep(60)
"""])
    deadline = time.time() + 60
    while not any(p.name.endswith(".tmp") for p in tmp_path.iterdir()):
        assert writer.poll() is None and time.time() < deadline, "the writer never began"
        time.sleep(0.02)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    assert path.read_text() == "step,em\n10,0.5\n"

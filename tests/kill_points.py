"""Named moments in a `t5nb train` process where the kill matrix (test_kill_matrix.py) stops it:
`arm(point, marker)` makes the process write `marker` when it reaches `point` and wait there,
so the test sends its signal at exactly that moment (and, for one the run handles, SIGTERM,
lets it go on by writing `<marker>.go`).

- `recipe.toml`, `config.json`: half of the file's bytes written (into the temporary name
  `files.write_atomically` renames when complete);
- `save`: inside this process's first checkpoint write, while orbax's temporary folder exists;
- `after a save`: at the first log after one of this process's checkpoints is on disk;
- `validation`: the validation's metrics computed, not yet written.

One more fault, without a kill: `no space`, every checkpoint write after the process's first
fails as on a full disk (ENOSPC from the write), for machines where the test cannot mount a
small filesystem."""
import errno
import os
import pathlib
import time

from t5nb import train
from t5nb.checkpoints import runs


def _reached(marker) -> None:
    """Say so, then wait for the test's kill (or, after a signal the run handles, for `<marker>.go`)."""
    pathlib.Path(marker).write_text(str(os.getpid()))
    go, deadline = pathlib.Path(f"{marker}.go"), time.time() + 600
    while not go.exists() and time.time() < deadline:
        time.sleep(0.01)


def arm(point: str, marker) -> None:
    if point in ("recipe.toml", "config.json"):
        write_bytes = pathlib.Path.write_bytes

        def half_written(self, data):
            if self.name.startswith(f".{point}."):
                with open(self, "wb") as file:
                    file.write(data[:len(data) // 2])
                _reached(marker)
            return write_bytes(self, data)

        pathlib.Path.write_bytes = half_written
    elif point == "save":
        runs._write = lambda directory, files: _reached(marker)
    elif point == "no space":
        write, writes = runs._write, []

        def full(directory, files):
            writes.append(directory)
            if len(writes) > 1:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))
            write(directory, files)

        runs._write = full
    elif point == "after a save":
        save, log = train.Saving.__call__, train.MetricsLog.__call__
        saved = []

        def saving(self, step, state):
            save(self, step, state)
            saved.append(self.checkpoints.directory / str(step))

        def logging(self, step):
            if saved:
                while not saved[-1].is_dir():  # orbax renames the step's folder when it is complete
                    time.sleep(0.01)
                _reached(marker)
            log(self, step)

        train.Saving.__call__, train.MetricsLog.__call__ = saving, logging
    elif point == "validation":
        teacher_forced = train.teacher_forced

        def computed(*args):
            metrics = teacher_forced(*args)
            _reached(marker)
            return metrics

        train.teacher_forced = computed
    else:
        raise ValueError(f"no kill point {point!r}")

"""What a hosted notebook's setup cell costs: scripts/hosted_setup.sh on Colab's preinstalled stack,
timed on this machine's cores, and the bytes of what it fetches.

    .venv/bin/python bench/setup_cell.py        # writes bench/results/setup_cell.json

A fresh virtualenv of Colab's Python seeded with the packages Colab preinstalls
(tests/hosted_stacks.py) stands in for a fresh runtime. The setup script runs in it once, as a
notebook's first run does (installing what the runtime lacks, fetched from the package
registry), then again, as after the restart that upgrading protobuf asks for. Every notebook
opens in a runtime of its own, so each pays both. The bytes are those of the wheels it installed,
fetched again on their own (`pip download --no-deps`), and of the repository's tracked files,
which the cell's `git clone --depth 1` fetches (compressed). bench/accelerator_estimates.py adds
the two runs' seconds to every notebook.
"""
import json
import pathlib
import subprocess
import sys
import tempfile
import time

from compile import cpu_name  # bench/compile.py

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "tests"))
import hosted_stacks  # noqa: E402  (tests/hosted_stacks.py)

RUNTIME = "colab"


def timed_setup(python: str) -> float:
    start = time.perf_counter()
    hosted_stacks.set_up(python)
    return time.perf_counter() - start


def repository_bytes() -> int:
    """The size of the repository's tracked files (what a clone of it checks out)."""
    names = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True, cwd=ROOT).stdout.split(b"\0")
    return sum((ROOT / name.decode()).stat().st_size for name in names if name and (ROOT / name.decode()).is_file())


def main():
    with tempfile.TemporaryDirectory() as scratch:
        scratch = pathlib.Path(scratch)
        python = hosted_stacks.seed(RUNTIME, scratch / "stack")
        before = hosted_stacks.installed(python)
        first = timed_setup(python)
        installed = {name: version for name, version in hosted_stacks.installed(python).items()
                     if before.get(name) != version and name != "t5nb"}
        again = timed_setup(python)
        wheels = scratch / "wheels"
        subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", "-d", wheels,
                        *(f"{name}=={version}" for name, version in installed.items())], check=True,
                       env=hosted_stacks.environment(scratch / "stack"))
        wheel_bytes = sum(path.stat().st_size for path in wheels.iterdir())
    result = {"runtime": RUNTIME, "cpu": cpu_name(), "first_run_s": first, "second_run_s": again,
              "installed": installed, "wheel_bytes": wheel_bytes, "repository_bytes": repository_bytes()}
    print(f"{RUNTIME}: the setup cell's first run {first:.0f} s ({len(installed)} packages, "
          f"{wheel_bytes / 1e6:.0f} MB of wheels; the repository {result['repository_bytes'] / 1e6:.0f} MB), "
          f"its second {again:.0f} s, on {result['cpu']}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "setup_cell.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

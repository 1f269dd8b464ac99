#!/usr/bin/env bash
# Colab's first cell runs this: install t5nb's dependencies into Colab's Python, changing as
# little of Colab as t5nb allows. Colab's jax, jaxlib, flax and their GPU or TPU builds stay:
# t5nb supports them (pyproject.toml's lower bounds; tests/test_colab_path.py runs t5nb on
# them). At requirements/base.lock's versions, with --no-deps as `make setup` does (README,
# "Why a lock"), so no resolver touches Colab's numpy, tensorflow, ipykernel and the rest:
# 1. protobuf, where Colab's is older than the lock's: Colab's own tensorflow-metadata needs
#    protobuf 6.31 or newer to import;
# 2. every package of the lock that Colab lacks. Colab's tensorflow-datasets goes first:
#    tfds-nightly, which seqio-nightly pins, provides the same module;
# 3. t5nb itself. Running it again changes nothing.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

python -m pip uninstall -q -y tensorflow-datasets 2>/dev/null
python - "$repo/requirements/base.lock" <<'PY' | xargs -r python -m pip install -q --no-deps
import importlib.metadata, re, sys
from packaging.version import Version
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
have = {norm(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
lock = {norm(n): v for n, v in (l.strip().split("==") for l in open(sys.argv[1]) if "==" in l and l[0] != "#")}
old = {"protobuf"} if Version(have.get("protobuf", "0")) < Version(lock["protobuf"]) else set()
print("\n".join(f"{n}=={v}" for n, v in lock.items() if n not in have or n in old))
PY
python -m pip install -q --no-deps -e "$repo"
echo "t5nb installed from $repo; jax $(python -m pip show jax | sed -n 's/^Version: //p') as Colab has it"

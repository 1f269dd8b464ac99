#!/usr/bin/env bash
# A hosted notebook's first cell runs this (Colab, Kaggle): install t5nb's dependencies into
# its Python, changing as little of it as t5nb allows. Its jax, jaxlib, flax and their GPU or
# TPU builds stay: t5nb supports them (pyproject.toml's lower bounds; tests/test_hosted_path.py
# runs t5nb on Colab's and Kaggle's). At requirements/base.lock's versions, with --no-deps as
# `make setup` does (docs/install.md, "Setup, and why a lock"), so no resolver touches the runtime's numpy,
# tensorflow, ipykernel and the rest:
# 1. protobuf, where the runtime's is older than the lock's: Colab's own tensorflow-metadata
#    needs protobuf 6.31 or newer to import;
# 2. every package of the lock that the runtime lacks. Its tensorflow-datasets goes first:
#    tfds-nightly, which seqio-nightly pins, provides the same module. A tensorflow-cpu (Kaggle's
#    TPU image) is the lock's tensorflow for this purpose, and tensorflow-text then comes at the
#    runtime's TensorFlow version (its kernels are built against one TensorFlow);
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
tensorflow = have.get("tensorflow") or have.get("tensorflow-cpu")
wanted = {**lock, "tensorflow-text": f"{'.'.join(tensorflow.split('.')[:2])}.*"} if tensorflow else lock
have.setdefault("tensorflow", tensorflow)
old = {"protobuf"} if Version(have.get("protobuf", "0")) < Version(lock["protobuf"]) else set()
print("\n".join(f"{n}=={v}" for n, v in wanted.items() if not have.get(n) or n in old))
PY
python -m pip install -q --no-deps -e "$repo"
echo "t5nb installed from $repo; jax $(python -m pip show jax | sed -n 's/^Version: //p') as the runtime has it"

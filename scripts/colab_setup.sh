#!/usr/bin/env bash
# Colab's first cell runs this: install t5nb's dependencies into Colab's Python, changing as
# little of Colab as t5nb allows. Three steps, all at requirements/base.lock's versions:
# 1. jax, when Colab's is older than the lock's (t5nb's flax needs it), with jaxlib and the
#    runtime's accelerator build: jax[cudaNN] where Colab has jax-cudaNN-plugin, jax[tpu]
#    where it has libtpu, so JAX keeps its GPU or TPU backend.
# 2. flax and protobuf where Colab's are older (flax 0.12's API, tensorflow-metadata's
#    generated protos), and every package of the lock that Colab lacks, with --no-deps as
#    `make setup` does (README, "Why a lock"): no resolver, so Colab's numpy, tensorflow,
#    ipykernel, ipywidgets and the rest stay as they are.
# 3. t5nb itself. Colab's tensorflow-datasets goes first: tfds-nightly, which seqio-nightly
#    pins, provides the same module. Running it again changes nothing.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

needs() {  # print what step 1 ("jax") or step 2 ("rest") installs, one requirement a line
  python - "$repo/requirements/base.lock" "$1" <<'PY'
import importlib.metadata, re, sys
from packaging.version import Version
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
have = {norm(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
lock = {norm(n): v for n, v in (l.strip().split("==") for l in open(sys.argv[1]) if "==" in l and l[0] != "#")}
old = {n for n in ("jax", "flax", "protobuf") if Version(have.get(n, "0")) < Version(lock[n])}
if sys.argv[2] == "jax" and "jax" in old:
    extra = [m[1] for m in (re.fullmatch(r"jax-(cuda\d+)-plugin", n) for n in have) if m]
    extra = extra or ["tpu"] * ("libtpu" in have)
    print(f"jax{'[%s]' % extra[0] if extra else ''}=={lock['jax']}", f"jaxlib=={lock['jaxlib']}")
elif sys.argv[2] == "rest":
    print("\n".join(f"{n}=={v}" for n, v in lock.items() if n not in have or n in old))
PY
}

python -m pip uninstall -q -y tensorflow-datasets 2>/dev/null
needs jax | xargs -r python -m pip install -q
needs rest | xargs -r python -m pip install -q --no-deps
python -m pip install -q --no-deps -e "$repo"
echo "t5nb installed from $repo with jax $(python -m pip show jax | sed -n 's/^Version: //p')"

#!/usr/bin/env bash
# Colab's first cell runs this: install t5nb and its dependencies into Colab's Python,
# keeping Colab's own jax (it matches the TPU/GPU runtime), then make sure exactly one
# distribution provides `tensorflow_datasets` (see README, "Why a lock").
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
pip install -q -e "$repo"
pip uninstall -q -y tensorflow-datasets
pip install -q --no-deps --force-reinstall \
  "$(grep -E '^tfds-nightly==' "$repo/requirements/base.lock")"
echo "t5nb installed from $repo"

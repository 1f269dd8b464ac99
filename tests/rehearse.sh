#!/usr/bin/env bash
# The dress rehearsal of the hosted path, as Colab and Kaggle open the course: each notebook alone,
# in a runs folder of its own (RUNS/<notebook>), under nbval; then each of 03-06 held to the train
# steps the estimate counts for it (tests/notebook_steps.py). The environment names the profile,
# the stand-ins and the devices (the Makefile's `test`).
#   bash tests/rehearse.sh PYTHON RUNS CHECKER [nbval options]
# PYTHON runs the notebooks (a hosted runtime's stack); CHECKER, the step count (t5nb's own lock).
set -u
python=$1 runs=$2 checker=$3
shift 3
cd "$(dirname "$0")/.."
failed=0
for notebook in notebooks/[0-9][0-9]_*.ipynb; do
  T5NB_RUNS_DIR="$runs/$(basename "$notebook" .ipynb)" "$python" -m pytest "$notebook" --nbval-lax \
    --nbval-current-env "$@" || failed=1
done
"$checker" tests/notebook_steps.py "$runs" "$T5NB_PROFILE" || failed=1
exit $failed

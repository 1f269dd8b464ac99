# One entry point. `make course` and `make test` each set up .venv (once) and run.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# The locks go in through uv, which fetches and unpacks in parallel: both locks into a fresh venv
# in 16 s on a 2-core AMD EPYC with an empty cache, where pip took about 3 minutes on one core.
# uv (the version test.lock pins) reads none of pip's settings: pip's find-links (torch's local
# CPU build) are passed on.
UV_VERSION := $(shell sed -n 's/^uv==//p' requirements/test.lock)
PIP := $(VENV)/bin/uv pip install -q --python $(PY) --no-deps $(foreach links,$(PIP_FIND_LINKS),--find-links $(links))
# Bytecode: make's commands write the bytecode of what they import, each module compiled once by
# the first process that imports it; where the environment sets PYTHONDONTWRITEBYTECODE, every
# process would otherwise compile TensorFlow, JAX and the rest from source (a small `t5nb train`
# run: 21 s with bytecode, 32 s without, on a 2-core AMD EPYC). Setup compiles what t5nb imports.
# Compiling every installed module instead (compileall: 23,000 files, most never imported) took
# 89 CPU s of `make test`'s setup.
export PYTHONDONTWRITEBYTECODE :=
COMPILE := $(PY) -c "import t5nb.cli, t5nb.plots, t5nb.widgets, t5nb.workflow"
# Identical programs (a test's worker processes, a notebook's two fine-tunings) compile once.
export JAX_COMPILATION_CACHE_DIR ?= $(CURDIR)/.jax_cache
# every compiled program, not only those over JAX's default of 1 s: the tests' and notebooks'
# processes compile the same small programs again and again
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS ?= 0

.PHONY: setup setup-lab setup-test course lab test bench clean

setup: $(VENV)/.base
setup-lab: $(VENV)/.lab
setup-test: $(VENV)/.test

$(VENV)/.base: requirements/base.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-deps --no-cache-dir uv==$(UV_VERSION)
	$(PIP) -r requirements/base.lock
	$(PIP) --no-build-isolation -e .
	$(PY) -m pip check
	$(COMPILE)
	touch $@

$(VENV)/.lab: $(VENV)/.base requirements/lab.lock
	$(PIP) -r requirements/lab.lock
	$(PY) -m pip check
	touch $@

# the tests start JupyterLab through `make lab` (tests/test_install.py)
$(VENV)/.test: $(VENV)/.lab requirements/test.lock
	$(PIP) -r requirements/test.lock
	$(PY) -m pip check
	touch $@

# The main job: the whole course, headless, on this machine's default profile. To publish its
# numbers: `python scripts/course_table.py` (docs/course_results.json, docs/course_times.json and the
# README's table).
course: $(VENV)/.base
	$(PY) -m t5nb course --fresh --out runs

# The course in JupyterLab on this machine, to step through it: the notebooks folder on localhost,
# with a token (the URL it prints opens it; JUPYTER_TOKEN sets one); the notebooks' runs go to
# runs/, as `make course` writes them (t5nb.system.runs_dir). LAB_PORT picks another port, LAB_ROOT
# another folder, LAB_ARGS adds JupyterLab options (tests/test_browser.py). As root too (a
# container's user), which JupyterLab refuses unless told: it listens on localhost only.
LAB_PORT ?= 8888
LAB_ROOT ?= $(CURDIR)/notebooks
lab: $(VENV)/.lab
	$(VENV)/bin/jupyter lab --no-browser --ServerApp.ip=localhost --ServerApp.port=$(LAB_PORT) \
	  --ServerApp.port_retries=0 --ServerApp.root_dir=$(LAB_ROOT) --ServerApp.allow_root=True $(LAB_ARGS)

# All tests: pytest on tests/ and nbval (lax) on every notebook with the CI profile, in fresh
# run folders, spread over the cores (conftest.py); where Chromium is installed (.ci/run installs
# Debian's), 02-04 run under the CI profile in it, through JupyterLab's page, instead of in nbval
# (tests/test_browser.py). Beside it, the dress rehearsal of the Colab path: every notebook with
# the accelerator course's tasks, sources and calls at toy sizes (profile `rehearsal`) on 8
# simulated devices, every remote source read from its local stand-in (needs the official
# vocabulary in T5NB_DATA_DIR), each notebook alone in a runs folder of its own, as Colab and
# Kaggle open them, then 03-06 held to the train steps the estimate counts (tests/rehearse.sh);
# its report follows pytest's. Notebook 06
# measures the facts world under every profile, so where the rehearsal runs it (on 8 devices),
# the CI profile's run leaves it out (85 CPU seconds of a run bound by CPU).
# The rehearsal is one notebook after another, one cell at a time; the tests are units that fill
# whatever CPU it leaves: they yield to it (nice), so that it is not the one left at the end. Beside
# three workers at the same priority, it took 1,175 s of a CI run of 1,371 s and ended last.
# Absolute paths: nbval runs each notebook in notebooks/.
STANDINS := $(CURDIR)/runs/standins
# the rehearsal stands for the hosted path, so it runs on a hosted runtime's own stack: Colab's
# (tests/hosted_stacks.py: Python 3.13, requirements/colab.txt, then scripts/hosted_setup.sh);
# where this machine has no Python 3.13 it says so and runs on the lock's, except under CI
COLAB_STACK := $(CURDIR)/runs/colab-stack
REHEARSAL := $(CURDIR)/runs/test-rehearsal
REHEARSAL_LOG := $(CURDIR)/runs/test-rehearsal.log
# One pytest worker more than cores: a test spends much of its time in one thread (imports, XLA's
# compiler, the kill matrix's and hosted setups' chains of processes), so a third worker keeps
# the second core busy (2-core AMD EPYC, fresh clones: 148% of the cores with 2 workers, 179%
# with 3, and 2 min less in all with more tests; 4 workers gained nothing more).
# A cell's limit: nbval waits on a kernel that died (an abort in XLA) until it passes; the
# slowest cell takes about 2 minutes (2-core AMD EPYC), nbval's default limit is 2000 s.
CELL_TIMEOUT := --nbval-cell-timeout=600
CHROMIUM ?= /usr/bin/chromium
IN_BROWSER := $(if $(wildcard $(CHROMIUM)),$(foreach notebook,02_pretraining 03_finetuning 04_closed_book_qa,\
  --ignore=notebooks/$(notebook).ipynb))
WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
# The rehearsal runs where T5NB_DATA_DIR holds the official vocabulary (t5nb.tasks.vocab's
# OFFICIAL_SPM_NAME), writing the stand-ins first, while pytest starts.
OFFICIAL_VOCABULARY := $${T5NB_DATA_DIR:-../shared/data}/vocab/cc_all.32000.sentencepiece.model
# XLA compiles the tests' and notebooks' many small programs, most of which run a few steps,
# with little optimization (JAX's jax_disable_most_optimizations: LLVM at -O0, its costly passes
# off): compiling costs them more than running. A clean clone's `make test`: 2,298 CPU s with it,
# 2,591 without (2-core AMD EPYC).
test: export JAX_DISABLE_MOST_OPTIMIZATIONS ?= 1
# No one sees the notebooks' inline TensorBoard here: nine servers, each importing TensorFlow
# (8 CPU s), and each cell waiting for its server to listen. tests/test_widgets.py starts one.
test: export T5NB_TENSORBOARD ?= 0
test: export T5NB_CHROMIUM := $(CHROMIUM)
test: $(VENV)/.test
	rm -rf runs/test-ci $(REHEARSAL) $(REHEARSAL_LOG)* $(STANDINS) $(COLAB_STACK)
	mkdir -p runs
	@if [ -f "$(OFFICIAL_VOCABULARY)" ]; then \
	  ({ $(PY) tests/standins.py $(STANDINS) && { stack=$$($(PY) tests/hosted_stacks.py colab $(COLAB_STACK)); built=$$?; \
	   if [ $$built -eq 3 ] && [ -z "$$CI" ]; then echo "so the rehearsal runs on the lock's packages"; stack=$(PY); \
	   elif [ $$built -ne 0 ]; then false; else echo "the rehearsal runs on Colab's stack: $$stack"; fi; } && \
	   T5NB_PROFILE=rehearsal T5NB_STANDINS=$(STANDINS) XLA_FLAGS=--xla_force_host_platform_device_count=8 \
	   bash tests/rehearse.sh $$stack $(REHEARSAL) $(PY) $(CELL_TIMEOUT) --durations=3; } > $(REHEARSAL_LOG) 2>&1; \
	   echo $$? > $(REHEARSAL_LOG).status) & \
	  in_rehearsal_only=--ignore=notebooks/06_knowledge_capacity.ipynb; \
	else in_rehearsal_only=; echo "rehearsal skipped: no official T5 vocabulary in T5NB_DATA_DIR ($${T5NB_DATA_DIR:-../shared/data})" \
	  | tee $(REHEARSAL_LOG); echo 0 > $(REHEARSAL_LOG).status; fi; \
	T5NB_PROFILE=ci T5NB_RUNS_DIR=$(CURDIR)/runs/test-ci nice -n 10 $(PY) -m pytest -n $(WORKERS) --no-loadscope-reorder \
	  tests notebooks $$in_rehearsal_only $(IN_BROWSER) --nbval-lax --nbval-current-env $(CELL_TIMEOUT) --durations=20; code=$$?; \
	wait; echo "== the rehearsal (T5NB_PROFILE=rehearsal, 8 simulated devices)"; cat $(REHEARSAL_LOG); \
	rehearsal=$$(cat $(REHEARSAL_LOG).status); if [ $$code -eq 0 ]; then exit $$rehearsal; fi; exit $$code

# Train-step throughput and MFU vs Hugging Face PyTorch T5 (docs/benchmarks.md); BENCH_ARGS=--quick.
bench: $(VENV)/.test
	$(PY) bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) runs .jax_cache

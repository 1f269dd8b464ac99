# One entry point. `make course` and `make test` each set up .venv (once) and run.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --no-deps --no-cache-dir
# Identical programs (a test's worker processes, a notebook's two fine-tunings) compile once.
export JAX_COMPILATION_CACHE_DIR ?= $(CURDIR)/.jax_cache

.PHONY: setup setup-test course test bench clean

setup: $(VENV)/.base
setup-test: $(VENV)/.test

$(VENV)/.base: requirements/base.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements/base.lock
	$(PIP) --no-build-isolation -e .
	$(PY) -m pip check
	touch $@

$(VENV)/.test: $(VENV)/.base requirements/test.lock
	$(PIP) -r requirements/test.lock
	$(PY) -m pip check
	touch $@

# The main job: the whole course, headless, on this machine's default profile.
course: $(VENV)/.base
	$(PY) -m t5nb course --fresh --out runs

# All tests: pytest on tests/ and nbval (lax) on every notebook with the CI profile.
test: $(VENV)/.test
	T5NB_PROFILE=ci $(PY) -m pytest tests notebooks --nbval-lax --nbval-current-env

# Train-step throughput and MFU vs Hugging Face PyTorch T5 (docs/benchmarks.md); BENCH_ARGS=--quick.
bench: $(VENV)/.test
	$(PY) bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) runs .jax_cache

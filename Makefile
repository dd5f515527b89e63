# Every set-up step lives here: a fresh clone needs only python3 (3.11+) and make.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: setup run test test-gpu lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,agent]'
	rm -f $(VENV)/.installed-*
	touch $@

## The main job on its bundled default: judge every bundled example (CPU ones without a GPU).
run: setup
	$(VENV)/bin/kerneljudge examples

## The test suite (GPU tests are skipped without a GPU).
test: setup
	$(PY) -m pytest -q

## GPU tier only (run on a machine with a CUDA GPU).
test-gpu: setup
	$(PY) -m pytest -q -m gpu

lint: setup
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .kerneljudge-cache

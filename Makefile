# Every set-up step lives here: a fresh clone needs only python3 (3.11+) and make.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: setup browser run test test-fast test-gpu lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,agent]'
	rm -f $(VENV)/.installed-*
	touch $@

## Chromium for the HTML report's browser test (tests/suite/test_report_browser.py), from Debian's
## packages when it is missing and we are root with apt-get; otherwise say so and go on (the
## browser test then fails with that message, or skips under KERNELJUDGE_NO_BROWSER=1).
browser:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium (apt-get)"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
		|| echo "make browser: apt-get could not install chromium; the browser test will fail"; \
	else \
		echo "make browser: /usr/bin/chromium is missing and cannot be installed here (needs"; \
		echo "  root and apt-get: apt-get install chromium); the browser test will fail unless"; \
		echo "  KERNELJUDGE_NO_BROWSER=1 is set"; \
	fi

## The main job on its bundled default: judge every bundled example (CPU ones without a GPU).
run: setup
	$(VENV)/bin/kerneljudge examples

## The test suite (GPU tests are skipped without a GPU).
test: setup browser
	$(PY) -m pytest -q --durations=30

## Every test but real compiler builds, the loaded-host tier and the browser (minutes, not tens).
test-fast: setup
	$(PY) -m pytest -q -m "not slow and not load and not browser"

## GPU tier only (run on a machine with a CUDA GPU).
test-gpu: setup
	$(PY) -m pytest -q -m gpu

lint: setup
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m ruff format --check src tests benchmarks
	$(PY) -m mypy src/kerneljudge

clean:
	rm -rf $(VENV) .pytest_cache .kerneljudge-cache

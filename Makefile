# The two commands: `make demo` (set up, then run the main job) and `make test` (set up, lint, test).
# Set-up is idempotent: a second run with nothing changed only compares a stamp.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint test-slow test-all test-browser bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/flashsim demo

lint: setup
	$(VENV)/bin/ruff check .

test: setup lint
	$(PY) -m pytest -q

# The slow tier alone: SmolLM2's logits against transformers, `validate --quick` end to end (real runs),
# the full demo, kill -9 of the CLI, the reference grids' slow half, a Dask cluster. CI runs it after `make test`.
SLOW := slow and not hardware and not browser and not benchmark
test-slow: setup
	$(PY) -m pytest -q -m "$(SLOW)"

# The browser tier: the HTML report opened in headless Chromium (Debian's package, installed by
# scripts/setup_browser.sh when missing; root). Screenshots are kept under artifacts/. CI runs it last.
test-browser: setup
	@bash scripts/setup_browser.sh
	$(PY) -m pytest -q -m browser

# Both tiers in one run.
test-all: setup lint
	$(PY) -m pytest -q -m "not hardware and not browser and not benchmark"

# Speed targets: ratios measured side by side, printed; never asserted in the test suite.
bench: setup
	$(PY) -m pytest -q -s tests/benchmarks -m "" -p no:cacheprovider

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis

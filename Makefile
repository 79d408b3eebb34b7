# The two commands: `make demo` (set up, then run the main job) and `make test` (set up, lint, test).
# Set-up is idempotent: a second run with nothing changed only compares a stamp.
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_WORKERS ?=

.PHONY: setup demo test lint test-all bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/flashsim demo

lint: setup
	$(VENV)/bin/ruff check .

test: setup lint
	$(PY) -m pytest -q

# Also the slow tests (real model end to end); CI runs these where time allows.
test-all: setup lint
	$(PY) -m pytest -q -m "not hardware and not browser and not benchmark"

# Speed targets: ratios measured side by side, printed; never asserted in the test suite.
bench: setup
	$(PY) -m pytest -q -s tests/benchmarks -m "" -p no:cacheprovider

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis

# GraphFlow: `make demo` runs the main job, `make test` the whole suite. Both set up .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export UCX_WARN_UNUSED_ENV_VARS := n
export RAY_AUTH_MODE := token

.PHONY: demo test lint typecheck unit integration venv clean

venv: $(STAMP)

# Rebuilt when pyproject.toml changes (a stale venv is replaced, not patched).
$(STAMP): pyproject.toml
	@if [ ! -x $(BIN)/python ] || ! $(BIN)/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then \
		rm -rf $(VENV); $(PYTHON) -m venv $(VENV); fi
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,peers]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/graphflow demo --model smollm2-135m --replicas 2 --tasks 2

lint: $(STAMP)
	$(BIN)/ruff check graphflow transport scheduler tests experiments
	$(BIN)/ruff format --check graphflow transport scheduler tests experiments

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q

integration: $(STAMP)
	$(BIN)/python -m pytest tests/integration -q

test: lint typecheck
	$(BIN)/python -m pytest tests -q --durations=10

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

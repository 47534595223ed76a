# The two commands a newcomer needs: `make serve` and `make test` (both set up first).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PROFILE ?= cpu
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
SEED ?= 7

.PHONY: setup serve test test-unit test-integration lint typecheck check model perf warmup clean

setup:
	@bash scripts/setup.sh

serve: setup
	$(PY) -m dispatch_service.server --profile $(PROFILE) \
		--http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT)

test: setup
	$(PY) -m pytest tests

test-unit: setup
	$(PY) -m pytest tests/unit

test-integration: setup
	$(PY) -m pytest tests/integration

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

check: lint typecheck test

# Retrain the committed model (reproducible from SEED); writes model.onnx and its card.
model: setup
	$(PY) -m dispatch_service.training --seed $(SEED)

# First perf_analyzer run of the ensemble; writes perf/reports/.
perf: setup
	$(PY) perf/run_perf_analyzer.py

clean:
	rm -rf $(VENV) .triton .pytest_cache .mypy_cache .ruff_cache

# Regenerate model_repository/*/warmup/ after changing the contract or the encoder.
warmup: setup
	$(PY) -m dispatch_service.warmup

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
	$(PY) -m dispatch_service.ops.server --profile $(PROFILE) \
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
	$(VENV)/bin/lint-imports

typecheck: setup
	$(VENV)/bin/mypy

check: lint typecheck test

# Retrain the committed model (reproducible from SEED); writes model.onnx and its card.
model: setup
	$(PY) -m dispatch_service.offline.training --seed $(SEED)

# Quick perf_analyzer sweep of the ensemble over gRPC; writes perf/reports/<stamp>/.
perf: setup
	$(PY) -m perf.run_perf_analyzer

clean:
	rm -rf $(VENV) .triton .pytest_cache .mypy_cache .ruff_cache

# Regenerate model_repository/*/warmup/ after changing the contract or the encoder.
warmup: setup
	$(PY) -m dispatch_service.ops.warmup

# Sign one model version folder (writes MANIFEST.json + MANIFEST.sig into it):
#   make sign MODEL=dispatch_model VERSION=2 KEY=path/to/signing.key [REPO=model_repository]
# Without KEY the private key PEM is read from the environment variable DISPATCH_SIGNING_KEY.
# Sign every version folder a server could load (all models but the ensembles):
#   make sign-all KEY=~/keys/ops.key [REPO=model_repository]
.PHONY: sign sign-all
sign-all: setup
	$(PY) -m dispatch_service.ops.admin sign-repository $(if $(REPO),$(REPO)) $(if $(KEY),--key $(KEY))

sign: setup
	@test -n "$(MODEL)" -a -n "$(VERSION)" || { \
		echo "usage: make sign MODEL=dispatch_model VERSION=2 [KEY=path/to/signing.key]" >&2; exit 2; }
	$(PY) -m dispatch_service.ops.admin sign --model $(MODEL) --version $(VERSION) \
		$(if $(KEY),--key $(KEY)) $(if $(REPO),--model-repository $(REPO))

# ONNX Runtime profile of the served dispatch_model over simulator windows: prints the
# per-operator table, writes the trace under perf/reports/profile-<stamp>/.
.PHONY: profile
profile: setup
	$(PY) -m dispatch_service.offline.profiling

# Every entry point (HTTP JSON, HTTP binary, gRPC, gRPC + system shm) of both Triton models
# (the dispatch ensemble and dispatch_fused) over a concurrency sweep and small/medium/large
# windows, against the in-process limit and a FastAPI baseline;
# writes perf/reports/bench-<stamp>/ (report.md, summary.json, plots). Under 10 minutes on
# 2 cores; `make bench-quick` is a 1-2 minute smoke run.
.PHONY: bench bench-quick
bench: setup
	$(PY) -m perf.bench

bench-quick: setup
	$(PY) -m perf.bench --quick

# Retrain dispatch_model version 2 (log features, more data, wider net) and compare it with
# version 1 on the same held-out pairs and policy windows in its card. Several minutes.
.PHONY: model-v2
model-v2: setup
	$(PY) -m dispatch_service.offline.training --seed $(SEED) --windows 3000 --epochs 40 \
		--eval-windows 256 --hidden 192,96 --log-features --version 2 \
		--compare-with model_repository/dispatch_model/1

# Latency cost of shadow scoring: the same windows with shadow_percent 0 and 100 on a
# server of its own; prints p50/p95/p99 per setting.
.PHONY: shadow-cost
shadow-cost: setup
	$(PY) -m perf.shadow_cost

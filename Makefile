# The two commands a newcomer needs: `make serve` and `make test` (both set up first).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PROFILE ?= cpu
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
SEED ?= 7

.PHONY: help setup serve test test-unit test-integration lint typecheck check model perf warmup clean

setup: ## install everything into .venv and .triton (idempotent)
	@bash scripts/setup.sh

# Loopback only, control endpoints locked (keys created in .triton/keys/ unless given; see
# docs/security.md); health on METRICS_PORT + 1 unless HEALTH_PORT is set. Follows the fleet
# state in STATE_STORE (docs/fleet.md).
STATE_STORE ?= .triton/fleet
serve: setup ## serve the repository, locked, on loopback (HTTP_PORT, GRPC_PORT, METRICS_PORT, HEALTH_PORT, PROFILE, STATE_STORE)
	$(PY) -m dispatch_service.ops.server --profile $(PROFILE) \
		--http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT) \
		$(if $(HEALTH_PORT),--health-port $(HEALTH_PORT)) --state-store $(STATE_STORE)

# Test files are spread over TEST_WORKERS processes, a file's tests in one (module-scoped
# servers are started once); TEST_WORKERS=0 runs everything in this process.
TEST_WORKERS ?= 2
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist loadfile

test: setup ## unit and integration tests (TEST_WORKERS=2 processes)
	$(PY) -m pytest $(PYTEST_PARALLEL) tests

test-unit: setup ## unit tests only
	$(PY) -m pytest $(PYTEST_PARALLEL) tests/unit

test-integration: setup ## integration tests on a live tritonserver
	$(PY) -m pytest $(PYTEST_PARALLEL) tests/integration

# The hostile-client checks at full size, beside `make test` (which runs each small):
# a model file swapped 0-100 ms after each of 100 load requests on every load path; 1,000
# wrapped-shape requests, /readyz through 5 stub kills, a second user polling /dev/shm
# through 50 reloads, 50 stops, 10 rounds of short-deadline bursts beside CPU burners, 192
# callers without the priority key flooding level 1, 10,000 windows through shared memory
# (docs/operations.md, "Health, supervision and drain").
.PHONY: test-hostile
test-hostile: setup ## the hostile-client checks at full size (about an hour)
	DISPATCH_SWAP_ATTEMPTS=100 DISPATCH_FLOODERS=192 DISPATCH_HOSTILE_FULL=1 $(PY) -m pytest -s \
		tests/unit/ops/test_repository_copy.py tests/integration/test_swapped_load.py \
		tests/integration/test_priority_entitlement.py \
		tests/integration/test_hostile_clients.py tests/integration/test_deadline_burst.py \
		tests/integration/test_shared_memory.py::test_many_requests_reuse_the_regions_and_leave_nothing_behind

# A rollout judged on outcomes, live (docs/experiments.md): the live city against a fleet of
# one, then of two replicas; a deliberately worse version rolled back at its first step, a
# better one stepped to 100 % and promoted. About 5-10 minutes a fleet on 2 cores.
.PHONY: test-rollout
test-rollout: setup ## rollouts judged on outcomes, live, on fleets of one and two replicas
	ROLLOUT_LIVE=1 ROLLOUT_REPLICAS=1 $(PY) -m pytest -s tests/integration/test_rollout_live.py
	ROLLOUT_LIVE=1 ROLLOUT_REPLICAS=2 $(PY) -m pytest -s tests/integration/test_rollout_live.py

lint: setup ## ruff check, ruff format --check, lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: setup ## mypy --strict
	$(VENV)/bin/mypy

check: lint typecheck test ## lint, typecheck and test

# Retrain the committed model (reproducible from SEED); writes model.onnx and its card.
model: setup ## retrain dispatch_model version 1 from SEED
	$(PY) -m dispatch_service.offline.training --seed $(SEED)

# Quick perf_analyzer sweep of the ensemble over gRPC; writes perf/reports/<stamp>/ (ignored
# by git). Starts its own server on free ports, or on the ports given on the command line
# (make perf HTTP_PORT=9000 GRPC_PORT=9001 METRICS_PORT=9002), or measures a running one
# (make perf URL=127.0.0.1:8001, its gRPC endpoint).
perf: setup ## perf_analyzer gRPC sweep (URL=host:port for a running server)
	$(PY) -m perf.run_perf_analyzer $(if $(URL),--url $(URL),$(if $(filter command line environment,$(origin GRPC_PORT)),--http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT)))

clean: ## remove .venv, .triton and tool caches
	rm -rf $(VENV) .triton .pytest_cache .mypy_cache .ruff_cache

# Regenerate model_repository/*/warmup/ after changing the contract or the encoder.
warmup: setup ## regenerate model_repository/*/warmup/
	$(PY) -m dispatch_service.ops.warmup

# Render dispatch_fused and dispatch_priority (config.pbtxt, 1/model.py) from their one
# source, dispatch_service.ops.entry_point_configs, and the contract's tensors.
.PHONY: configs
configs: setup ## render dispatch_fused's and dispatch_priority's config.pbtxt and model.py
	$(PY) -m dispatch_service.ops.entry_point_configs

# Sign one model version folder (writes MANIFEST.json + MANIFEST.sig into it):
#   make sign MODEL=dispatch_model VERSION=2 KEY=path/to/signing.key [REPO=model_repository]
# Without KEY the private key PEM is read from the environment variable DISPATCH_SIGNING_KEY.
# Sign every version folder a server could load (all models but the ensembles):
#   make sign-all KEY=~/keys/ops.key [REPO=model_repository]
.PHONY: sign sign-all
sign-all: setup ## sign every loadable version folder (KEY=, REPO=)
	$(PY) -m dispatch_service.ops.admin sign-repository $(if $(REPO),$(REPO)) $(if $(KEY),--key $(KEY))

sign: setup ## sign one version folder (MODEL=, VERSION=, KEY=)
	@test -n "$(MODEL)" -a -n "$(VERSION)" || { \
		echo "usage: make sign MODEL=dispatch_model VERSION=2 [KEY=path/to/signing.key]" >&2; exit 2; }
	$(PY) -m dispatch_service.ops.admin sign --model $(MODEL) --version $(VERSION) \
		$(if $(KEY),--key $(KEY)) $(if $(REPO),--model-repository $(REPO))

# ONNX Runtime profile of the served dispatch_model over simulator windows: prints the
# per-operator table, writes the trace under perf/reports/profile-<stamp>/.
.PHONY: profile
profile: setup ## ONNX Runtime per-operator profile of dispatch_model
	$(PY) -m dispatch_service.offline.profiling

# Every entry point (HTTP JSON, HTTP binary, gRPC, gRPC + system shm) of both Triton models
# (the dispatch ensemble and dispatch_fused) over a concurrency sweep and small/medium/large
# windows, against the in-process limit and a FastAPI baseline; the small c=64 comparison in
# three alternating rounds (median and spread); open-loop overload at 1.5x and 3x capacity
# with the server and the load on separate cores (perf.overload_bench). Writes
# perf/reports/bench-<stamp>/ (report.md, summary.json, plots; git-ignored). About 12-13
# minutes on 2 cores, on a quiet host; `make bench-quick` is a 4-6 minute smoke run whose
# figures are too short to judge. `make bench-overload` runs the open-loop part alone.
.PHONY: bench bench-quick bench-overload
bench: setup ## every entry point vs limits and FastAPI, rounds, open loop (about 12-13 minutes)
	$(PY) -m perf.bench

bench-quick: setup ## the bench pipeline in 4-6 minutes (a smoke run)
	$(PY) -m perf.bench --quick

bench-overload: setup ## open-loop overload, server and load on separate cores (about 2 minutes)
	$(PY) -m perf.overload_bench $(if $(SECONDS_PER_PHASE),--seconds $(SECONDS_PER_PHASE))

# Retrain dispatch_model version 2 (log features, wider net; same data and epochs as version
# 1 to keep CPU time small) and compare it with version 1 on the same held-out pairs and
# policy windows in its card.
.PHONY: model-v2
V2_ARGS := --hidden 192,96 --log-features --version 2 \
	--compare-with model_repository/dispatch_model/1
model-v2: setup ## retrain dispatch_model version 2 and compare with 1
	$(PY) -m dispatch_service.offline.training --seed $(SEED) $(V2_ARGS)

# Retrain v1 and v2 into temporary folders and compare every file (model.onnx, cards,
# feature_layout.json) byte for byte with the committed ones; fails on any difference.
.PHONY: model-check
model-check: setup ## retrain v1 and v2 in a temporary folder; fail unless byte-identical
	$(PY) -m dispatch_service.offline.training --seed $(SEED) --check
	$(PY) -m dispatch_service.offline.training --seed $(SEED) $(V2_ARGS) --check

# The cards' policy evaluation of v1 and v2 again, over their committed model.onnx, without
# training (training reads neither the default objective nor the report's code): what a
# change of either needs. `make model-check` confirms the cards a full retrain writes.
.PHONY: model-cards
model-cards: setup ## rewrite v1's and v2's card policy sections without training
	$(PY) -m dispatch_service.offline.training --seed $(SEED) --card-only
	$(PY) -m dispatch_service.offline.training --seed $(SEED) $(V2_ARGS) --card-only

# Every policy (nearest-rider, distance matching, rule ETA, model v1 and v2 as served, both
# oracles) on every registered city's and regime's held-out windows, every order counted, and
# the candidate objective weights judged by the default's stated measure: evaluation/reports/
# report.md, summary.json and plots. The (city, regime) cells run in two processes.
.PHONY: evaluate
evaluate: setup ## every policy in every city and regime, every order counted (evaluation/reports/)
	$(PY) -m dispatch_service.offline.evaluation --choose-weights --jobs 2

# Latency cost of shadow scoring: the same windows with shadow_percent 0 and 100 on a
# server of its own; prints p50/p95/p99 per setting.
.PHONY: shadow-cost
shadow-cost: setup ## latency cost of shadow scoring
	$(PY) -m perf.shadow_cost

# A live city against a running server (`make serve` in another terminal): the simulator
# plays CITIES (SPEED simulated seconds per wall second) through dispatch_fused and reports
# every outcome to the launcher's /v1/outcomes with the key in OUTCOME_KEY_FILE; it stops
# after ORDERS answered orders (docs/outcomes.md). SCENARIO changes one city's world, e.g.
# make live-city SCENARIO=speeds-30:city=chengdu:from-minute=30
CITIES ?= shanghai,chengdu
ORDERS ?= 2000
SPEED ?= 60
OUTCOME_KEY_FILE ?= .triton/keys/outcome.key
.PHONY: live-city live-city-full live-city-alerts
live-city: setup ## play simulated cities against a running server, outcomes reported late (CITIES, ORDERS, SCENARIO)
	$(PY) -m dispatch_service.offline.live_city --url 127.0.0.1:$(GRPC_PORT) \
		--outcomes-url http://127.0.0.1:$(or $(HEALTH_PORT),$(shell echo $$(($(METRICS_PORT) + 1)))) \
		--outcome-key-file $(OUTCOME_KEY_FILE) --cities $(CITIES) --orders $(ORDERS) \
		--speed $(SPEED) $(if $(SCENARIO),--scenario $(SCENARIO))

# The live-city integration test at 20,000 orders on a server of its own: every answered
# order has one decision record and every outcome is joined (about 15 minutes on 2 cores).
live-city-full: setup ## the live-city count test at 20,000 orders
	LIVE_CITY_ORDERS=20000 $(PY) -m pytest -s tests/integration/test_live_city.py -k one_decision

# The alerts against a changed world: speeds -30 % and an unlisted barrier in Chengdu, 70 %
# fewer riders in Beijing, each a run with its series through promtool (about 5 minutes each).
live-city-alerts: setup ## the live-city runs whose recorded series must fire a changed city's alerts
	LIVE_CITY_SCENARIOS=1 $(PY) -m pytest -s tests/integration/test_live_city.py -k changed_city

# One line per target, from the "## " note on its rule line.
help: ## list the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sort | \
		awk -F':.*## ' '{ printf "  %-17s %s\n", $$1, $$2 }'

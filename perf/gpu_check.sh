#!/usr/bin/env bash
# GPU check, at most five minutes: cpu profile vs gpu profile with CUDA shared memory vs gpu
# profile with ordinary copies (latency p50/p99, throughput at concurrency 128, GPU memory),
# and the feature-level entry point dispatch_features on the gpu server with CUDA shm vs plain
# gRPC at concurrency 128, set beside the original design's zero-copy vs memcpy figures.
# Writes perf/reports/gpu-<stamp>/report.md (and summary.json, server logs). Also runs the
# GPU monitor on the real NVML while the gpu server is measured (its CPU share,
# the GPUs' states, the CUDA context probe) and drills the device fallback on that server
# (every GPU marked unhealthy by synthetic readings -> L2 CPU instances -> back to L0).
#
# Needs an NVIDIA GPU with its driver and this project set up on that host (`make setup`
# installs onnxruntime-gpu there). Without a GPU it stops at once with "no NVIDIA GPU".
# Extra arguments go to perf/gpu_check.py (e.g. --orders 256 --riders 2000, or
# --tritonserver /opt/tritonserver/bin/tritonserver for the native onnxruntime backend).
set -euo pipefail
cd "$(dirname "$0")/.."
die() { printf 'gpu_check: %s\n' "$*" >&2; exit 2; }

command -v nvidia-smi >/dev/null 2>&1 \
  || die "no NVIDIA GPU: nvidia-smi not found; run this on a host with an NVIDIA GPU and driver"
gpus=$(nvidia-smi -L 2>/dev/null) || die "no NVIDIA GPU: nvidia-smi -L failed (driver not loaded?)"
[ -n "$gpus" ] || die "no NVIDIA GPU: nvidia-smi lists no device"
[ -x .venv/bin/python ] || die "no .venv: run 'make setup' on this GPU host first"
.venv/bin/python - <<'PY' || die "onnxruntime has no CUDA EP: run 'make setup' on this GPU host (installs onnxruntime-gpu)"
import onnxruntime, sys
sys.exit(0 if "CUDAExecutionProvider" in onnxruntime.get_available_providers() else 1)
PY

out=perf/reports/gpu-$(date +%Y%m%d-%H%M%S)
printf 'gpu_check: %s\ngpu_check: writing %s (at most 5 minutes)\n' "$gpus" "$out"
# SIGINT first so the script stops its servers; SIGKILL 15 s later if it does not.
exec timeout --signal=INT --kill-after=15 285 .venv/bin/python -m perf.gpu_check --out "$out" "$@"

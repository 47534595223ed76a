#!/usr/bin/env bash
# One idempotent setup: system libraries, the venv with pinned packages, and the Triton 2.51
# runtime from the nvidia-pytriton wheel laid out as a backend folder. Says what it does;
# stops with the reason on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3.11}
TRITON_HOME=$ROOT/.triton
say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] FAILED: %s\n' "$*" >&2; exit 1; }

command -v "$PYTHON" >/dev/null || die "$PYTHON not found on PATH; install Python 3.11 (Debian: apt-get install python3.11 python3.11-venv)"

# System libraries: the Python-backend stub embeds libpython3.11; perf_analyzer needs libb64;
# the metrics integration test scrapes the server with a real prometheus; the outcome store's
# tests and benchmark start a throwaway PostgreSQL (perf/postgres_server.py).
need_apt=()
ldconfig -p | grep -q 'libpython3.11.so.1.0' || need_apt+=(libpython3.11)
ldconfig -p | grep -q 'libb64.so.0d' || need_apt+=(libb64-0d)
command -v prometheus >/dev/null || need_apt+=(prometheus)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need_apt+=(postgresql)
# The C compiler builds native/private_shm.c (below); without one as a non-root user, the
# server runs without it and says so.
can_apt=no
[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && can_apt=yes
if [ "$can_apt" = yes ]; then
  command -v cc >/dev/null || need_apt+=(gcc)
  [ -e /usr/include/dlfcn.h ] || need_apt+=(libc6-dev)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$can_apt" = yes ]; then
    say "installing Debian packages: ${need_apt[*]}"
    apt-get update -qq >/dev/null || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null \
      || die "apt-get install ${need_apt[*]} failed"
  else
    die "missing system packages ${need_apt[*]}: run as root or 'sudo apt-get install ${need_apt[*]}'"
  fi
else
  say "system packages present (libpython3.11, libb64, prometheus $(prometheus --version 2>&1 | head -1 | awk '{print $3}'), postgresql)"
fi

# The venv, reinstalled only when the pins change.
if [ ! -x "$VENV/bin/python" ]; then
  say "creating venv $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV" || die "python -m venv failed (Debian: apt-get install python3.11-venv)"
fi
stamp=$VENV/.setup-stamp
want=$(cat VERSION pyproject.toml contract/pyproject.toml client/pyproject.toml requirements/constraints.txt | sha256sum | cut -c1-16)
gpu=no
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && gpu=yes
want="$want-gpu=$gpu"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing pinned packages into $VENV (gpu=$gpu)"
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  "$VENV/bin/pip" install -q -c requirements/constraints.txt \
    -e ./contract -e ./client -e ".[server,train,dev]" \
    || die "pip install failed"
  if [ "$gpu" = yes ]; then
    say "NVIDIA GPU found: replacing onnxruntime with onnxruntime-gpu"
    "$VENV/bin/pip" uninstall -q -y onnxruntime
    "$VENV/bin/pip" install -q "onnxruntime-gpu==$(grep -i '^onnxruntime==' requirements/constraints.txt | cut -d= -f3)" \
      || die "pip install onnxruntime-gpu failed"
  fi
  echo "$want" > "$stamp"
else
  say "venv up to date ($VENV)"
fi

# Triton's Python backend folder: library, utils and the 3.11 stub side by side.
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
PYTRITON=$SITE/pytriton/tritonserver
[ -x "$PYTRITON/bin/tritonserver" ] || die "tritonserver not found in nvidia-pytriton ($PYTRITON)"
mkdir -p "$TRITON_HOME/backends/python"
# Every make target runs this script, also while servers run from this folder (the
# integration tests run `make sign-all` next to their session server). A running tritonserver
# maps libtriton_python.so: `cp -f` over it rewrites the mapped file in place and the server
# dies (SIGBUS). So a file is left alone when unchanged, else replaced by a rename: running
# processes keep the old inode.
place() { # place SOURCE MODE: into the backend folder under the same name
  local target=$TRITON_HOME/backends/python/$(basename "$1")
  cmp -s "$1" "$target" && return 0
  cp "$1" "$target.tmp.$$" && chmod "$2" "$target.tmp.$$" && mv -f "$target.tmp.$$" "$target" \
    || die "cannot install $target"
}
place "$PYTRITON/backends/python/libtriton_python.so" 644
place "$PYTRITON/backends/python/triton_python_backend_utils.py" 644
place "$PYTRITON/python_backend_stubs/3.11/triton_python_backend_stub" 755
# The LD_PRELOAD shim that keeps the backend's /dev/shm regions 0600 from their creation
# (native/private_shm.c; the launcher preloads it into Triton). Replaced by a rename, as
# above: running servers map it.
SHIM=$TRITON_HOME/lib/libdispatch_private_shm.so
mkdir -p "$TRITON_HOME/lib"
if command -v cc >/dev/null \
  && cc -shared -fPIC -O2 -Wall -Wextra -Werror -o "$SHIM.tmp.$$" native/private_shm.c -ldl; then
  if cmp -s "$SHIM.tmp.$$" "$SHIM"; then rm -f "$SHIM.tmp.$$"; else mv -f "$SHIM.tmp.$$" "$SHIM"; fi
  say "private shared-memory shim: $SHIM"
else
  rm -f "$SHIM.tmp.$$"
  say "WARNING: $SHIM not built (no working C compiler): the Python backend's regions are made 0644 (docs/security.md)"
fi
cat > "$TRITON_HOME/env.sh" <<ENV
# Sourced by the Makefile and the test fixture: how to run this checkout's tritonserver.
export TRITONSERVER_BIN="$PYTRITON/bin/tritonserver"
export TRITON_BACKEND_DIR="$TRITON_HOME/backends"
export TRITON_LD_LIBRARY_PATH="$SITE/nvidia_pytriton.libs"
export PERF_ANALYZER_BIN="$VENV/bin/perf_analyzer"
export PERF_ANALYZER_LD_LIBRARY_PATH="$SITE/nvidia/cuda_runtime/lib"
ENV
LD_LIBRARY_PATH="$SITE/nvidia/cuda_runtime/lib" "$VENV/bin/perf_analyzer" --version >/dev/null 2>&1 \
  || die "perf_analyzer does not start: $(LD_LIBRARY_PATH="$SITE/nvidia/cuda_runtime/lib" "$VENV/bin/perf_analyzer" --version 2>&1 | head -1)"
say "perf_analyzer: $VENV/bin/perf_analyzer (from tritonclient 2.51.0)"
say "tritonserver: $PYTRITON/bin/tritonserver (Triton 2.51 from nvidia-pytriton 0.7.0)"
say "python backend: $TRITON_HOME/backends/python"
# The compiled kernels into numba's cache beside their modules, once: otherwise every stub
# of a first server start compiles them at once (several CPU-seconds each on 2 cores).
"$VENV/bin/python" -c "import dispatch_service.domain.pair_kernels, dispatch_service.domain.window_kernels" \
  || die "the numba kernels do not compile"
say "numba kernels compiled into their cache"
say "done"

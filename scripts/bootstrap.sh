# Sourced by scripts/up and scripts/test: make .venv ready, install what is missing.
# Idempotent and quick when nothing changed (a stamp of pyproject.toml's hash, the
# ONNX Runtime build and what was installed).
#
#   VIDREC_INSTALL=runtime (scripts/up) | test (scripts/test: the runtime, then the test
#     extras: pytest, the Kafka-protocol broker, deploy validators, Playwright, linters)
#   VIDREC_ONNXRUNTIME=auto (default: the GPU build when nvidia-smi lists a GPU, else the
#     CPU build) | cpu | gpu
#   VIDREC_TORCH: the torch requirement (default torch==2.13.0, a CPU wheel here)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
install="${VIDREC_INSTALL:-runtime}"

need_apt=()
if [ "${VIDREC_NEED_REDIS:-0}" = 1 ] && ! command -v redis-server >/dev/null 2>&1; then
  need_apt+=(redis-server)
fi
if [ "${VIDREC_NEED_BROWSER:-0}" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  need_apt+=(chromium)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: installing ${need_apt[*]} with apt-get" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
  # The Debian package may start a server on 6379; ours start their own.
fi

ort="${VIDREC_ONNXRUNTIME:-auto}"
if [ "$ort" = auto ]; then
  ort=cpu
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    ort=gpu
  fi
fi
case "$ort" in cpu|gpu) ;; *) echo "bootstrap: VIDREC_ONNXRUNTIME=$ort (auto, cpu or gpu)" >&2; exit 2;; esac
extras="$ort"; [ "$install" = test ] && extras="$ort,test"

if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv" >&2
  "$PY" -m venv .venv
fi
stamp=".venv/.vidrec-installed"   # "<pyproject hash> <cpu|gpu> <runtime|test>"
hash="$(sha256sum pyproject.toml | cut -c1-16)"
have_hash="" have_ort="" have_install=""
[ -f "$stamp" ] && read -r have_hash have_ort have_install < "$stamp" || true
# A test install holds the runtime too: scripts/up after scripts/test installs nothing.
if [ "$have_hash" != "$hash" ] || [ "$have_ort" != "$ort" ] \
   || { [ "$have_install" != test ] && [ "$install" = test ]; }; then
  echo "bootstrap: installing vidrec[$extras] into .venv" >&2
  # Editable installs from pyproject.toml need pip >= 21.3; newer ones are not upgraded.
  if ! .venv/bin/python -c 'import sys, pip; sys.exit(int(pip.__version__.split(".")[0]) < 22)'
  then
    .venv/bin/pip install -q --upgrade pip >/dev/null
  fi
  # Both ONNX Runtime builds install the one `onnxruntime` module: switching builds
  # removes both first (removing one would break the other's files), then installs one.
  other="onnxruntime-gpu"; [ "$ort" = gpu ] && other="onnxruntime"
  if .venv/bin/pip show -q "$other" >/dev/null 2>&1; then
    .venv/bin/pip uninstall -q -y onnxruntime onnxruntime-gpu
  fi
  # torch pinned in the same resolve: a bare `torch` requirement would pull CUDA (GBs).
  # Elsewhere, set VIDREC_TORCH to a CPU wheel (or a version your index serves).
  # --no-compile: Python compiles what a process imports on first use; compiling every
  # module of every wheel here took longer than the download (torch: 34 s, 13 s without).
  .venv/bin/pip install -q --no-compile "${VIDREC_TORCH:-torch==2.13.0}" -e ".[$extras]"
  echo "$hash $ort $install" > "$stamp"
fi
# --no-compile counts on Python caching the bytecode of what it imports. Where
# PYTHONDONTWRITEBYTECODE is set (some sandboxes and CI images), nothing is cached and
# every process compiles every module it imports again: a `vidrec train` start took
# 8.5-11 s of CPU instead of 3.6-4.0 (torch, sympy and torch._dynamo compiled each
# time), and the test suite starts dozens of `vidrec` processes (docs/benchmarks.md,
# *Test suite*). The cache goes under .venv (ignored; nothing beside the sources).
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
  unset PYTHONDONTWRITEBYTECODE
  export PYTHONPYCACHEPREFIX="$ROOT/.venv/pycache"
fi

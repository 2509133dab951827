# Sourced by scripts/up and scripts/test: make .venv ready, install what is missing.
# Idempotent and quick when nothing changed (a stamp of pyproject.toml's hash).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"

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

if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv" >&2
  "$PY" -m venv .venv
fi
stamp=".venv/.vidrec-installed"
want="$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "bootstrap: installing vidrec and its dependencies into .venv" >&2
  .venv/bin/pip install -q --upgrade pip >/dev/null
  # The CPU build of torch first: a bare `torch` requirement would pull CUDA (GBs).
  # Elsewhere, set VIDREC_TORCH to a CPU wheel (or a version your index serves).
  .venv/bin/pip install -q "${VIDREC_TORCH:-torch==2.13.0}"
  .venv/bin/pip install -q -e ".[test]"
  echo "$want" > "$stamp"
fi

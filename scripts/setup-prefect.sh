#!/usr/bin/env bash
# Prefect 3 for the `prefect` platform adapter, in its OWN virtualenv (.venv-prefect): Prefect's
# pins would fight ours, and the harness never imports prefect (it talks to the server over
# HTTP). This project is installed into it with --no-deps so the deployed flow can import
# controlplane.workload / controlplane.storage. Idempotent: a second run only checks the stamp.
# Measured on a 2-core machine: ~60 s from nothing (pip resolve + install).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${GAMEDAY_PREFECT_VENV:-.venv-prefect}
# pinned: the adapter relies on REST behaviour (idempotency keys, state history) measured on it
PREFECT_SPEC='prefect==3.9.1'
stamp="$VENV/.installed"
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt "$0" ] \
   && [ -x "$VENV/bin/prefect" ]; then
  echo "==> ready: $VENV/bin/prefect ($(cat "$stamp"))"
  exit 0
fi
started=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
echo "==> installing Prefect 3 (+ asyncpg, numpy, boto3) into $VENV (about a minute)"
"$VENV/bin/pip" install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
# asyncpg is Prefect's own PostgreSQL driver (a dependency of prefect); numpy + boto3 run the flow
"$VENV/bin/pip" install -q "$PREFECT_SPEC" asyncpg numpy boto3 2>&1 | grep -v "is ignored" || true
# flock: setup.sh installs this project editable into .venv at the same time (both write its
# egg-info in this tree)
flock pyproject.toml "$VENV/bin/pip" install -q --no-deps -e . 2>&1 | grep -v "is ignored" || true
version=$("$VENV/bin/python" -c 'import prefect; print(prefect.__version__)')
"$VENV/bin/python" -c 'import asyncpg, numpy, boto3, controlplane.workload.run' \
  || { echo "setup-prefect: $VENV is incomplete" >&2; exit 1; }
echo "prefect $version, installed in $(( $(date +%s) - started )) s" > "$stamp"
echo "==> ready: $VENV/bin/prefect ($(cat "$stamp"))"

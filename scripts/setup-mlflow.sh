#!/usr/bin/env bash
# MLflow 3 for `gameday bench controlplane --peer mlflow` and the tracking-outage failure class
# (its server in the local environment; the plain client as the peer), in its OWN virtualenv (.venv-mlflow):
# MLflow's pins (Flask, SQLAlchemy, alembic, numpy, pandas...) would fight ours, and the harness
# never imports mlflow: the bench starts `mlflow server` on the bench's PostgreSQL and talks to it
# over HTTP with wrk. Idempotent: a second run only checks the stamp. The bench never installs it.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${GAMEDAY_MLFLOW_VENV:-.venv-mlflow}
# pinned: the side-by-side figures in docs/performance.md were measured against this release
# (its tracking server's REST `runs/create` and its SQLAlchemy store); another release is another
# peer, so a bump is a deliberate re-measurement, not a drift. Not 3.18.0: it requires
# mlflow-tracing==3.18.0, which the package index here did not have (2026-12-06).
MLFLOW_SPEC='mlflow==3.17.2'
stamp="$VENV/.installed"
if [ -f "$stamp" ] && [ "$stamp" -nt "$0" ] && [ -x "$VENV/bin/mlflow" ]; then
  echo "==> ready: $VENV/bin/mlflow ($(cat "$stamp"))"
  exit 0
fi
started=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
echo "==> installing MLflow (+ psycopg2-binary) into $VENV (a few minutes)"
"$VENV/bin/pip" install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
# psycopg2 is the driver MLflow's SQLAlchemy store uses for postgresql:// URIs; boto3 is how
# its artifact proxy writes to an s3:// --artifacts-destination (the tracking-outage class's
# server keeps its artifacts in the local S3 server: environments/local/tracking.py)
"$VENV/bin/pip" install -q "$MLFLOW_SPEC" psycopg2-binary boto3 2>&1 | grep -v "is ignored" || true
version=$("$VENV/bin/python" -c 'import mlflow; print(mlflow.__version__)')
"$VENV/bin/python" -c 'import psycopg2, boto3, mlflow.server' \
  || { echo "setup-mlflow: $VENV is incomplete" >&2; exit 1; }
echo "mlflow $version, installed in $(( $(date +%s) - started )) s" > "$stamp"
echo "==> ready: $VENV/bin/mlflow ($(cat "$stamp"))"

#!/usr/bin/env bash
# KServe's Python model server for the local environment's serving replicas, in its OWN
# virtualenv (.venv-kserve): kserve 0.21 brings grpcio, pandas, kubernetes 37 and its own
# fastapi/uvicorn floors (about 450 MB); the harness never imports kserve, it starts
# `python -m controlplane.serving.server` with this interpreter (boto3 beside it: it reads the
# model from the S3 server with signed requests, as from any S3) and talks to it over HTTP
# (Open Inference Protocol v2). The replicas find this project through PYTHONPATH (set by
# environments/local/serving.py), so nothing of it is installed here. Idempotent: a second run
# only checks the stamp. Measured on this 2-core machine: 95 s from nothing (docs/serving.md).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${GAMEDAY_KSERVE_VENV:-.venv-kserve}
# pinned: the serving component and its failure classes were measured against this release
# (ModelServer with a model registered before start and loaded in the background, the v2
# readiness answer 503 until `ready`, response headers from predict)
KSERVE_SPEC='kserve==0.21.0'
stamp="$VENV/.installed"
if [ -f "$stamp" ] && [ "$stamp" -nt "$0" ] && [ -x "$VENV/bin/python" ]; then
  echo "==> ready: $VENV/bin/python ($(cat "$stamp"))"
  exit 0
fi
started=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
echo "==> installing KServe's model server into $VENV (about 2 minutes)"
"$VENV/bin/pip" install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
"$VENV/bin/pip" install -q "$KSERVE_SPEC" boto3 2>&1 | grep -v "is ignored" || true
version=$("$VENV/bin/python" -c 'import importlib.metadata as m, boto3, kserve.model_server; print(m.version("kserve"))')
echo "kserve $version, installed in $(( $(date +%s) - started )) s" > "$stamp"
echo "==> ready: $VENV/bin/python ($(cat "$stamp"))"

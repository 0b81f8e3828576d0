#!/usr/bin/env bash
# Everything a fresh machine needs: Debian packages for the local environment and the tests,
# the virtual environment at .venv, and this package installed into it (console script
# `gameday` in .venv/bin). Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

# Prefect 3 (its own venv, for the `prefect` platform adapter and its tests) and KServe's model
# server (its own venv, for the local environment's serving replicas: `gameday env up
# --serving`, docs/serving.md) install while the Debian packages and .venv do: a minute or two
# each, mostly download and unpack, so side by side they cost the longest of the three, not
# the sum. The two editable installs of this project (into .venv and .venv-prefect) write its
# egg-info in this tree: each holds a lock on pyproject.toml while it does (flock). Each side
# venv's output is shown once it ends.
side=$(mktemp -d)
trap 'jobs -p | xargs -r kill 2>/dev/null; rm -rf "$side"' EXIT
bash scripts/setup-prefect.sh > "$side/prefect.log" 2>&1 & prefect_pid=$!
bash scripts/setup-kserve.sh > "$side/kserve.log" 2>&1 & kserve_pid=$!

APT_PACKAGES=(postgresql-15 patroni etcd-server etcd-client haproxy docker-registry prometheus
              chromium iproute2 procps
              fuse3 libfuse3-3  # environments/local/faultfs: fusermount3 + the library mfusepy loads
              wrk)  # the load client of `gameday bench controlplane --peer`

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> installing Debian packages: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian starts nothing by itself here (no systemd), but make sure no packaged daemon
  # holds the ports or data directories the harness wants.
  for svc in etcd prometheus docker-registry haproxy patroni postgresql; do
    $SUDO service "$svc" stop >/dev/null 2>&1 || true
  done
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "==> installing the package and its dependencies into .venv (about 2 minutes)"
  .venv/bin/pip install -q --upgrade pip
  flock pyproject.toml .venv/bin/pip install -q -e '.[dev]'
  touch "$stamp"
fi
failed=()
for side_venv in prefect kserve; do
  pid_var="${side_venv}_pid"
  if wait "${!pid_var}"; then cat "$side/$side_venv.log"; else
    cat "$side/$side_venv.log" >&2
    failed+=("scripts/setup-$side_venv.sh")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "setup failed in ${failed[*]} (the output is above)" >&2
  exit 1
fi
# MLflow 3.17.2 (its own venv, scripts/setup-mlflow.sh: 182 s from nothing in a CI run) is NOT
# installed here: no test of `make test` needs it, and make test is at its time budget. Its
# users install it: `make test-tier2` (the tracking-outage rows), `gameday env up --tracking`
# and `gameday bench controlplane --peer mlflow` name the script when it is missing.
echo "==> ready: .venv/bin/gameday"

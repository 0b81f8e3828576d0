# Four images from one build (no container engine runs in CI here; see docs/infra.md):
#   control plane (slim: core dependencies only; API, reconciler, agents, migrate, the sample
#   workload):
#     docker build --target controlplane -t <account>.dkr.ecr.<region>.amazonaws.com/mlplatform-<stack>/controlplane:<version> .
#   game-day runner (adds the harness extra: Chaos Toolkit, Locust, moto; `gameday gate`):
#     docker build --target gameday -t <account>.dkr.ecr.<region>.amazonaws.com/mlplatform-<stack>/gameday:<version> .
#   model server (KServe's Python model server + controlplane/serving; provisioning/components/serving.py):
#     docker build --target serving -t <account>.dkr.ecr.<region>.amazonaws.com/mlplatform-<stack>/serving:<version> .
#   tracking server (MLflow + its PostgreSQL driver and S3 client; provisioning/components/tracking.py):
#     docker build --target tracking -t <account>.dkr.ecr.<region>.amazonaws.com/mlplatform-<stack>/tracking:<version> .
# The serving and tracking pins are scripts/setup-kserve.sh's and scripts/setup-mlflow.sh's (what
# the local environment measured); tests/infra/test_images.py keeps them equal.
# Base image pinned by tag; pin by digest in your registry mirror for fully reproducible builds.
# BuildKit (Docker's default builder since 23.0) builds only the stages a --target needs.

FROM python:3.11.7-slim-bookworm AS source
WORKDIR /src
COPY pyproject.toml ./
COPY gameday ./gameday
COPY controlplane ./controlplane
COPY slo ./slo
COPY chaos ./chaos
COPY loadtests ./loadtests
COPY provisioning ./provisioning
COPY environments ./environments
COPY operations ./operations
COPY platforms ./platforms

FROM source AS build-controlplane
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install . \
 && /opt/venv/bin/gameday controlplane --help >/dev/null

FROM source AS build-gameday
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install ".[harness]" \
 && /opt/venv/bin/gameday gate --help >/dev/null

# KServe and MLflow each in their own venv, never with the project: their pins (fastapi,
# kubernetes, SQLAlchemy, numpy...) would fight the core's, as .venv-kserve / .venv-mlflow keep
# them apart locally. Wheels only (no compiler in the image): psycopg2-binary carries libpq.
FROM python:3.11.7-slim-bookworm AS build-serving
ARG KSERVE_SPEC=kserve==0.21.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --only-binary=:all: "$KSERVE_SPEC" boto3
# The server and what it imports of this repository (nothing else: the harness never runs here).
COPY controlplane/__init__.py controlplane/defects.py /opt/app/controlplane/
COPY controlplane/serving /opt/app/controlplane/serving
RUN PYTHONPATH=/opt/app /opt/venv/bin/python -m controlplane.serving.server --help >/dev/null

FROM python:3.11.7-slim-bookworm AS build-tracking
ARG MLFLOW_SPEC=mlflow==3.17.2
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# psycopg2: the driver of MLflow's SQLAlchemy store for postgresql:// URIs; boto3: how its
# artifact proxy writes to the s3:// --artifacts-destination.
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --only-binary=:all: "$MLFLOW_SPEC" psycopg2-binary boto3 \
 && /opt/venv/bin/python -c "import psycopg2, boto3, mlflow.server" \
 && /opt/venv/bin/mlflow server --help >/dev/null

FROM python:3.11.7-slim-bookworm AS runtime
# Fixed non-root uid/gid: the Kubernetes pods run as 10001 (provisioning/components/controlplane.py,
# serving.py, tracking.py).
RUN groupadd --system --gid 10001 gameday \
 && useradd --system --uid 10001 --gid gameday --home-dir /home/gameday --create-home gameday
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /home/gameday

# The pods give the command and arguments (provisioning/components/serving.py); the port is
# ServingConfig.port's default.
FROM runtime AS serving
COPY --from=build-serving /opt/venv /opt/venv
COPY --from=build-serving /opt/app /opt/app
ENV PYTHONPATH=/opt/app
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["python", "-m", "controlplane.serving.server"]
CMD ["--help"]

# `mlflow server ...` and the Job's `mlflow db upgrade` (provisioning/components/tracking.py);
# the port is TrackingConfig.port's default.
FROM runtime AS tracking
COPY --from=build-tracking /opt/venv /opt/venv
USER 10001:10001
EXPOSE 5000
ENTRYPOINT ["mlflow"]
CMD ["server", "--help"]

FROM runtime AS base
ENTRYPOINT ["gameday"]

FROM base AS gameday
COPY --from=build-gameday /opt/venv /opt/venv
USER 10001:10001
CMD ["gate", "--help"]

# Last, so a plain `docker build .` makes the control-plane image.
FROM base AS controlplane
COPY --from=build-controlplane /opt/venv /opt/venv
USER 10001:10001
EXPOSE 8080 9090
CMD ["controlplane", "api", "--host", "0.0.0.0", "--port", "8080"]

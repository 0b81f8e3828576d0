# Two images from one build (no container engine runs in CI here; see docs/infra.md):
#   control plane (slim: core dependencies only; API, reconciler, agents, migrate, the sample
#   workload):
#     docker build --target controlplane -t <account>.dkr.ecr.<region>.amazonaws.com/mlplatform-<stack>/controlplane:<version> .
#   game-day runner (adds the harness extra: Chaos Toolkit, Locust, moto; `gameday gate`):
#     docker build --target gameday -t <account>.dkr.ecr.<region>.amazonaws.com/mlplatform-<stack>/gameday:<version> .
# Base image pinned by tag; pin by digest in your registry mirror for fully reproducible builds.

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

FROM python:3.11.7-slim-bookworm AS base
# Fixed non-root uid/gid: the Kubernetes pods run as 10001 (provisioning/components/controlplane.py).
RUN groupadd --system --gid 10001 gameday \
 && useradd --system --uid 10001 --gid gameday --home-dir /home/gameday --create-home gameday
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /home/gameday
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

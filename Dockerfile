# Control-plane image: the same `gameday` console script the local environment runs.
# Build (no container engine runs in CI here; see docs/infra.md):
#   docker build -t <account>.dkr.ecr.<region>.amazonaws.com/mlplatform-<stack>/controlplane:<version> .
# Base image pinned by tag; pin by digest in your registry mirror for fully reproducible builds.

FROM python:3.11.7-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml ./
COPY gameday ./gameday
COPY controlplane ./controlplane
COPY slo ./slo
COPY chaos ./chaos
COPY loadtests ./loadtests
COPY infra ./infra
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install "python-dateutil<3" . \
 && /opt/venv/bin/gameday --help >/dev/null

FROM python:3.11.7-slim-bookworm AS runtime
# Fixed non-root uid/gid: the Kubernetes pods run as 10001 (infra/components/controlplane.py).
RUN groupadd --system --gid 10001 gameday \
 && useradd --system --uid 10001 --gid gameday --home-dir /home/gameday --create-home gameday
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /home/gameday
EXPOSE 8080 9090
ENTRYPOINT ["gameday"]
CMD ["controlplane", "api", "--host", "0.0.0.0", "--port", "8080"]

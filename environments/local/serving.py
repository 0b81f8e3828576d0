"""Model serving in the local environment, opt-in (`gameday env up --serving`): ``REPLICAS``
KServe model servers (controlplane/serving/server.py, in ``.venv-kserve``) behind HAProxy's
``serving`` frontend, each loading the deployed version of the model from the artifact bucket
through the fault proxy's ``s3`` route (so cutting the store off reaches them too).

HAProxy checks each replica's ``GET /v2/models/<name>/ready`` (200 only once the model is
loaded with its digest), so a replica that is starting, loading or cannot read the store gets
no request. A replica's weight is set at run time through HAProxy's admin socket
(:func:`set_weight`; a rollout's canary share). Why a replica is not ready is in its status
file (``run/<replica>.model.json``), shown by ``gameday env status`` under the component.
docs/serving.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from controlplane.serving.artifact import encode_model, sha256
from controlplane.serving.catalog import GOOD, MODEL_NAME, VERSIONS, publish
from environments.local.spec import ComponentSpec, Group, HealthCheck
from environments.local.topology import BUCKET

KIND = "model-server"
REPLICAS = 2  # started at `up`
# declared with serving (a port, a server line in HAProxy's backend, in maintenance) but
# started only by a scale-up (environments/local/serving_scale.py)
MAX_REPLICAS = 3
REQUIREMENT = "serving"  # x-gameday ``requires`` of the serving classes
HINT = "start it with `gameday env up --serving` (KServe's venv: scripts/setup-kserve.sh)"
BACKEND = "serving"
VENV_ENV = "GAMEDAY_KSERVE_VENV"
ROOT = Path(__file__).resolve().parents[2]  # this checkout: the replicas import its controlplane


def venv_python() -> Path:
    return Path(os.environ.get(VENV_ENV) or ROOT / ".venv-kserve") / "bin" / "python"


def preflight() -> list[str]:
    python = venv_python()
    if not python.exists():
        return [(f"{python} is missing: KServe's model server has a venv of its own, "
                 "made by `bash scripts/setup-kserve.sh` (scripts/setup.sh runs it)")]
    return []


def replica_names(count: int = REPLICAS) -> list[str]:
    return [f"model-{i}" for i in range(1, count + 1)]


def port_name(replica: str) -> str:
    return replica.replace("-", "")  # model-3 -> model3


def port_names(enabled: bool) -> list[str]:
    if not enabled:
        return []
    return ["haproxy_serving"] + [f"model{i}" for i in range(1, MAX_REPLICAS + 1)]


def digest_of(version: str) -> str:
    """The sha256 a deploy of ``version`` names (its model.json is written deterministically)."""
    return sha256(encode_model(VERSIONS[version]))


def status_file(state: Path, replica: str) -> Path:
    return state / "run" / f"{replica}.model.json"


def ready_path() -> str:
    return f"/v2/models/{MODEL_NAME}/ready"


LIVE_PATH = "/v2/health/live"  # the server answers; says nothing about its model
CHECK_DEFECT = "serving-check-liveness"  # controlplane/defects.py (test only)


def check_path(defects: frozenset[str] = frozenset()) -> str:
    """What HAProxy's serving check asks: the model's readiness, or with the seeded defect
    ``serving-check-liveness`` the server's liveness (a loading replica looks fine)."""
    return LIVE_PATH if CHECK_DEFECT in defects else ready_path()


def with_check(cfg: str, defects: frozenset[str]) -> str:
    """A generated haproxy.cfg with the serving check switched for ``defects`` (set_defects
    rewrites the file HAProxy was started with, then restarts it)."""
    lines = [f"  option httpchk GET {check_path(defects)}"
             if line.strip() in (f"option httpchk GET {p}" for p in (ready_path(), LIVE_PATH))
             else line for line in cfg.split("\n")]
    return "\n".join(lines)


def component(state: Path, replica: str, port: int, store: str, version: str = GOOD) -> ComponentSpec:
    url = f"http://127.0.0.1:{port}"
    return ComponentSpec(
        name=replica, kind=KIND, group=Group.CONTROLPLANE,
        argv=[str(venv_python()), "-m", "controlplane.serving.server",
              "--model", MODEL_NAME, "--version", version, "--sha256", digest_of(version),
              "--store", store, "--bucket", BUCKET, "--port", str(port),
              "--status-file", str(status_file(state, replica)),
              "--seed", replica.rsplit("-", 1)[-1]],
        # v2's model readiness answers {"name": ..., "ready": true} only once loaded
        health=HealthCheck(f"{url}{ready_path()}", body_contains='"ready":true'),
        ports={"http": port},
        env={"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
             "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
             "AWS_DEFAULT_REGION": "us-east-1"},
        labels={"model": MODEL_NAME, "version": version, "url": url},
    )


def attach(specs: dict[str, ComponentSpec], state: Path, ports: Mapping[str, int]) -> None:
    """Add the replicas (when ``ports`` has theirs: the environment was started with serving)."""
    if "haproxy_serving" not in ports:
        return
    store = f"http://127.0.0.1:{ports['proxy_s3']}"
    for i, name in enumerate(replica_names(), start=1):
        specs[name] = component(state, name, ports[f"model{i}"], store)


def haproxy_section(ports: Mapping[str, int], defects: frozenset[str] = frozenset()) -> str:
    """The ``serving`` frontend and backend of haproxy.cfg, or nothing without serving."""
    if "haproxy_serving" not in ports:
        return ""
    # the replicas only a scale-up starts are declared in maintenance ("disabled"): no check,
    # no request until environments/local/serving_scale.py enables them (an environment made
    # before they existed has no port for them: no line)
    servers = "\n".join(
        f"  server model-{i} 127.0.0.1:{ports[f'model{i}']} check weight 100"
        + (" disabled" if i > REPLICAS else "")
        for i in range(1, MAX_REPLICAS + 1) if f"model{i}" in ports)
    return f"""
frontend serving
  mode http
  bind 127.0.0.1:{ports['haproxy_serving']}
  timeout client 30s
  default_backend {BACKEND}

# Only replicas whose model is loaded get requests: the check is the v2 model readiness.
# A prediction is safe to send again, so a request that met a dead replica is retried on
# another (retries + redispatch; HAProxy retries a request with a body only when it holds the
# whole body: http-buffer-request); a failed request switches that replica to fast checks.
backend {BACKEND}
  mode http
  balance roundrobin
  option http-buffer-request
  option httpchk GET {check_path(defects)}
  http-check expect status 200
  retries 2
  option redispatch 1
  retry-on conn-failure empty-response response-timeout
  timeout server 5s
  default-server inter 1s fastinter 250ms downinter 500ms fall 2 rise 1 observe layer7 error-limit 1 on-error fastinter
{servers}
"""


def endpoints(ports: Mapping[str, int]) -> dict[str, Any]:
    if "haproxy_serving" not in ports:
        return {}
    return {"serving": f"http://127.0.0.1:{ports['haproxy_serving']}", "serving_model": MODEL_NAME,
            "serving_replicas": {f"model-{i}": f"http://127.0.0.1:{ports[f'model{i}']}"
                                 for i in range(1, REPLICAS + 1)}}


def publish_catalog(put: Callable[[str, bytes], None]) -> dict[str, str]:
    """Every version of the catalog into the bucket (bad ones too: a bad rollout deploys a
    real artifact); version -> digest."""
    return {version: publish(put, version) for version in VERSIONS}


def model_status(state: Path, replica: str, pid: int | None) -> dict[str, Any] | None:
    """What the running replica (process ``pid``) last said of its model: state, version,
    reason. A file left by an earlier process of the replica (killed, restarted) is not its
    word: until the new one writes, the model is "starting"."""
    if pid is None:
        return None
    try:
        said = json.loads(status_file(state, replica).read_text())
    except (OSError, ValueError):
        said = None
    if not said or said.get("pid") != pid:
        return {"state": "starting", "reason": "the model server is starting (nothing loaded)",
                "pid": pid}
    return said


def replicas(components: Mapping[str, ComponentSpec]) -> list[str]:
    return [name for name, spec in components.items() if spec.kind == KIND]

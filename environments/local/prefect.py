"""Prefect 3 on the local environment: server, process workers and the sample flow's deployments.

Everything Prefect-specific of the launcher lives here; ``LocalEnvironment.up(platform="prefect")``
calls :func:`port_names`, :func:`build_components` and :func:`up`.

- Prefect runs from its own venv (``.venv-prefect``, made by ``scripts/setup-prefect.sh``); the
  harness never imports ``prefect`` and talks to the server over HTTP only.
- ``prefect-server``: ``prefect server start`` on 127.0.0.1, its database ``prefect`` on the
  environment's Patroni primary **through HAProxy** (so a database failover is the same fault for
  Prefect as for our control plane).
- workers: one ``prefect worker start --type process`` per entry of :data:`WORKERS`; each polls
  the work pool of its capacity pool (``cpu-pool``, ``gpu-pool``) and runs flow runs as local
  child processes. Component label ``pool`` = ``prefect-<pool>`` so the fault injector's
  ``withdraw_pool`` treats them like a node group (``PrefectAdapter.fault_targets`` maps
  ``pool:cpu`` -> ``prefect-cpu``).
- deployments: one per work pool for ``platforms.prefect_flow.gameday_train``, created
  through the REST API (module-path entrypoint: the project is installed into .venv-prefect),
  and one (cpu pool) for the pipeline flow ``platforms.prefect_pipeline.gameday_pipeline``.
- automation: Prefect's documented "zombie" automation (:data:`ZOMBIE_AUTOMATION`): a flow run
  whose heartbeats stop without a terminal state is set CRASHED (a Prefect user's setup; without
  it a flow run whose process died stays RUNNING for good).
"""

from __future__ import annotations

import os
import secrets as pysecrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from environments.local.database import ensure_role_and_database
from environments.local.errors import ComponentUnhealthy, EnvError
from environments.local.spec import ComponentSpec, Group, HealthCheck
from environments.local.topology import BUCKET

if TYPE_CHECKING:
    from environments.local.platform import LocalEnv

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("GAMEDAY_PREFECT_VENV") or REPO / ".venv-prefect")
DB_NAME = "prefect"
DB_USER = "prefect"
SERVER = "prefect-server"
FLOW_NAME = "gameday-train"
ENTRYPOINT = "platforms.prefect_flow.gameday_train"
PIPELINE_FLOW = "gameday-pipeline"
PIPELINE_ENTRYPOINT = "platforms.prefect_pipeline.gameday_pipeline"
PIPELINE_POOL = "cpu"  # one worker runs every pipeline: its persisted results are the cache


@dataclass(frozen=True)
class PrefectWorker:
    name: str
    pool: str  # the environment's capacity pool: cpu | gpu

    @property
    def work_pool(self) -> str:
        return f"{self.pool}-pool"


WORKERS: tuple[PrefectWorker, ...] = (PrefectWorker("prefect-cpu-1", "cpu"),
                                      PrefectWorker("prefect-gpu-1", "gpu"))
POOLS = tuple(sorted({w.pool for w in WORKERS}))


def prefect_bin(venv: Path | None = None) -> Path:
    return (venv or VENV) / "bin" / "prefect"


def missing(venv: Path | None = None) -> str | None:
    """Why Prefect cannot be started here, or None."""
    if not prefect_bin(venv).exists():
        return (f"{prefect_bin(venv)} is missing: run scripts/setup-prefect.sh "
                "(installs Prefect 3 into its own venv)")
    return None


def pool_label(pool: str) -> str:
    return f"prefect-{pool}"


def port_names() -> list[str]:
    return ["prefect_api", *[f"prefect_worker_{w.name}" for w in WORKERS]]


def api_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/api"


def db_url(port: int, password: str, host: str = "127.0.0.1", db: str = DB_NAME,
           user: str = DB_USER) -> str:
    return f"postgresql+asyncpg://{user}:{password}@{host}:{port}/{db}"


def server_env(home: Path, database_url: str, port: int) -> dict[str, str]:
    return {
        "PREFECT_HOME": str(home),
        "PREFECT_API_DATABASE_CONNECTION_URL": database_url,
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_SERVER_UI_ENABLED": "false",
        "PREFECT_API_DATABASE_CONNECTION_TIMEOUT": "3",
        "PREFECT_API_DATABASE_TIMEOUT": "5",
        "PYTHONUNBUFFERED": "1",
    }


def server_spec(home: Path, database_url: str, port: int, venv: Path | None = None) -> ComponentSpec:
    home.mkdir(parents=True, exist_ok=True)
    return ComponentSpec(
        name=SERVER, kind="prefect-server", group=Group.CONTROLPLANE,
        argv=[str(prefect_bin(venv)), "server", "start", "--host", "127.0.0.1", "--port", str(port),
              "--no-ui"],
        health=HealthCheck(f"http://127.0.0.1:{port}/api/health"),
        ports={"http": port}, env=server_env(home, database_url, port),
        labels={"platform": "prefect"},
    )


def worker_env(home: Path, api: str, worker: PrefectWorker, health_port: int,
               s3_endpoint: str | None) -> dict[str, str]:
    env = {
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": api,
        # poll every second (default 10 s) so local game days measure Prefect, not idle polling
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_WORKER_PREFETCH_SECONDS": "5",
        "PREFECT_WORKER_HEARTBEAT_SECONDS": "5",
        # flow processes heartbeat (default 180 s) for the zombie automation (create_zombie_automation)
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_SECONDS),
        # flow-run logs carry the workload's events: ship them every 0.5 s (default 2 s)
        "PREFECT_LOGGING_TO_API_BATCH_INTERVAL": "0.5",
        "PREFECT_WORKER_WEBSERVER_HOST": "127.0.0.1",
        "PREFECT_WORKER_WEBSERVER_PORT": str(health_port),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # which environment component runs a flow run: the flow logs it (fault targeting)
        "GAMEDAY_COMPONENT": worker.name,
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "PYTHONUNBUFFERED": "1",
        # the flows' code is this checkout's (not whatever the venv's editable install names)
        "PYTHONPATH": str(REPO),
        # Prefect's runner leaves its per-run temporary directories behind when a fault kills
        # the worker: they stay in the environment's state and go with `env down --purge`
        "TMPDIR": str(worker_tmp(home)),
    }
    if s3_endpoint:
        env["S3_ENDPOINT_URL"] = s3_endpoint
    return env


def worker_tmp(home: Path) -> Path:
    return home / "tmp"


def worker_spec(home: Path, api: str, worker: PrefectWorker, health_port: int,
                s3_endpoint: str | None, venv: Path | None = None) -> ComponentSpec:
    worker_tmp(home).mkdir(parents=True, exist_ok=True)
    return ComponentSpec(
        name=worker.name, kind="prefect-worker", group=Group.AGENT,
        argv=[str(prefect_bin(venv)), "worker", "start", "--pool", worker.work_pool, "--type",
              "process", "--name", worker.name, "--with-healthcheck"],
        health=HealthCheck(f"http://127.0.0.1:{health_port}/health"),
        ports={"health": health_port}, env=worker_env(home, api, worker, health_port, s3_endpoint),
        labels={"platform": "prefect", "pool": pool_label(worker.pool),
                "work_pool": worker.work_pool},
    )


CONTROLPLANE = False  # Prefect's server and workers replace our API, reconciler and agents


def prepare(previous: dict[str, Any]) -> dict[str, Any]:
    """What env.json keeps for Prefect across down/up: its database password."""
    return {"db_password": previous.get("db_password") or pysecrets.token_urlsafe(18)}


def build_components(state: Path, ports: dict[str, int],
                     info: dict[str, Any]) -> dict[str, ComponentSpec]:
    """Server + workers; the database is reached through HAProxy's `pg` frontend."""
    home = state / "prefect"
    api = api_url(ports["prefect_api"])
    specs = [server_spec(home / "server", db_url(ports["haproxy_pg"], info["db_password"]),
                         ports["prefect_api"])]
    for w in WORKERS:
        specs.append(worker_spec(home / w.name, api, w, ports[f"prefect_worker_{w.name}"],
                                 f"http://127.0.0.1:{ports['proxy_s3']}"))
    return {s.name: s for s in specs}


def endpoints(ports: dict[str, int]) -> dict[str, Any]:
    return {"prefect_api": api_url(ports["prefect_api"]),
            "prefect_pools": {p: f"{p}-pool" for p in POOLS}}


# -- bring-up -----------------------------------------------------------------------------------
def setup_database(admin_dsn: str, password: str) -> None:
    """Role + database ``prefect`` on the primary (idempotent)."""
    ensure_role_and_database(admin_dsn, DB_USER, password, DB_NAME)


def wait_pools(api: str, pools: list[str], timeout: float) -> None:
    """Workers create their work pools on start; deployments need them to exist."""
    deadline = time.monotonic() + timeout
    pending = list(pools)
    while pending:
        for p in list(pending):
            try:
                if httpx.get(f"{api}/work_pools/{p}", timeout=3).status_code == 200:
                    pending.remove(p)
            except httpx.HTTPError:
                pass
        if not pending:
            return
        if time.monotonic() > deadline:
            raise ComponentUnhealthy(SERVER, f"work pools {pending} not created within {timeout:.0f}s",
                                     "")
        time.sleep(0.2)


def deploy(api: str, s3_endpoint: str | None, bucket: str = BUCKET,
           pools: tuple[str, ...] = POOLS) -> dict[str, str]:
    """Create (or update) the flow and one deployment per work pool; pool -> deployment id."""
    c = httpx.Client(base_url=api, timeout=10)
    r = c.post("/flows/", json={"name": FLOW_NAME})
    if r.status_code not in (200, 201):
        raise EnvError(f"Prefect refused the flow: HTTP {r.status_code} {r.text[:300]}")
    flow_id = r.json()["id"]
    out = {}
    for pool in pools:
        body = {"name": f"train-{pool}", "flow_id": flow_id, "work_pool_name": f"{pool}-pool",
                "entrypoint": ENTRYPOINT, "enforce_parameter_schema": False,
                "parameters": {"s3_endpoint": s3_endpoint, "bucket": bucket},
                "job_variables": {}, "description": "gameday sample training job"}
        r = c.post("/deployments/", json=body)
        if r.status_code not in (200, 201):
            raise EnvError(f"Prefect refused deployment train-{pool}: HTTP {r.status_code} "
                           f"{r.text[:300]}")
        out[pool] = r.json()["id"]
    return out


# Prefect's documented automation for flow runs whose process died ("zombies"): a flow run that
# sent a heartbeat and then neither another one nor a terminal state within the window is set
# CRASHED. Flow processes heartbeat every HEARTBEAT_SECONDS (worker_env; Prefect's default 180).
HEARTBEAT_SECONDS = 30
ZOMBIE_WINDOW_SECONDS = 90
ZOMBIE_AUTOMATION = {
    "name": "gameday: crash zombie flow runs",
    "description": "flow run heartbeats stopped without a terminal state (process died)",
    "enabled": True,
    "trigger": {
        "type": "event", "posture": "Proactive", "threshold": 1,
        "within": ZOMBIE_WINDOW_SECONDS,
        "match": {"prefect.resource.id": "prefect.flow-run.*"},
        "for_each": ["prefect.resource.id"],
        "after": ["prefect.flow-run.heartbeat"],
        "expect": ["prefect.flow-run.heartbeat", "prefect.flow-run.Completed",
                   "prefect.flow-run.Failed", "prefect.flow-run.Cancelled",
                   "prefect.flow-run.Crashed"],
    },
    "actions": [{"type": "change-flow-run-state", "state": "CRASHED",
                 "message": "flow run marked crashed: its heartbeats stopped"}],
}


def create_zombie_automation(api: str) -> str:
    """The zombie automation (idempotent by name); its id."""
    c = httpx.Client(base_url=api, timeout=10)
    r = c.post("/automations/filter", json={"limit": 200})
    if r.status_code == 200:
        for a in r.json():
            if a.get("name") == ZOMBIE_AUTOMATION["name"]:
                return str(a["id"])
    r = c.post("/automations/", json=ZOMBIE_AUTOMATION)
    if r.status_code not in (200, 201):
        raise EnvError(f"Prefect refused the zombie automation: HTTP {r.status_code} "
                       f"{r.text[:300]}")
    return str(r.json()["id"])


def deploy_pipeline(api: str, pool: str = PIPELINE_POOL) -> str:
    """Create (or update) the pipeline flow and its deployment on ``pool``; its id."""
    c = httpx.Client(base_url=api, timeout=10)
    r = c.post("/flows/", json={"name": PIPELINE_FLOW})
    if r.status_code not in (200, 201):
        raise EnvError(f"Prefect refused the pipeline flow: HTTP {r.status_code} {r.text[:300]}")
    body = {"name": f"pipeline-{pool}", "flow_id": r.json()["id"], "work_pool_name": f"{pool}-pool",
            "entrypoint": PIPELINE_ENTRYPOINT, "enforce_parameter_schema": False,
            "parameters": {}, "job_variables": {},
            "description": "gameday pipeline-recovery pipeline (prefect tasks)"}
    r = c.post("/deployments/", json=body)
    if r.status_code not in (200, 201):
        raise EnvError(f"Prefect refused deployment pipeline-{pool}: HTTP {r.status_code} "
                       f"{r.text[:300]}")
    return str(r.json()["id"])


def up(env: LocalEnv, say: Any, timeout: float) -> None:
    """Database, server, workers, deployments; endpoints recorded in env.json."""
    info = env.info.setdefault("platform_info", {})
    password = info.setdefault("db_password", pysecrets.token_urlsafe(18))
    ports = env.info["ports"]
    setup_database(env.endpoints["admin_dsn"], password)
    started = time.monotonic()
    env.spawn(SERVER)
    env.wait_healthy([SERVER], max(timeout, 90.0), say)
    info["server_start_seconds"] = round(time.monotonic() - started, 2)
    workers = [w.name for w in WORKERS]
    for w in workers:
        env.spawn(w)
    env.wait_healthy(workers, timeout, say)
    api = api_url(ports["prefect_api"])
    wait_pools(api, [w.work_pool for w in WORKERS], timeout)
    env.endpoints["prefect_deployments"] = deploy(api, env.endpoints.get("s3"),
                                                  env.endpoints.get("bucket", BUCKET))
    env.endpoints["prefect_pipeline_deployment"] = deploy_pipeline(api)
    info["zombie_automation"] = create_zombie_automation(api)
    info["up_seconds"] = round(time.monotonic() - started, 2)
    say(f"prefect server + {len(workers)} workers up, flow deployed "
        f"({info['up_seconds']}s; server {info['server_start_seconds']}s)")

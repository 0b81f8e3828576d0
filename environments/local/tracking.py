"""MLflow's tracking server in the local environment (``gameday env up --tracking``): the
tracking-outage failure class's server, beside the control plane, not instead of it.

- MLflow runs from its own venv (``.venv-mlflow``, scripts/setup-mlflow.sh); the harness never
  imports ``mlflow`` and talks to the server over its REST API only.
- ``mlflow-server``: ``mlflow server`` on 127.0.0.1, its backend store the database ``mlflow`` on
  the environment's Patroni primary **through HAProxy** (a failover is the same fault for MLflow
  as for our control plane), its artifacts proxied (``--serve-artifacts``) into the local S3
  server under ``s3://<bucket>/mlflow/``, through the fault proxy like every other S3 client.
- the agents get ``MLFLOW_TRACKING_URI``, so a train workload submitted with ``tracking: 1``
  logs to it (controlplane/workload/tracking.py).
"""

from __future__ import annotations

import os
import secrets as pysecrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from environments.local.database import ensure_role_and_database
from environments.local.spec import ComponentSpec, Group, HealthCheck
from environments.local.topology import BUCKET

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("GAMEDAY_MLFLOW_VENV") or REPO / ".venv-mlflow")
SERVER = "mlflow-server"
DB_NAME = "mlflow"
DB_USER = "mlflow"
PORT_NAME = "mlflow_http"
EXPERIMENT = "gameday-training"  # the experiment the workload's runs go to
HINT = "gameday env up --tracking (MLflow from scripts/setup-mlflow.sh)"
# what an experiment that needs the tracking server declares (x-gameday ``requires``)
REQUIREMENT = "tracking-server"
ENV_URI = "MLFLOW_TRACKING_URI"


def mlflow_bin(venv: Path | None = None) -> Path:
    return (venv or VENV) / "bin" / "mlflow"


def missing(venv: Path | None = None) -> str | None:
    """Why MLflow cannot be started here, or None."""
    if not mlflow_bin(venv).exists():
        return (f"{mlflow_bin(venv)} is missing: run scripts/setup-mlflow.sh "
                "(installs MLflow 3.17.2 into its own venv)")
    return None


def port_names(enabled: bool) -> list[str]:
    return [PORT_NAME] if enabled else []


def new_password(previous: str | None) -> str:
    return previous or pysecrets.token_urlsafe(18)


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def db_uri(port: int, password: str, host: str = "127.0.0.1") -> str:
    return f"postgresql+psycopg2://{DB_USER}:{password}@{host}:{port}/{DB_NAME}"


def server_spec(database_uri: str, port: int, s3_endpoint: str, bucket: str = BUCKET,
                venv: Path | None = None) -> ComponentSpec:
    """One uvicorn worker: the game day's few trainers need no more, and two cores are shared."""
    return ComponentSpec(
        name=SERVER, kind="mlflow-server", group=Group.CONTROLPLANE,
        argv=[str(mlflow_bin(venv)), "server", "--serve-artifacts", "--artifacts-destination", f"s3://{bucket}/mlflow",
              "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        health=HealthCheck(f"{url(port)}/health"),
        ports={"http": port},
        # the store's URI (with its password) by the environment, never in argv: ps shows argv
        env={"MLFLOW_BACKEND_STORE_URI": database_uri, "MLFLOW_S3_ENDPOINT_URL": s3_endpoint,
             "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
             "AWS_DEFAULT_REGION": "us-east-1",
             # MLflow 3's background job runner (GenAI jobs) is no part of tracking runs; on,
             # its polling consumers cost more CPU than the trainers' calls (gameday/bench_peer.py)
             "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "PYTHONUNBUFFERED": "1"},
        labels={"service": "tracking"},
    )


def build_components(ports: dict[str, int], password: str,
                     components: dict[str, ComponentSpec]) -> dict[str, ComponentSpec]:
    """The server (database through HAProxy's ``pg`` frontend, S3 through the fault proxy);
    every agent of ``components`` is given its URI, which its workloads inherit."""
    uri = url(ports[PORT_NAME])
    for spec in components.values():
        if spec.kind == "agent":
            spec.env[ENV_URI] = uri
    server = server_spec(db_uri(ports["haproxy_pg"], password), ports[PORT_NAME],
                         f"http://127.0.0.1:{ports['proxy_s3']}")
    return {server.name: server}


def endpoints(ports: dict[str, int]) -> dict[str, Any]:
    return {"mlflow": url(ports[PORT_NAME]), "mlflow_experiment": EXPERIMENT}


class Spawner(Protocol):
    def spawn(self, component: str) -> int: ...
    def wait_healthy(self, components: list[str], timeout: float,
                     reporter: Any = None) -> None: ...


def up(processes: Spawner, admin_dsn: str, password: str, say: Callable[[str], None],
       timeout: float) -> float:
    """Its role and database on the primary, then the server until healthy (the first start
    migrates the schema: about 15 s here); returns the seconds it took."""
    ensure_role_and_database(admin_dsn, DB_USER, password, DB_NAME)
    started = time.monotonic()
    processes.spawn(SERVER)
    processes.wait_healthy([SERVER], max(timeout, 120.0), say)
    took = round(time.monotonic() - started, 2)
    say(f"mlflow tracking server up ({took}s)")
    return took

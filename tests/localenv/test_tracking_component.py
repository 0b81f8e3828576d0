"""MLflow's tracking server as a component of the local environment (`env up --tracking`),
without starting anything: what it is wired to and what an environment without it says."""

from __future__ import annotations

from pathlib import Path

from environments.local import tracking as lt
from environments.local.components import build_components
from environments.local.env import LocalEnvironment
from environments.local.topology import DEFAULT_AGENTS, Secrets, port_names


def _ports() -> dict[str, int]:
    names = [*port_names(DEFAULT_AGENTS), *lt.port_names(True)]
    return {n: 20000 + i for i, n in enumerate(names)}


def test_the_server_reaches_the_cluster_through_haproxy_and_the_agents_reach_it(
        tmp_path: Path) -> None:
    ports = _ports()
    components = build_components(tmp_path, "local", ports, Secrets(), DEFAULT_AGENTS, True,
                                  db_root=tmp_path / "db")
    added = lt.build_components(ports, "pw-not-in-argv", components)
    server = added[lt.SERVER]
    assert server.env["MLFLOW_BACKEND_STORE_URI"] == (
        f"postgresql+psycopg2://mlflow:pw-not-in-argv@127.0.0.1:{ports['haproxy_pg']}/mlflow")
    assert not any("pw-not-in-argv" in a for a in server.argv)  # ps shows argv
    assert server.env["MLFLOW_S3_ENDPOINT_URL"] == f"http://127.0.0.1:{ports['proxy_s3']}"
    assert "s3://ml-artifacts/mlflow" in server.argv
    agents = [s for s in components.values() if s.kind == "agent"]
    assert agents and all(a.env[lt.ENV_URI] == f"http://127.0.0.1:{ports[lt.PORT_NAME]}"
                          for a in agents)
    assert lt.port_names(False) == []


def test_an_environment_without_it_says_how_to_get_it(tmp_path: Path) -> None:
    env = LocalEnvironment("local", tmp_path)
    assert env.applicability("tracking-outage", [lt.REQUIREMENT]) == (
        "needs MLflow's tracking server: gameday env up --tracking (MLflow from "
        "scripts/setup-mlflow.sh)")
    assert env.applicability("db-primary-loss", []) is None

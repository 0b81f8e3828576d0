"""Component definitions: command line, config files, ports and health check of each server.

``build_components`` writes every generated config file under the state directory and
returns one :class:`ComponentSpec` per process. Specs are plain data stored in ``env.json``,
so a fault's ``start`` can re-launch a component exactly as ``up`` did.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from controlplane.clock import ENV as CLOCK_ENV
from environments.local import motoserver, node_disk, serving, storage
from environments.local.configs import (
    gameday_targets_file,
    generate_rules_file,
    haproxy_cfg,
    patroni_component,
    prometheus_cfg,
)
from environments.local.pg_files import (
    agent_token_file,
    app_dsn,
    chown_for_postgres,
    prepare_db_root,
    write_secret_files,
)
from environments.local.spec import ComponentSpec, Group, HealthCheck, gameday_argv
from environments.local.topology import API_REPLICAS, BUCKET, AgentSpec, Secrets
from environments.timeline_metrics import write_scrape_targets


def build_components(state: Path, env_name: str, ports: dict[str, int], secrets: Secrets,
                     agents: tuple[AgentSpec, ...], controlplane: bool,
                     db_root: Path | None = None,
                     storage_faults: bool = False) -> dict[str, ComponentSpec]:
    run, logs = state / "run", state / "logs"
    for sub in (run, logs, state / "etcd", state / "registry", state / "prometheus"):
        sub.mkdir(parents=True, exist_ok=True)
    specs: list[ComponentSpec] = []

    etcd_peer = f"http://127.0.0.1:{ports['etcd_peer']}"
    etcd_client = f"http://127.0.0.1:{ports['etcd_client']}"
    specs.append(ComponentSpec(
        name="etcd", kind="etcd", group=Group.INFRA,
        argv=["/usr/bin/etcd", "--name", "etcd0", "--data-dir", str(state / "etcd" / "data"),
              "--listen-client-urls", etcd_client, "--advertise-client-urls", etcd_client,
              "--listen-peer-urls", etcd_peer, "--initial-advertise-peer-urls", etcd_peer,
              "--initial-cluster", f"etcd0={etcd_peer}", "--initial-cluster-state", "new",
              "--logger", "zap", "--log-level", "warn"],
        health=HealthCheck(f"{etcd_client}/health"),
        ports={"client": ports["etcd_client"], "peer": ports["etcd_peer"]},
    ))
    db_root = db_root or state
    if db_root != state:
        prepare_db_root(db_root, state)
    if storage_faults:  # each member's disk first: it must be mounted before the member starts
        for i in (0, 1):
            (db_root / f"pg-{i}").mkdir(parents=True, exist_ok=True)
            chown_for_postgres(db_root / f"pg-{i}")
            specs.append(storage.disk_component(db_root / f"pg-{i}", i, ports[f"disk{i}_control"]))
    specs += [patroni_component(db_root, env_name, i, ports, secrets, storage_faults) for i in (0, 1)]

    (state / "haproxy.cfg").write_text(haproxy_cfg(state, ports))
    specs.append(ComponentSpec(
        name="haproxy", kind="haproxy", group=Group.INFRA,
        argv=["/usr/sbin/haproxy", "-db", "-f", str(state / "haproxy.cfg")],
        health=HealthCheck(f"http://127.0.0.1:{ports['haproxy_stats']}/stats"),
        ports={"pg": ports["haproxy_pg"], "api": ports["haproxy_api"], "stats": ports["haproxy_stats"]},
    ))

    proxy_routes: dict[str, dict[str, Any]] = {
        "s3": {"listen": ports["proxy_s3"], "target": f"127.0.0.1:{ports['moto']}"},
        "registry": {"listen": ports["proxy_registry"], "target": f"127.0.0.1:{ports['registry']}"},
    }
    for agent in agents:
        proxy_routes[f"agent-{agent.name}"] = {
            "listen": ports[f"proxy_agent_{agent.name}"],
            "target": f"127.0.0.1:{ports['haproxy_api']}",
        }
    if controlplane:
        for i in range(1, API_REPLICAS + 1):
            proxy_routes[f"db-api-{i}"] = {"listen": ports[f"proxy_db_api{i}"],
                                           "target": f"127.0.0.1:{ports['haproxy_pg']}"}
    (state / "proxy.json").write_text(json.dumps(
        {"control_port": ports["proxy_control"], "routes": proxy_routes}, indent=2))
    specs.append(ComponentSpec(
        name="proxy", kind="proxy", group=Group.INFRA,
        argv=[sys.executable, "-m", "environments.local.proxy", "--config", str(state / "proxy.json")],
        health=HealthCheck(f"http://127.0.0.1:{ports['proxy_control']}/healthz"),
        ports={"control": ports["proxy_control"], "s3": ports["proxy_s3"],
               "registry": ports["proxy_registry"]},
    ))

    specs.append(ComponentSpec(
        name="moto", kind="moto", group=Group.INFRA,
        argv=motoserver.command(ports["moto"]),
        health=HealthCheck(f"http://127.0.0.1:{ports['moto']}/moto-api/"),
        ports={"s3": ports["moto"]},
        env={"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
             "AWS_DEFAULT_REGION": "us-east-1"},
    ))

    registry_cfg = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(state / "registry" / "data")},
                    "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{ports['registry']}",
                 "debug": {"addr": f"127.0.0.1:{ports['registry_debug']}",
                           "prometheus": {"enabled": True, "path": "/metrics"}}},
    }
    (state / "registry" / "config.yml").write_text(yaml.safe_dump(registry_cfg, sort_keys=False))
    specs.append(ComponentSpec(
        name="registry", kind="registry", group=Group.INFRA,
        argv=["/usr/bin/docker-registry", "serve", str(state / "registry" / "config.yml")],
        health=HealthCheck(f"http://127.0.0.1:{ports['registry']}/v2/"),
        ports={"http": ports["registry"], "debug": ports["registry_debug"]},
    ))

    rules = generate_rules_file(state)
    write_scrape_targets(gameday_targets_file(state), [])  # a run lists itself while it runs
    (state / "prometheus" / "prometheus.yml").write_text(yaml.safe_dump(
        prometheus_cfg(state, env_name, ports, agents, controlplane, rules), sort_keys=False))
    specs.append(ComponentSpec(
        name="prometheus", kind="prometheus", group=Group.INFRA,
        argv=["/usr/bin/prometheus", f"--config.file={state / 'prometheus' / 'prometheus.yml'}",
              f"--storage.tsdb.path={state / 'prometheus' / 'data'}",
              f"--web.listen-address=127.0.0.1:{ports['prometheus']}",
              "--storage.tsdb.retention.time=3d", "--web.enable-lifecycle", "--log.level=warn"],
        health=HealthCheck(f"http://127.0.0.1:{ports['prometheus']}/-/ready"),
        ports={"http": ports["prometheus"]},
        labels={"rules": str(rules) if rules else ""},
    ))

    if controlplane:
        write_secret_files(state, secrets)
        dsn = app_dsn(ports, state)
        # Secrets go through the environment, not argv (argv is visible in ps).
        cp_env = {"CONTROLPLANE_DSN": dsn, "PYTHONUNBUFFERED": "1"}
        for i in range(1, API_REPLICAS + 1):
            port = ports[f"api{i}"]
            # through the replica's own proxy route to HAProxy's pg frontend, so one replica
            # can lose its database while the other keeps it (partition_database)
            api_env = {**cp_env, "CONTROLPLANE_DSN": app_dsn(ports, state, f"proxy_db_api{i}"),
                       # never called by the healthy API (controlplane/api/health.py)
                       "CONTROLPLANE_TELEMETRY_URL": f"http://127.0.0.1:{ports['prometheus']}"}
            specs.append(ComponentSpec(
                name=f"api-{i}", kind="api", group=Group.CONTROLPLANE,
                argv=gameday_argv("controlplane", "api", "--host", "127.0.0.1", "--port", str(port),
                                  "--lease-seconds", str(LEASE_SECONDS),
                                  "--token-cache-seconds", str(TOKEN_CACHE_SECONDS)),
                health=HealthCheck(f"http://127.0.0.1:{port}/readyz",
                                   body_contains='{"status":"ready"}'),
                ports={"http": port, "db_route": ports[f"proxy_db_api{i}"]}, env=api_env,
            ))
        specs.append(ComponentSpec(
            name="reconciler", kind="reconciler", group=Group.CONTROLPLANE,
            argv=gameday_argv("controlplane", "reconciler",
                              "--metrics-port", str(ports["reconciler_metrics"]),
                              "--lease-seconds", str(LEASE_SECONDS),
                              "--agent-timeout", str(LEASE_SECONDS),
                              "--progress-stale-seconds", str(3 * LEASE_SECONDS)),
            health=HealthCheck(f"http://127.0.0.1:{ports['reconciler_metrics']}/metrics",
                               body_contains="controlplane_reconciler_passes_total"),
            ports={"metrics": ports["reconciler_metrics"]},
            env={**cp_env, CLOCK_ENV: str(clock_offset_file(state, "reconciler"))},
        ))
        for agent in agents:
            specs.append(agent_component(state, agent, ports, secrets))
    out = {spec.name: spec for spec in specs}
    if storage_faults:  # one agent's checkpoint directory on a disk of its own
        node_disk.attach(out, state, ports)
    if controlplane:  # the model servers, when `up --serving` gave them ports
        serving.attach(out, state, ports)
    return out


# Short leases keep local game days short: a lost agent's work moves within ~2 leases.
LEASE_SECONDS = 5.0
# A revoked token stops working within this (the credential-rotation game day waits for it).
TOKEN_CACHE_SECONDS = 5.0


def clock_offset_file(state: Path, component: str) -> Path:
    """Where the fault driver's skew_clock puts a process's wall-clock offset (read by
    controlplane/clock.py through CLOCK_ENV): agents and the reconciler have one."""
    return state / "clock" / f"{component}.offset.json"


def agent_component(state: Path, agent: AgentSpec, ports: dict[str, int], secrets: Secrets) -> ComponentSpec:
    # Each agent reaches the API through its own fault-proxy route, so one agent can be
    # partitioned from the control plane without touching the others.
    api = f"http://127.0.0.1:{ports[f'proxy_agent_{agent.name}']}"
    metrics = ports[f"agent_metrics_{agent.name}"]
    argv = gameday_argv(
        "controlplane", "agent", "--api", api,
        "--name", agent.name, "--pool", agent.pool, "--zone", agent.zone, "--region", agent.region,
        "--cpu-slots", str(agent.cpu_slots),
        "--registry", f"127.0.0.1:{ports['proxy_registry']}",
        "--runtime", "local", "--s3-endpoint", f"http://127.0.0.1:{ports['proxy_s3']}",
        "--bucket", BUCKET, "--metrics-port", str(metrics),
        # undelivered events survive the agent (kill, restart) inside the environment's state
        "--spool-dir", str(state / "agents" / agent.name / "spool"),
    )
    if agent.accelerator_type:
        argv += ["--accelerator-type", agent.accelerator_type,
                 "--accelerator-count", str(agent.accelerator_count)]
    for dataset in agent.datasets:
        argv += ["--dataset", dataset]
    return ComponentSpec(
        name=agent.name, kind="agent", group=Group.AGENT, argv=argv,
        health=HealthCheck(f"http://127.0.0.1:{metrics}/metrics",
                           body_contains="controlplane_agent_slots"),
        ports={"metrics": metrics, "api_route": ports[f"proxy_agent_{agent.name}"]},
        env={"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
             "AWS_DEFAULT_REGION": "us-east-1", "PYTHONUNBUFFERED": "1",
             # a file, re-read when it changes: credential rotation replaces it
             "CONTROLPLANE_AGENT_TOKEN_FILE": str(agent_token_file(state)),
             CLOCK_ENV: str(clock_offset_file(state, agent.name))},
        labels={"pool": agent.pool, "zone": agent.zone, "region": agent.region},
    )

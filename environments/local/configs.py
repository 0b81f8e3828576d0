"""Generated configuration of the local environment's servers: a Patroni member's spec and
config file, HAProxy's config, Prometheus's config and SLO rules."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from controlplane.models import MAX_BODY_BYTES
from environments.local import serving
from environments.local.pg_files import (
    PG_BIN,
    chown_for_postgres,
    run_as_postgres,
)
from environments.local.spec import ComponentSpec, Group, HealthCheck
from environments.local.topology import API_REPLICAS, AgentSpec, Secrets


def patroni_component(db_root: Path, env_name: str, index: int, ports: dict[str, int],
             secrets: Secrets, on_disk: bool = False) -> ComponentSpec:
    name = f"pg-{index}"
    home = db_root / name
    home.mkdir(parents=True, exist_ok=True)
    chown_for_postgres(home)
    # with the storage layer the data directory lives on the member's faultfs mount
    # (environments/local/storage.py); config, password file and socket stay in its home
    data_dir = home / "disk" / "data" if on_disk else home / "data"
    pg, rest = ports[f"pg{index}"], ports[f"pg{index}_rest"]
    config = {
        "scope": f"gameday-{env_name}",
        "namespace": "/gameday/",
        "name": name,
        "log": {"level": "INFO", "format": "%(asctime)s %(levelname)s: %(message)s"},
        "restapi": {"listen": f"127.0.0.1:{rest}", "connect_address": f"127.0.0.1:{rest}"},
        "etcd3": {"hosts": [f"127.0.0.1:{ports['etcd_client']}"]},
        "bootstrap": {
            "dcs": {
                # ttl bounds the failover time after a whole-node loss; loop_wait 1 s keeps
                # switchovers and sync-standby assignment quick. ttl >= loop_wait + 2*retry_timeout.
                "ttl": 8, "loop_wait": 1, "retry_timeout": 3,
                "maximum_lag_on_failover": 1048576,
                # 0: a crashed primary is failed over, not restarted in place
                # (docs/DESIGN.md section 8.5).
                "primary_start_timeout": 0,
                "synchronous_mode": True,
                "synchronous_mode_strict": False,
                # A lone etcd is a single point of failure unless the leader may keep running
                # while it can still reach every member over the REST API.
                "failsafe_mode": True,
                "postgresql": {
                    "use_pg_rewind": True,
                    "use_slots": True,
                    "parameters": {
                        "wal_level": "replica", "hot_standby": "on", "wal_log_hints": "on",
                        "max_wal_senders": 10, "max_replication_slots": 10,
                        "max_connections": 100, "shared_buffers": "32MB",
                        "synchronous_commit": "on", "wal_keep_size": "128MB",
                        # a client that vanished mid-transaction must not hold row locks for
                        # long (the control plane's transactions last milliseconds)
                        "idle_in_transaction_session_timeout": "30s",
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}, "data-checksums"],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{pg}",
            "connect_address": f"127.0.0.1:{pg}",
            "data_dir": str(data_dir),
            "bin_dir": str(PG_BIN),
            "pgpass": str(home / "pgpass"),  # one per member (docs/DESIGN.md section 8.5)
            "authentication": {
                "superuser": {"username": "postgres", "password": secrets.pg_superuser},
                "replication": {"username": "replicator", "password": secrets.pg_replication},
                "rewind": {"username": "postgres", "password": secrets.pg_superuser},
            },
            "parameters": {"unix_socket_directories": str(home)},
            "pg_hba": [
                "local all all trust",
                "host all all 127.0.0.1/32 scram-sha-256",
                "host replication replicator 127.0.0.1/32 scram-sha-256",
            ],
            "remove_data_directory_on_rewind_failure": True,
            "remove_data_directory_on_diverged_timelines": True,
        },
        "watchdog": {"mode": "off"},
        "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
    }
    path = home / "patroni.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    chown_for_postgres(path)
    os.chmod(path, 0o600)
    return ComponentSpec(
        name=name, kind="patroni", group=Group.DATABASE, argv=["/usr/bin/patroni", str(path)],
        health=HealthCheck(f"http://127.0.0.1:{rest}/health"),
        ports={"postgres": pg, "rest": rest}, user=run_as_postgres(),
        labels={"data_dir": str(data_dir), "home": str(home)},
    )


def haproxy_cfg(state: Path, ports: dict[str, int]) -> str:
    api_servers = "\n".join(
        f"  server api-{i} 127.0.0.1:{ports[f'api{i}']} check" for i in range(1, API_REPLICAS + 1))
    return f"""# generated by environments/local (gameday env up); edits are overwritten
global
  maxconn 4000
  stats socket {state / 'run' / 'haproxy.sock'} mode 600 level admin
  stats timeout 10s

defaults
  timeout connect 1s
  timeout check 1s
  timeout client 30m
  timeout server 30m
  timeout queue 5s

# Writes go to whichever Patroni member answers OPTIONS /primary with 200 (OPTIONS, not GET;
# a libpq multi-host DSN can keep picking a zombie primary: docs/DESIGN.md section 8.6).
frontend pg
  mode tcp
  bind 127.0.0.1:{ports['haproxy_pg']}
  default_backend pg_primary

backend pg_primary
  mode tcp
  option httpchk OPTIONS /primary
  http-check expect status 200
  default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
  server pg-0 127.0.0.1:{ports['pg0']} check port {ports['pg0_rest']}
  server pg-1 127.0.0.1:{ports['pg1']} check port {ports['pg1_rest']}

frontend api
  mode http
  bind 127.0.0.1:{ports['haproxy_api']}
  timeout client 60s
  # the API's request size limit (controlplane/models.py), refused here before a byte of the
  # body is read or forwarded; a chunked body (no length) is bounded by the API itself
  http-request return status 413 content-type application/json string '{{"detail":"request body larger than {MAX_BODY_BYTES} bytes, the API limit"}}' if {{ req.hdr_val(content-length) gt {MAX_BODY_BYTES} }}
  default_backend api

# retries + redispatch hide a dead replica from all but in-flight requests; an in-flight
# POST is retried on an empty response, which is safe because submissions carry an
# Idempotency-Key and agent reports carry a fencing token.
backend api
  mode http
  balance roundrobin
  option httpchk GET /readyz
  http-check expect status 200
  retries 2
  option redispatch 1
  retry-on conn-failure empty-response response-timeout
  timeout server 10s
  # Checked every 2 s while up and quiet; a failed request (connection error, 5xx) switches
  # that replica to fastinter at once, and a down replica is checked every 500 ms: marked
  # down within about 1 s of the first failed request, as with inter 500ms, for a quarter
  # of the /readyz calls (each one a database round trip).
  default-server inter 2s fastinter 500ms downinter 500ms fall 2 rise 1 observe layer7 error-limit 1 on-error fastinter
{api_servers}

frontend stats
  mode http
  bind 127.0.0.1:{ports['haproxy_stats']}
  timeout client 10s
  http-request use-service prometheus-exporter if {{ path /metrics }}
  stats enable
  stats uri /stats
  stats refresh 5s
""" + serving.haproxy_section(ports)


def gameday_targets_file(state: Path) -> Path:
    """The local Prometheus's file of `gameday run`'s fault timeline endpoints."""
    return state / "prometheus" / "gameday-targets.json"


def prometheus_cfg(state: Path, env_name: str, ports: dict[str, int], agents: tuple[AgentSpec, ...],
                    controlplane: bool, rules_file: Path | None) -> dict[str, Any]:
    def job(name: str, targets: list[str], labels: dict[str, str] | None = None,
            path: str = "/metrics") -> dict[str, Any]:
        group: dict[str, Any] = {"targets": targets}
        if labels:
            group["labels"] = labels
        return {"job_name": name, "metrics_path": path, "static_configs": [group]}

    jobs = [
        job("prometheus", [f"127.0.0.1:{ports['prometheus']}"]),
        job("etcd", [f"127.0.0.1:{ports['etcd_client']}"]),
        {"job_name": "patroni", "static_configs": [
            {"targets": [f"127.0.0.1:{ports[f'pg{i}_rest']}"], "labels": {"member": f"pg-{i}"}}
            for i in (0, 1)]},
        job("haproxy", [f"127.0.0.1:{ports['haproxy_stats']}"]),
        job("registry", [f"127.0.0.1:{ports['registry_debug']}"]),
        # moto has no metrics endpoint: the fault proxy exports a TCP probe of it
        # (gameday_proxy_upstream_up{route="s3"}) and the mode of every route.
        job("faultproxy", [f"127.0.0.1:{ports['proxy_control']}"]),
        # the fault timeline of a running game day, on whatever port was free: the run lists
        # it in this file and empties it at the end (no target = no game day running)
        {"job_name": "gameday", "file_sd_configs": [{"files": [str(gameday_targets_file(state))]}]},
    ]
    # the storage layer's faultfs mounts (`env up --storage-faults`), by their control ports
    # (environments/local/storage.py port_names): faults injected, operations delayed or failed
    disks = sorted(n for n in ports if n.startswith("disk") and n.endswith("_control"))
    if disks:
        jobs.append({"job_name": "faultfs", "static_configs": [
            {"targets": [f"127.0.0.1:{ports[n]}"],
             "labels": {"disk": "disk-" + n.removeprefix("disk").removesuffix("_control")}}
            for n in disks]})
    if controlplane:
        jobs.append({"job_name": "api", "static_configs": [
            {"targets": [f"127.0.0.1:{ports[f'api{i}']}"], "labels": {"replica": f"api-{i}"}}
            for i in range(1, API_REPLICAS + 1)]})
        jobs.append(job("reconciler", [f"127.0.0.1:{ports['reconciler_metrics']}"]))
        jobs.append({"job_name": "agent", "static_configs": [
            {"targets": [f"127.0.0.1:{ports[f'agent_metrics_{a.name}']}"],
             "labels": {"agent": a.name, "pool": a.pool, "zone": a.zone, "region": a.region}}
            for a in agents]})
    config: dict[str, Any] = {
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s",
                   "external_labels": {"env": env_name}},
        "scrape_configs": jobs,
    }
    if rules_file is not None:
        config["rule_files"] = [str(rules_file)]
    return config


def generate_rules_file(state: Path) -> Path | None:
    """Write the SLO rule file from `slo/` when that module is available, else return None.

    The file is checked with `promtool check rules` so a bad rule fails `up` with promtool's
    message instead of a Prometheus that exits at start.
    """
    try:
        from slo.rules import generate_rules
        from slo.specs import load_specs
    except ImportError:
        return None
    path = state / "prometheus" / "rules.yml"
    path.write_text(yaml.safe_dump(generate_rules(load_specs(env="local")), sort_keys=False))
    promtool = shutil.which("promtool")
    if promtool:
        check = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True,
                               check=False)
        if check.returncode != 0:
            from environments.local.errors import ComponentUnhealthy

            raise ComponentUnhealthy("prometheus", f"generated SLO rules in {path} are invalid",
                                     (check.stdout + check.stderr)[-2000:])
    return path

"""Component definitions: command line, config files, ports and health check of each server.

``build_components`` writes every generated config file under the state directory and
returns one :class:`ComponentSpec` per process. Specs are plain data stored in ``env.json``,
so a fault's ``start`` can re-launch a component exactly as ``up`` did.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from controlplane.clock import ENV as CLOCK_ENV
from controlplane.models import MAX_BODY_BYTES
from environments.local import motoserver
from environments.local.topology import API_REPLICAS, BUCKET, AgentSpec, Secrets
from environments.timeline_metrics import write_scrape_targets

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_USER = "postgres"
APP_DB = "controlplane"
APP_USER = "controlplane"


class Group(str, Enum):
    """Start order: infrastructure first, then the control plane that needs the database."""

    INFRA = "infra"
    DATABASE = "database"
    CONTROLPLANE = "controlplane"
    AGENT = "agent"


@dataclass
class HealthCheck:
    url: str
    method: str = "GET"
    expect: tuple[int, ...] = (200,)
    # set where any HTTP server would answer the URL with 200 (a metrics endpoint on a port
    # someone else bound answers every path): the answer must also contain this
    body_contains: str = ""


@dataclass
class ComponentSpec:
    name: str
    kind: str  # etcd | patroni | haproxy | proxy | moto | registry | prometheus | api | reconciler | agent
    group: Group
    argv: list[str]
    health: HealthCheck
    ports: dict[str, int]
    user: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["group"] = self.group.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ComponentSpec:
        data = dict(data)
        data["group"] = Group(data["group"])
        data["health"] = HealthCheck(**{**data["health"], "expect": tuple(data["health"]["expect"])})
        return cls(**data)


def run_as_postgres() -> str | None:
    """Postgres refuses to run as root: switch to the `postgres` OS user only when root."""
    return PG_USER if os.geteuid() == 0 else None


def chown_for_postgres(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, PG_USER, PG_USER)


def check_traversable_by_postgres(state_dir: Path) -> str | None:
    """Name the first ancestor the `postgres` user cannot enter, or None when all is well."""
    if os.geteuid() != 0:
        return None
    for parent in [state_dir.resolve(), *state_dir.resolve().parents]:
        if not parent.exists():
            continue  # created by `up` with the default (traversable) mode
        mode = parent.stat().st_mode
        if not mode & 0o001:
            return str(parent)
    return None


# Where the database members live when the state directory is one the `postgres` OS user cannot
# enter (a clone under root's 0700 home): a system data directory, one per state directory.
SYSTEM_DB_ROOT = Path("/var/lib/gameday")


def db_root_for(state_dir: Path, env_name: str) -> Path:
    """The directory holding pg-0/ and pg-1/: the state directory itself when the postgres
    user can reach it (or when nothing runs as another user), else a directory of its own under
    SYSTEM_DB_ROOT. Users never have to loosen the permissions of their home."""
    if check_traversable_by_postgres(state_dir) is None:
        return state_dir
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    return SYSTEM_DB_ROOT / f"{env_name}-{digest}"


# In a database directory under SYSTEM_DB_ROOT: the state directory it belongs to, so that one
# left behind when that state directory is gone can be found and removed (environments/local/orphans.py)
OWNER_FILE = "STATE_DIR"


def prepare_db_root(db_root: Path, state_dir: Path) -> None:
    """Create ``db_root`` and its gameday parent, enterable by the postgres user (0755), and
    record the state directory it belongs to."""
    db_root.mkdir(parents=True, exist_ok=True)
    for d in (db_root.parent, db_root):
        d.chmod(0o755)
    (db_root / OWNER_FILE).write_text(f"{state_dir.resolve()}\n")


def gameday_argv(*args: str) -> list[str]:
    """Run `gameday ...` with the interpreter of this process (the project's venv)."""
    return [sys.executable, "-m", "gameday.cli", *args]


def secrets_dir(state: Path) -> Path:
    return state / "secrets"


def pgpass_file(state: Path) -> Path:
    """The app role's password, in libpq's password-file format."""
    return secrets_dir(state) / "pgpass"


def agent_token_file(state: Path) -> Path:
    return secrets_dir(state) / "agent-token"


def write_private(path: Path, text: str) -> None:
    """Mode 0600, replaced atomically: a reader sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_pgpass(state: Path, password: str) -> None:
    # any host/port/database: the DSNs reach the same role through HAProxy or a proxy route
    escaped = password.replace("\\", "\\\\").replace(":", "\\:")
    write_private(pgpass_file(state), f"*:*:*:{APP_USER}:{escaped}\n")


def write_agent_token(state: Path, token: str) -> None:
    write_private(agent_token_file(state), token + "\n")


def write_secret_files(state: Path, secrets: Secrets) -> None:
    """The files the control plane's processes read their credentials from, so rotating one
    means replacing a file (environments/local/credentials.py), never re-launching with a new argv or
    environment."""
    write_pgpass(state, secrets.pg_app)
    write_agent_token(state, secrets.agent_token)


def app_dsn(ports: dict[str, int], state: Path, port: str = "haproxy_pg") -> str:
    """The app role's DSN: no password in it, libpq reads it from the password file at every
    connection attempt. So after a password rotation (ALTER ROLE + a new file) every new
    connection of a pool uses the new password, with no restart; sessions already open stay
    authenticated (PostgreSQL checks the password at login only)."""
    return (f"postgresql://{APP_USER}@127.0.0.1:{ports[port]}/{APP_DB}"
            f"?passfile={pgpass_file(state)}&connect_timeout=3&application_name=gameday")


def superuser_dsn(port: int, secrets: Secrets, db: str = "postgres") -> str:
    return f"postgresql://postgres:{secrets.pg_superuser}@127.0.0.1:{port}/{db}?connect_timeout=3"


def _patroni(db_root: Path, env_name: str, index: int, ports: dict[str, int],
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


def _haproxy_cfg(state: Path, ports: dict[str, int]) -> str:
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
"""


def gameday_targets_file(state: Path) -> Path:
    """The local Prometheus's file of `gameday run`'s fault timeline endpoints."""
    return state / "prometheus" / "gameday-targets.json"


def _prometheus_cfg(state: Path, env_name: str, ports: dict[str, int], agents: tuple[AgentSpec, ...],
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
        from environments.local.storage import disk_component

        for i in (0, 1):
            (db_root / f"pg-{i}").mkdir(parents=True, exist_ok=True)
            chown_for_postgres(db_root / f"pg-{i}")
            specs.append(disk_component(db_root / f"pg-{i}", i, ports[f"disk{i}_control"]))
    specs += [_patroni(db_root, env_name, i, ports, secrets, storage_faults) for i in (0, 1)]

    (state / "haproxy.cfg").write_text(_haproxy_cfg(state, ports))
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
        _prometheus_cfg(state, env_name, ports, agents, controlplane, rules), sort_keys=False))
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
        from environments.local import node_disk

        node_disk.attach(out, state, ports)
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

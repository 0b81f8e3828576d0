"""The steps of bringing the local environment up, apart from the order `up` runs them in
(environments/local/env.py): what the machine lacks, the endpoints and zones env.json records, the
infrastructure with its bucket and sample image, and the control plane with its schema and
seed. Each step is given the components it uses."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
import httpx
import yaml

from controlplane.storage import StorageConfig, make_s3_client
from environments.local import node_disk, procs, serving, storage, tracking
from environments.local.components import build_components
from environments.local.configs import gameday_targets_file
from environments.local.database import LocalDatabase
from environments.local.errors import ComponentUnhealthy, EnvError
from environments.local.pg_files import PG_BIN, app_dsn, superuser_dsn
from environments.local.platform import local_platform
from environments.local.ports import allocate_ports
from environments.local.processes import Processes
from environments.local.spec import ComponentSpec, Group, gameday_argv
from environments.local.state import EnvState, tail
from environments.local.topology import (
    API_ZONES,
    BUCKET,
    DB_ZONES,
    DEFAULT_QUEUES,
    IMAGE_REPOSITORY,
    IMAGE_TAG,
    AgentSpec,
    Secrets,
    port_names,
    zone_map,
)
from environments.timeline import utcnow

Reporter = Callable[[str], None]
CONTROLPLANE_COMMANDS = {"migrate", "seed", "api", "reconciler"}


def controlplane_commands() -> set[str]:
    """Which `gameday controlplane` subcommands exist in this checkout.

    Only a checkout without the control plane has none: a control plane whose CLI fails to
    import is an error, not an environment quietly started without its API, reconciler and
    agents (which then measured and passed as if it were whole)."""
    try:
        module = importlib.import_module("controlplane.cli")
    except ModuleNotFoundError as exc:
        if exc.name not in ("controlplane", "controlplane.cli"):
            raise EnvError(f"the control plane cannot be imported: {exc}") from exc
        return set()
    except ImportError as exc:
        raise EnvError(f"the control plane cannot be imported: {exc}") from exc
    group = getattr(module, "group", None)
    if not isinstance(group, click.Group):
        return set()
    with click.Context(group) as ctx:  # list_commands sees lazily mounted commands too
        return set(group.list_commands(ctx))


def preflight(platform: str = "controlplane") -> list[str]:
    """What this machine lacks to run the environment with ``platform``, each thing named."""
    problems = []
    try:
        missing = local_platform(platform).missing()
    except EnvError as exc:
        missing = str(exc)
    if missing:
        problems.append(missing)
    for binary in ("/usr/bin/etcd", "/usr/bin/patroni", "/usr/sbin/haproxy",
                   "/usr/bin/docker-registry", "/usr/bin/prometheus", str(PG_BIN / "postgres")):
        if not Path(binary).exists():
            problems.append(f"{binary} is missing (apt-get install patroni etcd-server haproxy "
                            "docker-registry prometheus postgresql-15)")
    return problems


def endpoints_for(state: EnvState, ports: dict[str, int], secrets: Secrets, with_cp: bool) -> dict[str, Any]:
    registry = f"127.0.0.1:{ports['proxy_registry']}"
    endpoints: dict[str, Any] = {
        "api": f"http://127.0.0.1:{ports['haproxy_api']}",
        "api_replicas": {f"api-{i}": f"http://127.0.0.1:{ports[f'api{i}']}" for i in (1, 2)},
        "dsn": app_dsn(ports, state.dir),
        "admin_dsn": superuser_dsn(ports["haproxy_pg"], secrets),
        "s3": f"http://127.0.0.1:{ports['proxy_s3']}",
        "s3_direct": f"http://127.0.0.1:{ports['moto']}",
        "bucket": BUCKET,
        "registry": registry,
        "registry_direct": f"127.0.0.1:{ports['registry']}",
        "image": f"{registry}/{IMAGE_REPOSITORY}:{IMAGE_TAG}",
        "prometheus": f"http://127.0.0.1:{ports['prometheus']}",
        "haproxy_stats": f"http://127.0.0.1:{ports['haproxy_stats']}/stats",
        "haproxy_socket": str(state.dir / "run" / "haproxy.sock"),
        "etcd": f"http://127.0.0.1:{ports['etcd_client']}",
        "patroni": {f"pg-{i}": f"http://127.0.0.1:{ports[f'pg{i}_rest']}" for i in (0, 1)},
        "fault_proxy": f"http://127.0.0.1:{ports['proxy_control']}",
        "fault_timeline": str(state.timeline_file),
        # `gameday run` lists its fault timeline endpoint here for this Prometheus
        "fault_metrics_targets": str(gameday_targets_file(state.dir)),
    }
    if not with_cp:
        endpoints.pop("api_replicas")
    return endpoints


def label_zones(components: dict[str, ComponentSpec], agents: tuple[AgentSpec, ...]) -> dict[str, dict[str, list[str]]]:
    """Label the API replicas and database members with their zone and return what
    env.json keeps under ``zones`` (only the components this environment runs)."""
    for name, zone in {**API_ZONES, **DB_ZONES}.items():
        if name in components:
            components[name].labels["zone"] = zone
    present = set(components)
    routes = {f"db-{n}" for n in present} | {f"agent-{a.name}" for a in agents}
    return {zone: {"api": [n for n in parts["api"] if n in present],
                   "database": [n for n in parts["database"] if n in present],
                   "agents": [n for n in parts["agents"] if n in present],
                   "routes": [r for r in parts["routes"] if r in routes]}
            for zone, parts in zone_map(agents).items()}


def up_infra(state: EnvState, processes: Processes, db: LocalDatabase, say: Reporter,
             timeout: float) -> None:
    """The infrastructure (disks first when there are), the bucket, the sample image, the
    database members until writable, and the control plane's database."""
    for group in (Group.INFRA, Group.DATABASE):
        for name, spec in state.components.items():
            if spec.group is group:
                processes.spawn(name)
        if group is Group.INFRA and storage.disks(state.components):
            # the members' data directories are on these mounts
            processes.wait_healthy(storage.disks(state.components), timeout, say)
    say("infrastructure processes started")
    infra = [n for n, s in state.components.items() if s.group is Group.INFRA]
    processes.wait_healthy(infra, timeout, say)
    with ThreadPoolExecutor(2) as pool:
        bucket = pool.submit(create_bucket, state.endpoints)
        image = pool.submit(push_image, state)
        bucket.result()
        say(f"bucket {BUCKET} created")
        if serving.replicas(state.components):
            publish_models(state)
            say(f"model versions published ({', '.join(serving.VERSIONS)})")
        digest = image.result()
        say(f"image pushed ({digest[:19]})")
    state.info["endpoints"]["image_digest"] = digest
    processes.wait_healthy(["pg-0", "pg-1"], storage.db_timeout(state.components, timeout), say)
    db.wait_writable(storage.db_timeout(state.components, timeout))
    say(f"database primary: {db.leader()}")
    db.setup_app_database()


def create_bucket(endpoints: dict[str, Any]) -> None:
    url = f"{endpoints['s3']}/{BUCKET}"
    response = httpx.put(url, timeout=5.0)
    if response.status_code not in (200, 409):
        raise ComponentUnhealthy("moto", f"PUT {url} -> HTTP {response.status_code}",
                                 response.text[-500:])


def publish_models(state: EnvState) -> None:
    """The served model's versions into the bucket, signed like any S3 client (moto refuses
    anonymous reads), so the replicas find the version they are deployed with."""
    client = make_s3_client(StorageConfig(endpoint_url=state.endpoints["s3_direct"],
                                          bucket=BUCKET, access_key="testing",
                                          secret_key="testing"))
    serving.publish_catalog(lambda key, data: client.put_object(Bucket=BUCKET, Key=key, Body=data))


def push_image(state: EnvState) -> str:
    from controlplane.registry import push_minimal_image

    try:
        return push_minimal_image(state.endpoints["registry"], IMAGE_REPOSITORY, IMAGE_TAG,
                                  labels={"org.opencontainers.image.title": "gameday sample workload"})
    except httpx.HTTPError as exc:
        raise ComponentUnhealthy("registry", f"pushing the sample image failed: {exc}",
                                 tail(state.log_file("registry"))) from exc


def up_controlplane(state: EnvState, processes: Processes, db: LocalDatabase, say: Reporter,
                    timeout: float) -> None:
    """Migrate, seed, then the API replicas, the reconciler and the agents until healthy."""
    from controlplane.db import DSN_ENV

    dsn_env = {DSN_ENV: state.endpoints["dsn"]}
    processes.run_step("migrate", gameday_argv("controlplane", "migrate"), env_extra=dsn_env)
    say("schema migrated")
    secrets = db.secrets()
    seed = {
        "projects": [{"name": p, "token": t} for p, t in secrets.project_tokens.items()],
        "agent_tokens": [secrets.agent_token],
        "admin_tokens": [secrets.admin_token],
        "queues": [dict(q) for q in DEFAULT_QUEUES],
    }
    seed_file = state.dir / "seed.yaml"
    seed_file.write_text(yaml.safe_dump(seed, sort_keys=False))
    os.chmod(seed_file, 0o600)
    processes.run_step("seed", gameday_argv("controlplane", "seed", "--file", str(seed_file)),
                     env_extra=dsn_env)
    say("projects, tokens and queues seeded")
    # a service with a bring-up of its own (MLflow's server: environments/local/tracking.py) is
    # started by it, not here
    names = [n for n, s in state.components.items()
             if s.group in (Group.CONTROLPLANE, Group.AGENT) and "service" not in s.labels]
    for name in names:
        processes.spawn(name)
    say(f"control plane started ({len(names)} processes)")
    processes.wait_healthy(names, timeout, say)


def plan(state: EnvState, hooks: Any, platform: str, commands: set[str],
         topology: tuple[AgentSpec, ...], db_root: Path, storage_faults: bool,
         with_serving: bool = False, with_tracking: bool = False) -> bool:
    """What `up` is about to start, recorded in ``state`` (not yet written): ports (kept from
    the previous run when still free), the components of the shared services, the control plane
    when ``commands`` has it and the platform (``hooks``: environments/local/platform.py), zones,
    endpoints and tokens. Returns whether the control plane runs."""
    with_cp = CONTROLPLANE_COMMANDS <= commands
    with_agents = with_cp and "agent" in commands
    previous = state.info or {}
    secrets = Secrets(**previous["secrets"]) if previous.get("secrets") else Secrets()
    agents = topology if with_agents else ()
    state.agents = agents
    # the platform's own components join the shared ones
    ports = allocate_ports(port_names(topology) + hooks.port_names()
                           + storage.port_names(storage_faults)
                           + serving.port_names(with_serving and with_cp)
                           + node_disk.port_names(storage_faults, tuple(a.name for a in agents))
                           + tracking.port_names(with_tracking),
                           previous.get("ports"), owner=str(state.dir))
    for stale in (state.dir / "run").glob("*.json"):
        stale.unlink()
    state.components = build_components(state.dir, state.name, ports, secrets, agents, with_cp,
                                        db_root=db_root, storage_faults=storage_faults)
    tracking_password = tracking.new_password(previous.get("tracking_db_password"))
    if with_tracking:
        state.components.update(tracking.build_components(ports, tracking_password,
                                                          state.components))
    platform_info = hooks.prepare(previous.get("platform_info") or {})
    state.components.update(hooks.build_components(state.dir, ports, platform_info))
    zones = label_zones(state.components, agents)
    state.info = {
        "name": state.name, "state_dir": str(state.dir), "db_root": str(db_root),
        "status": "starting", "storage_faults": storage_faults,
        "serving": bool(serving.replicas(state.components)),
        "tracking": with_tracking, "tracking_db_password": tracking_password,
        "started_at": utcnow(), "ports": ports, "secrets": asdict(secrets),
        "agents": [a.as_dict() for a in agents],
        "controlplane": {"included": with_cp, "agents": with_agents,
                         "missing_commands": sorted(CONTROLPLANE_COMMANDS | {"agent"} - commands)},
        "endpoints": endpoints_for(state, ports, secrets, with_cp),
        "tokens": {"projects": secrets.project_tokens, "agent": secrets.agent_token,
                   "admin": secrets.admin_token},
        "platform": platform, "platform_info": platform_info,
        "zones": zones,
    }
    state.info["endpoints"].update(hooks.endpoints(ports))
    state.info["endpoints"].update(serving.endpoints(ports))
    if with_tracking:
        state.info["endpoints"].update(tracking.endpoints(ports))
    return with_cp


def status_of(state: EnvState, processes: Processes, db: LocalDatabase,
              active_faults: dict[str, Any]) -> dict[str, Any]:
    """env.json plus live health of each component (secrets left out): what `status` shows."""
    with ThreadPoolExecutor(8) as pool:
        checks = dict(zip(state.components, pool.map(processes.check, state.components)))
    roles = db.roles() if state.components else {}
    components = {}
    for name, spec in state.components.items():
        ok, detail = checks[name]
        components[name] = {
            "kind": spec.kind, "pid": processes.main_pid(name), "healthy": ok, "detail": detail,
            "ports": spec.ports, "health_url": spec.health.url, "log": str(state.log_file(name)),
        }
        if spec.kind == serving.KIND:  # why a replica is (not) ready, in its own words
            components[name]["model"] = serving.model_status(state.dir, name,
                                                             processes.main_pid(name))
        if spec.kind == "patroni":
            components[name]["role"] = roles.get(name)
            components[name]["postmaster_pid"] = processes.postmaster_pid(name)
    pids = procs.marked_processes(state.dir)
    info = {k: v for k, v in state.info.items() if k not in ("secrets", "components")}
    info.update(
        components=components,
        healthy=bool(components) and all(c["healthy"] for c in components.values()),
        db_leader=db.leader() if state.components else None,
        processes=len(pids), rss_mib=round(procs.rss_kib(pids) / 1024, 1),
        pss_mib=round(procs.pss_kib(pids) / 1024, 1),
        active_faults=active_faults,
    )
    return info

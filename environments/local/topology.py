"""What the local environment is made of: agents per pool/zone/region, queues, projects, ports."""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass, field

from controlplane.store.queues import HELD_QUEUE

BUCKET = "ml-artifacts"
IMAGE_REPOSITORY = "ml/trainer"
IMAGE_TAG = "1.0"
ACCELERATOR = "sim-a100"


@dataclass(frozen=True)
class AgentSpec:
    """One agent process standing for one node of a node pool."""

    name: str
    pool: str  # system | cpu | gpu
    zone: str
    region: str
    cpu_slots: int
    accelerator_count: int = 0
    datasets: tuple[str, ...] = ()

    @property
    def accelerator_type(self) -> str | None:
        return ACCELERATOR if self.accelerator_count else None

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["datasets"] = list(self.datasets)
        data["accelerator_type"] = self.accelerator_type
        return data


# Datasets live in only some regions, so routing eligibility is exercised: `imagenet-mini`
# exists only in region-1, `tokens-small` in both.
DEFAULT_AGENTS: tuple[AgentSpec, ...] = (
    AgentSpec("sys-1", "system", "zone-a", "region-1", cpu_slots=2),
    AgentSpec("cpu-1", "cpu", "zone-a", "region-1", cpu_slots=4,
              datasets=("imagenet-mini", "tokens-small")),
    AgentSpec("cpu-2", "cpu", "zone-b", "region-2", cpu_slots=4, datasets=("tokens-small",)),
    AgentSpec("gpu-1", "gpu", "zone-b", "region-1", cpu_slots=2, accelerator_count=2,
              datasets=("imagenet-mini",)),
    AgentSpec("gpu-2", "gpu", "zone-a", "region-2", cpu_slots=2, accelerator_count=1),
)

DEFAULT_QUEUES: tuple[dict[str, object], ...] = (
    {"name": "default", "priority": 0, "concurrency": 16},
    {"name": "gpu", "priority": 10, "concurrency": 4},
    # held (concurrency 0): accepted and stored, never routed (controlplane/store/queues.py);
    # the harness's cheap submissions (durability stream, overload load) need no agent
    {"name": HELD_QUEUE, "priority": -100, "concurrency": 0},
)
DEFAULT_PROJECTS: tuple[str, ...] = ("team-a", "team-b")
API_REPLICAS = 2

# Every zone holds one API replica and one database member as well as its agents, so one
# zone's loss (chaos: zone_outage) takes all of them at once while the other zone keeps a
# replica, the synchronous standby and agents. The reconciler, HAProxy, etcd, the fault proxy,
# the artifact store and the registry stand for regional services and belong to no zone.
API_ZONES: dict[str, str] = {"api-1": "zone-a", "api-2": "zone-b"}
DB_ZONES: dict[str, str] = {"pg-0": "zone-a", "pg-1": "zone-b"}


def zone_map(agents: tuple[AgentSpec, ...]) -> dict[str, dict[str, list[str]]]:
    """What `up` records in env.json under ``zones``: per zone its API replicas, database
    members, agents and fault-proxy routes (an agent's route to the API, an API replica's
    route to the database)."""
    zones = sorted({*API_ZONES.values(), *DB_ZONES.values(), *(a.zone for a in agents)})
    out: dict[str, dict[str, list[str]]] = {}
    for zone in zones:
        api = sorted(n for n, z in API_ZONES.items() if z == zone)
        members = [a.name for a in agents if a.zone == zone]
        out[zone] = {
            "api": api,
            "database": sorted(n for n, z in DB_ZONES.items() if z == zone),
            "agents": members,
            "routes": [f"db-{n}" for n in api] + [f"agent-{n}" for n in members],
        }
    return out


@dataclass
class Secrets:
    """Generated once per state directory and kept across `down`/`up`."""

    pg_superuser: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    pg_replication: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    pg_app: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    project_tokens: dict[str, str] = field(
        default_factory=lambda: {p: "user-" + secrets.token_urlsafe(24) for p in DEFAULT_PROJECTS})
    agent_token: str = field(default_factory=lambda: "agent-" + secrets.token_urlsafe(24))
    admin_token: str = field(default_factory=lambda: "admin-" + secrets.token_urlsafe(24))


def port_names(agents: tuple[AgentSpec, ...]) -> list[str]:
    names = [
        "etcd_client", "etcd_peer", "pg0", "pg0_rest", "pg1", "pg1_rest",
        "haproxy_pg", "haproxy_api", "haproxy_stats", "moto", "registry", "registry_debug",
        "proxy_control", "proxy_s3", "proxy_registry", "prometheus", "reconciler_metrics",
    ]
    names += [f"api{i}" for i in range(1, API_REPLICAS + 1)]
    # each API replica reaches the database through its own fault-proxy route
    names += [f"proxy_db_api{i}" for i in range(1, API_REPLICAS + 1)]
    for agent in agents:
        names += [f"proxy_agent_{agent.name}", f"agent_metrics_{agent.name}"]
    return names

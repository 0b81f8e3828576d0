"""What the local environment knows of one process: its command line, ports, health check and
start group (:class:`ComponentSpec`, plain data kept in ``env.json`` so that a fault's
``start`` re-launches a component exactly as ``up`` did). Every module that declares
components imports this one, and nothing else of the environment."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


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



def gameday_argv(*args: str) -> list[str]:
    """Run `gameday ...` with the interpreter of this process (the project's venv)."""
    return [sys.executable, "-m", "gameday.cli", *args]

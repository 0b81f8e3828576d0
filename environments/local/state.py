"""One local environment's state directory and what ``env.json`` records of it.

``EnvState`` owns the directory (layout: docs/local-environment.md): ``env.json`` (mode 0600:
it holds secrets), the fault timeline, component logs and pid records, and the record read
from and written to ``env.json``: ``info`` (ports, endpoints, tokens, secrets, zones ...), the
component specs and the agents that run. Every other component of the environment is handed
this object and reads the record through it; none holds a copy."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from environments.local.errors import EnvError
from environments.local.spec import ComponentSpec
from environments.local.topology import DEFAULT_AGENTS, AgentSpec, Secrets
from environments.timeline import Timeline


def default_home() -> Path:
    return Path(os.environ.get("GAMEDAY_HOME") or os.getcwd())


def state_dir_for(name: str, home: Path | None = None) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise EnvError(f"environment name {name!r} is invalid: use letters, digits, '-' or '_'")
    return (home or default_home()).resolve() / ".gameday" / "envs" / name


def tail(path: Path, lines: int = 25) -> str:
    try:
        data = path.read_bytes()[-16384:]
    except FileNotFoundError:
        return "(no log file)"
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


class EnvState:
    def __init__(self, name: str, state_dir: Path,
                 agents: tuple[AgentSpec, ...] = DEFAULT_AGENTS) -> None:
        self.name = name
        self.dir = state_dir
        self.info: dict[str, Any] = {}
        self.components: dict[str, ComponentSpec] = {}
        self.agents = agents  # what is running (from env.json once loaded)

    # -- files ------------------------------------------------------------------------------
    @property
    def env_file(self) -> Path:
        return self.dir / "env.json"

    @property
    def timeline_file(self) -> Path:
        return self.dir / "faults.jsonl"

    def log_file(self, component: str) -> Path:
        return self.dir / "logs" / f"{component}.log"

    def tail(self, component: str, lines: int = 25) -> str:
        """The end of a component's log (for error messages)."""
        return tail(self.log_file(component), lines)

    def pid_file(self, component: str) -> Path:
        return self.dir / "run" / f"{component}.json"

    def exists(self) -> bool:
        return self.env_file.exists()

    def read(self) -> dict[str, Any]:
        return json.loads(self.env_file.read_text())

    def write(self, info: dict[str, Any]) -> None:
        """Never half-written, never readable by others (tokens and passwords inside)."""
        tmp = self.env_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=2))
        os.chmod(tmp, 0o600)
        tmp.replace(self.env_file)

    def pid_record(self, component: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.pid_file(component).read_text())
        except FileNotFoundError:
            return None

    def write_pid_record(self, component: str, record: dict[str, Any]) -> None:
        self.pid_file(component).write_text(json.dumps(record))

    def note(self, what: str, details: dict[str, Any] | None = None) -> None:
        """A ``note`` line on the fault timeline (env up/down, defects, manual decisions)."""
        Timeline(self.timeline_file).record("note", what, self.name, details or {})

    # -- the record in env.json -------------------------------------------------------------
    def load(self) -> None:
        self.info = self.read()
        self.components = {n: ComponentSpec.from_json(c) for n, c in self.info["components"].items()}
        self.agents = tuple(AgentSpec(**{k: (tuple(v) if k == "datasets" else v)
                                         for k, v in a.items() if k != "accelerator_type"})
                            for a in self.info.get("agents", []))

    def save(self) -> None:
        """Write env.json after a change of ``info`` or of a component's spec."""
        self.info["components"] = {n: c.to_json() for n, c in self.components.items()}
        self.write(self.info)

    @property
    def endpoints(self) -> dict[str, Any]:
        return self.info.get("endpoints", {})

    @property
    def tokens(self) -> dict[str, Any]:
        return self.info.get("tokens", {})

    def secrets(self) -> Secrets:
        return Secrets(**self.info["secrets"])

    def zones(self) -> dict[str, dict[str, list[str]]]:
        """Per zone: its API replicas, database members, agents and fault-proxy routes, as
        `up` recorded them in env.json. An environment started before zones were recorded has
        none: that is an error naming the file, never a guess."""
        zones = self.info.get("zones")
        if not isinstance(zones, dict) or not zones:
            raise EnvError(f"{self.env_file}: no 'zones' field (this environment was started "
                           "before zones were recorded); run `gameday env down` and "
                           "`gameday env up` to record them")
        return zones

    def zone_of(self, component: str) -> str | None:
        """The zone of an API replica, database member or agent; None for regional services
        (and for every component of an environment started before zones were recorded)."""
        for zone, parts in (self.info.get("zones") or {}).items():
            if any(component in parts.get(k, []) for k in ("api", "database", "agents")):
                return zone
        return None

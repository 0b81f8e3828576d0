"""Network faults on the fault proxy's routes (environments/local/proxy.py): the object store, the
registry, one agent, one API replica's database connection cut off (``refuse`` or
``blackhole``) and healed (``pass``), each recorded on the fault timeline. Toxics on the same
routes (latency, bandwidth ...) are environments/local/route_toxics.py."""

from __future__ import annotations

from typing import Any

import httpx

from environments.local.errors import EnvError, NotRunning, UnknownTarget
from environments.local.fault_ledger import FaultLedger
from environments.local.state import EnvState

PROXY_MODES = ("refuse", "blackhole")
# fault -> the proxy route it cuts (partition_agent: agent-<target>)
ROUTE_OF = {"artifact_store_unreachable": "s3", "registry_unreachable": "registry"}


class ProxyRoutes:
    KINDS = ("artifact_store_unreachable", "registry_unreachable", "partition_agent",
             "partition_database")

    def __init__(self, state: EnvState, ledger: FaultLedger) -> None:
        self.state, self.ledger = state, ledger

    def route(self, route: str, mode: str) -> dict[str, Any]:
        url = f"{self.state.endpoints['fault_proxy']}/routes/{route}"
        try:
            response = httpx.post(url, params={"mode": mode}, timeout=5.0)
        except httpx.HTTPError as exc:
            raise NotRunning(f"fault proxy unreachable at {url}: {exc}") from exc
        if response.status_code != 200:
            raise EnvError(f"fault proxy refused {route}={mode}: {response.text}")
        return response.json()

    def _proxy_fault(self, fault: str, target: str, route: str, mode: str) -> dict[str, Any]:
        if mode not in PROXY_MODES:
            raise EnvError(f"mode {mode!r} is not one of {PROXY_MODES}")
        if self.ledger.is_active(fault, target):
            return {"target": target, "already": True}
        line = self.ledger.begin(fault, target, {"route": route, "mode": mode})
        self.route(route, mode)
        return {"target": target, "mode": mode, "time": line["time"]}

    def _proxy_heal(self, fault: str, target: str, route: str) -> dict[str, Any]:
        self.route(route, "pass")
        line = self.ledger.end(fault, target, {"route": route, "mode": "pass"})
        return {"target": target, "time": line["time"] if line else None}

    def artifact_store_unreachable(self, mode: str = "blackhole") -> dict[str, Any]:
        """Cut the S3 endpoint off (moto keeps running and keeps its data)."""
        return self._proxy_fault("artifact_store_unreachable", "moto", "s3", mode)

    def artifact_store_restore(self) -> dict[str, Any]:
        return self._proxy_heal("artifact_store_unreachable", "moto", "s3")

    def registry_unreachable(self, mode: str = "refuse") -> dict[str, Any]:
        return self._proxy_fault("registry_unreachable", "registry", "registry", mode)

    def registry_restore(self) -> dict[str, Any]:
        return self._proxy_heal("registry_unreachable", "registry", "registry")

    def _agent(self, name: str) -> str:
        if name not in {a.name for a in self.state.agents}:
            raise UnknownTarget(f"unknown agent {name!r}; agents: {', '.join(a.name for a in self.state.agents)}")
        return name

    def partition_agent(self, name: str, mode: str = "blackhole") -> dict[str, Any]:
        """Cut one agent off from the control plane (its own proxy route); the others keep working."""
        return self._proxy_fault("partition_agent", self._agent(name), f"agent-{name}", mode)

    def partition_database(self, component: str, mode: str = "refuse") -> dict[str, Any]:
        """Cut one API replica off from the database (its own proxy route to HAProxy's pg
        frontend); the other replica keeps its connection."""
        if "db_route" not in getattr(self.state.components.get(component), "ports", {}):
            replicas = [n for n, c in self.state.components.items() if "db_route" in c.ports]
            raise UnknownTarget(f"{component!r} has no database route of its own; API replicas: "
                                f"{', '.join(replicas) or 'none (restart the environment)'}")
        return self._proxy_fault("partition_database", component, f"db-{component}", mode)

    def heal_database(self, component: str) -> dict[str, Any]:
        return self._proxy_heal("partition_database", component, f"db-{component}")

    def heal_agent(self, name: str) -> dict[str, Any]:
        return self._proxy_heal("partition_agent", self._agent(name), f"agent-{name}")

    # -- asked by the fault driver (environments/local/faults.py) ------------------------------------
    def close(self, fault: dict[str, Any]) -> None:
        """The environment goes down: its route passes again (best effort)."""
        try:
            route = {**ROUTE_OF, "partition_database": f"db-{fault['target']}"}.get(
                fault["fault"], f"agent-{fault['target']}")
            self.route(route, "pass")
        except EnvError:
            pass  # the proxy is going away with the environment anyway

    def restore(self, fault: dict[str, Any]) -> None:
        kind, target = fault["fault"], fault["target"]
        if kind == "artifact_store_unreachable":
            self.artifact_store_restore()
        elif kind == "registry_unreachable":
            self.registry_restore()
        elif kind == "partition_agent":
            self.heal_agent(target)
        else:
            self.heal_database(target)

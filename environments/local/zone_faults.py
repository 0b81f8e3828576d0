"""A zone outage in the local environment: everything of one zone at once (env.json ``zones``,
environments/local/topology.py): its fault-proxy routes cut, then its API replica, database member and
agents SIGKILLed together; and the inverse. One fault on the timeline, its parts listed."""

from __future__ import annotations

import signal
import time
from typing import Any

from environments.local import procs
from environments.local.database import LocalDatabase
from environments.local.errors import EnvError, UnknownTarget
from environments.local.fault_ledger import FaultLedger
from environments.local.process_faults import ProcessFaults
from environments.local.processes import Processes
from environments.local.route_faults import PROXY_MODES, ProxyRoutes
from environments.local.state import EnvState


class ZoneFaults:
    KINDS = ("zone_outage",)

    def __init__(self, state: EnvState, processes: Processes, db: LocalDatabase,
                 ledger: FaultLedger, routes: ProxyRoutes, process_faults: ProcessFaults) -> None:
        self.state, self.processes, self.db, self.ledger = state, processes, db, ledger
        self.routes, self.process_faults = routes, process_faults

    def zone_outage(self, zone: str, mode: str = "blackhole") -> dict[str, Any]:
        """Everything of one zone at once (env.json ``zones``): its fault-proxy routes are cut
        first (the zone's network), then its API replica, database member and agents are
        SIGKILLed together (the zone's power). One fault on the timeline, its parts listed.
        When the member lost was the primary, Patroni promotes the synchronous standby of the
        other zone once the leader key expires; this returns when the processes are gone."""
        zones = self.state.zones()
        if zone not in zones:
            raise UnknownTarget(f"unknown zone {zone!r}; zones: {', '.join(sorted(zones))}")
        if mode not in PROXY_MODES:
            raise EnvError(f"mode {mode!r} is not one of {PROXY_MODES}")
        if self.ledger.is_active("zone_outage", zone):
            return {"target": zone, "already": True}
        parts = zones[zone]
        components = [c for k in ("api", "database", "agents") for c in parts.get(k, [])
                      if c in self.state.components]
        leader = self.db.leader()
        pids = {c: self.processes.component_pids(c) for c in components}
        details = {"api": parts.get("api", []), "database": parts.get("database", []),
                   "agents": parts.get("agents", []), "routes": parts.get("routes", []),
                   "mode": mode, "primary_lost": leader in parts.get("database", []),
                   "leader_before": leader, "pids": pids}
        line = self.ledger.begin("zone_outage", zone, details)
        for route in details["routes"]:
            self.routes.route(route, mode)
        for component in components:
            if pids[component]:
                self.process_faults.signal_component(component, signal.SIGKILL, False)
        everyone = [p for group in pids.values() for p in group]
        left = procs.wait_gone(everyone, 5.0)
        if left:
            raise EnvError(f"zone {zone}: pids {left} survived SIGKILL")
        return {"target": zone, **{k: details[k] for k in ("api", "database", "agents", "routes",
                                                           "primary_lost")},
                "time": line["time"]}

    def restore_zone(self, zone: str, timeout: float = 90.0) -> dict[str, Any]:
        """Inverse of zone_outage: heal the zone's routes, start its database member (it
        rejoins as a replica), API replica and agents, and wait until all are healthy."""
        active = self.ledger.active().get(f"zone_outage:{zone}")
        if active is None:
            return {"target": zone, "already": True}
        parts = active["details"]
        started = time.monotonic()
        for route in parts.get("routes", []):
            self.routes.route(route, "pass")
        components = [c for k in ("database", "api", "agents") for c in parts.get(k, [])
                      if c in self.state.components]
        spawned = []
        for component in components:
            procs.wait_reaped(self.processes.component_pids(component), 3.0)
            if not self.processes.main_pid(component):
                self.processes.spawn(component)
                spawned.append(component)
        self.processes.wait_healthy(components, timeout)
        # what was really down (and so started again): evidence that the outage took it
        details = {"restarted": spawned,
                   "recovered_seconds": round(time.monotonic() - started, 3)}
        line = self.ledger.end("zone_outage", zone, details)
        return {"target": zone, **details, "time": line["time"] if line else None}

    # -- asked by the fault driver (environments/local/faults.py) ------------------------------------
    def close(self, fault: dict[str, Any]) -> None:
        for route in fault.get("details", {}).get("routes", []):
            try:
                self.routes.route(route, "pass")
            except EnvError:
                pass  # the proxy is going away with the environment anyway

    def restore(self, fault: dict[str, Any]) -> None:
        self.restore_zone(fault["target"])

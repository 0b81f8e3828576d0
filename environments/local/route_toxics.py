"""Gray network faults on the fault proxy's routes: the proxy's toxics as a component.

The fault proxy (environments/local/proxy.py) owns its routes and applies toxics (latency, bandwidth,
slicer, limit_data, reset_peer, timeout: environments/local/toxics.py) per route and direction. This
part turns them into faults of the environment: it validates a toxic before anything changes,
applies it to every route a target names, records the fault on the fault timeline (start, each
run-time change as a note, end) and undoes it on ``restore_all``.

Targets: a route name (``s3``, ``registry``, ``agent-cpu-1``, ``db-api-1`` ...) or a group of
routes: ``agents`` (every agent's route to the API), ``database`` (every API replica's route to
the database), ``api`` is not a route (clients reach HAProxy directly).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from environments.local.errors import EnvError, NotRunning, UnknownTarget
from environments.local.fault_ledger import FaultLedger
from environments.local.toxics import ToxicError, parse_toxic

FAULT = "network_gray"
GROUPS: dict[str, Callable[[str], bool]] = {
    "agents": lambda route: route.startswith("agent-"),
    "database": lambda route: route.startswith("db-"),
}


class RouteToxics:
    """Toxics on the routes of one fault proxy, each recorded as a ``network_gray`` fault
    whose target is ``<route or group>/<toxic name>``."""

    def __init__(self, control_url: str | None, ledger: FaultLedger, *,
                 timeout: float = 5.0) -> None:
        self.control_url = control_url
        self.ledger = ledger
        self.timeout = timeout

    # -- the proxy's control API ------------------------------------------------------------
    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        if not self.control_url:
            raise NotRunning("this environment has no fault proxy (env.json has no fault_proxy)")
        url = f"{self.control_url}{path}"
        try:
            return httpx.request(method, url, json=body, timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise NotRunning(f"fault proxy unreachable at {url}: {exc}") from exc

    def routes_detail(self) -> dict[str, Any]:
        """Every route with its mode, target and toxics, as the proxy reports them."""
        response = self._call("GET", "/routes")
        if response.status_code != 200:
            raise EnvError(f"fault proxy: GET /routes answered {response.status_code}")
        return dict(response.json())

    def routes(self) -> list[str]:
        return sorted(self.routes_detail())

    def resolve(self, target: str) -> list[str]:
        """The routes a target names, in a stable order."""
        routes = self.routes()
        if target in GROUPS:
            chosen = [r for r in routes if GROUPS[target](r)]
        else:
            chosen = [r for r in routes if r == target]
        if not chosen:
            raise UnknownTarget(f"unknown route or group {target!r}; routes: {', '.join(routes)}; "
                                f"groups: {', '.join(GROUPS)}")
        return chosen

    # -- faults -----------------------------------------------------------------------------
    def add(self, target: str, toxic: dict[str, Any]) -> dict[str, Any]:
        """Add a toxic to every route of ``target``; returns once it is in effect on all.
        A second call with the same toxic name while it is active changes it instead."""
        try:
            parsed = parse_toxic(toxic, f"toxic on {target}")
        except ToxicError as exc:
            raise EnvError(str(exc)) from None
        key = f"{target}/{parsed.name}"
        if self.ledger.is_active(FAULT, key):
            return self.update(target, parsed.name, toxicity=parsed.toxicity,
                               attributes=parsed.to_json()["attributes"])
        routes = self.resolve(target)
        doc = parsed.to_json()
        line = self.ledger.begin(FAULT, key, {"routes": routes, "toxic": doc})
        applied: list[str] = []
        try:
            for route in routes:
                response = self._call("POST", f"/routes/{route}/toxics", doc)
                if response.status_code == 409:  # left over from a crashed run: take it over
                    response = self._call("POST", f"/routes/{route}/toxics/{parsed.name}", doc)
                if response.status_code != 200:
                    raise EnvError(f"fault proxy refused toxic {parsed.name!r} on {route}: "
                                   f"{response.status_code} {response.text[:300]}")
                applied.append(route)
        except (EnvError, NotRunning) as exc:
            for route in applied:  # all or nothing: no half-applied fault stays behind
                self._call("DELETE", f"/routes/{route}/toxics/{parsed.name}")
            self.ledger.end(FAULT, key, {"error": str(exc)})
            raise
        return {"target": key, "routes": routes, "toxic": doc, "time": line["time"]}

    def update(self, target: str, name: str, *, toxicity: float | None = None,
               attributes: dict[str, Any] | None = None) -> dict[str, Any]:
        """Change an active toxic in place (open connections included)."""
        key = f"{target}/{name}"
        entry = self.ledger.active().get(f"{FAULT}:{key}")
        if entry is None:
            raise EnvError(f"no active toxic {name!r} on {target!r}: add it first")
        current = dict(entry["details"]["toxic"])
        if toxicity is not None:
            current["toxicity"] = toxicity
        if attributes:
            current["attributes"] = {**current.get("attributes", {}), **attributes}
        try:
            doc = parse_toxic(current, f"toxic {name!r} on {target}").to_json()
        except ToxicError as exc:
            raise EnvError(str(exc)) from None
        for route in entry["details"]["routes"]:
            response = self._call("POST", f"/routes/{route}/toxics/{name}", doc)
            if response.status_code != 200:
                raise EnvError(f"fault proxy refused the change of {name!r} on {route}: "
                               f"{response.status_code} {response.text[:300]}")
        line = self.ledger.change(FAULT, key, {"toxic": doc})
        return {"target": key, "routes": entry["details"]["routes"], "toxic": doc,
                "time": line["time"], "changed": True}

    def remove(self, target: str, name: str) -> dict[str, Any]:
        """Remove a toxic from every route it was added to (idempotent)."""
        key = f"{target}/{name}"
        entry = self.ledger.active().get(f"{FAULT}:{key}")
        routes = entry["details"]["routes"] if entry else self.resolve(target)
        for route in routes:
            response = self._call("DELETE", f"/routes/{route}/toxics/{name}")
            if response.status_code not in (204, 404):
                raise EnvError(f"fault proxy could not remove {name!r} from {route}: "
                               f"{response.status_code} {response.text[:300]}")
        line = self.ledger.end(FAULT, key, {"routes": routes})
        return {"target": key, "routes": routes, "time": line["time"] if line else None}

    def restore_all(self) -> list[str]:
        """Remove every toxic this environment recorded as active."""
        restored = []
        for key, fault in self.ledger.active().items():
            if fault["fault"] == FAULT:
                target, _, name = fault["target"].rpartition("/")
                self.remove(target, name)
                restored.append(key)
        return restored

    def close_all(self, reason: str) -> list[str]:
        """As restore_all, for an environment going down: a proxy already gone is fine."""
        closed = []
        for key, fault in self.ledger.active().items():
            if fault["fault"] != FAULT:
                continue
            for route in fault["details"].get("routes", []):
                name = fault["target"].rpartition("/")[2]
                try:
                    self._call("DELETE", f"/routes/{route}/toxics/{name}")
                except NotRunning:
                    pass  # the proxy goes away with the environment anyway
            self.ledger.end(FAULT, fault["target"], {"restored_by": reason})
            closed.append(key)
        return closed

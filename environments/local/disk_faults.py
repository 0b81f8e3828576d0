"""Storage faults on the database members' disks, as a fault component: the storage layer's
faultfs processes (environments/local/storage.py, `gameday env up --storage-faults`) made slow, full
or failing, each step on the fault timeline as fault ``disk`` with the member as target.

Every record carries the Patroni cluster as it was then (``cluster``: leader, timeline), and
``clear`` can wait for the cluster to settle and record it once more: promotions while a disk
fault lasted are the timeline's increments, which slo/invariants.py (``no-failover``,
``at-most-one-failover``) reads. Targets: ``pg-0``, ``pg-1`` or the aliases ``primary`` /
``standby``, resolved at call time by the function the environment passes in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from environments.local import disk_spec
from environments.local.errors import EnvError, NotRunning, UnknownTarget
from environments.local.fault_ledger import FaultLedger
from environments.local.faultfs.client import FaultFsClient
from environments.local.faultfs.errors import ControlUnreachable, FaultFsError
from environments.local.spec import ComponentSpec

FAULT = "disk"
NO_LAYER = ("this environment has no storage fault layer: start it with "
            "`gameday env up --storage-faults`")
LEADER_ROLES = ("leader", "master", "primary")


def injected(metrics: str) -> dict[str, float]:
    """Totals of a faultfs /metrics text: errors and delays injected so far (pure)."""
    out = {"errors": 0.0, "delays": 0.0}
    for line in metrics.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        key = {"faultfs_injected_errors_total": "errors",
               "faultfs_injected_delays_total": "delays"}.get(name)
        if key:
            out[key] += float(line.rsplit(" ", 1)[1])
    return out


def cluster_of(members: list[dict[str, Any]]) -> dict[str, Any]:
    """Leader and timeline of Patroni's /cluster members (pure); the highest timeline any
    member reports (a promotion raises it by one)."""
    leader = next((m["name"] for m in members if m.get("role") in LEADER_ROLES), None)
    timelines = [m["timeline"] for m in members if isinstance(m.get("timeline"), int)]
    return {"leader": leader, "timeline": max(timelines) if timelines else None,
            "roles": {m["name"]: m.get("role") for m in members}}


class DiskFaults:
    def __init__(self, disks: Mapping[str, str], patroni: Mapping[str, str], ledger: FaultLedger,
                 resolve: Callable[[str], str], *, sleep: Callable[[float], None] = time.sleep
                 ) -> None:
        self.disks = dict(disks)  # member -> its faultfs control URL
        self.patroni = dict(patroni)  # member -> its Patroni REST URL
        self.ledger = ledger
        self.resolve = resolve  # target or alias -> member, at call time
        self.sleep = sleep

    @classmethod
    def for_components(cls, components: Mapping[str, ComponentSpec], ledger: FaultLedger,
                       resolve: Callable[[str], str]) -> DiskFaults:
        disks = {c.labels["member"]: c.labels["control_url"] for c in components.values()
                 if c.kind == "faultfs"}
        patroni = {n: f"http://127.0.0.1:{c.ports['rest']}" for n, c in components.items()
                   if c.kind == "patroni"}
        return cls(disks, patroni, ledger, resolve)

    # -- helpers ----------------------------------------------------------------------------
    def member(self, target: str) -> str:
        if not self.disks:
            raise NotRunning(NO_LAYER)
        member = self.resolve(target)
        if member not in self.disks:
            raise UnknownTarget(f"{target!r} is not a database member with a disk; members: "
                                f"{', '.join(sorted(self.disks))}, aliases: primary, standby")
        return member

    def _client(self, member: str) -> FaultFsClient:
        return FaultFsClient(self.disks[member], timeout=5.0)

    def cluster(self) -> dict[str, Any]:
        """Patroni's cluster from the first member that answers; unknown when none does."""
        for url in self.patroni.values():
            try:
                r = httpx.get(f"{url}/cluster", timeout=1.0)
                r.raise_for_status()
                return cluster_of(r.json().get("members", []))
            except (httpx.HTTPError, ValueError, KeyError):
                continue
        return {"leader": None, "timeline": None, "roles": {}}

    def _injected(self, member: str) -> dict[str, float] | None:
        try:
            return injected(self._client(member).metrics())
        except FaultFsError:
            return None

    # -- faults -----------------------------------------------------------------------------
    def _apply(self, target: str, mode: str, params: dict[str, Any]) -> dict[str, Any]:
        try:
            spec = disk_spec.build(mode, params)
        except disk_spec.DiskSpecInvalid as exc:
            raise EnvError(f"disk {mode}: {exc.field}: {exc.reason}") from None
        member = self.member(target)
        client = self._client(member)
        details = {"member": member, "alias": target, "mode": mode,
                   "params": {k: v for k, v in params.items() if v is not None},
                   "faults": spec, "cluster": self.cluster()}
        if self.ledger.is_active(FAULT, member):  # a new setting of the same fault
            self._call(lambda: client.set(**spec))
            line = self.ledger.change(FAULT, member, details)
            return {"target": member, "mode": mode, "faults": spec, "time": line["time"],
                    "changed": True}
        details["injected"] = self._injected(member)
        line = self.ledger.begin(FAULT, member, details)
        try:
            self._call(lambda: client.set(**spec))
        except EnvError as exc:
            self.ledger.end(FAULT, member, {"error": str(exc)})
            raise
        return {"target": member, "mode": mode, "faults": spec, "time": line["time"]}

    @staticmethod
    def _call(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except ControlUnreachable as exc:
            raise NotRunning(str(exc)) from None
        except FaultFsError as exc:
            raise EnvError(f"faultfs refused: {exc}") from None

    def slow(self, target: str, *, fsync_ms: float = 0, write_ms: float = 0, read_ms: float = 0,
             jitter_ms: float = 0, glob: str | None = None) -> dict[str, Any]:
        """Every matching operation late by its class's delay (fsync separately)."""
        return self._apply(target, "slow", {"fsync_ms": fsync_ms, "write_ms": write_ms,
                                            "read_ms": read_ms, "jitter_ms": jitter_ms,
                                            "glob": glob})

    def full(self, target: str, *, glob: str | None = None) -> dict[str, Any]:
        """ENOSPC on every matching write, file creation and extension; reads still work."""
        return self._apply(target, "full", {"glob": glob})

    def errors(self, target: str, *, read: float = 0, write: float = 0, fsync: float = 0,
               glob: str | None = None) -> dict[str, Any]:
        """EIO with these probabilities per operation."""
        return self._apply(target, "errors", {"read": read, "write": write, "fsync": fsync,
                                              "glob": glob})

    def _end(self, member: str, reason: str | None, *, reachable: bool = True) -> dict[str, Any]:
        entry = self.ledger.active().get(f"{FAULT}:{member}")
        if reachable:
            self._call(self._client(member).clear)
        details: dict[str, Any] = {"cluster": self.cluster()}
        after, before = self._injected(member), (entry or {}).get("details", {}).get("injected")
        if after is not None and isinstance(before, dict):
            details["injected"] = {k: after[k] - before.get(k, 0.0) for k in after}
        if reason:
            details["restored_by"] = reason
        line = self.ledger.end(FAULT, member, details)
        return {"target": member, **details, "time": line["time"] if line else None}

    def clear(self, target: str | None = None, *, settle_seconds: float = 0.0) -> dict[str, Any]:
        """Healthy disks again: ``target``'s, or (None) every one with a fault recorded. With
        ``settle_seconds``, wait up to that long for a leader and a synchronous standby and
        record the cluster then (a ``note``): promotions after the disk healed count too."""
        if target is None:
            if not self.disks:
                raise NotRunning(NO_LAYER)
            members = sorted(e["target"] for e in self.ledger.active().values()
                             if e["fault"] == FAULT)
        else:
            members = [self.member(target)]
        ended = [self._end(m, None) for m in members]
        out: dict[str, Any] = {"cleared": ended}
        if settle_seconds > 0 and members:
            out["settled"] = self.settle(members, settle_seconds)
        return out

    def settle(self, members: list[str], timeout: float) -> dict[str, Any]:
        started = time.monotonic()
        state = self.cluster()
        while time.monotonic() - started < timeout:
            if state["leader"] and "sync_standby" in state["roles"].values():
                break
            self.sleep(0.5)
            state = self.cluster()
        details = {"settled": bool(state["leader"]) and "sync_standby" in state["roles"].values(),
                   "settled_after_s": round(time.monotonic() - started, 3), "cluster": state}
        for member in members:
            self.ledger.timeline.record("note", FAULT, member, details)
        return details

    def restore_all(self) -> list[str]:
        keys = [k for k, e in self.ledger.active().items() if e["fault"] == FAULT]
        for key in keys:
            self._end(key.partition(":")[2], "restore_all")
        return keys

    def close_all(self, reason: str) -> list[str]:
        """As restore_all, for an environment going down: a disk already gone is fine."""
        keys = [k for k, e in self.ledger.active().items() if e["fault"] == FAULT]
        for key in keys:
            member = key.partition(":")[2]
            try:
                self._end(member, reason, reachable=member in self.disks)
            except NotRunning:
                self.ledger.end(FAULT, member, {"restored_by": reason})
        return keys

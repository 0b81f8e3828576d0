"""The cloud fault driver with a fault timeline: every primitive of
:class:`environments.cloud.driver.CloudFaults`, each recorded in the environment's ``faults.jsonl``
(docs/CONTRACTS.md section 4) the way the local FaultInjector records its own.

CloudFaults keeps only what it needs to *undo* (its state file); the evaluator needs *when*
each fault started and ended, from every process that injects or heals (the Chaos Toolkit
subprocess of each experiment and the runner's own final ``restore_all``). The timeline file is
the shared record: ``fault_start`` is written before the call (the fault begins with it),
``fault_end`` when the inverse returns, or at once with ``details.error`` when the injection
itself failed, so a window never stays open for a fault that never happened.

Faults without an inverse close by themselves: a pod kill ends when ``start`` (the experiment's
restart step) or ``restore_all`` runs; an RDS failover or a node termination ends when the call
returns (CloudFaults waits until the instance is ``available`` again).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from environments.timeline import Timeline

# inverse primitive -> the faults it ends (on the same target unless the fault has one target)
CLOSES: dict[str, tuple[str, ...]] = {
    "start": ("kill", "stop"),
    "resume": ("hang",),
    "heal_agent": ("partition_agent",),
    "restore_pool": ("withdraw_pool",),
    "artifact_store_restore": ("artifact_store_unreachable",),
    "registry_restore": ("registry_unreachable",),
    "restore_zone": ("zone_outage",),
    "remove_toxic": ("network_gray",),  # target "<target>/<toxic name>", as the local one
}
# one target per environment: recorded under these names, like the local timeline does
SINGLE_TARGET = {"artifact_store_unreachable": "artifact-store", "registry_unreachable": "registry",
                 "failover_db": "database"}


class RecordedToxics:
    """The ``network`` part (chaos/gray.py) with its timeline: each toxic is a
    ``network_gray`` fault whose target is ``<target>/<toxic name>``, as on the local fault
    proxy (environments/local/route_toxics.py)."""

    def __init__(self, recorded: RecordedCloudFaults, network: Any) -> None:
        self.recorded = recorded
        self.network = network  # environments.cloud.driver.CloudToxics

    def check(self, target: str, toxics: list[Any]) -> None:
        self.network.check(target, toxics)

    def add(self, target: str, toxic: dict[str, Any]) -> dict[str, Any]:
        from environments.local.toxics import parse_toxic

        self.network.check(target, [toxic])  # refused before anything starts: no window
        ref = f"{target}/{parse_toxic(toxic, '').name}"
        return self.recorded._inject("network_gray", ref, lambda: self.network.add(target, toxic))

    def update(self, target: str, name: str, *, toxicity: float | None = None,
               attributes: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.network.update(target, name, toxicity=toxicity, attributes=attributes)

    def remove(self, target: str, name: str) -> dict[str, Any]:
        return self.recorded._heal("remove_toxic", f"{target}/{name}",
                                   lambda: self.network.remove(target, name))


class RecordedCloudFaults:
    """A FaultDriver (environments/base.py) around CloudFaults that writes the fault timeline."""

    name = "kubernetes+aws"

    def __init__(self, driver: Any, timeline: Timeline) -> None:
        self.driver = driver  # environments.cloud.driver.CloudFaults
        self.timeline = timeline
        self.network = RecordedToxics(self, driver.network)

    # -- bookkeeping ------------------------------------------------------------------------
    def open_faults(self) -> list[tuple[str, str]]:
        """(fault, target) started and not yet ended, oldest first, from the timeline alone."""
        open_: list[tuple[str, str]] = []
        for row in self.timeline.read():
            key = (row["fault"], row["target"])
            if row["event"] == "fault_start" and key not in open_:
                open_.append(key)
            elif row["event"] == "fault_end" and key in open_:
                open_.remove(key)
        return open_

    def _inject(self, fault: str, target: str, call: Callable[[], dict[str, Any]],
                *, ends_on_return: bool = False) -> dict[str, Any]:
        if (fault, target) in self.open_faults():
            return {"target": target, "already": True}
        line = self.timeline.record("fault_start", fault, target, {"driver": self.name})
        try:
            out = call()
        except Exception as exc:
            self.timeline.record("fault_end", fault, target, {"error": str(exc)[:500]})
            raise
        if ends_on_return:
            self.timeline.record("fault_end", fault, target, _jsonable(out))
        return {**out, "time": line["time"]}

    def _heal(self, inverse: str, target: str | None, call: Callable[[], dict[str, Any]]
              ) -> dict[str, Any]:
        out = call()
        for fault, t in self.open_faults():
            if fault in CLOSES[inverse] and (target is None or t == target):
                self.timeline.record("fault_end", fault, t, {"restored_by": inverse})
        return out

    # -- processes / replicas ---------------------------------------------------------------
    def kill(self, target: str) -> dict[str, Any]:
        from environments.cloud.driver import DB_ALIASES

        # "primary/postgres" (the local crash of the primary's postgres) is the same class
        if target.partition("/")[0] in DB_ALIASES:  # on RDS: a forced Multi-AZ failover
            return self.failover_db()
        return self._inject("kill", target, lambda: self.driver.kill(target))

    def hang(self, target: str) -> dict[str, Any]:
        return self._inject("hang", target, lambda: self.driver.hang(target))

    def resume(self, target: str) -> dict[str, Any]:
        return self._heal("resume", target, lambda: self.driver.resume(target))

    def stop(self, target: str) -> dict[str, Any]:
        return self._inject("stop", target, lambda: self.driver.stop(target))

    def start(self, target: str) -> dict[str, Any]:
        return self._heal("start", target, lambda: self.driver.start(target))

    # -- database / dependencies ------------------------------------------------------------
    def failover_db(self, plain_reboot: bool = False) -> dict[str, Any]:
        return self._inject("failover_db", SINGLE_TARGET["failover_db"],
                            lambda: self.driver.failover_db(plain_reboot=plain_reboot),
                            ends_on_return=True)

    def artifact_store_unreachable(self) -> dict[str, Any]:
        return self._inject("artifact_store_unreachable",
                            SINGLE_TARGET["artifact_store_unreachable"],
                            self.driver.artifact_store_unreachable)

    def artifact_store_restore(self) -> dict[str, Any]:
        return self._heal("artifact_store_restore", None, self.driver.artifact_store_restore)

    def registry_unreachable(self) -> dict[str, Any]:
        return self._inject("registry_unreachable", SINGLE_TARGET["registry_unreachable"],
                            self.driver.registry_unreachable)

    def registry_restore(self) -> dict[str, Any]:
        return self._heal("registry_restore", None, self.driver.registry_restore)

    # -- capacity / network -----------------------------------------------------------------
    def withdraw_pool(self, pool: str, mode: str | None = None) -> dict[str, Any]:
        return self._inject("withdraw_pool", pool, lambda: self.driver.withdraw_pool(pool, mode))

    def restore_pool(self, pool: str) -> dict[str, Any]:
        return self._heal("restore_pool", pool, lambda: self.driver.restore_pool(pool))

    def terminate_node(self, pool: str, instance_id: str | None = None) -> dict[str, Any]:
        return self._inject("terminate_node", pool,
                            lambda: self.driver.terminate_node(pool, instance_id),
                            ends_on_return=True)

    def partition_agent(self, agent: str) -> dict[str, Any]:
        return self._inject("partition_agent", agent, lambda: self.driver.partition_agent(agent))

    def heal_agent(self, agent: str) -> dict[str, Any]:
        return self._heal("heal_agent", agent, lambda: self.driver.heal_agent(agent))

    # -- zones ------------------------------------------------------------------------------
    def zone_outage(self, zone: str) -> dict[str, Any]:
        return self._inject("zone_outage", zone, lambda: self.driver.zone_outage(zone))

    def restore_zone(self, zone: str) -> dict[str, Any]:
        return self._heal("restore_zone", zone, lambda: self.driver.restore_zone(zone))

    # -- all --------------------------------------------------------------------------------
    def active(self) -> dict[str, dict[str, Any]]:
        """Faults that still need undoing (CloudFaults' state file)."""
        return self.driver.state.active()

    def restore_all(self) -> list[str]:
        """Undo everything in the state file; on success every open timeline window closes
        (kills heal themselves once undone faults are gone). On failure the undone ones stay
        open in the timeline as they stay in the state file, and the error propagates."""
        try:
            restored = self.driver.restore_all()
        except Exception as exc:
            self.timeline.record("note", "restore_all_failed", "environment",
                                 {"error": str(exc)[:1000]})
            raise
        for fault, target in self.open_faults():
            self.timeline.record("fault_end", fault, target, {"restored_by": "restore_all"})
        return restored


def _jsonable(out: Any) -> dict[str, Any]:
    import json

    return json.loads(json.dumps(out, default=str)) if isinstance(out, dict) else {}

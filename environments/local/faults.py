"""The local environment's fault driver (environments/base.py FaultDriver): one object the
runner, the actions and the CLI call, over the fault components that do the work. Each
component owns its faults, their state and their inverses; every primitive returns once the
fault is *in effect*, is idempotent and is recorded on the fault timeline
(environments/local/fault_ledger.py):

====================================  =====================================  ======================
fault                                 inverse                                component
====================================  =====================================  ======================
``kill(target)`` (SIGKILL, tree)      ``start(target)``                      process_faults.py
``stop(target)`` (SIGTERM, grace)     ``start(target)``                      process_faults.py
``hang(target)`` (SIGSTOP, tree)      ``resume(target)`` (SIGCONT)           process_faults.py
``withdraw_pool(pool)``               ``restore_pool(pool)``                 process_faults.py
``failover_db()`` (Patroni failover)  ``failover_db()`` again                database.py
``artifact_store_unreachable()``      ``artifact_store_restore()``           route_faults.py
``registry_unreachable()``            ``registry_restore()``                 route_faults.py
``partition_agent(name)``             ``heal_agent(name)``                   route_faults.py
``partition_database(replica)``       ``heal_database(replica)``             route_faults.py
``skew_clock(target, seconds)``       ``restore_clock(target)``              clock_faults.py
``zone_outage(zone)``                 ``restore_zone(zone)``                 zone_faults.py
``roll_release(to)`` (rolling)        ``restore_all()`` (default release)    releases.py
``rotate_credentials()``              ``revoke_retired_credentials()``       credentials.py
``backups.lose()``                    ``backups.restore()`` + ``reopen()``   backup.py
``rollout(version, policy, ...)``     ``restore_all()`` (good version back)  rollout_faults.py
====================================  =====================================  ======================

Fault layers with state of their own are components too (``network``: toxics on proxy
routes, ``store``: the S3 brownout, ``cpu``, ``memory``, ``disks``, ``power``, and
``serving``, the model-serving replicas scaled at run time; built in
environments/local/fault_parts.py); a capability the environment lacks is None. Undoing everything
asks the layers first, then the component owning each active fault's kind, in the order the
faults began.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from environments.local.fault_ledger import FaultLedger

if TYPE_CHECKING:
    from controlplane.serving.rollout import Policy
    from environments.local.clock_faults import Clocks
    from environments.local.cpu_starvation import CpuStarvation
    from environments.local.credentials import CredentialRotation
    from environments.local.database import LocalDatabase
    from environments.local.disk_faults import DiskFaults
    from environments.local.memory_pressure import MemoryPressure
    from environments.local.power_loss import PowerLoss
    from environments.local.process_faults import ProcessFaults
    from environments.local.releases import Releases
    from environments.local.rollout_faults import Rollouts
    from environments.local.route_faults import ProxyRoutes
    from environments.local.route_toxics import RouteToxics
    from environments.local.serving_scale import ServingScale
    from environments.local.store_brownout import StoreBrownout
    from environments.local.zone_faults import ZoneFaults

# the fault layers, asked to undo what they did before the faults of the other components
LAYERS = ("network", "store", "cpu", "memory", "disks", "power", "serving")


class FaultOwner(Protocol):
    """A component owning the faults ``KINDS``: what the driver asks when undoing one."""

    KINDS: tuple[str, ...]

    def close(self, fault: dict[str, Any]) -> None: ...  # going down: revert what outlives it
    def restore(self, fault: dict[str, Any]) -> None: ...  # undo it for real (ends the fault)


class Backups(Protocol):
    """What undoing a lost database asks of the backups (environments/local/backup.py)."""

    def restore(self, backup_id: str = "latest") -> dict[str, Any]: ...
    def reopen(self) -> dict[str, Any]: ...


class FaultInjector:
    """The local environment's fault driver (environments/base.py FaultDriver): every fault
    primitive on real processes and proxy routes, each recorded on the fault timeline."""

    name = "local"

    def __init__(self, ledger: FaultLedger, parts: Mapping[str, Any]) -> None:
        self.ledger = ledger
        self.timeline = ledger.timeline
        self.active_file = ledger.active_file
        self.processes: ProcessFaults = parts.get("processes")  # type: ignore[assignment]
        self.routes: ProxyRoutes | None = parts.get("routes")
        self.clocks: Clocks | None = parts.get("clocks")
        self.zones: ZoneFaults | None = parts.get("zones")
        self.database: LocalDatabase | None = parts.get("database")
        self.releases: Releases | None = parts.get("releases")
        self.credentials: CredentialRotation | None = parts.get("credentials")
        self.rollouts: Rollouts | None = parts.get("rollouts")
        self.network: RouteToxics | None = parts.get("network")
        self.store: StoreBrownout | None = parts.get("store")
        self.cpu: CpuStarvation | None = parts.get("cpu")
        self.memory: MemoryPressure | None = parts.get("memory")
        self.disks: DiskFaults | None = parts.get("disks")
        self.power: PowerLoss | None = parts.get("power")
        self.serving: ServingScale | None = parts.get("serving")
        self.parts = tuple(parts[n] for n in LAYERS if parts.get(n) is not None)
        # kind -> the component owning it (FaultOwner)
        self.owners: dict[str, FaultOwner] = {
            kind: part for part in parts.values() for kind in getattr(part, "KINDS", ())}
        self.backups: Backups | None = None  # set by the composition root (it needs us)

    # -- bookkeeping (environments/local/fault_ledger.py) ------------------------------------------
    def active(self) -> dict[str, dict[str, Any]]:
        return self.ledger.active()

    def begin(self, fault: str, target: str, details: dict[str, Any]) -> dict[str, Any]:
        """Record that ``fault`` on ``target`` is in effect from now (timeline + active set).
        For fault mechanisms outside the fault components (e.g. losing the database)."""
        return self.ledger.begin(fault, target, details)

    def end(self, fault: str, target: str, details: dict[str, Any]) -> dict[str, Any] | None:
        """Record that the fault is over; None when it was not active (nothing recorded)."""
        return self.ledger.end(fault, target, details)

    def is_active(self, fault: str, target: str) -> bool:
        return self.ledger.is_active(fault, target)

    def resolve(self, target: str) -> tuple[str, bool]:
        """(component, postgres_only) for a target name or alias (``primary``, ``standby``)."""
        return self.processes.resolve(target)

    def power_off(self, component: str) -> list[int]:
        return self.processes.power_off(component)

    # -- processes (environments/local/process_faults.py) ------------------------------------------
    def kill(self, target: str) -> dict[str, Any]:
        return self.processes.kill(target)

    def stop(self, target: str, grace: float = 10.0) -> dict[str, Any]:
        return self.processes.stop(target, grace)

    def start(self, target: str, timeout: float = 60.0) -> dict[str, Any]:
        return self.processes.start(target, timeout)

    def hang(self, target: str) -> dict[str, Any]:
        return self.processes.hang(target)

    def resume(self, target: str) -> dict[str, Any]:
        return self.processes.resume(target)

    def withdraw_pool(self, pool: str, grace: float = 5.0) -> dict[str, Any]:
        return self.processes.withdraw_pool(pool, grace)

    def restore_pool(self, pool: str, timeout: float = 60.0) -> dict[str, Any]:
        return self.processes.restore_pool(pool, timeout)

    # -- the database (environments/local/database.py) ---------------------------------------------
    def failover_db(self, candidate: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
        assert self.database is not None
        return self.database.failover(self.ledger, candidate, timeout)

    # -- proxy routes (environments/local/route_faults.py) -----------------------------------------
    def artifact_store_unreachable(self, mode: str = "blackhole") -> dict[str, Any]:
        assert self.routes is not None
        return self.routes.artifact_store_unreachable(mode)

    def artifact_store_restore(self) -> dict[str, Any]:
        assert self.routes is not None
        return self.routes.artifact_store_restore()

    def registry_unreachable(self, mode: str = "refuse") -> dict[str, Any]:
        assert self.routes is not None
        return self.routes.registry_unreachable(mode)

    def registry_restore(self) -> dict[str, Any]:
        assert self.routes is not None
        return self.routes.registry_restore()

    def partition_agent(self, name: str, mode: str = "blackhole") -> dict[str, Any]:
        assert self.routes is not None
        return self.routes.partition_agent(name, mode)

    def heal_agent(self, name: str) -> dict[str, Any]:
        assert self.routes is not None
        return self.routes.heal_agent(name)

    def partition_database(self, component: str, mode: str = "refuse") -> dict[str, Any]:
        assert self.routes is not None
        return self.routes.partition_database(component, mode)

    def heal_database(self, component: str) -> dict[str, Any]:
        assert self.routes is not None
        return self.routes.heal_database(component)

    # -- clocks, zones, releases, credentials -----------------------------------------------
    def skew_clock(self, target: str, seconds: float) -> dict[str, Any]:
        assert self.clocks is not None
        return self.clocks.skew_clock(target, seconds)

    def restore_clock(self, target: str) -> dict[str, Any]:
        assert self.clocks is not None
        return self.clocks.restore_clock(target)

    def zone_outage(self, zone: str, mode: str = "blackhole") -> dict[str, Any]:
        assert self.zones is not None
        return self.zones.zone_outage(zone, mode)

    def restore_zone(self, zone: str, timeout: float = 90.0) -> dict[str, Any]:
        assert self.zones is not None
        return self.zones.restore_zone(zone, timeout)

    def roll_release(self, to: str, components: list[str] | None = None, *,
                     migrate: bool = True, timeout: float = 60.0) -> dict[str, Any]:
        assert self.releases is not None
        return self.releases.roll(to, components, migrate=migrate, timeout=timeout)

    def rotate_credentials(self, project: str | None = None) -> dict[str, Any]:
        assert self.credentials is not None
        return self.credentials.rotate_credentials(project)

    def revoke_retired_credentials(self) -> dict[str, Any]:
        assert self.credentials is not None
        return self.credentials.revoke_retired_credentials()

    def retired_credentials_refused(self, within: float) -> dict[str, Any]:
        assert self.credentials is not None
        return self.credentials.retired_credentials_refused(within)

    # -- model serving (environments/local/rollout_faults.py) -----------------------------------
    def rollout(self, version: str, policy: Policy, step_seconds: float,
                expect: str | None = None) -> dict[str, Any]:
        assert self.rollouts is not None
        return self.rollouts.rollout(version, policy, step_seconds, expect)

    # -- model serving's replicas (environments/local/serving_scale.py) ----------------------
    def scale_serving(self, replicas: int) -> dict[str, Any]:
        assert self.serving is not None
        return self.serving.scale(replicas)

    def watch_serving_replica(self, replica: str, states: list[str],
                              timeout: float = 30.0) -> dict[str, Any]:
        assert self.serving is not None
        return self.serving.watch(replica, states, timeout)

    # -- all --------------------------------------------------------------------------------
    def close_all(self, reason: str) -> list[str]:
        """Record the end of every active fault and revert the ones that outlive processes,
        without restarting anything (the environment is going down)."""
        restored = [key for part in self.parts for key in part.close_all(reason)]
        for key, fault in self.active().items():
            owner = self.owners.get(fault["fault"])
            if owner is not None:
                owner.close(fault)
            self.end(fault["fault"], fault["target"], {"restored_by": reason})
            restored.append(key)
        return restored

    def restore_all(self) -> list[str]:
        """Undo every active fault for real (restart what was killed, heal every route), e.g.
        between experiments. Safe to call any number of times."""
        restored = []
        if self.is_active("database_lost", "database") and self.backups is not None:
            # first: the restore order stops and restarts everything else itself
            self.backups.restore("latest")
            self.backups.reopen()
            restored.append("database_lost:database")
        restored += [key for part in self.parts for key in part.restore_all()]
        for key, fault in list(self.active().items()):
            owner = self.owners.get(fault["fault"])
            if owner is not None:
                owner.restore(fault)
            else:
                self.end(fault["fault"], fault["target"], {"restored_by": "restore_all"})
            restored.append(key)
        return restored

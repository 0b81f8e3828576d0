"""Fault primitives for the local environment, each recorded in the fault timeline.

Every primitive returns once the fault is *in effect* (processes gone or stopped, proxy
route switched, new primary accepting writes ...), is idempotent (a second call while the
fault is active records nothing new) and has an inverse:

====================================  =====================================
fault                                 inverse
====================================  =====================================
``kill(target)`` (SIGKILL, tree)      ``start(target)``
``stop(target)`` (SIGTERM, grace)     ``start(target)``
``hang(target)`` (SIGSTOP, tree)      ``resume(target)`` (SIGCONT)
``failover_db()`` (Patroni failover)  ``failover_db()`` again (back to the other member)
``artifact_store_unreachable()``      ``artifact_store_restore()``
``registry_unreachable()``            ``registry_restore()``
``withdraw_pool(pool)``               ``restore_pool(pool)``
``partition_agent(name)``             ``heal_agent(name)``
``skew_clock(target, seconds)``       ``restore_clock(target)``
``roll_release(to)`` (rolling)        ``restore_all()`` (default release back)
``DatabaseBackups.lose()``            ``DatabaseBackups.restore()`` + ``reopen()`` (environments/local/backup.py)
``zone_outage(zone)``                 ``restore_zone(zone)``
====================================  =====================================

Targets are component names (``api-1``, ``pg-0``, ``moto``, ``gpu-1`` ...) or the aliases
``primary`` / ``standby`` (the current Patroni leader / synchronous standby). A Patroni
target means the whole database node (Patroni and its postgres); ``primary/postgres`` or
``pg-0/postgres`` means only the postgres processes (a database crash that Patroni sees).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from controlplane.clock import ENV as CLOCK_ENV
from controlplane.clock import RECHECK_SECONDS as CLOCK_RECHECK_SECONDS
from environments.local import procs
from environments.local.errors import EnvError, NotRunning, UnknownTarget
from environments.local.fault_ledger import FaultLedger

if TYPE_CHECKING:
    from environments.local.cpu_starvation import CpuStarvation
    from environments.local.disk_faults import DiskFaults
    from environments.local.env import LocalEnvironment
    from environments.local.memory_pressure import MemoryPressure
    from environments.local.power_loss import PowerLoss
    from environments.local.route_toxics import RouteToxics
    from environments.local.store_brownout import StoreBrownout

PROXY_MODES = ("refuse", "blackhole")
CLOCK_KINDS = ("agent", "reconciler")  # processes with an injectable clock (controlplane/clock.py)


class FaultInjector:
    """The local environment's fault driver (environments/base.py FaultDriver): every fault
    primitive on real processes and proxy routes, each recorded on the fault timeline."""

    name = "local"

    def __init__(self, env: LocalEnvironment,
                 parts: Callable[[FaultInjector], Mapping[str, Any]] | None = None) -> None:
        self.env = env
        self.ledger = FaultLedger(env.timeline_file, env.state_dir / "faults_active.json")
        self.timeline = self.ledger.timeline
        self.active_file = self.ledger.active_file
        # Fault layers with their own state, each a component of its own (environments/local/
        # fault_parts.py, given by the composition root): asked to undo what they did before
        # the process faults below are undone. A capability a driver lacks is None.
        built = dict(parts(self)) if parts is not None else {}
        self.network: RouteToxics | None = built.get("network")
        self.store: StoreBrownout | None = built.get("store")
        self.cpu: CpuStarvation | None = built.get("cpu")
        self.memory: MemoryPressure | None = built.get("memory")
        self.disks: DiskFaults | None = built.get("disks")
        self.power: PowerLoss | None = built.get("power")
        self.parts = tuple(built.values())

    # -- bookkeeping (environments/local/fault_ledger.py) ------------------------------------------
    def active(self) -> dict[str, dict[str, Any]]:
        return self.ledger.active()

    def begin(self, fault: str, target: str, details: dict[str, Any]) -> dict[str, Any]:
        """Record that ``fault`` on ``target`` is in effect from now (timeline + active set).
        For fault mechanisms outside this class (e.g. losing the database in backup.py)."""
        return self.ledger.begin(fault, target, details)

    def end(self, fault: str, target: str, details: dict[str, Any]) -> dict[str, Any] | None:
        """Record that the fault is over; None when it was not active (nothing recorded)."""
        return self.ledger.end(fault, target, details)

    def is_active(self, fault: str, target: str) -> bool:
        return self.ledger.is_active(fault, target)

    def resolve(self, target: str) -> tuple[str, bool]:
        """(component, postgres_only) for a target name or alias."""
        base, _, scope = target.partition("/")
        if scope not in ("", "postgres"):
            raise UnknownTarget(f"target {target!r}: only '<pg member>/postgres' has a scope")
        if base in ("primary", "leader"):
            leader = self.env.db.leader()
            if leader is None:
                raise NotRunning("no database primary right now (Patroni reports no leader)")
            base = leader
        elif base in ("standby", "replica"):
            roles = self.env.db.roles()
            standby = next((n for n, r in roles.items() if r in ("sync_standby", "replica")), None)
            if standby is None:
                raise NotRunning(f"no database standby right now (roles {roles})")
            base = standby
        if base not in self.env.components:
            raise UnknownTarget(f"unknown target {target!r}; components: {', '.join(self.env.components)}"
                                ", aliases: primary, standby")
        if scope and self.env.components[base].kind != "patroni":
            raise UnknownTarget(f"target {target!r}: '/postgres' applies to database members only")
        return base, bool(scope)

    def _signal_component(self, component: str, sig: signal.Signals, postgres_only: bool) -> list[int]:
        pids = self.env.component_pids(component, postgres_only=postgres_only)
        if not postgres_only:
            record = self.env.pid_record(component)
            if record and self.env.main_pid(component):
                procs.signal_group(record["pgid"], sig)
        if self.env.components[component].kind == "patroni":
            postmaster = self.env.postmaster_pid(component)
            info = procs.read_stat(postmaster) if postmaster else None
            if info is not None:  # postgres runs in its own session (Patroni setsid()s it)
                procs.signal_group(info.pgid, sig)
        procs.signal_pids(pids, sig)
        return pids

    def power_off(self, component: str) -> list[int]:
        """SIGKILL a component's whole process tree and return once every process is gone,
        recording nothing: for fault parts that record a fault of their own (power_loss)."""
        pids = self.env.component_pids(component)
        self._signal_component(component, signal.SIGKILL, False)
        left = procs.wait_gone(pids, 5.0)
        if left:
            raise EnvError(f"{component}: pids {left} survived SIGKILL")
        procs.wait_reaped(pids, 3.0)
        return pids

    # -- process faults ---------------------------------------------------------------------
    def kill(self, target: str) -> dict[str, Any]:
        """SIGKILL a component (or one replica) with all its child processes."""
        component, pg_only = self.resolve(target)
        name = f"{component}/postgres" if pg_only else component
        if self.is_active("kill", name) or self.is_active("stop", name):
            return {"target": name, "already": True}
        pids = self.env.component_pids(component, postgres_only=pg_only)
        if not pids:
            raise NotRunning(f"{name} is not running")
        line = self.begin("kill", name, {"signal": "SIGKILL", "pids": pids, "alias": target})
        self._signal_component(component, signal.SIGKILL, pg_only)
        left = procs.wait_gone(pids, 5.0)
        if left:
            raise EnvError(f"{name}: pids {left} survived SIGKILL")
        return {"target": name, "pids": pids, "time": line["time"]}

    def stop(self, target: str, grace: float = 10.0) -> dict[str, Any]:
        """Graceful stop: SIGTERM, then SIGKILL after ``grace`` seconds."""
        component, pg_only = self.resolve(target)
        if pg_only:
            raise UnknownTarget("stop applies to whole components; use kill for 'member/postgres'")
        if self.is_active("stop", component) or self.is_active("kill", component):
            return {"target": component, "already": True}
        pids = self.env.component_pids(component)
        if not pids:
            raise NotRunning(f"{component} is not running")
        line = self.begin("stop", component, {"signal": "SIGTERM", "pids": pids, "alias": target})
        record = self.env.pid_record(component)
        if record:
            procs.signal_group(record["pgid"], signal.SIGCONT)
            procs.signal_group(record["pgid"], signal.SIGTERM)
        left = procs.wait_gone(pids, grace)
        if left:
            self._signal_component(component, signal.SIGKILL, False)
            procs.signal_pids(left, signal.SIGKILL)
            procs.wait_gone(left, 5.0)
        return {"target": component, "pids": pids, "time": line["time"], "forced": bool(left)}

    def start(self, target: str, timeout: float = 60.0) -> dict[str, Any]:
        """Inverse of kill/stop: re-launch the component as `up` did and wait until healthy.
        Idempotent: a component that runs and is not down by a fault is only waited for."""
        component, pg_only = self.resolve(target)
        name = f"{component}/postgres" if pg_only else component
        down = self.is_active("kill", name) or self.is_active("stop", name)
        if not pg_only and not down and self.env.main_pid(component):
            self.env.wait_healthy([component], timeout)
            return {"target": name, "already": True}
        started = time.monotonic()
        if pg_only:
            # Patroni restarts its own postgres (as a replica after a failover); wait for it.
            self.env.wait_healthy([component], timeout)
        else:
            # A killed postmaster is re-parented to the supervisor and reaped there; wait for
            # that so the new postgres never sees a stale lock file.
            procs.wait_reaped(self.env.component_pids(component), 3.0)
            self.env.spawn(component)
            self.env.wait_healthy([component], timeout)
        details = {"recovered_seconds": round(time.monotonic() - started, 3),
                   "pid": self.env.main_pid(component)}
        for fault in ("kill", "stop"):
            self.end(fault, name, details)
        return {"target": name, **details}

    def hang(self, target: str) -> dict[str, Any]:
        """SIGSTOP every process of a component: it keeps its sockets but answers nothing."""
        component, pg_only = self.resolve(target)
        name = f"{component}/postgres" if pg_only else component
        if self.is_active("hang", name):
            return {"target": name, "already": True}
        pids = self.env.component_pids(component, postgres_only=pg_only)
        if not pids:
            raise NotRunning(f"{name} is not running")
        line = self.begin("hang", name, {"signal": "SIGSTOP", "pids": pids, "alias": target})
        self._signal_component(component, signal.SIGSTOP, pg_only)
        procs.wait_stopped(pids, 5.0)
        return {"target": name, "pids": pids, "time": line["time"]}

    def resume(self, target: str) -> dict[str, Any]:
        component, pg_only = self.resolve(target)
        name = f"{component}/postgres" if pg_only else component
        pids = self._signal_component(component, signal.SIGCONT, pg_only)
        line = self.end("hang", name, {"signal": "SIGCONT", "pids": pids})
        return {"target": name, "pids": pids, "time": line["time"] if line else None}

    # -- database ---------------------------------------------------------------------------
    def failover_db(self, candidate: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
        """Patroni failover to the synchronous standby; returns once writes commit again."""
        roles = self.env.db.roles()
        leader = self.env.db.leader()
        if leader is None:
            raise NotRunning(f"no database primary to fail over from (roles {roles})")
        if candidate is None:
            candidate = next((n for n, r in roles.items() if r == "sync_standby"), None)
        if candidate is None or candidate == leader or candidate not in roles:
            raise EnvError(f"no eligible failover candidate (roles {roles}, asked {candidate!r})")
        started = time.monotonic()
        line = self.begin("failover_db", "database", {"from": leader, "to": candidate})
        rest = self.env.components[candidate].ports["rest"]
        response = httpx.post(f"http://127.0.0.1:{rest}/failover", json={"candidate": candidate},
                              timeout=timeout)
        if response.status_code != 200:
            self.end("failover_db", "database", {"error": response.text.strip()})
            raise EnvError(f"Patroni refused the failover to {candidate}: HTTP {response.status_code} "
                           f"{response.text.strip()}")
        deadline = time.monotonic() + timeout
        while self.env.db.leader() != candidate and time.monotonic() < deadline:
            time.sleep(0.05)
        self.env.wait_db_writable(max(1.0, deadline - time.monotonic()))
        seconds = round(time.monotonic() - started, 3)
        # The fault ends when redundancy is back: with synchronous_mode only a *synchronous*
        # standby may be promoted, so a primary loss right now would not fail over.
        self.env.db.wait_sync_standby(max(1.0, deadline - time.monotonic()))
        redundant = round(time.monotonic() - started, 3)
        details = {"from": leader, "to": candidate, "writable_after_s": seconds,
                   "sync_standby_after_s": redundant}
        self.end("failover_db", "database", details)
        return {**details, "time": line["time"]}

    # -- network faults through the fault proxy ---------------------------------------------
    def _route(self, route: str, mode: str) -> dict[str, Any]:
        url = f"{self.env.endpoints['fault_proxy']}/routes/{route}"
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
        if self.is_active(fault, target):
            return {"target": target, "already": True}
        line = self.begin(fault, target, {"route": route, "mode": mode})
        self._route(route, mode)
        return {"target": target, "mode": mode, "time": line["time"]}

    def _proxy_heal(self, fault: str, target: str, route: str) -> dict[str, Any]:
        self._route(route, "pass")
        line = self.end(fault, target, {"route": route, "mode": "pass"})
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
        if name not in {a.name for a in self.env.agents}:
            raise UnknownTarget(f"unknown agent {name!r}; agents: {', '.join(a.name for a in self.env.agents)}")
        return name

    def partition_agent(self, name: str, mode: str = "blackhole") -> dict[str, Any]:
        """Cut one agent off from the control plane (its own proxy route); the others keep working."""
        return self._proxy_fault("partition_agent", self._agent(name), f"agent-{name}", mode)

    def partition_database(self, component: str, mode: str = "refuse") -> dict[str, Any]:
        """Cut one API replica off from the database (its own proxy route to HAProxy's pg
        frontend); the other replica keeps its connection."""
        if "db_route" not in getattr(self.env.components.get(component), "ports", {}):
            replicas = [n for n, c in self.env.components.items() if "db_route" in c.ports]
            raise UnknownTarget(f"{component!r} has no database route of its own; API replicas: "
                                f"{', '.join(replicas) or 'none (restart the environment)'}")
        return self._proxy_fault("partition_database", component, f"db-{component}", mode)

    def heal_database(self, component: str) -> dict[str, Any]:
        return self._proxy_heal("partition_database", component, f"db-{component}")

    def heal_agent(self, name: str) -> dict[str, Any]:
        return self._proxy_heal("partition_agent", self._agent(name), f"agent-{name}")

    # -- clocks -----------------------------------------------------------------------------
    def _clock_file(self, component: str) -> Path:
        spec = self.env.components[component]
        if spec.kind not in CLOCK_KINDS:
            skewable = [n for n, c in self.env.components.items() if c.kind in CLOCK_KINDS]
            raise UnknownTarget(f"{component!r} ({spec.kind}) has no injectable clock; clocks "
                                f"can be skewed on: {', '.join(skewable)}")
        path = spec.env.get(CLOCK_ENV)
        if not path:
            raise UnknownTarget(f"{component!r} reads no clock offset ({CLOCK_ENV} is not in its "
                                "environment): restart the environment")
        return Path(path)

    def skew_clock(self, target: str, seconds: float) -> dict[str, Any]:
        """Step the wall clock of one agent or of the reconciler ``seconds`` away from the true
        time (forward > 0, backward < 0), as an NTP step or a resumed VM would: the process's
        every wall-clock reading (controlplane/clock.py) is off by that much from now on, its
        monotonic clock is not. A second call with another offset is a new jump (the previous
        skew ends on the timeline, the new one starts); with the same offset it is a no-op."""
        component, pg_only = self.resolve(target)
        if pg_only:
            raise UnknownTarget("skew_clock applies to agents and the reconciler")
        seconds = float(seconds)
        if seconds == 0:
            raise EnvError("skew_clock needs a non-zero offset; restore_clock puts the clock back")
        path = self._clock_file(component)
        current = self.active().get(f"clock_skew:{component}")
        if current and current["details"].get("offset_seconds") == seconds:
            return {"target": component, "offset_seconds": seconds, "already": True}
        if current:
            self.end("clock_skew", component, {"offset_seconds": seconds, "jumped": True})
        line = self.begin("clock_skew", component, {"offset_seconds": seconds,
                                                    "alias": target})
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"offset_seconds": seconds}))
        tmp.replace(path)  # atomic: a reader sees the old offset or the new one
        # in effect once the process has looked at the file again
        time.sleep(2 * CLOCK_RECHECK_SECONDS)
        return {"target": component, "offset_seconds": seconds, "time": line["time"]}

    def restore_clock(self, target: str) -> dict[str, Any]:
        """Inverse of skew_clock: the process reads the true time again. Idempotent."""
        component, _ = self.resolve(target)
        self._clock_file(component).unlink(missing_ok=True)
        time.sleep(2 * CLOCK_RECHECK_SECONDS)
        line = self.end("clock_skew", component, {"offset_seconds": 0.0})
        return {"target": component, "time": line["time"] if line else None}

    # -- capacity ---------------------------------------------------------------------------
    def _pool_agents(self, pool: str) -> list[str]:
        members = [a.name for a in self.env.agents if a.pool == pool]
        if not members:
            # [platform adapters] another platform's workers are a pool through their `pool`
            # label (e.g. Prefect process workers: pool "prefect-cpu", environments/local/prefect.py)
            members = [n for n, c in self.env.components.items()
                       if c.kind != "agent" and c.labels.get("pool") == pool]
        if not members:
            pools = sorted({a.pool for a in self.env.agents} |
                           {c.labels["pool"] for c in self.env.components.values()
                            if c.labels.get("pool")})
            raise UnknownTarget(f"pool {pool!r} has no agents; pools: {', '.join(pools) or 'none'}")
        return members

    def withdraw_pool(self, pool: str, grace: float = 5.0) -> dict[str, Any]:
        """Stop every agent of a pool (node group scaled to zero)."""
        members = self._pool_agents(pool)
        if self.is_active("withdraw_pool", pool):
            return {"target": pool, "already": True}
        pids = [p for m in members for p in self.env.component_pids(m)]
        line = self.begin("withdraw_pool", pool, {"agents": members})
        procs.stop_groups([record["pgid"] for m in members if (record := self.env.pid_record(m))],
                          pids, grace)
        return {"target": pool, "agents": members, "time": line["time"]}

    def restore_pool(self, pool: str, timeout: float = 60.0) -> dict[str, Any]:
        if not self.is_active("withdraw_pool", pool):
            return {"target": pool, "already": True}
        members = self._pool_agents(pool)
        for member in members:
            procs.wait_reaped(self.env.component_pids(member), 3.0)
            self.env.spawn(member)
        self.env.wait_healthy(members, timeout)
        line = self.end("withdraw_pool", pool, {"agents": members})
        return {"target": pool, "agents": members, "time": line["time"] if line else None}

    # -- credentials (environments/local/credentials.py) -----------------------------------------
    def rotate_credentials(self, project: str | None = None) -> dict[str, Any]:
        """Agent token, a project's token and the database password replaced while work
        runs; on the timeline from now until the old ones are revoked."""
        from environments.local.credentials import LocalCredentials

        if self.is_active("credential_rotation", "controlplane"):
            return {"target": "controlplane", "note": "a rotation is already in progress"}
        self.begin("credential_rotation", "controlplane", {"project": project})
        steps = LocalCredentials(self.env).rotate(project)
        self.timeline.record("note", "credentials_rotated", "controlplane", steps)
        return {"target": "controlplane", **steps}

    def revoke_retired_credentials(self) -> dict[str, Any]:
        """Revoke the tokens a rotation retired; ends the rotation on the timeline."""
        from environments.local.credentials import LocalCredentials

        out = LocalCredentials(self.env).revoke_retired()
        line = self.end("credential_rotation", "controlplane", out)
        return {"target": "controlplane", **out, "time": line["time"] if line else None}

    def retired_credentials_refused(self, within: float) -> dict[str, Any]:
        from environments.local.credentials import LocalCredentials

        return LocalCredentials(self.env).refused(within, record=lambda details: self.timeline.record(
            "note", "retired_credential_request", "controlplane", details))


    # -- zones ------------------------------------------------------------------------------
    def zone_outage(self, zone: str, mode: str = "blackhole") -> dict[str, Any]:
        """Everything of one zone at once (env.json ``zones``): its fault-proxy routes are cut
        first (the zone's network), then its API replica, database member and agents are
        SIGKILLed together (the zone's power). One fault on the timeline, its parts listed.
        When the member lost was the primary, Patroni promotes the synchronous standby of the
        other zone once the leader key expires; this returns when the processes are gone."""
        zones = self.env.zones()
        if zone not in zones:
            raise UnknownTarget(f"unknown zone {zone!r}; zones: {', '.join(sorted(zones))}")
        if mode not in PROXY_MODES:
            raise EnvError(f"mode {mode!r} is not one of {PROXY_MODES}")
        if self.is_active("zone_outage", zone):
            return {"target": zone, "already": True}
        parts = zones[zone]
        components = [c for k in ("api", "database", "agents") for c in parts.get(k, [])
                      if c in self.env.components]
        leader = self.env.db.leader()
        pids = {c: self.env.component_pids(c) for c in components}
        details = {"api": parts.get("api", []), "database": parts.get("database", []),
                   "agents": parts.get("agents", []), "routes": parts.get("routes", []),
                   "mode": mode, "primary_lost": leader in parts.get("database", []),
                   "leader_before": leader, "pids": pids}
        line = self.begin("zone_outage", zone, details)
        for route in details["routes"]:
            self._route(route, mode)
        for component in components:
            if pids[component]:
                self._signal_component(component, signal.SIGKILL, False)
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
        active = self.active().get(f"zone_outage:{zone}")
        if active is None:
            return {"target": zone, "already": True}
        parts = active["details"]
        started = time.monotonic()
        for route in parts.get("routes", []):
            self._route(route, "pass")
        components = [c for k in ("database", "api", "agents") for c in parts.get(k, [])
                      if c in self.env.components]
        spawned = []
        for component in components:
            procs.wait_reaped(self.env.component_pids(component), 3.0)
            if not self.env.main_pid(component):
                self.env.spawn(component)
                spawned.append(component)
        self.env.wait_healthy(components, timeout)
        # what was really down (and so started again): evidence that the outage took it
        details = {"restarted": spawned,
                   "recovered_seconds": round(time.monotonic() - started, 3)}
        line = self.end("zone_outage", zone, details)
        return {"target": zone, **details, "time": line["time"] if line else None}


    # -- releases (rolling upgrade) ---------------------------------------------------------
    def roll_release(self, to: str, components: list[str] | None = None, *,
                     migrate: bool = True, timeout: float = 60.0) -> dict[str, Any]:
        """Rolling upgrade (or rollback) to release ``to``: the schema step first (when
        ``migrate``), then each component (default: every API replica, the reconciler, every
        agent) restarted as ``to`` one by one, each healthy before the next. Every step is a
        fault span on the timeline (``roll_release`` on ``schema`` / the component); while any
        part runs a release other than the default, ``release_skew`` on ``controlplane`` is
        active, and ``restore_all`` takes everything back (docs/upgrades.md)."""
        from controlplane import release

        to = release.parse(to)
        order = self.env.release_order()
        targets = list(components) if components else order
        unknown = [c for c in targets if c not in order]
        if unknown:
            raise UnknownTarget(f"roll_release: {unknown} are not control-plane processes; "
                                f"those are {', '.join(order)}")
        if not self.is_active("release_skew", "controlplane"):
            self.begin("release_skew", "controlplane", {"to": to})
        steps = []
        if migrate and self.env.schema_release() != to:
            started = time.monotonic()
            self.begin("roll_release", "schema", {"from": self.env.schema_release(), "to": to})
            try:
                self.env.migrate_schema(to)
            finally:
                self.end("roll_release", "schema", {"to": to,
                                                    "seconds": round(time.monotonic() - started, 3)})
            steps.append("schema")
        for component in targets:
            before = self.env.release_of(component)
            if before == to:
                continue
            started = time.monotonic()
            self.begin("roll_release", component, {"from": before, "to": to})
            try:
                self.env.set_release(component, to, timeout=timeout)
            finally:
                self.end("roll_release", component, {
                    "to": to, "seconds": round(time.monotonic() - started, 3),
                    "pid": self.env.main_pid(component)})
            steps.append(component)
        return {"release": to, "steps": steps,
                "releases": {c: self.env.release_of(c) for c in order},
                "schema": self.env.schema_release()}

    # -- all --------------------------------------------------------------------------------
    def close_all(self, reason: str) -> list[str]:
        """Record the end of every active fault and revert the ones that outlive processes,
        without restarting anything (the environment is going down)."""
        restored = [key for part in self.parts for key in part.close_all(reason)]
        for key, fault in self.active().items():
            if fault["fault"] in ("artifact_store_unreachable", "registry_unreachable",
                                  "partition_agent", "partition_database"):
                try:
                    route = {"artifact_store_unreachable": "s3", "registry_unreachable": "registry",
                             "partition_database": f"db-{fault['target']}"}.get(
                        fault["fault"], f"agent-{fault['target']}")
                    self._route(route, "pass")
                except EnvError:
                    pass  # the proxy is going away with the environment anyway
            if fault["fault"] == "clock_skew" and fault["target"] in self.env.components:
                # the offset file outlives the processes: a later `up` must start on true time
                self._clock_file(fault["target"]).unlink(missing_ok=True)
            if fault["fault"] == "zone_outage":
                for route in fault.get("details", {}).get("routes", []):
                    try:
                        self._route(route, "pass")
                    except EnvError:
                        pass  # the proxy is going away with the environment anyway
            if fault["fault"] == "hang":
                component = fault["target"].split("/")[0]
                if component in self.env.components:
                    self._signal_component(component, signal.SIGCONT, fault["target"].endswith("/postgres"))
            self.end(fault["fault"], fault["target"], {"restored_by": reason})
            restored.append(key)
        return restored

    def restore_all(self) -> list[str]:
        """Undo every active fault for real (restart what was killed, heal every route), e.g.
        between experiments. Safe to call any number of times."""
        restored = []
        if self.is_active("database_lost", "database"):
            # first: the restore order stops and restarts everything else itself
            from environments.local.backup import DatabaseBackups

            backups = DatabaseBackups(self.env)
            backups.restore("latest")
            backups.reopen()
            restored.append("database_lost:database")
        restored += [key for part in self.parts for key in part.restore_all()]
        for key, fault in list(self.active().items()):
            kind, target = fault["fault"], fault["target"]
            if kind in ("kill", "stop"):
                self.start(target)
            elif kind == "hang":
                self.resume(target)
            elif kind == "artifact_store_unreachable":
                self.artifact_store_restore()
            elif kind == "registry_unreachable":
                self.registry_restore()
            elif kind == "partition_agent":
                self.heal_agent(target)
            elif kind == "partition_database":
                self.heal_database(target)
            elif kind == "withdraw_pool":
                self.restore_pool(target)
            elif kind == "clock_skew":
                self.restore_clock(target)
            elif kind == "credential_rotation":
                # forward only: the new credentials are in place, finish by revoking the old
                self.revoke_retired_credentials()
            elif kind == "zone_outage":
                self.restore_zone(target)
            elif kind == "release_skew":
                changed = self.env.reset_release()
                self.end(kind, target, {"restored_by": "restore_all", "restarted": changed})
            else:
                self.end(kind, target, {"restored_by": "restore_all"})
            restored.append(key)
        return restored


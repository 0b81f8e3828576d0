"""Process faults of the local environment: SIGKILL, SIGTERM, SIGSTOP a component (or only a
database member's postgres), start it again, and withdraw a pool's agents; each recorded on
the fault timeline (environments/local/fault_ledger.py).

Targets are component names (``api-1``, ``pg-0``, ``moto``, ``gpu-1`` ...) or the aliases
``primary`` / ``standby`` (the current Patroni leader / synchronous standby). A Patroni
target means the whole database node (Patroni and its postgres); ``primary/postgres`` or
``pg-0/postgres`` means only the postgres processes (a database crash that Patroni sees).
"""

from __future__ import annotations

import signal
import time
from typing import Any

from environments.local import procs
from environments.local.database import LocalDatabase
from environments.local.errors import EnvError, NotRunning, UnknownTarget
from environments.local.fault_ledger import FaultLedger
from environments.local.processes import Processes
from environments.local.state import EnvState


class ProcessFaults:
    """``kill`` / ``stop`` / ``hang`` of a component and their inverses, ``withdraw_pool``."""

    KINDS = ("kill", "stop", "hang", "withdraw_pool")

    def __init__(self, state: EnvState, processes: Processes, db: LocalDatabase,
                 ledger: FaultLedger) -> None:
        self.state, self.processes, self.db, self.ledger = state, processes, db, ledger

    def resolve(self, target: str) -> tuple[str, bool]:
        """(component, postgres_only) for a target name or alias."""
        base, _, scope = target.partition("/")
        if scope not in ("", "postgres"):
            raise UnknownTarget(f"target {target!r}: only '<pg member>/postgres' has a scope")
        if base in ("primary", "leader"):
            leader = self.db.leader()
            if leader is None:
                raise NotRunning("no database primary right now (Patroni reports no leader)")
            base = leader
        elif base in ("standby", "replica"):
            roles = self.db.roles()
            standby = next((n for n, r in roles.items() if r in ("sync_standby", "replica")), None)
            if standby is None:
                raise NotRunning(f"no database standby right now (roles {roles})")
            base = standby
        if base not in self.state.components:
            raise UnknownTarget(f"unknown target {target!r}; components: {', '.join(self.state.components)}"
                                ", aliases: primary, standby")
        if scope and self.state.components[base].kind != "patroni":
            raise UnknownTarget(f"target {target!r}: '/postgres' applies to database members only")
        return base, bool(scope)

    def signal_component(self, component: str, sig: signal.Signals, postgres_only: bool) -> list[int]:
        pids = self.processes.component_pids(component, postgres_only=postgres_only)
        if not postgres_only:
            record = self.state.pid_record(component)
            if record and self.processes.main_pid(component):
                procs.signal_group(record["pgid"], sig)
        if self.state.components[component].kind == "patroni":
            postmaster = self.processes.postmaster_pid(component)
            info = procs.read_stat(postmaster) if postmaster else None
            if info is not None:  # postgres runs in its own session (Patroni setsid()s it)
                procs.signal_group(info.pgid, sig)
        procs.signal_pids(pids, sig)
        return pids

    def power_off(self, component: str) -> list[int]:
        """SIGKILL a component's whole process tree and return once every process is gone,
        recording nothing: for fault parts that record a fault of their own (power_loss)."""
        pids = self.processes.component_pids(component)
        self.signal_component(component, signal.SIGKILL, False)
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
        if self.ledger.is_active("kill", name) or self.ledger.is_active("stop", name):
            return {"target": name, "already": True}
        pids = self.processes.component_pids(component, postgres_only=pg_only)
        if not pids:
            raise NotRunning(f"{name} is not running")
        line = self.ledger.begin("kill", name, {"signal": "SIGKILL", "pids": pids, "alias": target})
        self.signal_component(component, signal.SIGKILL, pg_only)
        left = procs.wait_gone(pids, 5.0)
        if left:
            raise EnvError(f"{name}: pids {left} survived SIGKILL")
        return {"target": name, "pids": pids, "time": line["time"]}

    def stop(self, target: str, grace: float = 10.0) -> dict[str, Any]:
        """Graceful stop: SIGTERM, then SIGKILL after ``grace`` seconds."""
        component, pg_only = self.resolve(target)
        if pg_only:
            raise UnknownTarget("stop applies to whole components; use kill for 'member/postgres'")
        if self.ledger.is_active("stop", component) or self.ledger.is_active("kill", component):
            return {"target": component, "already": True}
        pids = self.processes.component_pids(component)
        if not pids:
            raise NotRunning(f"{component} is not running")
        line = self.ledger.begin("stop", component, {"signal": "SIGTERM", "pids": pids, "alias": target})
        record = self.state.pid_record(component)
        if record:
            procs.signal_group(record["pgid"], signal.SIGCONT)
            procs.signal_group(record["pgid"], signal.SIGTERM)
        left = procs.wait_gone(pids, grace)
        if left:
            self.signal_component(component, signal.SIGKILL, False)
            procs.signal_pids(left, signal.SIGKILL)
            procs.wait_gone(left, 5.0)
        return {"target": component, "pids": pids, "time": line["time"], "forced": bool(left)}

    def start(self, target: str, timeout: float = 60.0) -> dict[str, Any]:
        """Inverse of kill/stop: re-launch the component as `up` did and wait until healthy.
        Idempotent: a component that runs and is not down by a fault is only waited for."""
        component, pg_only = self.resolve(target)
        name = f"{component}/postgres" if pg_only else component
        down = self.ledger.is_active("kill", name) or self.ledger.is_active("stop", name)
        if not pg_only and not down and self.processes.main_pid(component):
            self.processes.wait_healthy([component], timeout)
            return {"target": name, "already": True}
        started = time.monotonic()
        if pg_only:
            # Patroni restarts its own postgres (as a replica after a failover); wait for it.
            self.processes.wait_healthy([component], timeout)
        else:
            # A killed postmaster is re-parented to the supervisor and reaped there; wait for
            # that so the new postgres never sees a stale lock file.
            procs.wait_reaped(self.processes.component_pids(component), 3.0)
            self.processes.spawn(component)
            self.processes.wait_healthy([component], timeout)
        details = {"recovered_seconds": round(time.monotonic() - started, 3),
                   "pid": self.processes.main_pid(component)}
        for fault in ("kill", "stop"):
            self.ledger.end(fault, name, details)
        return {"target": name, **details}

    def hang(self, target: str) -> dict[str, Any]:
        """SIGSTOP every process of a component: it keeps its sockets but answers nothing."""
        component, pg_only = self.resolve(target)
        name = f"{component}/postgres" if pg_only else component
        if self.ledger.is_active("hang", name):
            return {"target": name, "already": True}
        pids = self.processes.component_pids(component, postgres_only=pg_only)
        if not pids:
            raise NotRunning(f"{name} is not running")
        line = self.ledger.begin("hang", name, {"signal": "SIGSTOP", "pids": pids, "alias": target})
        self.signal_component(component, signal.SIGSTOP, pg_only)
        procs.wait_stopped(pids, 5.0)
        return {"target": name, "pids": pids, "time": line["time"]}

    def resume(self, target: str) -> dict[str, Any]:
        component, pg_only = self.resolve(target)
        name = f"{component}/postgres" if pg_only else component
        pids = self.signal_component(component, signal.SIGCONT, pg_only)
        line = self.ledger.end("hang", name, {"signal": "SIGCONT", "pids": pids})
        return {"target": name, "pids": pids, "time": line["time"] if line else None}

    # -- capacity ---------------------------------------------------------------------------
    def _pool_agents(self, pool: str) -> list[str]:
        members = [a.name for a in self.state.agents if a.pool == pool]
        if not members:
            # [platform adapters] another platform's workers are a pool through their `pool`
            # label (e.g. Prefect process workers: pool "prefect-cpu", environments/local/prefect.py)
            members = [n for n, c in self.state.components.items()
                       if c.kind != "agent" and c.labels.get("pool") == pool]
        if not members:
            pools = sorted({a.pool for a in self.state.agents} |
                           {c.labels["pool"] for c in self.state.components.values()
                            if c.labels.get("pool")})
            raise UnknownTarget(f"pool {pool!r} has no agents; pools: {', '.join(pools) or 'none'}")
        return members

    def withdraw_pool(self, pool: str, grace: float = 5.0) -> dict[str, Any]:
        """Stop every agent of a pool (node group scaled to zero)."""
        members = self._pool_agents(pool)
        if self.ledger.is_active("withdraw_pool", pool):
            return {"target": pool, "already": True}
        pids = [p for m in members for p in self.processes.component_pids(m)]
        line = self.ledger.begin("withdraw_pool", pool, {"agents": members})
        procs.stop_groups([record["pgid"] for m in members if (record := self.state.pid_record(m))],
                          pids, grace)
        return {"target": pool, "agents": members, "time": line["time"]}

    def restore_pool(self, pool: str, timeout: float = 60.0) -> dict[str, Any]:
        if not self.ledger.is_active("withdraw_pool", pool):
            return {"target": pool, "already": True}
        members = self._pool_agents(pool)
        for member in members:
            procs.wait_reaped(self.processes.component_pids(member), 3.0)
            self.processes.spawn(member)
        self.processes.wait_healthy(members, timeout)
        line = self.ledger.end("withdraw_pool", pool, {"agents": members})
        return {"target": pool, "agents": members, "time": line["time"] if line else None}

    # -- asked by the fault driver (environments/local/faults.py) ------------------------------------
    def close(self, fault: dict[str, Any]) -> None:
        """The environment goes down: a hung process is let go (SIGCONT) so it can be stopped."""
        if fault["fault"] == "hang":
            component = fault["target"].split("/")[0]
            if component in self.state.components:
                self.signal_component(component, signal.SIGCONT, fault["target"].endswith("/postgres"))

    def restore(self, fault: dict[str, Any]) -> None:
        kind, target = fault["fault"], fault["target"]
        if kind in ("kill", "stop"):
            self.start(target)
        elif kind == "hang":
            self.resume(target)
        else:
            self.restore_pool(target)

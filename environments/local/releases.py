"""Releases of the local environment's control plane (docs/upgrades.md): which release each
process and the schema run, a rolling upgrade or rollback as a fault on the timeline
(``roll_release`` / ``release_skew``), everything back to the default release, and the seeded
defects (controlplane/defects.py; test only) switched on by restarting with them."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from environments.local import procs, serving
from environments.local.errors import UnknownTarget
from environments.local.fault_ledger import FaultLedger
from environments.local.processes import Processes
from environments.local.spec import Group, gameday_argv
from environments.local.state import EnvState


class Releases:
    KINDS = ("release_skew",)

    def __init__(self, state: EnvState, processes: Processes, ledger: FaultLedger) -> None:
        self.state, self.processes, self.ledger = state, processes, ledger

    def set_defects(self, names: list[str] | tuple[str, ...]) -> list[str]:
        """Restart every control-plane process (API replicas, reconciler, agents) with the
        seeded defects ``names`` switched on (controlplane/defects.py; test only), or with none.
        Returns the restarted components."""
        from controlplane import defects

        wanted = defects.parse(",".join(names))
        changed = []
        for name, spec in self.state.components.items():
            if spec.group not in (Group.CONTROLPLANE, Group.AGENT):
                continue
            env = {k: v for k, v in spec.env.items() if k != defects.ENV}
            mine = defects.for_part(spec.kind, wanted)
            if mine:
                env[defects.ENV] = ",".join(mine)
            if env != spec.env:
                self.state.components[name] = dataclasses.replace(spec, env=env)
                changed.append(name)
        cfg = self.state.dir / "haproxy.cfg"
        if "haproxy" in self.state.components and cfg.is_file():
            text = cfg.read_text()
            switched = serving.with_check(text, wanted)
            if switched != text:  # a defect in the generated config: HAProxy reads it at start
                cfg.write_text(switched)
                changed.append("haproxy")
        # a defect of no process (the rollout controller's) changes the record alone: noted too
        switched = self.state.info.get("defects", []) != sorted(wanted)
        self.state.info["defects"] = sorted(wanted)
        self.state.save()
        if changed or switched:
            self.state.note("defects", {"defects": sorted(wanted), "restarted": changed})
        if changed:
            self.processes.restart(changed)
        return changed

    def release_order(self) -> list[str]:
        """The control-plane processes in the order a rolling upgrade takes them: API
        replicas, then the reconciler, then the agents."""
        rank = {"api": 0, "reconciler": 1, "agent": 2}
        names = [n for n, s in self.state.components.items() if s.kind in rank]
        return sorted(names, key=lambda n: (rank[self.state.components[n].kind], names.index(n)))

    def release_of(self, component: str) -> str:
        from controlplane import release

        return release.parse(self.state.components[component].env.get(release.ENV))

    def schema_release(self) -> str:
        return str(self.state.info.get("schema_release", "N"))

    def migrate_schema(self, to: str, *, allow_downgrade: bool = False) -> None:
        """Run `gameday controlplane migrate --release TO` against the environment's database,
        as a deploy job would: with the seeded defects that live in the schema step on
        (controlplane/defects.py WHERE "migrate"; test only)."""
        from controlplane import defects
        from controlplane.db import DSN_ENV

        extra = {DSN_ENV: self.state.endpoints["dsn"]}
        mine = defects.for_part("migrate", self.state.info.get("defects", []))
        if mine:
            extra[defects.ENV] = ",".join(mine)
        argv = gameday_argv("controlplane", "migrate", "--release", to)
        self.processes.run_step("migrate", argv + (["--allow-downgrade"] if allow_downgrade else []),
                       env_extra=extra)
        self.state.info["schema_release"] = to
        self.state.save()

    def set_release(self, component: str, to: str, *, wait: bool = True,
                    timeout: float = 60.0) -> bool:
        """Restart one control-plane process as release ``to`` (SIGTERM, drain, start, wait
        healthy). False when it already runs that release (nothing restarted)."""
        from controlplane import release

        spec = self.state.components[component]
        env = {k: v for k, v in spec.env.items() if k != release.ENV}
        if release.parse(to) != release.DEFAULT:
            env[release.ENV] = to
        if env == spec.env:
            return False
        self.state.components[component] = dataclasses.replace(spec, env=env)
        self.state.save()
        if wait:
            self.processes.restart([component], timeout)
        return True

    def reset_release(self, timeout: float = 60.0) -> list[str]:
        """Everything back to the default release: processes first (without waiting, so a
        broken schema cannot wedge the restore), then the schema, then wait for all."""
        from controlplane import release

        changed = [n for n in self.release_order()
                   if self.set_release(n, release.DEFAULT, wait=False)]
        if changed:
            self.processes.terminate(changed, 10.0)
        if self.schema_release() != release.DEFAULT:
            self.migrate_schema(release.DEFAULT, allow_downgrade=True)
        for name in changed:
            procs.wait_reaped(self.processes.component_pids(name), 3.0)
            self.processes.spawn(name)
        self.processes.wait_healthy(changed, timeout)
        if changed:
            self.state.note("release", {"release": release.DEFAULT, "restarted": changed})
        return changed

    # -- the fault -------------------------------------------------------------------------
    def roll(self, to: str, components: list[str] | None = None, *,
             migrate: bool = True, timeout: float = 60.0) -> dict[str, Any]:
        """Rolling upgrade (or rollback) to release ``to``: the schema step first (when
        ``migrate``), then each component (default: every API replica, the reconciler, every
        agent) restarted as ``to`` one by one, each healthy before the next. Every step is a
        fault span on the timeline (``roll_release`` on ``schema`` / the component); while any
        part runs a release other than the default, ``release_skew`` on ``controlplane`` is
        active, and ``restore_all`` takes everything back (docs/upgrades.md)."""
        from controlplane import release

        to = release.parse(to)
        order = self.release_order()
        targets = list(components) if components else order
        unknown = [c for c in targets if c not in order]
        if unknown:
            raise UnknownTarget(f"roll_release: {unknown} are not control-plane processes; "
                                f"those are {', '.join(order)}")
        if not self.ledger.is_active("release_skew", "controlplane"):
            self.ledger.begin("release_skew", "controlplane", {"to": to})
        steps = []
        if migrate and self.schema_release() != to:
            started = time.monotonic()
            self.ledger.begin("roll_release", "schema", {"from": self.schema_release(), "to": to})
            try:
                self.migrate_schema(to)
            finally:
                self.ledger.end("roll_release", "schema", {"to": to,
                                                    "seconds": round(time.monotonic() - started, 3)})
            steps.append("schema")
        for component in targets:
            before = self.release_of(component)
            if before == to:
                continue
            started = time.monotonic()
            self.ledger.begin("roll_release", component, {"from": before, "to": to})
            try:
                self.set_release(component, to, timeout=timeout)
            finally:
                self.ledger.end("roll_release", component, {
                    "to": to, "seconds": round(time.monotonic() - started, 3),
                    "pid": self.processes.main_pid(component)})
            steps.append(component)
        return {"release": to, "steps": steps,
                "releases": {c: self.release_of(c) for c in order},
                "schema": self.schema_release()}

    # -- asked by the fault driver (environments/local/faults.py) ------------------------------------
    def close(self, fault: dict[str, Any]) -> None:
        pass  # the processes go down with the environment; `up` starts the default release

    def restore(self, fault: dict[str, Any]) -> None:
        changed = self.reset_release()
        self.ledger.end(fault["fault"], fault["target"], {"restored_by": "restore_all",
                                                          "restarted": changed})

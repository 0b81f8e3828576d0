"""Scaling the model-serving replicas at run time (docs/serving.md, "Scale-up"): from the
``REPLICAS`` started at `up` to at most ``MAX_REPLICAS`` and back, each step a ``note`` on the
timeline (``serving_scale``), and what a replica says of its model meanwhile
(``serving_replica_state``: the evidence that a new replica stays out, and why).

A replica a scale-up starts is declared in haproxy.cfg in maintenance (environments/local/
serving.py). Leaving maintenance, HAProxy 2.6 counts a server UP until a check fails (it has
no ``init-state down`` before 3.1), so the server is enabled at weight 0, its health forced
down, and only then given its weight: it gets a request only once its readiness check
(``/v2/models/<name>/ready``, 200 only once the model is loaded with its digest) passes.

Scaling owns no fault; ``restore_all`` scales back to ``REPLICAS`` (between experiments, and
an experiment's rollback), ``close_all`` has nothing to revert (the processes go down with
the environment, HAProxy's runtime state with HAProxy).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from environments.local import haproxy_admin, serving
from environments.local.errors import EnvError
from environments.local.processes import Processes
from environments.local.state import EnvState

SKIPS_READINESS = "scale-up-skips-readiness"  # controlplane/defects.py (test only)
# a prediction takes 10-40 ms here: a replica at weight 0 this long has none in flight
DRAIN_S = 1.0


class ScaleRefused(EnvError):
    """A scale the environment cannot do; the message names the argument and why."""


def plan(running: list[str], wanted: int, declared: list[str], floor: int) -> tuple[
        list[str], list[str]]:
    """(replicas to start, replicas to stop) to go from ``running`` to ``wanted`` replicas
    out of ``declared`` (in order; the first ``floor`` are the ones `up` starts, never
    stopped here). Pure; refuses a count outside ``floor``..len(declared)."""
    if isinstance(wanted, bool) or not isinstance(wanted, int):
        raise ScaleRefused(f"replicas: {wanted!r} is not a whole number")
    if not floor <= wanted <= len(declared):
        raise ScaleRefused(f"replicas: {wanted} is outside {floor}..{len(declared)} (the "
                           f"{floor} started at `up` stay; {len(declared)} are declared: "
                           f"{', '.join(declared)})")
    target = declared[:wanted]
    return ([r for r in target if r not in running],
            [r for r in reversed(declared) if r in running and r not in target])


class ServingScale:
    KINDS: tuple[str, ...] = ()  # no fault of its own

    def __init__(self, state: EnvState, processes: Processes,
                 admin: Callable[[str, str], str] | None = None) -> None:
        self.state, self.processes = state, processes
        self.admin = admin or (lambda socket, line: haproxy_admin.command(socket, line))

    # -- what runs --------------------------------------------------------------------------
    def declared(self) -> list[str]:
        """Every replica this environment has a port for (a third one only in an environment
        made since scale-up exists)."""
        ports = self.state.info.get("ports") or {}
        return [r for r in serving.replica_names(serving.MAX_REPLICAS)
                if serving.port_name(r) in ports]

    def running(self) -> list[str]:
        # from the pid records, not the component list: another process (the runner, the
        # chaos actions) may hold an older copy of env.json
        return [r for r in self.declared() if self.processes.main_pid(r)]

    def _spec(self, replica: str) -> Any:
        """The replica's component, serving what the first replica serves, with the seeded
        defects of the model server switched on when the environment has them."""
        from controlplane import defects

        first = self.state.components.get(serving.replica_names()[0])
        version = first.labels.get("version", serving.GOOD) if first else serving.GOOD
        store = f"http://127.0.0.1:{self.state.info['ports']['proxy_s3']}"
        spec = serving.component(self.state.dir, replica,
                                 self.state.info["ports"][serving.port_name(replica)], store, version)
        mine = defects.for_part(spec.kind, self.state.info.get("defects") or ())
        if not mine:
            return spec
        return dataclasses.replace(spec, env={**spec.env, defects.ENV: ",".join(mine)})

    @property
    def socket(self) -> str:
        return str(self.state.endpoints["haproxy_socket"])

    def _set(self, replica: str, *commands: str) -> None:
        for command in commands:
            answer = self.admin(self.socket, command.format(be=serving.BACKEND, s=replica)).strip()
            if answer:  # HAProxy's runtime API is silent on success
                raise EnvError(f"HAProxy refused {command.format(be=serving.BACKEND, s=replica)!r}: "
                               f"{answer}")

    # -- scaling ----------------------------------------------------------------------------
    def scale(self, replicas: int) -> dict[str, Any]:
        """Start or stop replicas until ``replicas`` run. A new one is started and enabled in
        HAProxy behind its readiness check, and this returns without waiting for its model
        (a store that cannot be reached keeps it unready: ``watch`` says why)."""
        if not serving.replicas(self.state.components):
            raise ScaleRefused(f"environment {self.state.name!r} serves no model: {serving.HINT}")
        declared = self.declared()
        if len(declared) < serving.MAX_REPLICAS:
            raise ScaleRefused(f"environment {self.state.name!r} has no port for "
                               f"{serving.replica_names(serving.MAX_REPLICAS)[-1]} (made before "
                               "scale-up existed): `gameday env down` and `env up --serving`")
        before = self.running()
        start, stop = plan(before, replicas, declared, serving.REPLICAS)
        forced = SKIPS_READINESS in (self.state.info.get("defects") or ())
        for replica in start:
            self.state.components[replica] = self._spec(replica)
            self.state.save()
            self.processes.spawn(replica)
            if forced:  # seeded defect: in at once, no check asked
                self._set(replica, "set server {be}/{s} state ready",
                          "disable health {be}/{s}", "set server {be}/{s} weight 100")
            else:
                self._set(replica, "set server {be}/{s} weight 0", "set server {be}/{s} state ready",
                          "enable health {be}/{s}", "set server {be}/{s} health down",
                          "set server {be}/{s} weight 100")
        for replica in stop:
            self._set(replica, "set server {be}/{s} weight 0")
            time.sleep(DRAIN_S)
            self._set(replica, "set server {be}/{s} state maint", "enable health {be}/{s}")
            # its spec, for its process tree, even when this process read env.json before the
            # scale-up wrote it
            self.state.components.setdefault(replica, self._spec(replica))
            self.processes.terminate([replica], grace=5.0)
            self.state.components.pop(replica, None)
            self.state.save()
        out = {"replicas": replicas, "before": before, "after": self.running(),
               "started": start, "stopped": stop,
               "check": "none: forced up (seeded defect)" if forced and start else "readiness"}
        if start or stop:
            self.state.note("serving_scale", out)
        return out

    def watch(self, replica: str, states: list[str] | tuple[str, ...],
              timeout: float = 30.0) -> dict[str, Any]:
        """Wait (at most ``timeout`` s) until ``replica``'s running process says its model is in
        one of ``states``; note what it said last and HAProxy's view of it either way
        (``serving_replica_state``): the evidence the serving invariants read."""
        if replica not in self.declared():
            raise ScaleRefused(f"replica: {replica!r} is not one of {', '.join(self.declared())}")
        deadline = time.monotonic() + timeout
        while True:
            said = serving.model_status(self.state.dir, replica, self.processes.main_pid(replica)) or {
                "state": "stopped", "reason": "no process of the replica runs"}
            if said["state"] in states or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        try:
            row = haproxy_admin.servers(self.socket, serving.BACKEND).get(replica, {})
            lb = {"op_state": row.get("srv_op_state"), "admin_state": row.get("srv_admin_state"),
                  "check_state": row.get("srv_check_state")}
        except haproxy_admin.HaproxyAdminError as exc:
            lb = {"error": str(exc)}
        seen = {"replica": replica, "state": said["state"], "reason": said.get("reason", ""),
                "version": said.get("version"), "since": said.get("time"),
                "waited_for": list(states), "reached": said["state"] in states,
                "haproxy": lb}
        self.state.note("serving_replica_state", seen)
        return seen

    # -- the driver's undo ------------------------------------------------------------------
    def restore_all(self) -> list[str]:
        if not serving.replicas(self.state.components) or "haproxy_socket" not in self.state.endpoints:
            return []
        extra = [r for r in self.running() if r not in serving.replica_names()]
        if not extra:
            return []
        self.scale(serving.REPLICAS)
        return [f"serving_scale:{r}" for r in extra]

    def close_all(self, reason: str) -> list[str]:
        return []

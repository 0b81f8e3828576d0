"""A kernel resource limit on one component: its processes (and whatever they start later,
which inherits the group) moved into a cgroup of their own with a limit, and moved back where
they were when the fault is undone (the group removed). The shared mechanics of CPU starvation
and memory pressure (environments/local/cpu_starvation.py, memory_pressure.py): each names its
controller and what to write; this module finds the hierarchy, moves the processes and keeps
the fault timeline.

Works on cgroup v1 (one hierarchy per controller, e.g. /sys/fs/cgroup/memory) and on cgroup v2
(one unified hierarchy with the controller enabled), whichever this machine mounts; needs root.
Without either, the fault is refused with the reason, never faked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from environments.local.errors import EnvError
from environments.local.fault_ledger import FaultLedger


@dataclass(frozen=True)
class CgroupRoot:
    path: Path
    version: int  # 1: a hierarchy of the controller's own; 2: the unified hierarchy
    controller: str  # "cpu", "memory"


def find_root(controller: str, v1_marker: str, candidates: tuple[Path, ...]) -> CgroupRoot | None:
    """The first mounted hierarchy where a child group can have a ``controller`` limit:
    v1 when ``v1_marker`` (a file only that controller has) is there, v2 when the
    controller is enabled for children."""
    for path in candidates:
        if (path / v1_marker).exists():
            return CgroupRoot(path, 1, controller)
        enabled = path / "cgroup.subtree_control"
        if enabled.exists() and controller in enabled.read_text().split():
            return CgroupRoot(path, 2, controller)
    return None


def cgroup_of(pid: int, root: CgroupRoot) -> str | None:
    """The pid's group path within ``root``'s hierarchy ("/" for the root), None if gone."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (root.version == 2 and controllers == "") or \
                (root.version == 1 and root.controller in controllers.split(",")):
            return path
    return "/"


class CgroupLimit:
    """Limit one component at a time through a cgroup; each limit one ``fault`` on the
    ledger. Subclasses say what to write (``limit_files``) and may prepare a new group."""

    fault = ""
    needs = ""  # what the refusal says is missing
    group_prefix = "gameday"  # groups are named <prefix>-<environment>-<component>

    @staticmethod
    def find_root() -> CgroupRoot | None:
        """The hierarchy of this limit's controller on this machine (subclasses say which)."""
        return None

    def __init__(self, ledger: FaultLedger, pids_of: Callable[[str], list[int]], scope: str,
                 root: CgroupRoot | None = None, *,
                 find: Callable[[], CgroupRoot | None] | None = None) -> None:
        self.ledger = ledger
        self.pids_of = pids_of
        # groups named per environment: two environments on one machine never share one
        self.scope = hashlib.sha256(scope.encode()).hexdigest()[:10]
        self._root = root
        self._find = find or self.find_root

    def root(self) -> CgroupRoot:
        root = self._root or self._find()
        if root is None:
            raise EnvError(self.needs)
        self._root = root
        return root

    def group(self, component: str) -> Path:
        return self.root().path / f"{self.group_prefix}-{self.scope}-{component}"

    def prepare(self, group: Path) -> dict[str, Any]:
        """Settings of a new group before any process moves in; returns what to record."""
        return {}

    def _write(self, group: Path, files: dict[str, str]) -> None:
        for name, value in files.items():
            (group / name).write_text(value)

    def apply(self, component: str, files: dict[str, str], details: dict[str, Any]
              ) -> dict[str, Any]:
        """Limit every process of ``component``; returns once they are in the limited group.
        Again while active: the new limit applies (recorded as a change). A limit the kernel
        refuses leaves everything as it was (processes back home, no group, nothing on the
        timeline)."""
        pids = self.pids_of(component)
        if not pids:
            raise EnvError(f"{component} has no running process to limit")
        group = self.group(component)
        if self.ledger.active().get(f"{self.fault}:{component}") is not None:
            try:
                self._write(group, files)
            except OSError as exc:
                raise EnvError(f"cannot change the limit of {group}: {exc}") from exc
            line = self.ledger.change(self.fault, component, details)
            return {"target": component, **details, "time": line["time"], "changed": True}
        origins = {str(p): cgroup_of(p, self.root()) for p in pids}
        try:
            group.mkdir(exist_ok=True)
        except OSError as exc:
            raise EnvError(f"cannot create the cgroup {group}: {exc}") from exc
        try:
            details = {**details, **self.prepare(group)}
        except OSError as exc:
            self._undo(group, origins)
            raise EnvError(f"cannot set up the cgroup {group}: {exc}") from exc
        try:
            moved = self._move(pids, group / "cgroup.procs")
        except EnvError:
            self._undo(group, origins)  # nothing is recorded, so nothing may stay moved
            raise
        try:
            self._write(group, files)
        except OSError as exc:
            self._undo(group, origins)
            raise EnvError(f"cannot limit {component} ({', '.join(f'{k}={v}' for k, v in files.items())}):"
                           f" {exc.strerror or exc}{self.refused_hint(group, exc)}") from exc
        line = self.ledger.begin(self.fault, component, {**details, "group": str(group),
                                                         "origins": origins})
        return {"target": component, **details, "pids": moved, "time": line["time"]}

    def refused_hint(self, group: Path, exc: OSError) -> str:
        return ""

    def _move(self, pids: list[int], procs_file: Path) -> list[int]:
        moved = []
        for pid in pids:
            try:
                procs_file.write_text(str(pid))
                moved.append(pid)
            except ProcessLookupError:
                continue  # exited meanwhile
            except OSError as exc:
                raise EnvError(f"cannot move pid {pid} into {procs_file.parent}: {exc}") from exc
        return moved

    def _undo(self, group: Path, origins: dict[str, str | None]) -> list[int]:
        """Move the group's processes back where they came from and remove the group."""
        root = self.root()
        members = []
        try:
            members = [int(x) for x in (group / "cgroup.procs").read_text().split()]
        except OSError:
            pass
        for pid in members:  # children started under the fault go where their parent came from
            home = origins.get(str(pid)) or next(iter(origins.values()), None) or "/"
            try:
                (root.path / home.lstrip("/") / "cgroup.procs").write_text(str(pid))
            except OSError:
                try:
                    (root.path / "cgroup.procs").write_text(str(pid))
                except ProcessLookupError:
                    pass
        try:
            group.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise EnvError(f"cannot remove the cgroup {group}: {exc}") from exc
        return members

    def restore(self, component: str, reason: str | None = None) -> dict[str, Any]:
        """Move the component's processes back where they were and remove the group."""
        entry = self.ledger.active().get(f"{self.fault}:{component}")
        origins: dict[str, str | None] = entry["details"].get("origins", {}) if entry else {}
        members = self._undo(self.group(component), origins)
        details: dict[str, Any] = {"moved_back": members}
        if reason:
            details["restored_by"] = reason
        line = self.ledger.end(self.fault, component, details)
        return {"target": component, "moved_back": members,
                "time": line["time"] if line else None}

    def restore_all(self) -> list[str]:
        keys = [k for k, f in self.ledger.active().items() if f["fault"] == self.fault]
        for key in keys:
            self.restore(key.split(":", 1)[1], "restore_all")
        return keys

    def close_all(self, reason: str) -> list[str]:
        keys = [k for k, f in self.ledger.active().items() if f["fault"] == self.fault]
        for key in keys:
            try:
                self.restore(key.split(":", 1)[1], reason)
            except EnvError:  # the processes go away with the environment anyway
                self.ledger.end(self.fault, key.split(":", 1)[1], {"restored_by": reason})
        return keys

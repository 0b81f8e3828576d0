"""CPU starvation of one component: a gray fault (the process is up, answers health checks,
and is slow), made with the kernel's CPU bandwidth controller.

The component's processes (and whatever they start later, which inherits the group) are moved
into a cgroup of their own whose quota is ``share`` of one core per period; undoing the fault
moves them back where they were and removes the group. Works on the cgroup v1 ``cpu``
hierarchy (``cpu.cfs_quota_us``) and on cgroup v2 (``cpu.max``), whichever this machine
mounts with the cpu controller enabled (``find_cpu_root``); needs root. Without either, the
fault is refused with the reason, never faked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.local.errors import EnvError
from infra.local.fault_ledger import FaultLedger

FAULT = "cpu_starvation"
PERIOD_US = 100_000
MIN_SHARE = 0.01  # 1 ms per 100 ms period: the kernel refuses quotas under 1 ms
CGROUP_MOUNTS = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct"),
                 Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


@dataclass(frozen=True)
class CpuRoot:
    path: Path
    version: int  # 1: cpu.cfs_quota_us; 2: cpu.max

    def limit_files(self, share: float) -> dict[str, str]:
        """What to write into a new group for ``share`` of one core (pure)."""
        quota = quota_us(share)
        if self.version == 1:
            return {"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": str(quota)}
        return {"cpu.max": f"{quota} {PERIOD_US}"}


def quota_us(share: float) -> int:
    """Microseconds of CPU per period for ``share`` of one core."""
    if not MIN_SHARE <= share <= 1.0:
        raise EnvError(f"share: must be between {MIN_SHARE} and 1 (of one core), got {share}")
    return round(share * PERIOD_US)


def find_cpu_root(candidates: tuple[Path, ...] = CGROUP_MOUNTS) -> CpuRoot | None:
    """The first mounted hierarchy where a child group can have a CPU limit."""
    for path in candidates:
        if (path / "cpu.cfs_quota_us").exists():
            return CpuRoot(path, 1)
        controllers = path / "cgroup.subtree_control"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            return CpuRoot(path, 2)
    return None


def _cgroup_of(pid: int, root: CpuRoot) -> str | None:
    """The pid's group path within ``root``'s hierarchy ("/" for the root), None if gone."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (root.version == 2 and controllers == "") or \
                (root.version == 1 and "cpu" in controllers.split(",")):
            return path
    return "/"


class CpuStarvation:
    """Starve a component of CPU; each starvation one ``cpu_starvation`` fault on the ledger."""

    def __init__(self, ledger: FaultLedger, pids_of: Callable[[str], list[int]], scope: str,
                 root: CpuRoot | None = None, *, find: Callable[[], CpuRoot | None] = find_cpu_root
                 ) -> None:
        self.ledger = ledger
        self.pids_of = pids_of
        # groups named per environment: two environments on one machine never share one
        self.scope = hashlib.sha256(scope.encode()).hexdigest()[:10]
        self._root = root
        self._find = find

    def root(self) -> CpuRoot:
        root = self._root or self._find()
        if root is None:
            raise EnvError("CPU starvation needs a cgroup hierarchy with the cpu controller "
                           f"(looked in {', '.join(str(p) for p in CGROUP_MOUNTS)}) and root")
        self._root = root
        return root

    def group(self, component: str) -> Path:
        return self.root().path / f"gameday-{self.scope}-{component}"

    def starve(self, component: str, share: float) -> dict[str, Any]:
        """Limit every process of ``component`` to ``share`` of one core; returns once the
        processes are in the limited group. Again while active: the new share applies."""
        limits = self.root().limit_files(share)
        pids = self.pids_of(component)
        if not pids:
            raise EnvError(f"{component} has no running process to starve")
        group = self.group(component)
        active = self.ledger.active().get(f"{FAULT}:{component}")
        try:
            group.mkdir(exist_ok=True)
            for name, value in limits.items():
                (group / name).write_text(value)
        except OSError as exc:
            raise EnvError(f"cannot create or limit the cgroup {group}: {exc}") from exc
        if active is not None:
            line = self.ledger.change(FAULT, component, {"share": share})
            return {"target": component, "share": share, "time": line["time"], "changed": True}
        origins = {str(p): _cgroup_of(p, self.root()) for p in pids}
        line = self.ledger.begin(FAULT, component, {"share": share, "group": str(group),
                                                    "origins": origins})
        moved = self._move(pids, group / "cgroup.procs")
        return {"target": component, "share": share, "pids": moved, "time": line["time"]}

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

    def restore(self, component: str, reason: str | None = None) -> dict[str, Any]:
        """Move the component's processes back where they were and remove the group."""
        entry = self.ledger.active().get(f"{FAULT}:{component}")
        group = self.group(component)
        origins: dict[str, str | None] = entry["details"].get("origins", {}) if entry else {}
        root = self.root()
        members = []
        try:
            members = [int(x) for x in (group / "cgroup.procs").read_text().split()]
        except OSError:
            pass
        for pid in members:  # children started under the fault go where their parent came from
            home = origins.get(str(pid)) or next(iter(origins.values()), None) or "/"
            target = root.path / home.lstrip("/")
            try:
                (target / "cgroup.procs").write_text(str(pid))
            except OSError:
                (root.path / "cgroup.procs").write_text(str(pid))
        try:
            group.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise EnvError(f"cannot remove the cgroup {group}: {exc}") from exc
        details: dict[str, Any] = {"moved_back": members}
        if reason:
            details["restored_by"] = reason
        line = self.ledger.end(FAULT, component, details)
        return {"target": component, "moved_back": members,
                "time": line["time"] if line else None}

    def restore_all(self) -> list[str]:
        keys = [k for k, f in self.ledger.active().items() if f["fault"] == FAULT]
        for key in keys:
            self.restore(key.split(":", 1)[1], "restore_all")
        return keys

    def close_all(self, reason: str) -> list[str]:
        keys = [k for k, f in self.ledger.active().items() if f["fault"] == FAULT]
        for key in keys:
            try:
                self.restore(key.split(":", 1)[1], reason)
            except EnvError:  # the processes go away with the environment anyway
                self.ledger.end(FAULT, key.split(":", 1)[1], {"restored_by": reason})
        return keys

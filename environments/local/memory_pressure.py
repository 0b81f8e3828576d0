"""Memory pressure on one component: its processes get at most ``limit_mib`` of memory, so the
kernel reclaims their page cache, and an allocation beyond the limit ends in the out-of-memory
killer inside the group (the component dies as it would in a container at its memory limit;
the supervisor's restart or failover is what the platform is judged on).

cgroup v1 (this machine: the ``memory`` hierarchy) sets ``memory.limit_in_bytes`` after the
processes moved in. Where the kernel still moves their charges along
(``memory.move_charge_at_immigrate``) what they already use counts, and a limit below what it
cannot reclaim (anonymous memory, no swap) is refused (EBUSY): the fault is refused, nothing
changed. Kernel 6.x removed that knob (this machine runs 6.18): there what the processes held
before stays charged to their old group and the limit bounds what they allocate from now on
(recorded as ``charges_moved: false`` on the timeline).
cgroup v2 sets ``memory.max`` (the same hard limit; above it the kernel reclaims, then kills).
Needs root; without a memory hierarchy the fault is refused with the reason, never faked.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

from environments.local.cgroup_limit import CgroupLimit, CgroupRoot, find_root
from environments.local.errors import EnvError

FAULT = "memory_pressure"
MIB = 1024 * 1024
MIN_LIMIT_MIB = 8  # below this a Python process cannot even start a thread
MAX_LIMIT_MIB = 1024 * 1024
CGROUP_MOUNTS = (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/unified"),
                 Path("/sys/fs/cgroup"))


def limit_bytes(limit_mib: float) -> int:
    if isinstance(limit_mib, bool) or not MIN_LIMIT_MIB <= limit_mib <= MAX_LIMIT_MIB:
        raise EnvError(f"limit_mib: must be between {MIN_LIMIT_MIB} and {MAX_LIMIT_MIB} MiB, "
                       f"got {limit_mib!r}")
    return int(limit_mib * MIB)


def limit_files(root: CgroupRoot, limit_mib: float) -> dict[str, str]:
    """What to write into the group for a limit of ``limit_mib`` (pure)."""
    value = str(limit_bytes(limit_mib))
    return {"memory.limit_in_bytes": value} if root.version == 1 else {"memory.max": value}


def find_memory_root(candidates: tuple[Path, ...] = CGROUP_MOUNTS) -> CgroupRoot | None:
    return find_root("memory", "memory.limit_in_bytes", candidates)


def usage_mib(group: Path, version: int) -> float | None:
    name = "memory.usage_in_bytes" if version == 1 else "memory.current"
    try:
        return int((group / name).read_text()) / MIB
    except (OSError, ValueError):
        return None


class MemoryPressure(CgroupLimit):
    """Squeeze a component's memory; each squeeze one ``memory_pressure`` fault on the ledger."""

    fault = FAULT
    needs = ("memory pressure needs a cgroup hierarchy with the memory controller "
             f"(looked in {', '.join(str(p) for p in CGROUP_MOUNTS)}) and root")

    group_prefix = "gameday-memory"
    find_root = staticmethod(find_memory_root)

    def prepare(self, group: Path) -> dict[str, Any]:
        if self.root().version != 1:
            return {}
        # charges (anonymous 1, file 2) move with the process, so what it uses counts; kernels
        # from 6.x removed the knob (EINVAL): then only what it allocates from now on counts
        try:
            (group / "memory.move_charge_at_immigrate").write_text("3")
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            return {"charges_moved": False}
        return {"charges_moved": True}

    def refused_hint(self, group: Path, exc: OSError) -> str:
        if exc.errno == errno.EBUSY:
            return (": the kernel could not reclaim enough of what the component already uses"
                    " (anonymous memory and no swap); choose a limit above its resident memory")
        return ""

    def squeeze(self, component: str, limit_mib: float) -> dict[str, Any]:
        """Limit every process of ``component`` to ``limit_mib`` of memory in all; returns
        once the limit is in effect. Again while active: the new limit applies."""
        files = limit_files(self.root(), limit_mib)
        result = self.apply(component, files, {"limit_mib": limit_mib})
        used = usage_mib(self.group(component), self.root().version)
        if used is not None:
            result["usage_mib"] = round(used, 1)
        return result

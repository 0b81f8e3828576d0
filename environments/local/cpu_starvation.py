"""CPU starvation of one component: a gray fault (the process is up, answers health checks,
and is slow), made with the kernel's CPU bandwidth controller.

The component's processes go into a cgroup of their own whose quota is ``share`` of one core
per period (environments/local/cgroup_limit.py moves them and back). The cgroup v1 ``cpu`` hierarchy
(``cpu.cfs_quota_us``) or cgroup v2 (``cpu.max``), whichever this machine mounts with the cpu
controller enabled; needs root. Without either, the fault is refused with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from environments.local.cgroup_limit import CgroupLimit, CgroupRoot, find_root
from environments.local.errors import EnvError

FAULT = "cpu_starvation"
PERIOD_US = 100_000
MIN_SHARE = 0.01  # 1 ms per 100 ms period: the kernel refuses quotas under 1 ms
CGROUP_MOUNTS = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct"),
                 Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


def limit_files(root: CgroupRoot, share: float) -> dict[str, str]:
    """What to write into the group for ``share`` of one core (pure)."""
    quota = quota_us(share)
    if root.version == 1:
        return {"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": str(quota)}
    return {"cpu.max": f"{quota} {PERIOD_US}"}


def quota_us(share: float) -> int:
    """Microseconds of CPU per period for ``share`` of one core."""
    if not MIN_SHARE <= share <= 1.0:
        raise EnvError(f"share: must be between {MIN_SHARE} and 1 (of one core), got {share}")
    return round(share * PERIOD_US)


def find_cpu_root(candidates: tuple[Path, ...] = CGROUP_MOUNTS) -> CgroupRoot | None:
    """The first mounted hierarchy where a child group can have a CPU limit."""
    return find_root("cpu", "cpu.cfs_quota_us", candidates)


class CpuStarvation(CgroupLimit):
    """Starve a component of CPU; each starvation one ``cpu_starvation`` fault on the ledger."""

    fault = FAULT
    needs = ("CPU starvation needs a cgroup hierarchy with the cpu controller "
             f"(looked in {', '.join(str(p) for p in CGROUP_MOUNTS)}) and root")

    find_root = staticmethod(find_cpu_root)

    def starve(self, component: str, share: float) -> dict[str, Any]:
        """Limit every process of ``component`` to ``share`` of one core; returns once the
        processes are in the limited group. Again while active: the new share applies."""
        return self.apply(component, limit_files(self.root(), share), {"share": share})

"""A node's own disk in the local environment, opt-in with the storage layer (`gameday env up
--storage-faults`): the checkpoint directory of one agent (``NODE``) on a faultfs mount of its
own (docs/faultfs.md), so that the agent's host can lose power: every write its workloads did
not fsync is dropped (environments/local/power_loss.py).

The agent's workloads find the directory in ``CONTROLPLANE_CHECKPOINT_DIR``
(controlplane/workload/local.py). In its home ``<state>/agents/<agent>/``:

* ``checkpoints/`` the mount point (the workloads' checkpoint directory);
* ``checkpoints.backing/`` the real files, beside it: what survives a power loss.

The faultfs process is a component of its own (``node-disk-<agent>``, kind ``node-disk``),
started and healthy (mounted) with the infrastructure, long before its agent. ``NODE`` is
``cpu-2``: the only CPU agent of region-2, so work placed in region-2 comes back to the same
node after a restart (the only case in which a node-local copy can be used at all).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from environments.local.spec import ComponentSpec, Group, HealthCheck

KIND = "node-disk"
NODE = "cpu-2"
ENV = "CONTROLPLANE_CHECKPOINT_DIR"  # controlplane/workload/local.py reads it


def name_of(agent: str) -> str:
    return f"node-disk-{agent}"


def port_names(enabled: bool, agents: tuple[str, ...]) -> list[str]:
    return ["node_disk_control"] if enabled and NODE in agents else []


def home(state: Path, agent: str) -> Path:
    return state / "agents" / agent


def component(state: Path, agent: str, port: int) -> ComponentSpec:
    """The faultfs process holding ``agent``'s checkpoint directory (directories made here)."""
    mount, backing = home(state, agent) / "checkpoints", home(state, agent) / "checkpoints.backing"
    for d in (mount, backing):
        d.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}"
    return ComponentSpec(
        name=name_of(agent), kind=KIND, group=Group.INFRA,
        argv=[sys.executable, "-m", "environments.local.faultfs", "--source", str(backing),
              "--mount", str(mount), "--control-port", str(port)],
        # the control API answers only once the mount is up (environments/local/faultfs/mount.py)
        health=HealthCheck(f"{url}/healthz", body_contains='"ok"'),
        ports={"control": port},
        labels={"agent": agent, "mount": str(mount), "source": str(backing), "control_url": url},
    )


def attach(specs: dict[str, ComponentSpec], state: Path, ports: Mapping[str, int]) -> None:
    """Add the node disk of ``NODE`` (when that agent runs) and point the agent at it."""
    agent = specs.get(NODE)
    if agent is None or agent.kind != "agent":
        return
    disk = component(state, NODE, ports["node_disk_control"])
    specs[disk.name] = disk
    agent.env[ENV] = disk.labels["mount"]


def node_disks(components: Mapping[str, ComponentSpec]) -> dict[str, ComponentSpec]:
    """agent -> its node disk, for the environment's components."""
    return {c.labels["agent"]: c for c in components.values() if c.kind == KIND}

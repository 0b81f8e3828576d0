"""Power loss of an agent's host, as a fault component: the agent with its workloads SIGKILLed,
then every write on the node's disk (environments/local/node_disk.py) that was not fsynced dropped
(faultfs ``crash``, LazyFS's model, docs/faultfs.md), then the agent started again on the same
disk: the power is back. One fault on the timeline (``power_loss``, target the agent): its
start names what was unsynced when the power went, its end carries faultfs's crash report
(``dropped_bytes``, ``dropped_files``: the loss, visible in the evidence) and how long the
agent took to come back.

The order is the one a real power loss gives (docs/faultfs.md, "How to crash"): no process
may write (and fsync) after the crash, so every process using the disk is gone first.
Timed, optionally, inside a checkpoint write of one operation (``during_write_of``): when a
slot of that operation's checkpoint directory claims at least ``min_step`` and what readers of
the mount see of it differs from the backing directory (some of its bytes are not durable yet:
the write is under way), so that the loss meets a checkpoint whose bytes are only partly
durable; whether it did is in the answer (``landed_in_write``), read from the crash report.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from environments.local.errors import EnvError, NotRunning, UnknownTarget
from environments.local.fault_ledger import FaultLedger
from environments.local.faultfs.client import FaultFsClient
from environments.local.faultfs.errors import ControlUnreachable, FaultFsError
from environments.local.node_disk import KIND, NODE
from environments.local.spec import ComponentSpec

FAULT = "power_loss"
NO_LAYER = ("no agent of this environment has a node disk: start it with "
            "`gameday env up --storage-faults`")


def claimed_step(slot_dir: Path) -> int | None:
    """The step a checkpoint slot's state.json claims, as readers of the mount see it now."""
    try:
        return int(json.loads((slot_dir / "state.json").read_bytes())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def write_under_way(op_mount: Path, op_backing: Path, min_step: int) -> int | None:
    """The step of a slot of one operation that claims at least ``min_step`` (as readers of the
    mount see it) and whose files differ from the backing directory's (not all durable yet);
    None when there is none."""
    for slot in sorted(op_mount.glob("slot-*")):
        step = claimed_step(slot)
        if step is None or step < min_step:
            continue
        try:
            names = sorted(p.name for p in slot.iterdir())
        except OSError:
            continue
        if any(_bytes(slot / n) != _bytes(op_backing / slot.name / n) for n in names):
            return step
    return None


def dropped_under(report: Mapping[str, Any], prefix: str) -> list[str]:
    """Paths of the crash report's dropped and removed files under ``prefix`` (pure)."""
    paths = [str(f.get("path", "")) for f in report.get("dropped_files", [])
             if isinstance(f, dict)]
    paths += [str(p.get("path", p) if isinstance(p, dict) else p)
              for p in report.get("removed_files", [])]
    clean = prefix.strip("/") + "/"
    return sorted({p for p in paths if p.lstrip("/").startswith(clean)})


class PowerLoss:
    def __init__(self, disks: Mapping[str, ComponentSpec], ledger: FaultLedger,
                 power_off: Callable[[str], list[int]], power_on: Callable[[str], Any],
                 *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.disks = dict(disks)  # agent -> its node disk component
        self.ledger = ledger
        self.power_off = power_off  # SIGKILL the agent's whole tree, return once gone
        self.power_on = power_on  # start the agent as `up` did, return once healthy
        self.sleep = sleep

    @classmethod
    def for_components(cls, components: Mapping[str, ComponentSpec], ledger: FaultLedger,
                       power_off: Callable[[str], list[int]],
                       power_on: Callable[[str], Any]) -> PowerLoss:
        disks = {c.labels["agent"]: c for c in components.values() if c.kind == KIND}
        return cls(disks, ledger, power_off, power_on)

    def _disk(self, agent: str) -> ComponentSpec:
        if not self.disks:
            raise NotRunning(NO_LAYER)
        if agent not in self.disks:
            raise UnknownTarget(f"{agent!r} has no node disk; agents with one: "
                                f"{', '.join(sorted(self.disks))}")
        return self.disks[agent]

    @staticmethod
    def _client(disk: ComponentSpec) -> FaultFsClient:
        return FaultFsClient(disk.labels["control_url"], timeout=10.0)

    def _wait_for_write(self, disk: ComponentSpec, operation_id: str, min_step: int,
                        timeout: float) -> int:
        op_mount = Path(disk.labels["mount"]) / operation_id
        op_backing = Path(disk.labels["source"]) / operation_id
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            step = write_under_way(op_mount, op_backing, min_step)
            if step is not None:
                return step
            self.sleep(0.05)
        raise EnvError(f"no checkpoint write of {operation_id} at step >= {min_step} on "
                       f"{disk.name} within {timeout:g} s")

    def cut(self, agent: str = NODE, *, during_write_of: str | None = None, min_step: int = 0,
            settle: float = 0.5, timeout: float = 60.0) -> dict[str, Any]:
        """Power loss of ``agent``'s host, then power back (see the module's docstring)."""
        disk = self._disk(agent)
        client = self._client(disk)
        try:
            writing = (self._wait_for_write(disk, during_write_of, min_step, timeout)
                       if during_write_of else None)
            if writing is not None and settle > 0:
                self.sleep(settle)  # the write's first files are durable by now, its last not
            before = client.state()
        except ControlUnreachable as exc:
            raise NotRunning(str(exc)) from None
        details = {"agent": agent, "disk": disk.name, "mount": disk.labels["mount"],
                   "unsynced_bytes": before.get("unsynced_bytes"),
                   "unsynced_files": before.get("unsynced_files"),
                   **({"operation_id": during_write_of, "checkpoint_step": writing}
                      if during_write_of else {})}
        line = self.ledger.begin(FAULT, agent, details)
        started = time.monotonic()
        pids = self.power_off(agent)
        try:
            report = client.crash()
        except FaultFsError as exc:  # the power comes back all the same
            self.power_on(agent)
            self.ledger.end(FAULT, agent, {"error": f"crash refused: {exc}", "pids": pids})
            raise EnvError(f"{disk.name}: crash refused: {exc}") from None
        self.power_on(agent)
        landed = dropped_under(report, during_write_of) if during_write_of else []
        end = {"crash": report, "pids": pids,
               "recovered_seconds": round(time.monotonic() - started, 3),
               **({"dropped_checkpoint_files": landed} if during_write_of else {})}
        self.ledger.end(FAULT, agent, end)
        return {"target": agent, "time": line["time"], "pids": pids, "crash": report,
                "checkpoint_step": writing, "landed_in_write": bool(landed),
                "dropped_checkpoint_files": landed}

    # -- undo -------------------------------------------------------------------------------
    def _active(self) -> list[str]:
        return [e["target"] for e in self.ledger.active().values() if e["fault"] == FAULT]

    def restore_all(self) -> list[str]:
        """A power loss left half-way (its action crashed): the agent started again."""
        out = []
        for agent in self._active():
            self.power_on(agent)
            self.ledger.end(FAULT, agent, {"restored_by": "restore_all"})
            out.append(f"{FAULT}:{agent}")
        return out

    def close_all(self, reason: str) -> list[str]:
        out = []
        for agent in self._active():
            self.ledger.end(FAULT, agent, {"restored_by": reason})
            out.append(f"{FAULT}:{agent}")
        return out

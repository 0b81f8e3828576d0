"""What is broken right now and since when: the fault timeline plus the set of active faults.

One small part that every fault-injecting component of the local environment shares (the
process faults of ``FaultInjector``, the proxy's toxics, the S3 brownout, the storage layer),
so that none of them reaches into another to record a fault. ``begin`` / ``end`` write the
``fault_start`` / ``fault_end`` lines of the fault timeline (docs/CONTRACTS.md section 4) and
keep ``faults_active.json`` in step; ``change`` records a change of a fault that stays active
(a run-time parameter change) as a ``note`` line, the only other event the evidence format has.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from environments.timeline import Timeline


class FaultLedger:
    def __init__(self, timeline_file: Path, active_file: Path) -> None:
        self.timeline = Timeline(timeline_file)
        self.active_file = active_file

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # Several processes inject faults into one environment (the runner, each experiment's
        # Chaos Toolkit process): read-modify-write of the active set under one lock.
        self.active_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.active_file.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def active(self) -> dict[str, dict[str, Any]]:
        try:
            return json.loads(self.active_file.read_text())
        except FileNotFoundError:
            return {}

    def is_active(self, fault: str, target: str) -> bool:
        return f"{fault}:{target}" in self.active()

    def begin(self, fault: str, target: str, details: dict[str, Any]) -> dict[str, Any]:
        """Record that ``fault`` on ``target`` is in effect from now."""
        with self._locked():
            active = self.active()
            line = self.timeline.record("fault_start", fault, target, details)
            active[f"{fault}:{target}"] = {"fault": fault, "target": target,
                                           "since": line["time"], "details": details}
            self._write(active)
        return line

    def change(self, fault: str, target: str, details: dict[str, Any]) -> dict[str, Any]:
        """Record a new setting of an active fault (the fault goes on: no start, no end)."""
        with self._locked():
            active = self.active()
            entry = active.get(f"{fault}:{target}")
            if entry is None:
                raise KeyError(f"{fault}:{target} is not active")
            line = self.timeline.record("note", fault, target, {"changed": True, **details})
            entry["details"] = {**entry["details"], **details}
            self._write(active)
        return line

    def end(self, fault: str, target: str, details: dict[str, Any]) -> dict[str, Any] | None:
        """Record that the fault is over; None when it was not active (nothing recorded)."""
        with self._locked():
            active = self.active()
            if active.pop(f"{fault}:{target}", None) is None:
                return None
            line = self.timeline.record("fault_end", fault, target, details)
            self._write(active)
        return line

    def _write(self, active: dict[str, dict[str, Any]]) -> None:
        tmp = self.active_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(active, indent=2))
        tmp.replace(self.active_file)  # a reader never sees half a file

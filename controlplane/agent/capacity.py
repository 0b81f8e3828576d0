"""Per-agent capacity: CPU slots and (simulated) accelerator slots, reserved per attempt."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Demand:
    cpu: int
    accelerator_type: str | None = None
    accelerator_count: int = 0


class Capacity:
    """Thread-safe ledger: an attempt runs only while it holds a reservation."""

    def __init__(self, cpu_slots: int, accelerator_type: str | None = None,
                 accelerator_count: int = 0) -> None:
        if cpu_slots < 1:
            raise ValueError(f"cpu_slots must be >= 1, got {cpu_slots}")
        if accelerator_count < 0:
            raise ValueError(f"accelerator_count must be >= 0, got {accelerator_count}")
        self.cpu_slots = cpu_slots
        self.accelerator_type = accelerator_type
        self.accelerator_count = accelerator_count if accelerator_type else 0
        self._held: dict[str, Demand] = {}
        self._lock = threading.Lock()
        self._on_release: list[Callable[[], None]] = []

    def on_release(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (outside the lock) whenever a reservation is released."""
        self._on_release.append(callback)

    def _used(self) -> tuple[int, int]:
        return (sum(d.cpu for d in self._held.values()),
                sum(d.accelerator_count for d in self._held.values()))

    def free(self) -> tuple[int, int]:
        """(free cpu slots, free accelerator slots)."""
        with self._lock:
            cpu, acc = self._used()
            return self.cpu_slots - cpu, self.accelerator_count - acc

    def why_not(self, demand: Demand) -> str | None:
        """None when the demand fits now, else the reason it does not."""
        with self._lock:
            return self._why_not(demand)

    def _why_not(self, demand: Demand) -> str | None:
        cpu, acc = self._used()
        if demand.cpu > self.cpu_slots - cpu:
            return f"needs {demand.cpu} cpu slots, {self.cpu_slots - cpu} free of {self.cpu_slots}"
        if demand.accelerator_count:
            if demand.accelerator_type != self.accelerator_type:
                return (f"needs accelerator {demand.accelerator_type!r}, agent has "
                        f"{self.accelerator_type!r}")
            if demand.accelerator_count > self.accelerator_count - acc:
                return (f"needs {demand.accelerator_count} accelerators, "
                        f"{self.accelerator_count - acc} free of {self.accelerator_count}")
        return None

    def reserve(self, attempt_id: str, demand: Demand) -> str | None:
        """Reserve for the attempt; returns None on success or the reason it does not fit."""
        with self._lock:
            if attempt_id in self._held:
                return None
            reason = self._why_not(demand)
            if reason is None:
                self._held[attempt_id] = demand
            return reason

    def release(self, attempt_id: str) -> None:
        with self._lock:
            released = self._held.pop(attempt_id, None) is not None
        if released:
            for callback in self._on_release:
                callback()

    def held(self) -> dict[str, Demand]:
        with self._lock:
            return dict(self._held)

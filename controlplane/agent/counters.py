"""How many events this agent dropped or had refused, kept on disk so a restart keeps counting.

``counters.json`` in the spool directory holds the running totals (mirrored into the agent's
Prometheus counters, which start from them after a restart) and the drops not yet announced to
the control plane by an ``evidence_dropped`` event. It is rewritten atomically on every change;
a drop is counted *before* the events are removed, so a crash can over-count a loss but never
hide one.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from controlplane import clock
from controlplane.agent.metrics import AgentMetrics

log = logging.getLogger(__name__)
DROP_REASONS = ("spool_full", "expired", "unreadable")
COUNTERS_FILE = "counters.json"


class EvidenceCounters:
    def __init__(self, directory: Path, metrics: AgentMetrics) -> None:
        self.path = directory / COUNTERS_FILE
        self.metrics = metrics
        self._lock = threading.Lock()
        self.dropped = dict.fromkeys(DROP_REASONS, 0)
        self.refused = 0
        self.unreported = dict.fromkeys(DROP_REASONS, 0)
        # An attempt whose events were dropped: where the agent-level endpoint records the drop.
        self.related_attempt: str | None = None
        self._load()
        for reason in DROP_REASONS:  # every series exists from the start, at its persisted total
            metrics.events_dropped.labels(reason).inc(self.dropped[reason])
        metrics.events_refused.inc(self.refused)

    def drop(self, reason: str, count: int, attempt_id: str | None) -> None:
        if reason not in DROP_REASONS:
            raise ValueError(f"unknown drop reason {reason!r}; expected one of {DROP_REASONS}")
        if count <= 0:
            return
        with self._lock:
            self.dropped[reason] += count
            self.unreported[reason] += count
            if attempt_id:
                self.related_attempt = attempt_id
            self._save()
        self.metrics.events_dropped.labels(reason).inc(count)
        log.error("dropped %d undelivered events (%s)", count, reason)

    def refuse(self, count: int) -> None:
        if count <= 0:
            return
        with self._lock:
            self.refused += count
            self._save()
        self.metrics.events_refused.inc(count)

    def pending_report(self) -> dict[str, int]:
        """Drops not yet announced to the control plane, by reason."""
        with self._lock:
            return {r: n for r, n in self.unreported.items() if n > 0}

    def reported(self, counts: dict[str, int]) -> None:
        with self._lock:
            for reason, n in counts.items():
                self.unreported[reason] = max(0, self.unreported[reason] - n)
            self._save()

    def forget_related_attempt(self) -> None:
        with self._lock:
            self.related_attempt = None
            self._save()

    def _load(self) -> None:
        if not self.path.exists():
            return
        try:
            doc = json.loads(self.path.read_text())
            dropped = {r: int(doc.get("dropped", {}).get(r, 0)) for r in DROP_REASONS}
            unreported = {r: int(doc.get("unreported", {}).get(r, 0)) for r in DROP_REASONS}
            refused = int(doc.get("refused", 0))
            related = doc.get("related_attempt")
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            # Keep the bad file for a human; counting restarts at zero, and says so.
            aside = self.path.with_name(f"{COUNTERS_FILE}.unreadable-{int(clock.wall())}")
            os.replace(self.path, aside)
            log.error("%s: unreadable (%s); moved to %s, counting restarts at 0",
                      self.path, exc, aside.name)
            return
        self.dropped, self.unreported, self.refused = dropped, unreported, refused
        self.related_attempt = str(related) if related else None

    def _save(self) -> None:
        doc: dict[str, Any] = {"dropped": self.dropped, "refused": self.refused,
                               "unreported": self.unreported,
                               "related_attempt": self.related_attempt}
        write_atomic(self.path, json.dumps(doc, sort_keys=True).encode())


def write_atomic(path: Path, data: bytes) -> None:
    """Write, fsync, rename: readers see the old or the new content, never a torn one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

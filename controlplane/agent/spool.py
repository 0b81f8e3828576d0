"""The agent's on-disk spool of workload events not delivered yet: nothing is dropped silently.

Layout of the spool directory (one agent process at a time, enforced by a lock file)::

    .lock                       flock held by the agent process that owns the spool
    counters.json               drop/refusal totals (see counters.py)
    segments/<attempt_id>.jsonl one line per event: seq, time, attempt_id, operation_id,
                                fencing_token, event; append-only, fsync'ed per batch
    segments/<attempt_id>.pos   highest seq of that segment already consumed (delivered,
                                refused or dropped), written atomically after each consumption

``seq`` grows across the whole spool, so "oldest" means the same thing across attempts. The
bound ``max_bytes`` counts the bytes of events not consumed yet; only when an append would
exceed it are the oldest events consumed as dropped (``spool_full``), counted first. Consumed
prefixes are reclaimed by deleting a finished segment, or by rewriting its tail once the prefix
is at least as large as the tail (amortised: each byte is copied at most once more), so the disk
holds at most about twice the bound. Delivery is at least once: a crash between a delivery and
its ``.pos`` update sends those events again.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.agent.counters import EvidenceCounters, fsync_dir, write_atomic
from controlplane.agent.metrics import AgentMetrics

log = logging.getLogger(__name__)
SEGMENTS = "segments"
LOCK_FILE = ".lock"
COMPACT_MIN_BYTES = 64 * 1024  # below this a consumed prefix is not worth a rewrite


class SpoolBusy(Exception):
    """Another process holds the spool directory (two agents must never share one)."""


@dataclass(frozen=True)
class ClaimKey:
    """The claim whose events a segment holds: delivered with this fencing token only."""

    attempt_id: str
    operation_id: str
    fencing_token: int


@dataclass
class Batch:
    """The oldest unconsumed events of one segment, read for delivery."""

    key: ClaimKey
    start: int  # byte offsets of the lines read
    end: int
    events: list[dict[str, Any]]
    lines: int  # lines consumed when acknowledged (events + unreadable ones)
    unreadable: int
    last_seq: int


@dataclass
class _Segment:
    key: ClaimKey
    path: Path
    cursor: int = 0  # byte offset of the first unconsumed line
    size: int = 0
    pending: int = 0  # unconsumed lines
    head_seq: int = 0  # seq of the line at the cursor (when pending > 0)
    consumed_seq: int = -1
    last_time: float = 0.0  # wall time of the newest line: the segment's age
    in_flight: bool = False  # a batch of it is being delivered: byte offsets must not move

    @property
    def pos_path(self) -> Path:
        return self.path.with_suffix(".pos")

    @property
    def pending_bytes(self) -> int:
        return self.size - self.cursor


class Spool:
    def __init__(self, directory: Path, *, max_bytes: int, max_age_seconds: float,
                 metrics: AgentMetrics, clock: Callable[[], float] = time.time) -> None:
        if max_bytes < 1024:
            raise ValueError(f"spool max_bytes must be at least 1024, got {max_bytes}")
        self.directory = directory
        self.max_bytes = max_bytes
        self.max_age_seconds = max_age_seconds
        self.metrics = metrics
        self.clock = clock
        self._segdir = directory / SEGMENTS
        self._segdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock_fd = _lock(directory / LOCK_FILE)
        self._lock = threading.RLock()
        self._segments: dict[str, _Segment] = {}
        self._owned: dict[str, ClaimKey] = {}
        self._seq = 0
        self.counters = EvidenceCounters(directory, metrics)
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    # --- who delivers what -------------------------------------------------------------------

    def own(self, key: ClaimKey) -> None:
        """A live runner delivers this claim's events itself; the flusher leaves them alone."""
        with self._lock:
            self._owned[key.attempt_id] = key

    def disown(self, attempt_id: str) -> None:
        with self._lock:
            self._owned.pop(attempt_id, None)

    def owned(self) -> list[ClaimKey]:
        with self._lock:
            return list(self._owned.values())

    def orphans(self) -> list[ClaimKey]:
        """Segments no live runner owns, oldest first: the flusher's work."""
        with self._lock:
            segs = [s for s in self._segments.values()
                    if s.pending and s.key.attempt_id not in self._owned]
            return [s.key for s in sorted(segs, key=lambda s: s.head_seq)]

    def has_pending(self, attempt_id: str) -> bool:
        with self._lock:
            seg = self._segments.get(attempt_id)
            return seg is not None and seg.pending > 0

    def pending_events(self) -> int:
        with self._lock:
            return sum(s.pending for s in self._segments.values())

    def pending_bytes(self) -> int:
        with self._lock:
            return sum(s.pending_bytes for s in self._segments.values())

    # --- write --------------------------------------------------------------------------------

    def append(self, key: ClaimKey, events: list[dict[str, Any]]) -> None:
        """Persist events (flush + fsync) after the claim's older ones; make room if needed."""
        if not events:
            return
        with self._lock:
            now = self.clock()
            lines = []
            for event in events:
                self._seq += 1
                lines.append(_encode(self._seq, now, key, event))
            first_kept = _newest_that_fit(lines, self.max_bytes)
            if first_kept:  # one batch larger than the whole bound: its oldest go first
                self.counters.drop("spool_full", first_kept, key.attempt_id)
                lines = lines[first_kept:]
            data = b"".join(lines)
            self._make_room(len(data))
            seg = self._segments.get(key.attempt_id)
            if seg is None:
                seg = _Segment(key, self._segdir / f"{key.attempt_id}.jsonl")
                self._segments[key.attempt_id] = seg
            try:
                with open(seg.path, "ab") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                if seg.size == 0:
                    fsync_dir(self._segdir)
            except OSError as exc:
                # A spool that cannot be written is a full one: count the loss, do not hide it.
                log.error("spool %s: cannot write %d events: %s", seg.path, len(lines), exc)
                _truncate_quietly(seg.path, seg.size)
                self.counters.drop("spool_full", len(lines), key.attempt_id)
                if seg.size == 0:
                    del self._segments[key.attempt_id]
                return
            if seg.pending == 0:
                seg.head_seq = json.loads(lines[0])["seq"]
            seg.size += len(data)
            seg.pending += len(lines)
            seg.last_time = now
            self.metrics.events_spooled.inc(len(lines))

    def _make_room(self, need: int) -> None:
        """Consume the oldest events as dropped until ``need`` more bytes fit in the bound."""
        excess = self.pending_bytes() + need - self.max_bytes
        while excess > 0:
            # A batch being delivered is left alone (it is about to be consumed anyway).
            candidates = sorted((s for s in self._segments.values() if s.pending and not s.in_flight),
                                key=lambda s: s.head_seq)
            if not candidates:
                return
            seg = candidates[0]
            stop_at = candidates[1].head_seq if len(candidates) > 1 else None
            batch = self._read(seg, limit=None, max_bytes=excess, stop_at_seq=stop_at)
            if batch.lines == 0:  # the file is shorter than we thought: nothing left to read
                log.error("spool segment %s: %d events missing from the file", seg.path,
                          seg.pending)
                self.counters.drop("unreadable", seg.pending, seg.key.attempt_id)
                self._delete(seg)
                continue
            self.counters.drop("spool_full", batch.lines, seg.key.attempt_id)  # count first
            self._consume(seg, batch)
            excess -= batch.end - batch.start

    # --- read and consume ---------------------------------------------------------------------

    def read_batch(self, attempt_id: str, limit: int) -> Batch | None:
        """The oldest unconsumed events of a segment; ``ack`` or ``release`` it afterwards."""
        with self._lock:
            seg = self._segments.get(attempt_id)
            if seg is None or not seg.pending:
                return None
            batch = self._read(seg, limit=limit)
            if batch.lines == 0:  # the file is shorter than we thought: nothing left to read
                log.error("spool segment %s: %d events missing from the file", seg.path,
                          seg.pending)
                self.counters.drop("unreadable", seg.pending, attempt_id)
                self._delete(seg)
                return None
            seg.in_flight = True
            return batch

    def release(self, batch: Batch) -> None:
        """The batch was not delivered: it stays the oldest of its segment."""
        with self._lock:
            seg = self._segments.get(batch.key.attempt_id)
            if seg is not None:
                seg.in_flight = False

    def ack(self, batch: Batch, *, rejected: bool = False) -> None:
        """The batch was delivered (or rejected as malformed: counted ``unreadable``)."""
        with self._lock:
            seg = self._segments.get(batch.key.attempt_id)
            if seg is None:
                return
            seg.in_flight = False
            unreadable = batch.lines if rejected else batch.unreadable
            self.counters.drop("unreadable", unreadable, seg.key.attempt_id)
            self._consume(seg, batch)

    def refuse(self, attempt_id: str) -> int:
        """The control plane refused this claim: its unconsumed events are counted ``refused``."""
        with self._lock:
            seg = self._segments.get(attempt_id)
            if seg is None:
                return 0
            count = seg.pending
            self.counters.refuse(count)
            self._delete(seg)
            return count

    def expire(self) -> int:
        """Orphan segments idle longer than the age bound: dropped (``expired``)."""
        with self._lock:
            now = self.clock()
            dropped = 0
            for seg in list(self._segments.values()):
                if seg.key.attempt_id in self._owned or seg.in_flight:
                    continue
                if seg.pending and now - seg.last_time > self.max_age_seconds:
                    log.error("spool segment %s: %d events older than %.0fs: giving up on them",
                              seg.path.name, seg.pending, self.max_age_seconds)
                    self.counters.drop("expired", seg.pending, seg.key.attempt_id)
                    dropped += seg.pending
                    self._delete(seg)
            return dropped

    def _read(self, seg: _Segment, *, limit: int | None, max_bytes: int | None = None,
              stop_at_seq: int | None = None) -> Batch:
        events: list[dict[str, Any]] = []
        lines = unreadable = 0
        last_seq = seg.consumed_seq
        end = seg.cursor
        with open(seg.path, "rb") as f:
            f.seek(seg.cursor)
            while lines < seg.pending and (limit is None or lines < limit):
                if max_bytes is not None and end - seg.cursor >= max_bytes:
                    break
                raw = f.readline()
                if not raw:
                    break
                doc = _decode(raw)
                seq = doc["seq"] if doc else last_seq + 1
                if stop_at_seq is not None and lines and seq > stop_at_seq:
                    break  # another segment now holds the oldest events
                end += len(raw)
                lines += 1
                last_seq = seq
                if doc is None:
                    unreadable += 1
                else:
                    events.append(doc["event"])
        return Batch(seg.key, seg.cursor, end, events, lines, unreadable, last_seq)

    def _consume(self, seg: _Segment, batch: Batch) -> None:
        if batch.start != seg.cursor or batch.lines == 0:
            return  # already consumed (cannot happen while in_flight protects the batch)
        seg.cursor = batch.end
        seg.pending -= batch.lines
        seg.consumed_seq = batch.last_seq
        if seg.pending <= 0:
            self._delete(seg)
            return
        write_atomic(seg.pos_path, str(seg.consumed_seq).encode())
        if seg.cursor >= COMPACT_MIN_BYTES and seg.cursor >= seg.pending_bytes:
            self._compact(seg)
        seg.head_seq = self._head_seq(seg)

    def _compact(self, seg: _Segment) -> None:
        """Rewrite the unconsumed tail alone; .pos stays valid because it names a seq."""
        with open(seg.path, "rb") as f:
            f.seek(seg.cursor)
            tail = f.read()
        write_atomic(seg.path, tail)
        seg.cursor, seg.size = 0, len(tail)

    def _head_seq(self, seg: _Segment) -> int:
        with open(seg.path, "rb") as f:
            f.seek(seg.cursor)
            doc = _decode(f.readline())
        return doc["seq"] if doc else seg.consumed_seq + 1

    def _delete(self, seg: _Segment) -> None:
        self._segments.pop(seg.key.attempt_id, None)
        for path in (seg.path, seg.pos_path):  # segment first: a stray .pos is harmless
            path.unlink(missing_ok=True)

    # --- start-up -----------------------------------------------------------------------------

    def _load(self) -> None:
        """Adopt the segments a previous agent process left behind (killed or restarted)."""
        for tmp in self._segdir.glob("*.tmp"):
            tmp.unlink()
        for path in sorted(self._segdir.glob("*.jsonl")):
            self._load_segment(path)
        for pos in self._segdir.glob("*.pos"):
            if not pos.with_suffix(".jsonl").exists():
                pos.unlink()
        with self._lock:
            self._make_room(0)  # the bound may have been lowered since
        if self._segments:
            log.info("spool %s: %d undelivered events in %d segments from before this start",
                     self.directory, self.pending_events(), len(self._segments))

    def _load_segment(self, path: Path) -> None:
        pos = path.with_suffix(".pos")
        consumed = -1
        if pos.exists():
            try:
                consumed = int(pos.read_text().strip())
            except (OSError, ValueError) as exc:
                log.warning("%s: unreadable (%s): its segment may be delivered twice", pos, exc)
        raw_lines = path.read_bytes().splitlines(keepends=True)
        kept: list[tuple[bytes, dict[str, Any]]] = []
        unreadable = 0
        for raw in raw_lines:
            doc = _decode(raw) if raw.endswith(b"\n") else None  # no newline: torn by a crash
            if doc is None:
                unreadable += 1
            elif doc["seq"] > consumed:
                kept.append((raw, doc))
            self._seq = max(self._seq, doc["seq"] if doc else 0, consumed)
        if unreadable:
            log.error("%s: %d unreadable lines", path, unreadable)
            self.counters.drop("unreadable", unreadable, path.stem)
        if not kept:
            path.unlink()
            pos.unlink(missing_ok=True)
            return
        if len(kept) != len(raw_lines):
            write_atomic(path, b"".join(raw for raw, _ in kept))
        first = kept[0][1]
        key = ClaimKey(str(first["attempt_id"]), str(first["operation_id"]),
                       int(first["fencing_token"]))
        self._segments[key.attempt_id] = _Segment(
            key, path, cursor=0, size=sum(len(raw) for raw, _ in kept), pending=len(kept),
            head_seq=first["seq"], consumed_seq=consumed,
            last_time=max(float(doc["time"]) for _, doc in kept))


def _encode(seq: int, now: float, key: ClaimKey, event: dict[str, Any]) -> bytes:
    doc = {"seq": seq, "time": now, "attempt_id": key.attempt_id,
           "operation_id": key.operation_id, "fencing_token": key.fencing_token, "event": event}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode() + b"\n"


def _decode(raw: bytes) -> dict[str, Any] | None:
    """A spool line, or None if it is not one (torn or corrupted)."""
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or not isinstance(doc.get("event"), dict):
            return None
        int(doc["fencing_token"])
        float(doc["time"])
        if not isinstance(doc["seq"], int) or not doc["attempt_id"] or not doc["operation_id"]:
            return None
    except (ValueError, KeyError, TypeError):
        return None
    return doc


def _newest_that_fit(lines: list[bytes], max_bytes: int) -> int:
    """Index of the first line of the newest suffix that fits in ``max_bytes``."""
    total = 0
    for i in range(len(lines) - 1, -1, -1):
        total += len(lines[i])
        if total > max_bytes:
            return i + 1
    return 0


def _truncate_quietly(path: Path, size: int) -> None:
    try:
        with open(path, "r+b") as f:
            f.truncate(size)
    except OSError:
        pass


def _lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise SpoolBusy(f"spool directory {path.parent} is in use by another agent process "
                        f"(pid {holder}); give each agent its own --spool-dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd

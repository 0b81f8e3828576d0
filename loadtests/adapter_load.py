"""Background load through a platform adapter (for platforms the Locust scenarios do not speak).

The Locust scenarios (loadtests/) drive our control plane's HTTP API. For any other platform
the game day still needs the same evidence: ``requests.jsonl`` (every request, for API
availability), ``ledger.jsonl`` (every acknowledged submission, for durability) and
``load_stats.json``. This generator makes them with the adapter itself: a submitter that
retries each submission with the same idempotency key until it is acknowledged (a
well-behaved client), and a poller that reads and lists operations. Plain threads + httpx (no
gevent), so it can run inside the harness process.

    handle = start_background(lambda: get_adapter("prefect", eps, tokens), run_dir)
    ...
    summary = handle.stop()       # .acknowledged .requests .reason .exit_code
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from platforms.base import PlatformAdapter, PlatformError, SubmitRequest, Workload
from slo.ledger import LedgerEntry, LedgerWriter

DEFAULT_WORKLOAD = Workload(steps=20, checkpoint_every=10, step_delay=0.02, name="gameday-load")


@dataclass
class AdapterLoadSummary:
    acknowledged: int
    abandoned: int
    requests: int
    errors: int
    reason: str
    exit_code: int  # 0 fine, 1 a submission was abandoned or nothing was acknowledged


@dataclass
class AdapterLoad:
    factory: Callable[[], PlatformAdapter]
    out_dir: Path
    workload: Workload = DEFAULT_WORKLOAD
    # each Prefect flow run is a new Python process (~3-5 s CPU on 2 cores): keep it light
    submit_every: tuple[float, float] = (8.0, 12.0)
    poll_every: tuple[float, float] = (0.7, 1.5)
    submit_deadline: float = 120.0  # long enough to ride out an API or DB outage
    seed: int = 1
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)
    _ids: list[str] = field(default_factory=list)
    _routes: Counter = field(default_factory=Counter)
    _failed: Counter = field(default_factory=Counter)
    acknowledged: int = 0
    abandoned: int = 0

    def __post_init__(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._requests = open(self.out_dir / "requests.jsonl", "a")
        self._ledger = LedgerWriter(self.out_dir / "ledger.jsonl")
        self._rng = random.Random(self.seed)

    # -- records ---------------------------------------------------------------------------
    def _record(self, row: dict[str, Any]) -> None:
        with self._lock:
            self._requests.write(json.dumps(row) + "\n")
            self._requests.flush()
            self._routes[f"{row['method']} {row['route']}"] += 1
            if row["error"] or (row["status"] or 0) >= 500:
                self._failed[f"{row['method']} {row['route']}"] += 1

    def _adapter(self) -> PlatformAdapter:
        a = self.factory()
        a.recorder = self._record  # type: ignore[attr-defined]
        return a

    def _sleep(self, bounds: tuple[float, float]) -> bool:
        return self._stop.wait(self._rng.uniform(*bounds))

    # -- users -----------------------------------------------------------------------------
    def _submitter(self) -> None:
        a = self._adapter()
        n = 0
        while not self._stop.is_set():
            n += 1
            k = f"load-{n:05d}-{uuid.uuid4()}"
            deadline = time.monotonic() + self.submit_deadline
            backoff = 0.2
            while True:
                try:
                    ack = a.submit(SubmitRequest(self.workload, k))
                except PlatformError:
                    if time.monotonic() > deadline:
                        with self._lock:
                            self.abandoned += 1
                        break
                    time.sleep(backoff)  # keep retrying with the same key, also while stopping
                    backoff = min(backoff * 2, 3.0)
                    continue
                with self._lock:
                    self._ledger.append([LedgerEntry(
                        operation_id=ack.operation_id, idempotency_key=k, acked_at=ack.acked_at,
                        project=getattr(a, "project", ""), status=ack.status, source="load")])
                    self.acknowledged += 1
                    self._ids.append(ack.operation_id)
                break
            if self._sleep(self.submit_every):
                return

    def _poller(self) -> None:
        a = self._adapter()
        i = 0
        while not self._sleep(self.poll_every):
            i += 1
            try:
                if i % 5 == 0 or not self._ids:
                    a.list(limit=50)
                else:
                    with self._lock:
                        op = self._rng.choice(self._ids)
                    a.get(op)
            except PlatformError:
                pass  # recorded by the adapter's recorder

    # -- control ---------------------------------------------------------------------------
    def start(self) -> AdapterLoad:
        for target in (self._submitter, self._poller):
            t = threading.Thread(target=target, name=f"load-{target.__name__}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, timeout: float | None = None) -> AdapterLoadSummary:
        self._stop.set()
        for t in self._threads:
            t.join(timeout if timeout is not None else self.submit_deadline + 10)
        with self._lock:
            requests = sum(self._routes.values())
            errors = sum(self._failed.values())
            stats = {"generator": "loadtests.adapter_load", "requests": requests,
                     "errors": errors, "acknowledged": self.acknowledged,
                     "abandoned": self.abandoned, "by_route": dict(self._routes),
                     "errors_by_route": dict(self._failed)}
            self._requests.close()
        (self.out_dir / "load_stats.json").write_text(json.dumps(stats, indent=2))
        ok = self.abandoned == 0 and self.acknowledged > 0
        reason = (f"{self.acknowledged} acknowledged, {self.abandoned} abandoned, "
                  f"{errors}/{requests} requests failed")
        return AdapterLoadSummary(self.acknowledged, self.abandoned, requests, errors, reason,
                                  0 if ok else 1)


def start_background(factory: Callable[[], PlatformAdapter], out_dir: Path,
                     **kw: Any) -> AdapterLoad:
    return AdapterLoad(factory, out_dir, **kw).start()


def start_for_platform(env: Any, adapter_factory: Callable[[], PlatformAdapter], out_dir: Path,
                       scenario: str, allow_remote: bool) -> AdapterLoad:
    """Background load for any platform with an adapter (platforms/registry.py): the same
    evidence files as the Locust load, made through the adapter. ``scenario`` and
    ``allow_remote`` are the Locust load's; this generator only reaches the environment's
    adapter (local in tests), so it has no use for them."""
    return start_background(adapter_factory, out_dir)

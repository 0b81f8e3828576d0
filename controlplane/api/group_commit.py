"""Group commit for submissions: requests that arrive while a group is committing wait for the
next group, which commits them all in one statement (store/submissions.py). Each request is
answered only from its group's committed result.

At low load a lone request is committed at once (one round trip, as without grouping). Under
load the groups grow by themselves to what arrived during the previous commit; and while
submissions arrive faster than three per ``window`` (600/s for 5 ms), one group at a time
gathers for up to ``window`` before it commits, closing early when the arrivals pause. Each
group costs a transaction, a WAL flush, a NOTIFY and a routing pass whatever its size: at half
the saturation rate, groups of about one doubled the CPU per submission and kept the machine
nearly busy, which is what made the tail (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime

from psycopg_pool import AsyncConnectionPool

from controlplane import db, defects
from controlplane.metrics import SUBMIT_GROUP_SIZE
from controlplane.store import StoreUnavailable
from controlplane.store.submissions import SubmitItem, SubmitResult, submit_many

# an idle spell counts as at most this gap, so the rate estimate catches up with a burst within
# a few dozen arrivals instead of a few hundred
_GAP_CAP = 0.02

log = logging.getLogger("controlplane.api")


class GroupCommit:
    def __init__(self, pool: Callable[[], AsyncConnectionPool], *, max_group: int = 64,
                 max_inflight: int = 2, window: float = 0.005) -> None:
        self.pool = pool  # read per group: the app's pool (a test may swap it)
        self.max_group = max_group
        # up to two groups in flight: one is built and answered in Python while the other
        # commits. Counted by hand, not by a semaphore: a worker gives up its place in the same
        # step in which it sees the queue empty, so no request is ever left without a worker.
        self.max_inflight = max_inflight
        self.window = window  # 0: never gather
        self._workers = 0
        self._gathering = False  # one worker at a time gathers; it takes all that wait
        self._waiting: deque[tuple[SubmitItem, asyncio.Future[SubmitResult]]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._arrivals = 0
        self._last = time.monotonic()
        self._gap = _GAP_CAP  # moving average of the time between arrivals, seconds

    def _busy(self) -> bool:
        """Arrivals fast enough that gathering for ``window`` would add three or more: below
        that the wait buys too little (at 400/s, 5 ms gave groups of 1.9 for 2.7 ms more at the
        median, docs/performance.md)."""
        return self.window > 0 and self._gap * 3 <= self.window

    async def submit(self, item: SubmitItem) -> SubmitResult:
        now = time.monotonic()
        self._gap += (min(now - self._last, _GAP_CAP) - self._gap) / 16
        self._last = now
        self._arrivals += 1
        fut: asyncio.Future[SubmitResult] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, fut))
        # a gathering worker will take this request; while busy, one worker, that gathers
        limit = 1 if self._busy() else self.max_inflight
        if not self._gathering and self._workers < limit:
            self._workers += 1
            task = asyncio.create_task(self._work())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await fut

    async def _work(self) -> None:
        try:
            while self._waiting:
                if self._gathering:  # the gathering worker looks at the queue again after
                    return           # its gather, so these requests are its own
                if self._busy():
                    self._gathering = True
                    try:
                        await self._gather()
                    finally:
                        self._gathering = False
                group = [self._waiting.popleft()
                         for _ in range(min(self.max_group, len(self._waiting)))]
                await self._commit(group)  # not empty: nobody else takes during a gather
        finally:
            self._workers -= 1

    async def _gather(self) -> None:
        """Wait up to ``window`` for a fuller group; go as soon as the group is full or no
        request came for twice the usual gap (a closed-loop client has no more to send)."""
        deadline = time.monotonic() + self.window
        while len(self._waiting) < self.max_group:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            seen = self._arrivals
            await asyncio.sleep(min(left, 2 * self._gap))
            if self._arrivals == seen:
                return

    async def _commit(self, group: list[tuple[SubmitItem, asyncio.Future[SubmitResult]]]
                      ) -> None:
        SUBMIT_GROUP_SIZE.observe(len(group))
        try:
            async with db.connection(self.pool()) as c:
                results = await submit_many(c, [item for item, _ in group])
        except Exception as exc:  # noqa: BLE001 - every waiter gets it (StoreUnavailable: 503)
            presume = (isinstance(exc, StoreUnavailable)
                       and defects.enabled("ack-unknown-outcome"))  # seeded defect: test only
            for item, fut in group:
                if not fut.done():
                    if presume:  # an unknown outcome taken for a commit
                        fut.set_result(_presumed(item))
                    else:
                        fut.set_exception(exc)
            return
        for (_, fut), res in zip(group, results, strict=True):
            if fut.done():  # the request was cancelled (client gone): nothing to answer
                continue
            if isinstance(res, Exception):
                fut.set_exception(res)
            else:
                fut.set_result(res)
        _log_accepted(results)  # after the answers: nothing here may keep one waiting

    async def close(self) -> None:
        """Let the groups in flight finish: their requests are being answered."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=10)


def _log_accepted(results: list[SubmitResult | Exception]) -> None:
    """One line per committed group, naming every operation it created. A line per submission
    was the API's largest remaining cost of its own under load (docs/performance.md); the
    durable record of each is its `accepted` event, committed with it."""
    ids = [str(r.operation.get("id")) for r in results
           if isinstance(r, SubmitResult) and r.created]
    if ids:
        log.info("submissions accepted", extra={"action": "submit", "count": len(ids),
                                                "operation_ids": ids})


def _presumed(item: SubmitItem) -> SubmitResult:
    """Seeded defect ack-unknown-outcome only: the answer a commit would have given."""
    now = datetime.now(UTC)
    row = {"id": item.op_id or str(uuid.uuid4()), "spec": item.spec, "state": "accepted",
           "state_reason": "submission committed", "pending_reason": None, "wait_reason": None,
           "attempt_count": 0, "idempotency_key": item.key, "current_attempt_id": None,
           "pinned_agent": None, "created_at": now, "updated_at": now, "result": None,
           "last_error": None, "first_error": None}
    return SubmitResult(row, created=True)

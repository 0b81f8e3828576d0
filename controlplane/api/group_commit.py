"""Group commit for submissions: requests that arrive while a group is committing wait for the
next group, which commits them all in one statement (store/submissions.py).

No timer: a lone request is committed at once, so latency at low load is one round trip as
before; under load, groups grow by themselves to what arrived during the previous commit. Each
request is answered only from its group's committed result.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from psycopg_pool import AsyncConnectionPool

from controlplane import db
from controlplane.metrics import SUBMIT_GROUP_SIZE
from controlplane.store.submissions import SubmitItem, SubmitResult, submit_many


class GroupCommit:
    def __init__(self, pool: Callable[[], AsyncConnectionPool], *, max_group: int = 64,
                 max_inflight: int = 2) -> None:
        self.pool = pool  # read per group: the app's pool (a test may swap it)
        self.max_group = max_group
        # up to two groups in flight: one is built and answered in Python while the other
        # commits. Counted by hand, not by a semaphore: a worker gives up its place in the same
        # step in which it sees the queue empty, so no request is ever left without a worker.
        self.max_inflight = max_inflight
        self._workers = 0
        self._waiting: deque[tuple[SubmitItem, asyncio.Future[SubmitResult]]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, item: SubmitItem) -> SubmitResult:
        fut: asyncio.Future[SubmitResult] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, fut))
        if self._workers < self.max_inflight:
            self._workers += 1
            task = asyncio.create_task(self._work())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await fut

    async def _work(self) -> None:
        try:
            while self._waiting:
                group = [self._waiting.popleft()
                         for _ in range(min(self.max_group, len(self._waiting)))]
                await self._commit(group)
        finally:
            self._workers -= 1

    async def _commit(self, group: list[tuple[SubmitItem, asyncio.Future[SubmitResult]]]
                      ) -> None:
        SUBMIT_GROUP_SIZE.observe(len(group))
        try:
            async with db.connection(self.pool()) as c:
                results = await submit_many(c, [item for item, _ in group])
        except Exception as exc:  # noqa: BLE001 - every waiter gets it (StoreUnavailable: 503)
            for _, fut in group:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for (_, fut), res in zip(group, results, strict=True):
            if fut.done():  # the request was cancelled (client gone): nothing to answer
                continue
            if isinstance(res, Exception):
                fut.set_exception(res)
            else:
                fut.set_result(res)

    async def close(self) -> None:
        """Let the groups in flight finish: their requests are being answered."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=10)

"""Hedged calls: a call that has not answered after a while is sent again alongside, and the
first answer wins (Dean and Barroso, "The Tail at Scale", CACM 2013: hedged requests).

For the attempt heartbeat on a gray network: a connection that is accepted and then never
answers costs a plain call its whole deadline, and two such calls in a row (a short blackout,
then one unlucky new connection) cost a five-second lease. A second call on a new connection
half a deadline later gets through as soon as the path does, while the first may still answer
if the API is merely slow, so a slow API is never given up on sooner than before.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def hedged(call: Callable[[], T], *, retry_on: type[BaseException], every: float,
           within: float, name: str = "hedge") -> T:
    """Run ``call``; while no answer has come, start it again alongside every ``every``
    seconds until ``within`` seconds have passed since the first start, then wait for the
    calls already started (each bounded by its own deadline). The first success is returned.
    An exception other than ``retry_on`` (a refusal, a lost lease) is an answer too and is
    raised at once; if every call failed with ``retry_on``, the last such error is raised.
    A call that fails at once is not repeated inside the round: hedging is for silence, and
    the caller paces retries after failures itself.
    Calls left running after the answer finish on their own daemon threads: ``call`` must be
    safe to repeat and bounded by a timeout."""
    if every <= 0 or within < 0:
        raise ValueError(f"hedged: every must be > 0 and within >= 0 (got {every}, {within})")
    answers: queue.Queue[tuple[bool, object]] = queue.Queue()

    def one() -> None:
        try:
            answers.put((True, call()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            answers.put((False, exc))

    start = time.monotonic()
    started = finished = 0
    last: BaseException | None = None
    while True:
        threading.Thread(target=one, daemon=True, name=f"{name}-{started}").start()
        started += 1
        hedge_at = time.monotonic() + every
        while finished < started:
            wait = hedge_at - time.monotonic() if hedge_at - start < within else None
            try:
                ok, value = answers.get(timeout=None if wait is None else max(0.0, wait))
            except queue.Empty:
                break  # still silent: time for another call alongside
            finished += 1
            if ok:
                return value  # type: ignore[return-value]
            assert isinstance(value, BaseException)
            if not isinstance(value, retry_on):
                raise value
            last = value
        else:
            # every call started so far has failed: the caller decides when to try again
            assert last is not None
            raise last

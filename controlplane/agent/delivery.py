"""Delivery of one claim's events, in order: straight to the API while nothing of that claim is
spooled, through the spool (oldest first) as soon as something is.

Answers of the events endpoint and what they mean for the events:

* 2xx: delivered.
* transport error, 5xx, 401/403 (a bad token is a config error, not the events' fault): kept,
  tried again later.
* 409 (stale fencing token / attempt no longer active) or 404 (unknown attempt): the control
  plane *refused* the claim: every event of it still held is discarded and counted ``refused``,
  and ``LeaseLost`` is raised (the claim is not ours any more).
* 400/413/422: this batch is malformed; it would block the claim forever, so it is consumed
  and counted dropped as ``unreadable``.
"""

from __future__ import annotations

import logging
from enum import Enum
from typing import Any

from controlplane.agent.api import AgentApi, ApiRejected, ApiUnavailable, LeaseLost
from controlplane.agent.metrics import AgentMetrics
from controlplane.agent.spool import ClaimKey, Spool

log = logging.getLogger(__name__)
EVENTS_PER_REQUEST = 200  # the API refuses larger batches (AttemptEvents.events, max_length)
REFUSED_STATUSES = frozenset({404})  # 409 arrives as LeaseLost
MALFORMED_STATUSES = frozenset({400, 413, 422})


class Delivery(Enum):
    DONE = "done"  # nothing of the claim is held any more
    MORE = "more"  # the batch budget ran out; more is spooled
    UNAVAILABLE = "unavailable"  # the API cannot take them now; they are spooled


class _Sent(Enum):
    OK = "ok"
    RETRY = "retry"
    MALFORMED = "malformed"


class _Refused(Exception):
    pass


class Courier:
    def __init__(self, api: AgentApi, spool: Spool, metrics: AgentMetrics) -> None:
        self.api = api
        self.spool = spool
        self.metrics = metrics

    def forward(self, key: ClaimKey, events: list[dict[str, Any]], *,
                max_batches: int | None = None) -> Delivery:
        """Deliver ``events`` after whatever of the claim is already spooled.

        What cannot be delivered now is spooled (fsync'ed) before this returns.
        Raises ``LeaseLost`` when the control plane refuses the claim.
        """
        if self.spool.has_pending(key.attempt_id):
            self.spool.append(key, events)  # behind the older ones: order is kept
            return self.flush(key, max_batches=max_batches)
        sent = 0
        while sent < len(events):
            chunk = events[sent:sent + EVENTS_PER_REQUEST]
            try:
                outcome = self._send(key, chunk)
            except _Refused as exc:
                self.spool.counters.refuse(len(events) - sent)
                raise LeaseLost(f"{len(events) - sent} events refused: {exc}") from None
            except Exception:  # a surprise must not cost the events still in hand
                self.spool.append(key, events[sent:])
                raise
            if outcome is _Sent.RETRY:
                self.spool.append(key, events[sent:])
                return Delivery.UNAVAILABLE
            if outcome is _Sent.MALFORMED:
                self.spool.counters.drop("unreadable", len(chunk), key.attempt_id)
            sent += len(chunk)
        return Delivery.DONE

    def flush(self, key: ClaimKey, *, max_batches: int | None = None) -> Delivery:
        """Deliver the claim's spooled events oldest first, with the token they were sent with.

        Raises ``LeaseLost`` when the control plane refuses the claim (events counted refused).
        """
        batches = 0
        while max_batches is None or batches < max_batches:
            batch = self.spool.read_batch(key.attempt_id, EVENTS_PER_REQUEST)
            if batch is None:
                return Delivery.DONE
            batches += 1
            events = coalesce_progress(batch.events)
            if not events:  # only unreadable lines
                self.spool.ack(batch)
                continue
            try:
                outcome = self._send(batch.key, events)
            except _Refused as exc:
                self.spool.release(batch)
                count = self.spool.refuse(key.attempt_id)
                raise LeaseLost(f"{count} spooled events refused: {exc}") from None
            if outcome is _Sent.RETRY:
                self.spool.release(batch)
                return Delivery.UNAVAILABLE
            self.spool.ack(batch, rejected=outcome is _Sent.MALFORMED)
        return Delivery.MORE if self.spool.has_pending(key.attempt_id) else Delivery.DONE

    def _send(self, key: ClaimKey, events: list[dict[str, Any]]) -> _Sent:
        """Send one request's worth; raises _Refused when the claim is refused."""
        try:
            self.api.send_events(key.attempt_id, key.fencing_token, events)
        except ApiUnavailable as exc:
            self.metrics.api_errors.labels("events", "unavailable").inc()
            log.warning("attempt %s: events not delivered yet: %s", key.attempt_id, exc)
            return _Sent.RETRY
        except LeaseLost as exc:
            raise _Refused(str(exc)) from exc
        except ApiRejected as exc:
            self.metrics.api_errors.labels("events", "rejected").inc()
            if exc.status in REFUSED_STATUSES:
                raise _Refused(str(exc)) from exc
            if exc.status in MALFORMED_STATUSES:
                log.error("attempt %s: %d events rejected as malformed, dropping them: %s",
                          key.attempt_id, len(events), exc)
                return _Sent.MALFORMED
            log.error("attempt %s: events rejected, keeping them: %s", key.attempt_id, exc)
            return _Sent.RETRY
        self.metrics.events_forwarded.inc(len(events))
        return _Sent.OK


def coalesce_progress(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep every event but only the newest progress event: progress is a level, not a log."""
    last_progress = max((i for i, e in enumerate(events) if e.get("kind") == "progress"),
                        default=None)
    return [e for i, e in enumerate(events) if e.get("kind") != "progress" or i == last_progress]

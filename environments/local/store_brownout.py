"""An S3 brownout of the local environment's object store, as a fault: the S3 server's
brownout layer (environments/local/s3_brownout.py: SlowDown / 5xx at a rate, latency, a bandwidth
cap) switched on, changed and off, each step on the fault timeline.

The fault's records carry what the evidence needs to judge retry amplification without the
platform's own word for it: the S3 requests the server saw in a short baseline just before
the brownout, at its start, and at its end (``fault_start`` / ``fault_end`` details:
``baseline``, ``counters``). slo/invariants.py ``bounded-retry-amplification`` reads them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from environments.local.errors import EnvError, NotRunning
from environments.local.fault_ledger import FaultLedger
from environments.local.s3_brownout import BrownoutInvalid, Counters, parse_brownout
from environments.local.s3_brownout_client import (
    BrownoutClient,
    BrownoutRejected,
    BrownoutUnreachable,
)

FAULT = "s3_brownout"
TARGET = "moto"


def _counts(counters: Counters) -> dict[str, Any]:
    return {"requests": counters.requests, "injected": dict(counters.injected)}


class StoreBrownout:
    def __init__(self, s3_url: str | None, ledger: FaultLedger, *,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.client = BrownoutClient(s3_url) if s3_url else None
        self.ledger = ledger
        self.sleep = sleep

    def _client(self) -> BrownoutClient:
        if self.client is None:
            raise NotRunning("this environment records no S3 server port (components.moto)")
        return self.client

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except BrownoutUnreachable as exc:
            raise NotRunning(str(exc)) from None
        except BrownoutRejected as exc:
            raise EnvError(f"S3 brownout refused: {exc.field}: {exc.reason}") from None

    @staticmethod
    def validate(settings: dict[str, Any]) -> dict[str, Any]:
        """The brownout as the server will hold it; EnvError naming the field if invalid."""
        try:
            return parse_brownout(settings).to_json()
        except BrownoutInvalid as exc:
            raise EnvError(f"S3 brownout: {exc.field}: {exc.reason}") from None

    def start(self, settings: dict[str, Any], baseline_seconds: float = 3.0) -> dict[str, Any]:
        """Brown the store out; returns once the server applies it. The requests of the
        ``baseline_seconds`` before are counted first (the rate to compare the brownout's
        with). A second start while active changes the brownout instead."""
        state = self.validate(settings)
        if self.ledger.is_active(FAULT, TARGET):
            return self.change(settings)
        client = self._client()
        first = self._call(client.state).counters
        started = time.monotonic()
        if baseline_seconds > 0:
            self.sleep(baseline_seconds)
        before = self._call(client.state).counters
        baseline = {"requests": before.requests - first.requests,
                    "seconds": round(time.monotonic() - started, 3)}
        line = self.ledger.begin(FAULT, TARGET, {"brownout": state, "baseline": baseline,
                                                 "counters": _counts(before)})
        try:
            self._call(lambda: client.set(**settings))
        except (EnvError, NotRunning) as exc:
            self.ledger.end(FAULT, TARGET, {"error": str(exc)})
            raise
        return {"target": TARGET, "brownout": state, "baseline": baseline, "time": line["time"]}

    def change(self, settings: dict[str, Any]) -> dict[str, Any]:
        state = self.validate(settings)
        if not self.ledger.is_active(FAULT, TARGET):
            raise EnvError("no S3 brownout is active: start one first")
        status = self._call(lambda: self._client().set(**settings))
        line = self.ledger.change(FAULT, TARGET, {"brownout": state,
                                                  "counters": _counts(status.counters)})
        return {"target": TARGET, "brownout": state, "time": line["time"], "changed": True}

    def end(self, reason: str | None = None) -> dict[str, Any]:
        """Healthy again (idempotent); the fault_end carries the counters at that moment."""
        status = self._call(self._client().clear)
        details: dict[str, Any] = {"counters": _counts(status.counters)}
        if reason:
            details["restored_by"] = reason
        line = self.ledger.end(FAULT, TARGET, details)
        return {"target": TARGET, "counters": details["counters"],
                "time": line["time"] if line else None}

    def restore_all(self) -> list[str]:
        if not self.ledger.is_active(FAULT, TARGET):
            return []
        self.end("restore_all")
        return [f"{FAULT}:{TARGET}"]

    def close_all(self, reason: str) -> list[str]:
        if not self.ledger.is_active(FAULT, TARGET):
            return []
        try:
            self.end(reason)
        except NotRunning:  # the server goes away with the environment anyway
            self.ledger.end(FAULT, TARGET, {"restored_by": reason})
        return [f"{FAULT}:{TARGET}"]

"""The wall clock of a control-plane process, with an injectable offset (clock-skew rehearsals).

Which clock decides what
------------------------
* **The database's ``now()`` is the only authority for leases.** A claim sets
  ``lease_expires_at = now() + lease`` and each attempt heartbeat renews it the same way
  (store/agents.py); the reconciler expires an attempt when ``lease_expires_at < now()`` and
  wakes retries when ``next_eligible_at <= now()`` (store/scheduling.py). Every grant, renewal
  and expiry is compared on that one clock, so no process's own clock can make a lease start
  late, end early or be granted to two holders at once.
* **An agent keeps its own lease deadline on ``time.monotonic()``** (agent/attempt.py): it
  stops its workload when no heartbeat got through for a lease, measured from when the last
  successful heartbeat was *sent*, so it always gives up no later than the database expires
  the lease. A step of the wall clock (NTP, a VM resumed, an operator) does not move a
  monotonic clock, so the agent's self-fencing is immune to it.
* **The reconciler's loop timing** (how often it expires, routes, exports) is also monotonic
  (``loop.time()``).
* **Wall time (this module)** is only *reported*: agents send their reading with each claim
  and attempt heartbeat (the API records the offset from the database's clock on the claim
  event; the seeded defect ``lease-from-agent-clock`` uses it for the lease instead), the
  reconciler exports its offset from the database's clock as a gauge, and the agent's files
  set aside are named with it. Nothing decides ownership on it.

The offset
----------
``CONTROLPLANE_CLOCK_OFFSET_FILE`` names a per-process file holding ``{"offset_seconds": S}``;
the local environment's fault driver writes it (environments/local/faults.py ``skew_clock``) and
removes it to restore the clock. Every reading adds ``S`` to ``time.time()``: the real code
paths run with a clock that jumped forward (S > 0) or backward (S < 0), as they would on a host
whose clock stepped. The file is checked at most every ``RECHECK_SECONDS`` (a ``stat``; it is
read again only when its mtime or size changed), so a reading costs nothing measurable. Without
the variable (every deployment) the offset is 0 and no file is ever looked at. Monotonic time
is deliberately not offset: a clock step does not move it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from datetime import UTC, datetime

ENV = "CONTROLPLANE_CLOCK_OFFSET_FILE"
RECHECK_SECONDS = 0.2

log = logging.getLogger("controlplane.clock")

# warnings gathered under the lock, logged after it: (format, args, extra)
_Said = list[tuple[str, tuple[object, ...], dict[str, object] | None]]


class _Offset:
    """The offset read from one file, re-read when the file changes."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seconds = 0.0
        self._stamp: tuple[int, int] | None = None  # (mtime_ns, size) of what was read
        self._checked = float("-inf")

    def seconds(self) -> float:
        if not self.path:
            return 0.0
        now = time.monotonic()
        if now - self._checked < RECHECK_SECONDS:
            return self._seconds
        said: _Said = []
        with self._lock:
            self._checked = now
            self._refresh(said)
        # Logged only once the lock is released: a JSON log line is stamped with this clock
        # (logs.py), so logging under the lock would wait on the lock itself for good.
        for msg, args, extra in said:
            log.warning(msg, *args, extra=extra)
        return self._seconds

    def _refresh(self, said: _Said) -> None:
        try:
            st = os.stat(self.path)  # type: ignore[arg-type]
        except FileNotFoundError:
            self._set(0.0, None, "file removed", said)
            return
        except OSError as exc:
            said.append(("%s: cannot stat clock offset file: %s; keeping %+.3fs",
                         (self.path, exc, self._seconds), None))
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._set(self._read(said), stamp, "file changed", said)

    def _read(self, said: _Said) -> float:
        try:
            with open(self.path) as f:  # type: ignore[arg-type]
                value = json.load(f)["offset_seconds"]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"offset_seconds must be a number, got {value!r}")
            return float(value)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # a half-written or broken file must not stop the process: keep the last offset
            said.append(("%s: unusable clock offset file (%s); keeping %+.3fs",
                         (self.path, exc, self._seconds), None))
            return self._seconds

    def _set(self, seconds: float, stamp: tuple[int, int] | None, why: str,
             said: _Said) -> None:
        if seconds != self._seconds:
            said.append(("wall clock offset now %+.3fs (%s: %s)", (seconds, why, self.path),
                         {"action": "clock_offset", "offset_seconds": seconds}))
        self._seconds, self._stamp = seconds, stamp


_offset = _Offset(os.environ.get(ENV) or None)


def configure(path: str | None) -> None:
    """Use the offset in ``path`` (None: no offset). For tests and embedding; processes read
    ``CONTROLPLANE_CLOCK_OFFSET_FILE`` at import."""
    global _offset
    _offset = _Offset(path)


def offset() -> float:
    """Seconds this process's wall clock is off (0 unless a clock-skew fault is in effect)."""
    return _offset.seconds()


def wall() -> float:
    """Wall-clock time in epoch seconds, as this process's (possibly skewed) clock reads it."""
    return time.time() + _offset.seconds()


def utcnow() -> datetime:
    return datetime.fromtimestamp(wall(), UTC)

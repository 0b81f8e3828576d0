"""The clock fault of the local environment: an agent's or the reconciler's wall clock stepped
away from the true time through the offset file its process re-reads (controlplane/clock.py),
and put back; each jump recorded on the fault timeline."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controlplane.clock import ENV as CLOCK_ENV
from controlplane.clock import RECHECK_SECONDS as CLOCK_RECHECK_SECONDS
from environments.local.errors import EnvError, UnknownTarget
from environments.local.fault_ledger import FaultLedger
from environments.local.state import EnvState

CLOCK_KINDS = ("agent", "reconciler")  # processes with an injectable clock (controlplane/clock.py)


class Clocks:
    KINDS = ("clock_skew",)

    def __init__(self, state: EnvState, ledger: FaultLedger,
                 resolve: Callable[[str], tuple[str, bool]]) -> None:
        self.state, self.ledger = state, ledger
        self.resolve = resolve  # a target name or alias -> (component, postgres_only)

    def clock_file(self, component: str) -> Path:
        spec = self.state.components[component]
        if spec.kind not in CLOCK_KINDS:
            skewable = [n for n, c in self.state.components.items() if c.kind in CLOCK_KINDS]
            raise UnknownTarget(f"{component!r} ({spec.kind}) has no injectable clock; clocks "
                                f"can be skewed on: {', '.join(skewable)}")
        path = spec.env.get(CLOCK_ENV)
        if not path:
            raise UnknownTarget(f"{component!r} reads no clock offset ({CLOCK_ENV} is not in its "
                                "environment): restart the environment")
        return Path(path)

    def skew_clock(self, target: str, seconds: float) -> dict[str, Any]:
        """Step the wall clock of one agent or of the reconciler ``seconds`` away from the true
        time (forward > 0, backward < 0), as an NTP step or a resumed VM would: the process's
        every wall-clock reading (controlplane/clock.py) is off by that much from now on, its
        monotonic clock is not. A second call with another offset is a new jump (the previous
        skew ends on the timeline, the new one starts); with the same offset it is a no-op."""
        component, pg_only = self.resolve(target)
        if pg_only:
            raise UnknownTarget("skew_clock applies to agents and the reconciler")
        seconds = float(seconds)
        if seconds == 0:
            raise EnvError("skew_clock needs a non-zero offset; restore_clock puts the clock back")
        path = self.clock_file(component)
        current = self.ledger.active().get(f"clock_skew:{component}")
        if current and current["details"].get("offset_seconds") == seconds:
            return {"target": component, "offset_seconds": seconds, "already": True}
        if current:
            self.ledger.end("clock_skew", component, {"offset_seconds": seconds, "jumped": True})
        line = self.ledger.begin("clock_skew", component, {"offset_seconds": seconds,
                                                    "alias": target})
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"offset_seconds": seconds}))
        tmp.replace(path)  # atomic: a reader sees the old offset or the new one
        # in effect once the process has looked at the file again
        time.sleep(2 * CLOCK_RECHECK_SECONDS)
        return {"target": component, "offset_seconds": seconds, "time": line["time"]}

    def restore_clock(self, target: str) -> dict[str, Any]:
        """Inverse of skew_clock: the process reads the true time again. Idempotent."""
        component, _ = self.resolve(target)
        self.clock_file(component).unlink(missing_ok=True)
        time.sleep(2 * CLOCK_RECHECK_SECONDS)
        line = self.ledger.end("clock_skew", component, {"offset_seconds": 0.0})
        return {"target": component, "time": line["time"] if line else None}

    # -- asked by the fault driver (environments/local/faults.py) ------------------------------------
    def close(self, fault: dict[str, Any]) -> None:
        if fault["target"] in self.state.components:
            # the offset file outlives the processes: a later `up` must start on true time
            self.clock_file(fault["target"]).unlink(missing_ok=True)

    def restore(self, fault: dict[str, Any]) -> None:
        self.restore_clock(fault["target"])

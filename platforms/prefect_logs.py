"""What the adapter and the pipeline translation both read from Prefect (pure): terminal state
types and the flow's ``@event {json}`` run-log lines (the workload's events, platforms/prefect_flow.py)."""

from __future__ import annotations

import json
from typing import Any

EVENT_PREFIX = "@event "
TERMINAL = frozenset({"COMPLETED", "FAILED", "CRASHED", "CANCELLED"})


def parse_event(message: str) -> dict[str, Any] | None:
    """The event of one ``@event`` log line ({kind, message, data}); None for any other line."""
    if not message.startswith(EVENT_PREFIX):
        return None
    try:
        body = json.loads(message[len(EVENT_PREFIX):])
    except ValueError:
        return None
    return body if isinstance(body, dict) else None

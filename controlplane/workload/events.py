"""The workload -> agent event channel: one JSON object per stdout line.

Shape matches the agent event body of CONTRACTS.md section 1 (``kind``, ``message``, ``data``),
so the agent forwards lines as they are. Anything on stdout that is not such a line is
treated by the agent as a ``log`` event.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

EVENT_KINDS = frozenset({
    "log", "progress", "checkpoint_started", "checkpoint_written", "checkpoint_skipped_torn",
    "checkpoint_skipped_local",
    "artifact_written", "start_failed", "resumed",
})
PREFIX = "@event "  # marks event lines so stray prints of libraries are not misparsed


@dataclass(frozen=True)
class WorkloadEvent:
    kind: str
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "data": self.data}


def emit(kind: str, message: str = "", stream: TextIO | None = None, **data: Any) -> None:
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown event kind {kind!r}; expected one of {sorted(EVENT_KINDS)}")
    out = stream or sys.stdout
    out.write(PREFIX + json.dumps({"kind": kind, "message": message, "data": data}, sort_keys=True) + "\n")
    out.flush()


def parse_line(line: str) -> WorkloadEvent:
    """An event line becomes its event; anything else becomes a ``log`` event with the text."""
    text = line.rstrip("\n")
    if text.startswith(PREFIX):
        try:
            body = json.loads(text[len(PREFIX):])
            kind = body["kind"]
            if kind in EVENT_KINDS:
                return WorkloadEvent(kind, str(body.get("message", "")), dict(body.get("data") or {}))
        except (ValueError, KeyError, TypeError):
            pass
    return WorkloadEvent("log", text[:2000])

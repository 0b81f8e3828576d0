"""The fault timeline (docs/CONTRACTS.md section 4): append-only JSONL, one line per
``fault_start`` / ``fault_end`` / ``note``, written by every process that injects or heals a
fault (the runner, each Chaos Toolkit experiment), locked so lines never interleave. Shared by
the local and the cloud environment."""

from __future__ import annotations

import fcntl
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def utcnow() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class Timeline:
    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self, event: str, fault: str, target: str, details: dict[str, Any]) -> dict[str, Any]:
        line = {"time": utcnow(), "event": event, "fault": fault, "target": target, "details": details}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as out:
            fcntl.flock(out, fcntl.LOCK_EX)
            out.write(json.dumps(line) + "\n")
        return line

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

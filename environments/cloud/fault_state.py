"""The cloud faults' undo file: every change with an inverse is written here *before* it is
made, so a crashed run (or a new process) can still roll back. Its own module so the drivers
(environments/cloud/aws.py, kubernetes.py) and their router (driver.py) import it without importing
each other."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


class FaultState:
    """Active faults and what undoes them, persisted as JSON after every change."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            return json.loads(self.path.read_text())["faults"]
        except FileNotFoundError:
            return {}

    def _write(self, faults: dict[str, dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Atomic replace: a crash mid-write must not lose the undo information.
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".faults-")
        with os.fdopen(fd, "w") as out:
            json.dump({"version": 1, "faults": faults}, out, indent=2, sort_keys=True)
        os.replace(tmp, self.path)

    def get(self, key: str) -> dict[str, Any] | None:
        return self._read().get(key)

    def put(self, key: str, fault: str, target: str, undo: Mapping[str, Any]) -> None:
        faults = self._read()
        since = faults.get(key, {}).get("since") or datetime.now(UTC).isoformat()
        faults[key] = {"fault": fault, "target": target, "since": since, "undo": dict(undo)}
        self._write(faults)

    def pop(self, key: str) -> None:
        faults = self._read()
        if faults.pop(key, None) is not None:
            self._write(faults)

    def active(self) -> dict[str, dict[str, Any]]:
        return self._read()

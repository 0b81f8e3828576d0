"""One local environment's state directory: ``env.json`` (mode 0600: it holds secrets), the
fault timeline, component logs and pid records (layout: docs/local-environment.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from environments.timeline import Timeline


class EnvState:
    def __init__(self, name: str, state_dir: Path) -> None:
        self.name = name
        self.dir = state_dir

    @property
    def env_file(self) -> Path:
        return self.dir / "env.json"

    @property
    def timeline_file(self) -> Path:
        return self.dir / "faults.jsonl"

    def log_file(self, component: str) -> Path:
        return self.dir / "logs" / f"{component}.log"

    def pid_file(self, component: str) -> Path:
        return self.dir / "run" / f"{component}.json"

    def exists(self) -> bool:
        return self.env_file.exists()

    def read(self) -> dict[str, Any]:
        return json.loads(self.env_file.read_text())

    def write(self, info: dict[str, Any]) -> None:
        """Never half-written, never readable by others (tokens and passwords inside)."""
        tmp = self.env_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=2))
        os.chmod(tmp, 0o600)
        tmp.replace(self.env_file)

    def pid_record(self, component: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.pid_file(component).read_text())
        except FileNotFoundError:
            return None

    def write_pid_record(self, component: str, record: dict[str, Any]) -> None:
        self.pid_file(component).write_text(json.dumps(record))

    def note(self, what: str, details: dict[str, Any] | None = None) -> None:
        """A ``note`` line on the fault timeline (env up/down, defects, manual decisions)."""
        Timeline(self.timeline_file).record("note", what, self.name, details or {})

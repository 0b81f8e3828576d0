"""Append-only JSONL evidence written from inside the Locust process(es).

Each line is written and flushed at once (one write per line), so a SIGKILLed load process
still leaves every acknowledgement it saw. In distributed mode each worker writes its own part
file; `loadtests.collect` merges them into the run directory.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from slo.ledger import LedgerWriter


def utc_iso(ts: float | None = None) -> str:
    moment = datetime.now(UTC) if ts is None else datetime.fromtimestamp(ts, UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


class JsonlWriter:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # held open for the process's life: one append + flush per line
        self._file: IO[str] = open(path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self.write_many([record])

    def write_many(self, records: list[dict[str, Any]]) -> None:
        """The records, one line each, and one flush."""
        if not records:
            return
        self._file.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class PartWriters:
    """The part files of one load process: ledger, requests, submissions, inference."""

    def __init__(self, parts_dir: Path, tag: str | None = None) -> None:
        self.tag = tag or f"p{os.getpid()}"
        tag = self.tag
        parts_dir.mkdir(parents=True, exist_ok=True)
        self.ledger = LedgerWriter(parts_dir / f"ledger.{tag}.jsonl")  # the one ledger format
        self.requests = JsonlWriter(parts_dir / f"requests.{tag}.jsonl")
        self.submissions = JsonlWriter(parts_dir / f"submissions.{tag}.jsonl")
        self.inference = JsonlWriter(parts_dir / f"inference.{tag}.jsonl")

    def close(self) -> None:
        for w in (self.requests, self.submissions, self.inference):
            w.close()

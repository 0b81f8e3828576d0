"""The client ack ledger: the evidence that proves "no acknowledged work lost".

One line per acknowledged submission (docs/EVIDENCE.md, ledger.jsonl), written by a client only
*after* the platform acknowledged it. This module is the only place that knows the format:
one type (``LedgerEntry``), one writer (``LedgerWriter``, or ``dumps`` for a client with its own
files), one reader (``read``), and one definition of a lost acknowledgement (``lost``) that both
the durability SLI and the database restore use.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError


def _as_utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class LedgerError(ValueError):
    """A ledger line is unusable (message names the file, line and field)."""


class LedgerEntry(BaseModel):
    # producers may add fields; we read what we need
    model_config = ConfigDict(extra="ignore", frozen=True)

    operation_id: str
    idempotency_key: str
    acked_at: Annotated[datetime, AfterValidator(_as_utc)]
    project: str
    status: int | None = None  # 201 created, 200 the same operation again
    source: str | None = None  # "load", "experiment:<name>", "probe:<name>", "replay:<name>"
    # the body that was acknowledged: lets the restore order replay a submission it lost
    request: dict[str, Any] | None = None

    @classmethod
    def now(cls, operation_id: str, idempotency_key: str, project: str, *,
            status: int | None = None, source: str | None = None,
            request: dict[str, Any] | None = None) -> LedgerEntry:
        return cls(operation_id=operation_id, idempotency_key=idempotency_key,
                   acked_at=datetime.now(UTC), project=project, status=status, source=source,
                   request=request)


def dumps(entry: LedgerEntry) -> str:
    """One JSONL line (with its newline)."""
    return json.dumps(entry.model_dump(mode="json", exclude_none=True),
                      separators=(",", ":")) + "\n"


class LedgerWriter:
    """Appends entries to a ledger file: locked (several processes may append), flushed per
    call, so an acknowledgement is on disk before the client goes on."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, entries: Iterable[LedgerEntry]) -> int:
        lines = [dumps(e) for e in entries]
        if not lines:
            return 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.writelines(lines)
            f.flush()
        return len(lines)

    def replace(self, entries: Iterable[LedgerEntry]) -> int:
        """Rewrite the whole file (e.g. merged and sorted), never half-written."""
        lines = [dumps(e) for e in entries]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(lines), encoding="utf-8")
        tmp.replace(self.path)
        return len(lines)


def parse_line(raw: str, where: str) -> LedgerEntry:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise LedgerError(f"{where}: not valid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise LedgerError(f"{where}: must be a JSON object")
    try:
        return LedgerEntry.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "?"
        raise LedgerError(f"{where}: field {field}: {err['msg']}") from None


def read(paths: Iterable[Path], *, torn_tail_ok: bool = False, names: dict[Path, str] | None = None
         ) -> list[LedgerEntry]:
    """Every entry of the ledger files, in file order. ``torn_tail_ok``: a writer killed
    mid-append leaves at most one unreadable *last* line, which is then skipped; anything else
    malformed raises LedgerError naming file and line."""
    out: list[LedgerEntry] = []
    for path in paths:
        name = (names or {}).get(path, str(path))
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                out.append(parse_line(raw, f"{name}: line {number}"))
            except LedgerError:
                if torn_tail_ok and number == len(lines):
                    continue
                raise
    return out


@dataclass(frozen=True)
class Submission:
    """One acknowledged (project, idempotency key): a client retry answered 200 is the same one."""

    first: LedgerEntry  # its earliest acknowledgement
    operation_ids: frozenset[str]  # every operation id it was acknowledged with


def submissions(entries: Iterable[LedgerEntry]) -> dict[tuple[str, str], Submission]:
    """The ledger grouped by (project, idempotency key)."""
    first: dict[tuple[str, str], LedgerEntry] = {}
    ids: dict[tuple[str, str], set[str]] = {}
    for e in entries:
        k = (e.project, e.idempotency_key)
        ids.setdefault(k, set()).add(e.operation_id)
        if k not in first or e.acked_at < first[k].acked_at:
            first[k] = e
    return {k: Submission(first[k], frozenset(ids[k])) for k in first}


def lost(entries: Iterable[LedgerEntry], stored_ids: set[str],
         stored_keys: set[tuple[str, str]]) -> list[LedgerEntry]:
    """The acknowledged submissions the store does not have: for each (project, key), the first
    acknowledgement, when the store holds neither that key nor any operation id it was
    acknowledged with. Oldest first. The durability SLI and the restore both use this."""
    return sorted((s.first for k, s in submissions(entries).items()
                   if k not in stored_keys and not s.operation_ids & stored_ids),
                  key=lambda e: e.acked_at)

"""The inference ledger: one line per prediction request a client sent to the serving frontend
(``inference.jsonl`` in a run directory; docs/serving.md). The only place that knows the
format: one type (``InferenceRecord``), one line writer (``dumps``), one reader (``read``).

A line says what the client saw: when it asked, the HTTP status (or the transport error), how
long the answer took, which model version answered (the ``x-model-version`` header, else the
v2 body's ``model_version``) and whether the answer was the golden one for its input (``None``
when the input was not a golden row or there was no answer). The serving SLIs
(slo/sli.py ``serving_*``) are computed from these lines alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

FILE = "inference.jsonl"


def _as_utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class InferenceLedgerError(ValueError):
    """A line is unusable; the message names the file, line and field."""


class InferenceRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    time: Annotated[datetime, AfterValidator(_as_utc)]
    status: int | None = None
    error: str | None = None
    latency_ms: float = Field(ge=0)
    version: str | None = None
    correct: bool | None = None

    @property
    def answered(self) -> bool:
        """A prediction came back: no transport error, no 5xx (a 4xx is the client's fault)."""
        return self.error is None and self.status is not None and self.status < 500


def dumps(record: InferenceRecord) -> str:
    return json.dumps(record.model_dump(mode="json"), separators=(",", ":")) + "\n"


def read(path: Path) -> list[InferenceRecord]:
    """Every line of ``path`` (none when it does not exist: a run without inference load)."""
    if not path.exists():
        return []
    return list(_records(path))


def _records(path: Path) -> Iterator[InferenceRecord]:
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield InferenceRecord.model_validate_json(line)
        except ValidationError as exc:
            if number == len(lines) and any(e["type"] == "json_invalid" for e in exc.errors()):
                return  # a load process killed mid-write leaves at most one torn last line
            err = exc.errors()[0]
            raise InferenceLedgerError(f"{path}: line {number}: field "
                                       f"{'.'.join(map(str, err['loc'])) or '(line)'}: "
                                       f"{err['msg']}") from None

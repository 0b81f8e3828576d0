"""After the Locust process(es) end: merge per-process part files into the run directory and
run the integrity checks on the client's own evidence.

Merged files are validated against the evidence models the gate reads (`slo.evidence`), so a
load run never hands the gate a file it cannot use.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from slo.evidence import RequestRecord
from slo.inference_ledger import FILE as INFERENCE
from slo.inference_ledger import InferenceRecord
from slo.ledger import LedgerEntry

LEDGER = "ledger.jsonl"
REQUESTS = "requests.jsonl"
SUBMISSIONS = "submissions.jsonl"
STATS = "load_stats.json"


class CollectError(Exception):
    """A part file is unusable (the evidence cannot be trusted)."""


def _read_parts(parts_dir: Path, kind: str, model: type[BaseModel] | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted(parts_dir.glob(f"{kind}.*.jsonl")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if model is not None:
                    model.model_validate(row)
            except json.JSONDecodeError:
                if number == len(lines):
                    continue  # a process killed mid-write leaves at most one torn last line
                raise CollectError(f"{path.name}: line {number}: not valid JSON") from None
            except ValidationError as exc:
                err = exc.errors()[0]
                raise CollectError(f"{path.name}: line {number}: field "
                                   f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
            rows.append(row)
    return rows


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)
    tmp.replace(path)  # nothing half-written under the final name


@dataclass(frozen=True)
class Collected:
    ledger: list[dict[str, Any]]
    requests: list[dict[str, Any]]
    submissions: list[dict[str, Any]]
    outcomes: dict[str, int] = field(default_factory=dict)


def merge_parts(parts_dir: Path, out_dir: Path, *, keep_parts: bool = False) -> Collected:
    """Merge every process's part files into OUT (sorted by time) and drop the parts."""
    ledger = sorted(_read_parts(parts_dir, "ledger", LedgerEntry), key=lambda r: r["acked_at"])
    reqs = sorted(_read_parts(parts_dir, "requests", RequestRecord), key=lambda r: r["time"])
    subs = sorted(_read_parts(parts_dir, "submissions", None), key=lambda r: r["first_at"])
    inference = sorted(_read_parts(parts_dir, "inference", InferenceRecord), key=lambda r: r["time"])
    if inference:  # only a run with Inferrer users has an inference ledger
        _write_jsonl(out_dir / INFERENCE, inference)
    _write_jsonl(out_dir / LEDGER, ledger)
    _write_jsonl(out_dir / REQUESTS, reqs)
    _write_jsonl(out_dir / SUBMISSIONS, subs)
    if not keep_parts:
        shutil.rmtree(parts_dir, ignore_errors=True)
    return Collected(ledger, reqs, subs, dict(Counter(s["outcome"] for s in subs)))


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def ledger_check(ledger: list[dict[str, Any]]) -> Check:
    """One ledger line per key, one key per operation: the client acknowledged each logical
    submission exactly once and the platform never mapped two keys onto one operation."""
    by_key: dict[str, set[str]] = defaultdict(set)
    by_op: dict[str, set[str]] = defaultdict(set)
    lines = Counter(r["idempotency_key"] for r in ledger)
    for r in ledger:
        by_key[r["idempotency_key"]].add(r["operation_id"])
        by_op[r["operation_id"]].add(r["idempotency_key"])
    repeated = sorted(k for k, n in lines.items() if n > 1)
    split = sorted(k for k, ops in by_key.items() if len(ops) > 1)
    merged = sorted(o for o, keys in by_op.items() if len(keys) > 1)
    problems = [f"{len(repeated)} key(s) acknowledged more than once (e.g. {repeated[0]})"] if repeated else []
    problems += [f"{len(split)} key(s) mapped to several operations (e.g. {split[0]})"] if split else []
    problems += [f"{len(merged)} operation(s) acknowledged under several keys (e.g. {merged[0]})"] if merged else []
    return Check("ledger_exactly_once", not problems,
                 "; ".join(problems) or f"{len(ledger)} acknowledgements, one per key")


def rejection_check(submissions: list[dict[str, Any]]) -> Check:
    """A 4xx on our own, valid submissions (409 same key/other payload, 422, 401) is a bug in
    the platform or in the scenario, never load: it fails the run as a check."""
    rejected = [s for s in submissions if s["outcome"] == "rejected"]
    statuses = Counter(str(s.get("last_status")) for s in rejected)
    detail = ", ".join(f"HTTP {k} x{n}" for k, n in sorted(statuses.items()))
    return Check("no_rejected_submissions", not rejected,
                 f"{len(rejected)} rejected ({detail})" if rejected else "none rejected")


def harness_check(exceptions: int) -> Check:
    return Check("no_user_exceptions", exceptions == 0,
                 f"{exceptions} exception(s) in Locust user code (see locust*.log)"
                 if exceptions else "none")

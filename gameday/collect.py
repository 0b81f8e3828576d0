"""Gather a game day's raw evidence into its run directory (layout: docs/EVIDENCE.md)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx

from platforms import PlatformAdapter
from slo import ledger
from slo.ledger import LedgerWriter


class CollectError(Exception):
    """A piece of evidence could not be collected (message says which and why)."""


def utcnow() -> datetime:
    return datetime.now(UTC)


def _parse(t: str) -> datetime:
    d = datetime.fromisoformat(t)
    return d if d.tzinfo else d.replace(tzinfo=UTC)


def merge_ledgers(run_dir: Path) -> int:
    """Experiments' own acknowledged submissions join the load generator's ledger."""
    path = run_dir / "ledger.jsonl"
    files = [p for p in (path, run_dir / "ledger-experiments.jsonl") if p.exists()]
    entries = sorted(ledger.read(files, torn_tail_ok=True), key=lambda e: e.acked_at)
    return LedgerWriter(path).replace(entries)


def copy_faults(timeline: Path, run_dir: Path, since: datetime) -> int:
    """The environment's fault timeline, from the start of this run on."""
    rows = []
    if timeline.exists():
        for line in timeline.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if _parse(row["time"]) >= since:
                    rows.append(row)
    (run_dir / "faults.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def query_prometheus(url: str, run_dir: Path, start: datetime, end: datetime,
                     queries: dict[str, str], step: float = 5.0) -> dict[str, str]:
    """query_range results, one file each; a failed query is recorded, never invented."""
    out_dir = run_dir / "prometheus"
    out_dir.mkdir(exist_ok=True)
    status: dict[str, str] = {}
    for name, query in queries.items():
        params = {"query": query, "start": start.timestamp(), "end": end.timestamp(),
                  "step": step}
        try:
            r = httpx.get(f"{url}/api/v1/query_range", params=params, timeout=20)
            body = r.json()
            status[name] = body.get("status", f"HTTP {r.status_code}")
        except (httpx.HTTPError, ValueError) as exc:
            body = {"status": "error", "error": str(exc)}
            status[name] = f"error: {exc}"
        (out_dir / f"{name}.json").write_text(json.dumps(
            {"query": query, "start": params["start"], "end": params["end"], "step": step,
             "response": body}))
    return status


def versions() -> dict[str, str]:
    out = {}
    for dist, key in (("mlplatform-gameday", "harness"), ("mlplatform-gameday", "controlplane"),
                      ("chaostoolkit", "chaostoolkit"), ("chaostoolkit-lib", "chaostoolkit-lib"),
                      ("locust", "locust")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = "unknown"
    return out


def write_run_json(run_dir: Path, info: dict[str, Any]) -> None:
    tmp = run_dir / "run.json.tmp"
    tmp.write_text(json.dumps(info, indent=2, default=str))
    tmp.replace(run_dir / "run.json")


def snapshot(adapter: PlatformAdapter, run_dir: Path, since: datetime | None = None,
             attempts: int = 5) -> dict[str, int]:
    """The platform's store after the run, this run's operations only (created at or after
    ``since``); retried because the last fault may still be healing."""
    last: Exception | None = None
    for _ in range(attempts):
        try:
            return adapter.snapshot(run_dir, since=since)
        except Exception as exc:  # noqa: BLE001 - any failure: wait and retry, then report
            last = exc
            time.sleep(2)
    raise RuntimeError(f"snapshot failed after {attempts} tries: {last}")


def s3_objects(bucket: str | None, region: str, path: Path, session: Any = None,
               operations: set[str] | None = None) -> int:
    """snapshot/objects.jsonl from AWS S3 itself (cloud runs): the default credential chain
    (IRSA in the game-day pod), same rows as the local listing (docs/EVIDENCE.md)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from platforms.controlplane import write_objects

    if not bucket:
        raise CollectError("snapshot/objects.jsonl: the target names no artifactBucket")
    s3 = (session or boto3.Session()).client("s3", region_name=region)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return write_objects(s3, bucket, path, operations)
    except (BotoCoreError, ClientError) as exc:
        raise CollectError(f"snapshot/objects.jsonl: listing s3://{bucket} failed: {exc} (the "
                           "game-day role needs s3:ListBucket and s3:GetObject on it)") from exc


def write_gaps(run_dir: Path, gaps: dict[str, str]) -> None:
    """collection-gaps.json: evidence this run could not collect, and why (instead of an empty
    or invented file). The evaluator does not read it; people and `gameday evaluate`'s
    'evidence missing' errors point at the same files."""
    (run_dir / "collection-gaps.json").write_text(json.dumps(gaps, indent=2, sort_keys=True))

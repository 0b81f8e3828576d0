"""The evidence of a game day, collected once its faults are undone and its load stopped:
client ledgers, fault timeline, Prometheus queries and the platform's store snapshot into the
run directory; what the environment cannot provide is written down, never faked
(environments/base.py EvidenceNeeds)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from environments.base import Environment, EvidenceNeeds
from gameday import collect, tracking_collect
from gameday.output import say
from slo.telemetry import SCRAPES_PROMQL, SCRAPES_QUERY

PROM_QUERIES = {
    "alerts": "ALERTS",
    "queue_age": "max by (queue) (controlplane_queue_age_seconds)",
    "pending": "sum by (reason) (controlplane_pending_operations)",
    "api_requests": "sum by (code) (rate(haproxy_backend_http_responses_total[30s]))",
    # agents count every event they had to drop (slo/dropped.py reads the increase per agent)
    "evidence_dropped": "sum by (agent) (controlplane_agent_events_dropped_total)",
    # Prometheus's own liveness: a gap means its evidence of that stretch is lost (slo/telemetry.py)
    SCRAPES_QUERY: SCRAPES_PROMQL,
}


@dataclass
class Evidence:
    """What run.json records of the collection."""

    ended_at: datetime
    ledger_entries: int
    fault_events: int
    prometheus: Any
    snapshot: dict[str, Any]


def collect_evidence(env: Environment, adapter: Any, run_dir: Path, started_at: datetime,
                     rollback: dict[str, Any], lock: Any, console: Console) -> Evidence:
    needs = env.evidence_needs
    eps = env.endpoints
    ended_at = collect.utcnow()
    acks = collect.merge_ledgers(run_dir)
    faults = collect.copy_faults(Path(eps["fault_timeline"]), run_dir, started_at)
    queries = {k: q for k, q in {**PROM_QUERIES, **needs.queries}.items() if q is not None}
    prom = collect.query_prometheus(eps["prometheus"], run_dir, started_at, ended_at, queries)
    try:
        counts = collect.snapshot(adapter, run_dir, since=started_at)
    except RuntimeError as exc:
        counts = {"error": str(exc)}
        say(console, f"[red]{exc}[/]")
    if eps.get("mlflow") and "error" not in counts:  # the environment runs a tracking server
        try:
            counts["tracking_runs"] = tracking_collect.tracking_runs(
                eps["mlflow"], eps.get("mlflow_experiment") or "gameday-training",
                run_dir / "snapshot" / "tracking_runs.jsonl", started_at)
        except RuntimeError as exc:  # not written: the tracking invariants say "no data"
            counts["tracking_runs"] = f"error: {exc}"
            say(console, f"[red]{exc}[/]")
    if needs.known_gaps is not None:
        counts = record_gaps(needs, run_dir, counts, rollback, lock, console)
    return Evidence(ended_at, acks, faults, prom, counts)


def record_gaps(needs: EvidenceNeeds, run_dir: Path, counts: dict[str, Any],
                rollback: dict[str, Any], lock: Any, console: Console) -> dict[str, Any]:
    """Where the environment cannot provide everything (the cloud): the object listing from
    AWS S3 (IAM), not an endpoint URL; what could not be collected is written down in
    collection-gaps.json, with the rollback's outcome in the snapshot's counts."""
    gaps: dict[str, str] = dict(needs.known_gaps or {})
    objects = run_dir / "snapshot" / "objects.jsonl"
    if "error" in counts:
        gaps["snapshot/"] = f"the store snapshot failed ({needs.snapshot_source}): {counts['error']}"
    elif needs.aws_objects is not None:
        bucket, region = needs.aws_objects
        try:
            counts["objects"] = collect.s3_objects(bucket, region, objects,
                                                   operations=_run_operations(run_dir))
        except collect.CollectError as exc:
            objects.unlink(missing_ok=True)
            gaps["snapshot/objects.jsonl"] = str(exc)
            counts["objects"] = f"error: {exc}"
            say(console, f"[red]{exc}[/]")
    if "error" in rollback:
        gaps["rollback"] = (f"restore_all failed: {rollback['error']}; the faults still active "
                            f"are in {needs.active_faults_at}")
    if lock is not None and getattr(lock, "lost", None):
        gaps["lock"] = f"the game-day Lease was lost during the run: {lock.lost}"
    collect.write_gaps(run_dir, gaps)
    counts["rollback"] = rollback
    return counts


def _run_operations(run_dir: Path) -> set[str]:
    path = run_dir / "snapshot" / "operations.jsonl"
    return {json.loads(x)["id"] for x in path.read_text().splitlines() if x.strip()}

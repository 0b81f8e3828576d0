"""snapshot/tracking_runs.jsonl: what the environment's MLflow tracking server holds of this
run's training runs, read back through its REST API after the game day (docs/EVIDENCE.md;
judged by slo/tracking_invariants.py)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controlplane.workload.mlflow_rest import ATTEMPT_TAG, MlflowRest, TrackingError


def _iso(ms: object) -> str | None:
    if not isinstance(ms, (int, float)) or ms <= 0:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def run_row(client: MlflowRest, run: dict[str, Any]) -> dict[str, Any]:
    info, data = run["info"], run.get("data") or {}
    tags = {t["key"]: t["value"] for t in data.get("tags") or []}
    rid = info["run_id"]
    points = {}
    for key in sorted({m["key"] for m in data.get("metrics") or []}):
        points[key] = len({(m["step"], m["timestamp"]) for m in client.metric_history(rid, key)})
    return {"run_id": rid, "attempt_tag": tags.get(ATTEMPT_TAG), "status": info["status"],
            "start_time": _iso(info.get("start_time")), "end_time": _iso(info.get("end_time")),
            "metric_points": points, "params": len(data.get("params") or []),
            "artifacts": client.artifacts(rid)}


def tracking_runs(url: str, experiment: str, path: Path, since: datetime,
                  tries: int = 10) -> int:
    """Write one row per run started since ``since``; retried while the server (perhaps still
    restarting after the last fault) does not answer. Returns the number of rows."""
    last: Exception | None = None
    for _ in range(tries):
        client = MlflowRest(url, timeout=10.0)
        try:
            rows = [run_row(client, r) for r in client.runs_since(
                client.experiment_id(experiment), int(since.timestamp() * 1000))]
            break
        except TrackingError as exc:
            last = exc
            time.sleep(3)
        finally:
            client.close()
    else:
        raise RuntimeError(f"tracking snapshot failed after {tries} tries: {last}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    tmp.replace(path)
    return len(rows)

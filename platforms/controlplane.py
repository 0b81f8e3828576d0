"""Adapter for the reference control plane (controlplane/): its HTTP API for work, its database
and the artifact bucket for the evidence snapshot."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from controlplane.store.agents import FLEET_OPERATION, HEARD_AGAIN
from controlplane.store.queues import HELD_QUEUE
from platforms.base import (
    Ack,
    OperationView,
    PlatformError,
    StoredOperation,
    SubmitRequest,
    Workload,
)
from slo.ledger import LedgerEntry

RESTORE_ROUTE = "/v1/admin/operations/restore"  # the control plane's admin restore route
CANCEL_HELD_ROUTE = "/v1/admin/queues/{queue}/cancel-held"  # and its held queues' bulk cancel

# Snapshot rows are written with the API's field names (docs/CONTRACTS.md section 1), for the
# operations created since the run started only: a store that outlives runs holds earlier runs'
# work too, and its artifacts may be gone (the in-memory S3 restarts empty).
_RUN_OPS = "SELECT id FROM operations WHERE created_at >= %(since)s"
_OPS_SQL = """
SELECT o.id::text, p.name AS project, o.state, o.state_reason, o.pending_reason,
       o.idempotency_key, o.created_at, o.updated_at, o.queue, o.spec->'workload' AS workload,
       o.spec->'resources' AS resources, o.spec->'placement' AS placement, o.attempt_count,
       o.max_retries, o.result, o.first_error, o.last_error
FROM operations o JOIN projects p ON p.id = o.project_id
WHERE o.created_at >= %(since)s ORDER BY o.created_at"""
_ATTEMPTS_SQL = f"""
SELECT t.id::text, t.operation_id::text, t.number, a.name AS agent_name, t.state,
       t.fencing_token, t.created_at, t.claimed_at, t.started_at, t.finished_at, t.error, t.result
FROM attempts t JOIN agents a ON a.id = t.agent_id
WHERE t.operation_id IN ({_RUN_OPS}) ORDER BY t.created_at"""
_EVENTS_SQL = f"""
SELECT id, operation_id::text, attempt_id::text, time, actor, kind, from_state, to_state, reason,
       coalesce(data, '{{}}'::jsonb) AS data FROM events
WHERE operation_id IN ({_RUN_OPS}) ORDER BY id"""
# pipelines submitted since the run's start, their steps, their events (operation_id is the
# pipeline's id) and the side effects of the run's operations: what the pipeline invariants
# judge (docs/EVIDENCE.md, "Pipelines")
_RUN_PIPELINES = "SELECT id FROM pipelines WHERE created_at >= %(since)s"
_PIPELINES_SQL = """
SELECT l.id::text, p.name AS project, l.name, l.idempotency_key, l.state, l.state_reason,
       l.report, l.spec, l.created_at, l.updated_at
FROM pipelines l JOIN projects p ON p.id = l.project_id
WHERE l.created_at >= %(since)s ORDER BY l.created_at"""
_PIPELINE_STEPS_SQL = f"""
SELECT pipeline_id::text, name, position, state, state_reason, operation_id::text, cache_key,
       inputs, manifest, report, started_at, finished_at
FROM pipeline_steps WHERE pipeline_id IN ({_RUN_PIPELINES}) ORDER BY pipeline_id, position"""
_PIPELINE_EVENTS_SQL = f"""
SELECT id, operation_id::text AS pipeline_id, time, actor, kind, reason,
       coalesce(data, '{{}}'::jsonb) AS data FROM events
WHERE operation_id IN ({_RUN_PIPELINES}) ORDER BY id"""
_SIDE_EFFECTS_SQL = f"""
SELECT operation_id::text, action_id, kind, payload, receipt, created_at FROM side_effects
WHERE operation_id IN ({_RUN_OPS}) ORDER BY created_at"""
# what eligibility is judged against (docs/EVIDENCE.md, snapshot/agents.jsonl)
_AGENTS_SQL = """
SELECT name, pool, zone, region, datasets, accelerator_type, accelerator_count, registries,
       cpu_slots, registered_at
FROM agents ORDER BY name"""
# agents heard again after a silence (controlplane/store/agents.py, fleet records under the nil
# operation): what the routed-to-live-agents invariant judges dispatches against
_LIVENESS_SQL = f"""
SELECT data->>'agent' AS agent, time, data->>'silent_since' AS silent_since,
       (data->>'timeout_seconds')::float8 AS timeout_seconds FROM events
WHERE operation_id = '{FLEET_OPERATION}'::uuid
  AND kind = '{HEARD_AGAIN}' AND time >= %(since)s ORDER BY id"""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _jsonable(v: Any) -> Any:
    return v.isoformat() if isinstance(v, datetime) else v


class ControlPlaneAdapter:
    name = "controlplane"

    def __init__(self, api_url: str, token: str, project: str, *, admin_dsn: str | None = None,
                 s3_endpoint: str | None = None, bucket: str = "ml-artifacts",
                 image: str = "127.0.0.1:5000/ml/trainer:1.0", timeout: float = 5.0,
                 region: str | None = None, agent_token: str | None = None,
                 admin_token: str | None = None, image_digest: str | None = None) -> None:
        self.api_url, self.project, self.admin_dsn = api_url, project, admin_dsn
        self.region = region  # real AWS S3 when there is no endpoint (cloud runs)
        self.s3_endpoint, self.bucket, self.image = s3_endpoint, bucket, image
        self.agent_token, self.admin_token = agent_token, admin_token
        self.image_digest = image_digest
        self.http = httpx.Client(base_url=api_url, timeout=timeout,
                                 headers={"Authorization": f"Bearer {token}"})

    @classmethod
    def from_env(cls, endpoints: dict[str, Any], tokens: dict[str, Any]) -> ControlPlaneAdapter:
        projects = tokens.get("projects") or tokens.get("project_tokens") or {}
        if not projects:
            raise PlatformError("environment has no project token (env.json: tokens.projects)")
        project, token = min(projects.items())
        return cls(endpoints["api"], token, project, admin_dsn=endpoints.get("dsn"),
                   s3_endpoint=endpoints.get("s3_direct") or endpoints.get("s3"),
                   bucket=endpoints.get("bucket", "ml-artifacts"),
                   image=endpoints.get("image", "127.0.0.1:5000/ml/trainer:1.0"),
                   region=endpoints.get("region"), agent_token=tokens.get("agent"),
                   image_digest=endpoints.get("image_digest"),
                   admin_token=tokens.get("admin"))

    # -- work ------------------------------------------------------------------------------
    def spec(self, w: Workload) -> dict[str, Any]:
        return {
            "name": w.name, "queue": w.queue, "max_retries": w.max_retries,
            "timeout_seconds": w.timeout_seconds,
            "workload": {"kind": "train", "image": self.image,
                         "params": {"steps": w.steps, "checkpoint_every": w.checkpoint_every,
                                    "seed": w.seed, "step_delay": w.step_delay,
                                    **({"checkpoint_commit_delay": w.checkpoint_commit_delay}
                                       if w.checkpoint_commit_delay else {}),
                                    **({"checkpoint_upload_every": w.checkpoint_upload_every}
                                       if w.checkpoint_upload_every != 1 else {}),
                                    **({"checkpoint_sync_delay": w.checkpoint_sync_delay}
                                       if w.checkpoint_sync_delay else {}),
                                    **({"tracking": 1} if w.tracking else {})}},
            "resources": {"cpu": w.cpu, "accelerator":
                          {"type": "sim-a100", "count": w.accelerators} if w.accelerators else None},
            "placement": {"regions": list(w.regions) if w.regions else None, "dataset": w.dataset},
        }

    def submit(self, req: SubmitRequest) -> Ack:
        body = self.spec(req.workload)
        try:
            r = self.http.post("/v1/operations", json=body,
                               headers={"Idempotency-Key": req.idempotency_key})
        except httpx.HTTPError as exc:
            raise PlatformError(f"submit: {type(exc).__name__}: {exc}") from exc
        if r.status_code not in (200, 201):
            raise PlatformError(f"submit: HTTP {r.status_code}: {r.text[:300]}")
        return Ack(r.json()["id"], req.idempotency_key, r.status_code, _now(), request=body)

    def get(self, operation_id: str, *, timeline: bool = False) -> OperationView:
        try:
            r = self.http.get(f"/v1/operations/{operation_id}")
            r.raise_for_status()
            op = r.json()
            view = OperationView(op["id"], op["state"], op.get("state_reason"),
                                 op.get("pending_reason"), op.get("result"))
            if timeline:
                view.attempts = self.http.get(
                    f"/v1/operations/{operation_id}/attempts").json()["items"]
                view.events = self.http.get(
                    f"/v1/operations/{operation_id}/events").json()["items"]
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise PlatformError(f"get {operation_id}: {exc}") from exc
        return view

    def list(self, state: str | None = None, limit: int = 100) -> list[OperationView]:
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state
        r = self.http.get("/v1/operations", params=params)
        if r.status_code != 200:
            raise PlatformError(f"list: HTTP {r.status_code}: {r.text[:200]}")
        return [OperationView(o["id"], o["state"], o.get("state_reason"), o.get("pending_reason"),
                              o.get("result")) for o in r.json()["items"]]

    def cancel(self, operation_id: str, reason: str = "") -> OperationView:
        r = self.http.post(f"/v1/operations/{operation_id}/cancel",
                           json={"reason": reason or "canceled by the harness"})
        if r.status_code not in (200, 409):
            raise PlatformError(f"cancel {operation_id}: HTTP {r.status_code}: {r.text[:200]}")
        return self.get(operation_id)

    # -- pipelines (reference control plane only; docs/CONTRACTS.md section 5) -------------
    @property
    def pinned_image(self) -> str:
        """The image by digest (pipeline steps are cacheable only with a pinned image)."""
        if "@sha256:" in self.image or not self.image_digest:
            return self.image
        return self.image.rsplit(":", 1)[0] + "@" + self.image_digest

    def submit_pipeline(self, body: dict[str, Any], key: str) -> dict[str, Any]:
        try:
            r = self.http.post("/v1/pipelines", json=body, headers={"Idempotency-Key": key})
        except httpx.HTTPError as exc:
            raise PlatformError(f"submit pipeline: {type(exc).__name__}: {exc}") from exc
        if r.status_code not in (200, 201):
            raise PlatformError(f"submit pipeline: HTTP {r.status_code}: {r.text[:300]}")
        return dict(r.json())

    def pipeline(self, pipeline_id: str) -> dict[str, Any]:
        try:
            r = self.http.get(f"/v1/pipelines/{pipeline_id}")
            r.raise_for_status()
            return dict(r.json())
        except (httpx.HTTPError, ValueError) as exc:
            raise PlatformError(f"pipeline {pipeline_id}: {exc}") from exc

    def record_side_effect(self, operation_id: str, action_id: str, kind: str,
                           payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """POST /v1/operations/{id}/side-effects as the agent does (HTTP status, receipt)."""
        try:
            r = self.http.post(f"/v1/operations/{operation_id}/side-effects",
                               json={"action_id": action_id, "kind": kind, "payload": payload})
        except httpx.HTTPError as exc:
            raise PlatformError(f"side effect: {type(exc).__name__}: {exc}") from exc
        if r.status_code not in (200, 201):
            raise PlatformError(f"side effect: HTTP {r.status_code}: {r.text[:300]}")
        return r.status_code, dict(r.json())

    def put_object(self, key: str, data: bytes) -> None:
        s3_client(self.s3_endpoint, self.bucket, self.region).put_object(
            Bucket=self.bucket, Key=key, Body=data)

    def delete_object(self, key: str) -> None:
        s3_client(self.s3_endpoint, self.bucket, self.region).delete_object(
            Bucket=self.bucket, Key=key)

    def healthy(self) -> tuple[bool, str]:
        try:
            r = self.http.get("/readyz", timeout=2.0)
        except httpx.HTTPError as exc:
            return False, f"API unreachable: {type(exc).__name__}"
        return r.status_code == 200, f"/readyz {r.status_code}"

    def results_location(self, operation_id: str) -> str:
        return f"s3://{self.bucket}/artifacts/{operation_id}/"

    def components(self) -> dict[str, str]:
        return {"api": "API replicas behind the load balancer", "reconciler": "routing, leases",
                "db": "PostgreSQL primary + synchronous standby", "agents": "node pools",
                "artifact-store": "S3 bucket", "registry": "image registry"}

    def reconcile_artifacts(self) -> dict[str, Any]:
        """The restore-order reconciliation step (runbooks/db-primary-loss.md): the store and the
        artifact bucket must agree. A succeeded operation without its COMPLETE.json, or a
        COMPLETE.json of an operation the store does not know (acknowledged work lost by a
        restore), is a discrepancy. Work still running may have neither yet: not counted."""
        import psycopg

        if not self.admin_dsn:
            raise PlatformError("reconciliation needs the database DSN")
        s3 = s3_client(self.s3_endpoint, self.bucket, self.region)

        def manifests(prefix: str) -> set[str]:
            out: set[str] = set()
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                     Prefix=prefix):
                out.update(o["Key"].split("/")[1] for o in page.get("Contents", [])
                           if o["Key"].endswith("/COMPLETE.json"))
            return out

        # The bucket first, then the store: an operation is committed before anything of it
        # runs, so every manifest listed belongs to a row the later read sees (the other order
        # reported a manifest written between the two reads as of an unknown operation: seen
        # with 121,000 operations under load). A succeeded operation the listing missed may
        # have finished after it: its own prefix is listed again.
        complete = manifests("artifacts/")
        with psycopg.connect(self.admin_dsn, connect_timeout=5) as conn:
            states = dict(conn.execute("SELECT id::text, state FROM operations").fetchall())
        missing = sorted(i for i, st in states.items() if st == "succeeded" and i not in complete
                         and i not in manifests(f"artifacts/{i}/"))
        unknown = sorted(i for i in complete if i not in states)
        return {"operations": len(states), "complete_manifests": len(complete),
                "succeeded_without_artifacts": missing, "artifacts_of_unknown_operations": unknown,
                "consistent": not missing and not unknown}

    # -- restore order (runbooks/db-primary-loss.md B) -----------------------------------
    def stored_operations(self) -> list[StoredOperation]:
        """Every operation the store knows (all runs): the restore's reconciliation compares
        them with object storage and the client ledgers."""
        import psycopg

        if not self.admin_dsn:
            raise PlatformError("the store index needs the control plane's database DSN")
        with psycopg.connect(self.admin_dsn, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT o.id::text, p.name, o.state, o.attempt_count, o.idempotency_key "
                "FROM operations o JOIN projects p ON p.id = o.project_id").fetchall()
        return [StoredOperation(*r) for r in rows]

    def restore_acknowledged(self, entry: LedgerEntry, restore_id: str) -> dict[str, Any]:
        """Re-create one acknowledged submission a restore lost, under the operation id its
        client holds (admin route). The record (restore.json): ``old_id`` the client holds,
        ``new_id`` that answers now, ``identity`` ``same_id`` (equal) or ``redirect`` (the old
        id answers 308 to the operation that holds its key), ``error`` or None."""
        out: dict[str, Any] = {"key": entry.idempotency_key, "status": None,
                               "old_id": entry.operation_id, "new_id": None, "identity": None}
        if not self.admin_token:
            return {**out, "error": "no admin token (env.json: tokens.admin): the replay uses "
                                    "an admin-only route"}
        body = {"project": entry.project, "idempotency_key": entry.idempotency_key,
                "operation_id": entry.operation_id, "spec": dict(entry.request or {}),
                "acknowledged_at": entry.acked_at.isoformat(), "restore_id": restore_id,
                "redirect_if_key_taken": True}
        try:
            r = self.http.post(RESTORE_ROUTE, json=body, timeout=10.0,
                               headers={"Authorization": f"Bearer {self.admin_token}"})
        except httpx.HTTPError as exc:
            return {**out, "error": f"{type(exc).__name__}: {exc}"}
        out["status"] = r.status_code
        if r.status_code not in (200, 201):
            return {**out, "error": r.text[:300]}
        out["new_id"] = r.json().get("id")
        same = str(out["new_id"]).lower() == entry.operation_id.lower()
        return {**out, "identity": "same_id" if same else "redirect", "error": None}

    def cancel_held(self, queue: str = HELD_QUEUE, reason: str = "harness load done") -> int:
        """Cancel every waiting operation of the held queue the harness's cheap submissions
        went to (admin route, a bounded batch per call): a held backlog costs every gauge
        pass that counts waiting work. The number canceled; PlatformError on a refusal."""
        if not self.admin_token:
            raise PlatformError("no admin token (env.json: tokens.admin): canceling a held "
                                "queue uses an admin-only route")
        total = 0
        while True:
            try:
                r = self.http.post(CANCEL_HELD_ROUTE.format(queue=queue), timeout=60.0,
                                   json={"reason": reason},
                                   headers={"Authorization": f"Bearer {self.admin_token}"})
            except httpx.HTTPError as exc:
                raise PlatformError(f"cancel held queue {queue}: {type(exc).__name__}: "
                                    f"{exc}") from exc
            if r.status_code != 200:
                raise PlatformError(f"cancel held queue {queue}: HTTP {r.status_code} "
                                    f"{r.text[:300]}")
            n = int(r.json()["canceled"])
            total += n
            if n == 0:
                return total

    def late_report(self, attempt: dict[str, Any]) -> dict[str, Any]:
        """What a partitioned agent sends once it is back: the events it buffered and its
        success, with the fencing token of the attempt it lost. Fencing must refuse both (409);
        what the store kept is judged from the evidence (the fencing invariant)."""
        if not self.agent_token:
            raise PlatformError("late_report needs the agent token (env.json: tokens.agent)")
        headers = {"Authorization": f"Bearer {self.agent_token}",
                   "X-Agent-Name": str(attempt.get("agent_name") or "unknown")}
        base = f"/v1/attempts/{attempt['id']}"
        token = attempt["fencing_token"]
        try:
            events = self.http.post(f"{base}/events", headers=headers, json={
                "fencing_token": token, "events": [
                    {"kind": "log", "message": "late report from the partitioned agent",
                     "data": {"late": True}}]})
            report = self.http.post(f"{base}/report", headers=headers, json={
                "fencing_token": token, "state": "succeeded", "result": {"late": True}})
        except httpx.HTTPError as exc:
            raise PlatformError(f"late report for attempt {attempt['id']}: {exc}") from exc
        return {"events_status": events.status_code, "report_status": report.status_code,
                "refused": events.status_code == 409 and report.status_code == 409}

    def fault_targets(self) -> dict[str, str]:
        return {"api-replica": "api-1"}

    def applicability(self, experiment: str) -> str | None:
        return None  # the reference control plane is the target every experiment is written for

    # -- evidence --------------------------------------------------------------------------
    def snapshot(self, out_dir: Path, since: datetime | None = None) -> dict[str, int]:
        """Write snapshot/{operations,attempts,events,agents,agent_liveness,objects}.jsonl and the
        pipelines' snapshot/{pipelines,pipeline_steps,pipeline_events,side_effects}.jsonl
        (docs/EVIDENCE.md) for what was created at or after ``since`` (the run's start)."""
        import psycopg
        from psycopg.rows import dict_row

        if not self.admin_dsn:
            raise PlatformError("snapshot needs the control plane's database DSN")
        out = out_dir / "snapshot"
        out.mkdir(parents=True, exist_ok=True)
        counts: dict[str, int] = {}
        with psycopg.connect(self.admin_dsn, row_factory=dict_row, connect_timeout=5) as conn:
            params = {"since": since or _EPOCH}
            ops: set[str] = set()
            for name, sql in (("operations", _OPS_SQL), ("attempts", _ATTEMPTS_SQL),
                              ("events", _EVENTS_SQL), ("agents", _AGENTS_SQL),
                              ("pipelines", _PIPELINES_SQL),
                              ("pipeline_steps", _PIPELINE_STEPS_SQL),
                              ("pipeline_events", _PIPELINE_EVENTS_SQL),
                              ("side_effects", _SIDE_EFFECTS_SQL),
                              ("agent_liveness", _LIVENESS_SQL)):
                rows = conn.execute(sql, params if "%(since)s" in sql else None).fetchall()
                write_jsonl(out / f"{name}.jsonl", rows)
                counts[name] = len(rows)
                if name == "operations":
                    ops = {r["id"] for r in rows}
        counts["objects"] = snapshot_objects(self.s3_endpoint, self.bucket,
                                             out / "objects.jsonl", self.region,
                                             operations=None if since is None else ops)
        return counts


def read_store(dsn: str, since: datetime) -> dict[str, Any]:
    """The rows a snapshot holds (operations created at or after ``since``, their attempts and
    events, every agent) read in one READ ONLY transaction, plus the database's ``now``: what
    `gameday cost report --dsn` prices. Changes nothing in the store."""
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(dsn, row_factory=dict_row, connect_timeout=5) as conn:
        conn.read_only = True
        with conn.transaction():
            now = conn.execute("SELECT now() AS now").fetchone()["now"]  # type: ignore[index]
            rows: dict[str, Any] = {"now": now}
            for name, sql in (("operations", _OPS_SQL), ("attempts", _ATTEMPTS_SQL),
                              ("events", _EVENTS_SQL), ("agents", _AGENTS_SQL)):
                rows[name] = conn.execute(sql, {"since": since} if "%(since)s" in sql
                                          else None).fetchall()
    return rows


def s3_client(endpoint: str | None, bucket: str, region: str | None = None) -> Any:
    """The local S3 endpoint (moto, test keys), or with no endpoint real AWS S3 in ``region``
    through the default credential chain (IRSA in the game-day pod)."""
    if endpoint:
        from controlplane.storage import StorageConfig, make_s3_client

        return make_s3_client(StorageConfig(endpoint, bucket=bucket, read_timeout=10))
    if not region:
        raise PlatformError("object storage: neither an S3 endpoint nor an AWS region is known")
    import boto3

    return boto3.client("s3", region_name=region)


def snapshot_objects(endpoint: str | None, bucket: str, path: Path, region: str | None = None,
                     operations: set[str] | None = None) -> int:
    """objects.jsonl of a platform snapshot; empty when the environment names no object store."""
    if not (endpoint or region):
        path.write_text("")
        return 0
    return write_objects(s3_client(endpoint, bucket, region), bucket, path, operations)


# Object layout docs/CONTRACTS.md section 3: checkpoints/<op>/..., artifacts/<op>/...,
# local-checkpoints/<op>/... (the records of node-local checkpoints). The evidence reads every
# object under these (write_objects); the cloud game-day role may read exactly these
# (provisioning/components/identity.py).
EVIDENCE_PREFIXES = ("checkpoints", "artifacts", "local-checkpoints")


def _belongs(key: str, operations: set[str] | None) -> bool:
    if operations is None:
        return True
    parts = key.split("/", 2)
    return len(parts) > 2 and parts[0] in EVIDENCE_PREFIXES and parts[1] in operations


def write_objects(s3: Any, bucket: str, path: Path, operations: set[str] | None = None) -> int:
    """snapshot/objects.jsonl: the bucket's listing with sha256, manifests parsed (shared by
    every adapter whose platform writes to the environment's S3 store, and cloud runs); only
    the objects of ``operations`` when given (this run's)."""
    listing = [obj for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
               for obj in page.get("Contents", []) if _belongs(obj["Key"], operations)]

    def row_of(obj: dict[str, Any]) -> dict[str, Any]:
        body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        row: dict[str, Any] = {"key": obj["Key"], "size": obj["Size"],
                               "etag": obj.get("ETag", "").strip('"'),
                               "sha256": hashlib.sha256(body).hexdigest(), "content": None}
        if obj["Key"].endswith(("MANIFEST.json", "COMPLETE.json")) or obj["Key"].startswith(
                "local-checkpoints/"):
            try:
                row["content"] = json.loads(body)
            except ValueError:
                row["content"] = None  # a torn manifest is evidence too
        return row

    # every object is read to verify manifest checksums: thousands after a core suite, so fetch
    # in parallel (boto3 clients are thread-safe)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        rows = list(pool.map(row_of, listing))
    write_jsonl(path, rows)
    return len(rows)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.writelines(json.dumps({k: _jsonable(v) for k, v in r.items()}, default=str) + "\n" for r in rows)
    tmp.replace(path)

"""Adapter for Prefect 3 (a control plane we did not write), over its REST API only.

The harness never imports ``prefect`` (its pins would fight ours; it lives in ``.venv-prefect``).
Everything goes through ``httpx`` to the server's ``/api``:

============================  ==================================================================
harness                       Prefect
============================  ==================================================================
submit (idempotency key)      ``POST /deployments/{id}/create_flow_run`` with ``idempotency_key``
                              (201 new; 200 and the *same* flow run for a repeated key, whatever
                              the payload: Prefect never answers 409, see ``FINDINGS``)
operation                     flow run (id = operation id, project ``prefect``)
queue / capacity pool         work pool (``cpu-pool``, ``gpu-pool``) and its process workers
attempt                       one pass through PENDING -> RUNNING -> end in the state history
                              (``run_count`` is the attempt number the flow writes under)
events                        state history (``to_state``) + the flow's own run logs: the sample
                              workload's ``@event`` lines (progress, checkpoint_*, artifact_written,
                              resumed) and the worker's "submitting flow run" line (agent name)
cancel                        ``set_state`` CANCELLING (running) or CANCELLED (not yet picked up)
healthy                       ``GET /ready`` (503 when Prefect cannot reach its database)
pipeline                      a flow run of the pipeline flow (platforms/prefect_pipeline.py),
                              its steps the flow's task runs (prefect_pipeline_records.py)
============================  ==================================================================

States are mapped to the harness vocabulary (docs/CONTRACTS.md): SCHEDULED -> queued (LATE too,
with a pending reason), PENDING -> dispatched (a worker took it and is starting the process),
RUNNING/CANCELLING -> running, COMPLETED -> succeeded, FAILED/CRASHED -> failed,
CANCELLED -> canceled, PAUSED -> blocked.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from platforms import prefect_pipeline_records as pipes
from platforms.base import Ack, OperationView, PlatformError, SubmitRequest, Workload
from platforms.controlplane import s3_client, snapshot_objects, write_jsonl
from platforms.prefect_logs import TERMINAL, parse_event

PROJECT = "prefect"
STATE_MAP = {"SCHEDULED": "queued", "PENDING": "dispatched", "RUNNING": "running",
             "CANCELLING": "running", "COMPLETED": "succeeded", "FAILED": "failed",
             "CRASHED": "failed", "CANCELLED": "canceled", "PAUSED": "blocked"}
# harness state -> Prefect state types (for list filters)
TYPES_OF = {"queued": ["SCHEDULED"], "accepted": ["SCHEDULED"], "dispatched": ["PENDING"],
            "running": ["RUNNING", "CANCELLING"], "succeeded": ["COMPLETED"],
            "failed": ["FAILED", "CRASHED"], "canceled": ["CANCELLED"], "blocked": ["PAUSED"],
            "retrying": ["AWAITINGRETRY"]}
_WORKER_LINE = re.compile(r"Worker '(?P<name>[^']+)' submitting flow run")

# Which experiments make sense for Prefect, and why not when they do not (the game day reports
# the reason instead of skipping silently).
NOT_APPLICABLE: dict[str, str] = {
    "agent-connectivity-loss": (
        "no leases/fencing tokens to test: a Prefect process worker holds no lease on a flow run "
        "and reports carry no fencing token, so there is no stale report to refuse "
        "(the experiment's stale_report_refused probe is control-plane specific)"),
    "registry-failure": (
        "no image pull: Prefect process workers run the flow in a local process from the "
        "worker's own virtualenv, no registry is on the start path"),
    "ineligible-fallback-region": (
        "no region eligibility rules: a Prefect flow run is routed by work pool only, there is "
        "no region/dataset constraint that could be violated by a fallback"),
    "credential-rotation": (
        "rotates the reference control plane's agent/project tokens and its database role's "
        "password; Prefect's API keys and database are not driven by this experiment"),
    "tracking-outage": (
        "judges the reference control plane's training workload logging to MLflow through its "
        "own tracking sink (controlplane/workload/tracking.py); the Prefect flow does not log to "
        "a tracking server, and the plain MLflow client's behaviour is measured apart (docs/"
        "tracking.md)"),
    "zone-outage": (
        "the Prefect server and its process workers belong to no zone in the local environment "
        "(env.json zones lists the reference control plane's replicas and agents only), so a "
        "zone outage would take only a database member: not a rehearsal of this class"),
    "db-restore-from-backup": (
        "the restore order (environments/local/backup.py) stops and restarts the reference control "
        "plane's API, reconciler and agents and reconciles its operations table; Prefect's "
        "server, workers and flow-run tables would need their own restore order"),
}
APPLICABLE = {"api-replica-loss", "db-primary-loss", "artifact-store-unavailable",
              "node-pool-exhausted", "node-interruption-checkpoint", "pipeline-recovery"}

# What the game days found about Prefect 3 (stated in docs/adapters.md and the lead's report;
# each names the evidence that shows it).
FINDINGS = {
    "idempotency-payload-ignored": (
        "a repeated idempotency key returns the existing flow run (HTTP 200) even when the "
        "parameters differ; our control plane answers 409 for a different payload"),
    # pipeline-recovery (platforms/prefect_pipeline.py; docs/adapters.md section 6)
    "default-cache-never-cross-run": (
        "DEFAULT = INPUTS + TASK_SOURCE + RUN_ID (prefect/cache_policies.py): the default policy "
        "never reuses a result across flow runs"),
    "inputs-cache-keys-names-not-bytes": (
        "INPUTS + TASK_SOURCE with persisted results reuses prepare after the bytes behind the "
        "same dataset name/uri changed (snapshot/pipeline_steps.jsonl: state reused, "
        "inputs.digests != manifest.inputs; invariant stale-cache-reuse)"),
    "task-retry-repeats-side-effect": (
        "a task retry after a lost answer registers a second model version with the same task "
        "run id and no receipt (snapshot/side_effects.jsonl; invariant side-effect-once)"),
    "killed-flow-run-never-recovered": (
        "a flow run whose worker process died stays RUNNING; Prefect's documented zombie "
        "automation (environments/local/prefect.py) sets it CRASHED, nothing resumes it from a "
        "checkpoint and its task runs stay RUNNING (snapshot/pipelines.jsonl state failed; "
        "probe interrupted-candidate-resumed-from-checkpoint)"),
    "task-run-cache-key-not-recorded": (
        "task_run.cache_key is null; the key is visible only as the result record's storage_key"),
}

Recorder = Callable[[dict[str, Any]], None]


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _route(path: str) -> str:
    return "/api" + re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "{id}",
                           path)


class PrefectAdapter:
    name = "prefect"
    project = PROJECT

    def __init__(self, api_url: str, deployments: dict[str, str], *,
                 s3_endpoint: str | None = None, bucket: str = "ml-artifacts",
                 pools: dict[str, str] | None = None, timeout: float = 5.0,
                 recorder: Recorder | None = None,
                 pipeline_deployment: str | None = None) -> None:
        if not deployments:
            raise PlatformError("no Prefect deployment known (env.json: endpoints."
                                "prefect_deployments); was the environment brought up with "
                                "platform 'prefect'?")
        self.api_url = api_url.rstrip("/")
        self.deployments = dict(deployments)  # capacity pool -> deployment id
        self.pools = pools or {p: f"{p}-pool" for p in deployments}
        self.s3_endpoint, self.bucket = s3_endpoint, bucket
        self.recorder = recorder
        self.pipeline_deployment = pipeline_deployment
        self.http = httpx.Client(base_url=self.api_url, timeout=timeout)

    @classmethod
    def from_env(cls, endpoints: dict[str, Any], tokens: dict[str, Any]) -> PrefectAdapter:
        if not endpoints.get("prefect_api"):
            raise PlatformError("environment has no Prefect server (env.json: endpoints."
                                "prefect_api); bring it up with `gameday env up --platform prefect`")
        return cls(endpoints["prefect_api"], endpoints.get("prefect_deployments") or {},
                   s3_endpoint=endpoints.get("s3_direct") or endpoints.get("s3"),
                   bucket=endpoints.get("bucket", "ml-artifacts"),
                   pools=endpoints.get("prefect_pools"),
                   pipeline_deployment=endpoints.get("prefect_pipeline_deployment"))

    # -- HTTP ------------------------------------------------------------------------------
    def _call(self, method: str, path: str, what: str, ok: tuple[int, ...] = (200, 201),
              **kw: Any) -> httpx.Response:
        sent = _now()
        started = time.monotonic()
        status: int | None = None
        error: str | None = None
        try:
            r = self.http.request(method, path, **kw)
            status = r.status_code
        except httpx.HTTPError as exc:
            error = type(exc).__name__
            raise PlatformError(f"{what}: {type(exc).__name__}: {exc}") from exc
        finally:
            if self.recorder is not None:
                self.recorder({"time": sent, "method": method, "route": _route(path),
                               "status": status, "error": error,
                               "latency_ms": round((time.monotonic() - started) * 1000, 2)})
        if r.status_code not in ok:
            raise PlatformError(f"{what}: HTTP {r.status_code}: {r.text[:300]}")
        return r

    # -- work ------------------------------------------------------------------------------
    def pool_for(self, w: Workload) -> str:
        pool = "gpu" if w.accelerators else "cpu"
        if pool not in self.deployments:
            raise PlatformError(f"no Prefect deployment for pool {pool!r} "
                                f"(known: {sorted(self.deployments)})")
        return pool

    def submit(self, req: SubmitRequest) -> Ack:
        w = req.workload
        pool = self.pool_for(w)
        params = {"steps": w.steps, "checkpoint_every": w.checkpoint_every, "seed": w.seed,
                  "step_delay": w.step_delay}
        if w.checkpoint_commit_delay:
            params["checkpoint_commit_delay"] = w.checkpoint_commit_delay
        body = {"parameters": params,
                "idempotency_key": req.idempotency_key,
                "tags": ["gameday", f"queue:{w.queue}", f"pool:{pool}"]}
        r = self._call("POST", f"/deployments/{self.deployments[pool]}/create_flow_run",
                       "submit", json=body)
        return Ack(r.json()["id"], req.idempotency_key, r.status_code, _now())

    def _view(self, fr: dict[str, Any]) -> OperationView:
        state = fr.get("state") or {}
        typ, name = state.get("type", "SCHEDULED"), state.get("name") or ""
        mapped = STATE_MAP.get(typ, "queued")
        reason = state.get("message") or name or None
        pending = None
        if mapped == "queued":
            pool = fr.get("work_pool_name") or "?"
            pending = (f"late: no worker of work pool {pool} picked it up" if name == "Late"
                       else f"waiting for a worker of work pool {pool}")
            reason = pending
        return OperationView(fr["id"], mapped, reason, pending)

    def get(self, operation_id: str, *, timeline: bool = False) -> OperationView:
        r = self._call("GET", f"/flow_runs/{operation_id}", f"get {operation_id}", ok=(200,))
        fr = r.json()
        view = self._view(fr)
        if timeline or view.state == "succeeded":
            history = self._states(operation_id)
            logs = self._logs([operation_id]).get(operation_id, [])
            view.attempts, view.events = _timeline(fr, history, logs)
            view.result = _result(fr, view.events) if view.state == "succeeded" else None
        return view

    def list(self, state: str | None = None, limit: int = 100) -> list[OperationView]:
        flt: dict[str, Any] = {"deployment_id": {"any_": list(self.deployments.values())}}
        body: dict[str, Any] = {"flow_runs": {}, "deployments": {"id": flt["deployment_id"]},
                                "limit": limit, "sort": "START_TIME_DESC"}
        if state:
            if state not in TYPES_OF:
                raise PlatformError(f"list: unknown state {state!r}")
            body["flow_runs"]["state"] = {"type": {"any_": TYPES_OF[state]}}
        out: list[dict[str, Any]] = []
        while len(out) < limit:  # Prefect caps a page at 200
            page = min(200, limit - len(out))
            r = self._call("POST", "/flow_runs/filter", "list", ok=(200,),
                           json={**body, "limit": page, "offset": len(out)})
            rows = r.json()
            out += rows
            if len(rows) < page:
                break
        return [self._view(fr) for fr in out]

    def cancel(self, operation_id: str, reason: str = "") -> OperationView:
        view = self.get(operation_id)
        if view.terminal:
            return view
        # not yet picked up: nothing runs, cancel outright; else the worker kills the process
        target = "CANCELLED" if view.state in ("queued", "blocked") else "CANCELLING"
        self._call("POST", f"/flow_runs/{operation_id}/set_state", f"cancel {operation_id}",
                   json={"state": {"type": target,
                                   "message": reason or "canceled by the harness"}})
        return self.get(operation_id)

    # -- pipelines (the pipeline flow: platforms/prefect_pipeline.py) -----------------------
    @property
    def pinned_image(self) -> str:
        """No image: process workers run the flow from the worker's virtualenv."""
        return "prefect-process-worker:.venv-prefect"

    def _pipeline_deployment(self) -> str:
        if not self.pipeline_deployment:
            raise PlatformError("no Prefect pipeline deployment known (env.json: endpoints."
                                "prefect_pipeline_deployment); bring the environment up again "
                                "with `gameday env up --platform prefect`")
        return self.pipeline_deployment

    def submit_pipeline(self, body: dict[str, Any], key: str) -> dict[str, Any]:
        """One flow run of the pipeline flow; the key is Prefect's idempotency key."""
        try:
            params = pipes.submission(body, None, self.bucket)  # the worker's S3 endpoint
        except ValueError as exc:
            raise PlatformError(f"submit pipeline: {exc}") from exc
        r = self._call("POST", f"/deployments/{self._pipeline_deployment()}/create_flow_run",
                       "submit pipeline", json={"parameters": params, "idempotency_key": key,
                                                "tags": ["gameday", "pipeline"]})
        fr = r.json()
        return {"id": fr["id"], "state": pipes.FLOW_STATE.get(
            (fr.get("state") or {}).get("type") or "SCHEDULED", "running"), "status": r.status_code}

    def _task_runs(self, flow_run_ids: list[str]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for chunk in range(0, len(flow_run_ids), 50):
            r = self._call("POST", "/task_runs/filter", "task runs", ok=(200,),
                           json={"flow_runs": {"id": {"any_": flow_run_ids[chunk:chunk + 50]}},
                                 "limit": 200, "sort": "EXPECTED_START_TIME_ASC"})
            out += r.json()
        return out

    def _settled_task_runs(self, flow_run_ids: list[str], wait: float = 10.0,
                           ) -> list[dict[str, Any]]:
        """Task runs of flow runs that have ended: Prefect 3 writes task-run records through its
        event pipeline, so they lag the flow run's final state (docs/adapters.md section 6);
        read until two reads 1 s apart agree (at most ``wait`` seconds)."""
        seen = self._task_runs(flow_run_ids)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            time.sleep(1.0)
            again = self._task_runs(flow_run_ids)
            if ({(t["id"], t.get("state_id")) for t in again}
                    == {(t["id"], t.get("state_id")) for t in seen}):
                return again
            seen = again
        return seen

    def _registry(self, flow_run_id: str) -> list[dict[str, Any]]:
        """The registrations the register task wrote (registry/<flow_run_id>/...)."""
        if not self.s3_endpoint:
            return []
        s3 = s3_client(self.s3_endpoint, self.bucket)
        try:
            listed = s3.list_objects_v2(Bucket=self.bucket,
                                        Prefix=f"{pipes.REGISTRY_PREFIX}{flow_run_id}/")
            out = []
            for o in listed.get("Contents") or []:
                raw = s3.get_object(Bucket=self.bucket, Key=o["Key"])["Body"].read()
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {}
                out.append({"key": o["Key"], "last_modified": o["LastModified"].isoformat(),
                            "body": body})
        except Exception as exc:
            raise PlatformError(f"registry of {flow_run_id}: {type(exc).__name__}: {exc}") from exc
        return sorted(out, key=lambda o: o["last_modified"])

    def _pipeline_records(self, fr: dict[str, Any], task_runs: list[dict[str, Any]],
                          logs: list[dict[str, Any]], registry: bool,
                          accepted: dict[str, dict[str, Any]] | None = None) -> tuple[Any, ...]:
        return pipes.pipeline_records(fr, task_runs, logs,
                                      self._registry(fr["id"]) if registry else None, accepted)

    def pipeline(self, pipeline_id: str) -> dict[str, Any]:
        fr = self._call("GET", f"/flow_runs/{pipeline_id}", f"pipeline {pipeline_id}",
                        ok=(200,)).json()
        done = (fr.get("state") or {}).get("type") in TERMINAL
        trs = (self._settled_task_runs if done else self._task_runs)([pipeline_id])
        p, steps, _, _ = self._pipeline_records(
            fr, trs, self._logs([pipeline_id]).get(pipeline_id, []), registry=False)
        return pipes.view(p, steps)

    def record_side_effect(self, operation_id: str, action_id: str, kind: str,
                           payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Prefect has no side-effect API to send a registration to again: the lost answer is
        rehearsed inside the flow (register's first attempt loses its answer, Prefect's task
        retry runs it again). Answers with what the registry holds, never a receipt (status 0:
        no request was sent)."""
        found = self._registry(operation_id)
        return 0, {"created": None, "receipt": None, "registrations": len(found),
                   "action_ids": sorted({str((o["body"] or {}).get("action_id")) for o in found}),
                   "not_applicable": "Prefect offers no side-effect receipts or an API to "
                                     "resend one; the retry after a lost answer is Prefect's "
                                     "own task retry of register (platforms/prefect_pipeline.py)"}

    def put_object(self, key: str, data: bytes) -> None:
        try:
            s3_client(self.s3_endpoint, self.bucket).put_object(Bucket=self.bucket, Key=key,
                                                                Body=data)
        except Exception as exc:
            raise PlatformError(f"put {key}: {type(exc).__name__}: {exc}") from exc

    def healthy(self) -> tuple[bool, str]:
        try:
            r = self.http.get("/ready", timeout=2.0)
        except httpx.HTTPError as exc:
            return False, f"Prefect API unreachable: {type(exc).__name__}"
        if r.status_code != 200:
            return False, f"/api/ready {r.status_code}: {r.text[:120]}"
        return True, "/api/ready 200"

    def results_location(self, operation_id: str) -> str:
        return f"s3://{self.bucket}/artifacts/{operation_id}/"

    def components(self) -> dict[str, str]:
        return {"prefect-server": "Prefect API server + services (one process)",
                "db": "PostgreSQL primary + synchronous standby (database 'prefect', via HAProxy)",
                "workers": "Prefect process workers, one per work pool (capacity pools)",
                "artifact-store": "S3 bucket (checkpoints/artifacts written by the flow)"}

    def fault_targets(self) -> dict[str, str]:
        targets = {"api-replica": "prefect-server"}
        targets.update({f"pool:{p}": f"prefect-{p}" for p in self.deployments})
        return targets

    def applicability(self, experiment: str) -> str | None:
        if experiment in NOT_APPLICABLE:
            return NOT_APPLICABLE[experiment]
        if experiment in APPLICABLE:
            return None
        return "not assessed for Prefect yet (add it to platforms/prefect.py)"

    # -- raw records -----------------------------------------------------------------------
    def _states(self, flow_run_id: str) -> list[dict[str, Any]]:
        r = self._call("GET", "/flow_run_states/", f"states {flow_run_id}", ok=(200,),
                       params={"flow_run_id": flow_run_id})
        return sorted(r.json(), key=lambda s: s["timestamp"])

    def _logs(self, flow_run_ids: list[str], page: int = 200) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {i: [] for i in flow_run_ids}
        for chunk in range(0, len(flow_run_ids), 50):
            ids = flow_run_ids[chunk:chunk + 50]
            offset = 0
            while True:
                r = self._call("POST", "/logs/filter", "logs", ok=(200,),
                               json={"logs": {"flow_run_id": {"any_": ids}}, "limit": page,
                                     "offset": offset, "sort": "TIMESTAMP_ASC"})
                rows = r.json()
                for row in rows:
                    out.setdefault(row.get("flow_run_id"), []).append(row)
                if len(rows) < page:
                    break
                offset += page
        return out

    def _all_flow_runs(self, page: int = 200) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = []
        offset = 0
        while True:
            r = self._call("POST", "/flow_runs/filter", "snapshot", ok=(200,),
                           json={"deployments": {"id": {"any_": list(self.deployments.values())}},
                                 "limit": page, "offset": offset, "sort": "START_TIME_DESC"})
            rows = r.json()
            runs += rows
            if len(rows) < page:
                return runs
            offset += page

    # -- evidence --------------------------------------------------------------------------
    def snapshot(self, out_dir: Path, since: datetime | None = None) -> dict[str, int]:
        """Write snapshot/{operations,attempts,events,objects}.jsonl (docs/EVIDENCE.md) from
        Prefect's flow runs created at or after ``since`` (the run's start), their state
        history and their logs."""
        out = out_dir / "snapshot"
        out.mkdir(parents=True, exist_ok=True)
        runs = sorted((f for f in self._all_flow_runs()
                       if since is None or _time(f["created"]) >= since), key=lambda f: f["created"])
        logs = self._logs([f["id"] for f in runs])
        ops, attempts, events = [], [], []
        for fr in runs:
            view = self._view(fr)
            atts, evs = _timeline(fr, self._states(fr["id"]), logs.get(fr["id"], []))
            params = fr.get("parameters") or {}
            tags = fr.get("tags") or []
            queue = next((t.split(":", 1)[1] for t in tags if t.startswith("queue:")),
                         fr.get("work_queue_name") or "default")
            ops.append({
                "id": fr["id"], "project": PROJECT, "state": view.state,
                "state_reason": view.state_reason, "pending_reason": view.pending_reason,
                "idempotency_key": fr.get("idempotency_key"), "created_at": fr["created"],
                "updated_at": fr.get("updated"), "queue": queue,
                "workload": {"kind": "train", "params": params},
                "attempt_count": len(atts), "name": fr.get("name"),
                "work_pool": fr.get("work_pool_name"), "prefect_state": (fr.get("state") or {}).get("type"),
                "result": _result(fr, evs) if view.state == "succeeded" else None})
            attempts += atts
            events += evs
        for name, rows in (("operations", ops), ("attempts", attempts), ("events", events)):
            write_jsonl(out / f"{name}.jsonl", rows)
        counts = {"operations": len(ops), "attempts": len(attempts), "events": len(events)}
        counts.update(self._snapshot_pipelines(out, since))
        counts["objects"] = snapshot_objects(
            self.s3_endpoint, self.bucket, out / "objects.jsonl",
            operations=None if since is None else {o["id"] for o in ops})
        return counts


    def _snapshot_pipelines(self, out: Path, since: datetime | None) -> dict[str, int]:
        """snapshot/{pipelines,pipeline_steps,pipeline_events,side_effects}.jsonl from the
        pipeline flow's runs (platforms/prefect_pipeline_records.py); none are written when no
        pipeline deployment exists (older environment): the invariants then have no data."""
        if not self.pipeline_deployment:
            return {}
        runs: list[dict[str, Any]] = []
        offset = 0
        while True:
            r = self._call("POST", "/flow_runs/filter", "snapshot pipelines", ok=(200,),
                           json={"deployments": {"id": {"any_": [self.pipeline_deployment]}},
                                 "limit": 200, "offset": offset, "sort": "START_TIME_DESC"})
            rows = r.json()
            runs += rows
            if len(rows) < 200:
                break
            offset += 200
        runs = sorted((f for f in runs if since is None or _time(f["created"]) >= since),
                      key=lambda f: f["created"])
        ids = [f["id"] for f in runs]
        logs = self._logs(ids)
        trs: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
        for tr in self._settled_task_runs(ids) if ids else []:
            trs.setdefault(tr.get("flow_run_id"), []).append(tr)
        registry = {i: self._registry(i) for i in ids}
        first = [pipes.pipeline_records(f, trs[f["id"]], logs.get(f["id"], []), registry[f["id"]])
                 for f in runs]
        accepted = pipes.accepted_results([s for rec in first for s in rec[1]])
        files: dict[str, list[dict[str, Any]]] = {"pipelines": [], "pipeline_steps": [],
                                                   "pipeline_events": [], "side_effects": []}
        for f in runs:
            p, steps, evs, effects = pipes.pipeline_records(
                f, trs[f["id"]], logs.get(f["id"], []), registry[f["id"]], accepted)
            files["pipelines"].append(p)
            files["pipeline_steps"] += steps
            files["pipeline_events"] += evs
            files["side_effects"] += effects
        for name, rows in files.items():
            write_jsonl(out / f"{name}.jsonl", rows)
        return {name: len(rows) for name, rows in files.items()}


# -- mapping Prefect records to the evidence format ------------------------------------------
def _event(op: str, attempt: str | None, time_: str, kind: str, *, from_state: str | None = None,
           to_state: str | None = None, reason: str | None = None, data: dict | None = None,
           actor: str = "prefect") -> dict[str, Any]:
    return {"operation_id": op, "attempt_id": attempt, "time": time_, "actor": actor,
            "kind": kind, "from_state": from_state, "to_state": to_state, "reason": reason,
            "data": data or {}}


def _time(value: str) -> datetime:
    d = datetime.fromisoformat(value)
    return d if d.tzinfo else d.replace(tzinfo=UTC)


def _timeline(fr: dict[str, Any], history: list[dict[str, Any]],
              logs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Attempts and events of one flow run from its state history and logs."""
    op = fr["id"]
    attempts: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    prev: str | None = None
    if not history or STATE_MAP.get(history[0]["type"]) != "queued":
        # the run was created in a state other than SCHEDULED: still record that it was accepted
        events.append(_event(op, None, fr["created"], "state", to_state="queued",
                             reason="flow run created"))
        prev = "queued"
    current: dict[str, Any] | None = None
    for st in history:
        typ, t = st["type"], st["timestamp"]
        mapped = STATE_MAP.get(typ, "queued")
        starts = (mapped == "dispatched" and (current is None or current["state"] not in
                                              ("dispatched",))) or \
                 (mapped == "running" and (current is None or current["state"] not in
                                           ("dispatched", "running")))
        if starts:
            current = {"id": f"{op}-{len(attempts) + 1}", "operation_id": op,
                       "number": len(attempts) + 1, "agent_name": None, "state": "dispatched",
                       "created_at": t, "started_at": None, "finished_at": None, "error": None,
                       "result": None}
            attempts.append(current)
        if current is not None:
            if mapped == "running" and current["state"] == "dispatched":
                current["state"], current["started_at"] = "running", t
            elif typ in TERMINAL:
                current["finished_at"] = t
                current["state"] = {"COMPLETED": "succeeded", "FAILED": "failed",
                                    "CRASHED": "lost", "CANCELLED": "canceled"}[typ]
                if typ in ("FAILED", "CRASHED"):
                    current["error"] = {"kind": typ.lower(), "message": st.get("message")}
                current = None
            elif mapped == "queued":  # rescheduled (e.g. retry/reschedule): attempt over
                current["state"], current["finished_at"] = "lost", t
                current = None
        if mapped != prev:
            events.append(_event(op, attempts[-1]["id"] if attempts and mapped != "queued"
                                 else None, t, "state", from_state=prev, to_state=mapped,
                                 reason=st.get("message") or st.get("name")))
            prev = mapped
    # the flow's own events and the worker's log line (who runs it)
    for row in logs:
        msg, t = row.get("message") or "", row["timestamp"]
        attempt = _attempt_at(attempts, t)
        m = _WORKER_LINE.search(msg)
        if m and attempt is not None and not attempt["agent_name"]:
            attempt["agent_name"] = m["name"]
        body = parse_event(msg)
        if body is not None:
            data = dict(body.get("data") or {})
            if body.get("kind") == "log" and data.get("agent_name") and attempt is not None:
                attempt["agent_name"] = data["agent_name"]
            events.append(_event(op, attempt["id"] if attempt else None, t,
                                 str(body.get("kind", "log")), reason=body.get("message"),
                                 data=data, actor="flow"))
        else:
            events.append(_event(op, attempt["id"] if attempt else None, t, "log",
                                 reason=msg[:500], actor=row.get("name") or "prefect"))
    for a in attempts:
        a["agent_name"] = a["agent_name"] or "prefect-worker"
    events.sort(key=lambda e: e["time"])
    return attempts, events


def _attempt_at(attempts: list[dict[str, Any]], t: str) -> dict[str, Any] | None:
    found = None
    for a in attempts:
        if a["created_at"] <= t:
            found = a
    return found or (attempts[0] if attempts else None)


def _result(fr: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    art = [e for e in events if e["kind"] == "artifact_written"]
    resumed = [e for e in events if e["kind"] == "resumed"]
    res: dict[str, Any] = {"flow_run": fr.get("name"), "resumed_from_step":
                           resumed[-1]["data"].get("from_step") if resumed else 0}
    if art:
        d = art[-1]["data"]
        res.update(artifacts_prefix=d.get("prefix"), weights_sha256=d.get("weights_sha256"),
                   files=d.get("files"))
    reg = [e for e in events if e["kind"] == "step_result"
           and (e["data"] or {}).get("step") == "register"]
    if reg:  # a pipeline flow run: the registration its register task returned
        r = reg[-1]["data"].get("registration") or {}
        res["side_effect"] = {"action_id": r.get("action_id"), "key": r.get("key"),
                              "receipt": None}
    res["torn_checkpoints_skipped"] = len([e for e in events
                                           if e["kind"] == "checkpoint_skipped_torn"])
    return res

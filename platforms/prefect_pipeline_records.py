"""Prefect pipeline records -> the pipeline evidence of docs/EVIDENCE.md (pure, no I/O).

One pipeline of the harness is one flow run of ``platforms.prefect_pipeline.gameday_pipeline``;
its steps are the flow's task runs (``task_run_name`` = step name). What each evidence field is
made of (so slo/pipelines.py judges Prefect with the same invariants as our control plane):

================================  ==============================================================
evidence                          Prefect
================================  ==============================================================
pipeline (id, state, report)      flow run (id, state type mapped as for operations), the flow's
                                  ``@event pipeline_report`` log line, the submitted spec
                                  (flow parameter ``spec``)
step state                        task run: state name ``Cached`` -> ``reused``, other COMPLETED
                                  -> ``succeeded``, FAILED/CRASHED -> ``failed``, RUNNING (and a
                                  retry waiting) -> ``running``; no task run: ``waiting`` while
                                  the flow runs, ``skipped`` after (``failed`` "release refused"
                                  when the flow logged ``release_refused``)
step operation_id                 the flow run id (every task runs in the flow run's process)
step cache_key                    what Prefect's cache policy computed: Prefect 3.9.1 leaves
                                  the task run's ``cache_key`` null and stores the result record
                                  under the key, so the key is the last part of the state's
                                  ``data.storage_key`` (``cache_key`` is used when set)
step inputs.digests               prepare: the flow parameter ``dataset_sha256`` (the bytes the
                                  submitter wrote); a candidate: prepare's ``output_sha256``
step manifest.inputs              the ``consumed`` digests of the step's ``@event step_result``
                                  (what the result it returned, cached or not, was made from)
step manifest.checks / report     evaluate's ``step_result`` checks / report
side effect                       one object ``registry/<flow_run_id>/version-*.json`` each
                                  (Prefect gives no receipt: ``receipt`` is empty)
================================  ==============================================================
"""

from __future__ import annotations

from typing import Any

from platforms.prefect_logs import TERMINAL, parse_event

STEP_ORDER = ("prepare", "train-a", "train-b", "train-c", "evaluate", "register")
FLOW_STATE = {"SCHEDULED": "running", "PENDING": "running", "RUNNING": "running",
              "CANCELLING": "running", "PAUSED": "running", "COMPLETED": "succeeded",
              "FAILED": "failed", "CRASHED": "failed", "CANCELLED": "canceled"}
REGISTRY_PREFIX = "registry/"


def submission(body: dict[str, Any], s3_endpoint: str | None, bucket: str) -> dict[str, Any]:
    """The flow parameters for the harness's pipeline body (chaos/actions.py _pipeline_body):
    the dataset of the first step that declares one, each candidate's workload, the evaluation's
    ``min_candidates``; the body itself is kept as ``spec`` (evidence only)."""
    steps = {s["name"]: s for s in body.get("steps") or [] if isinstance(s, dict)}
    dataset = next((d for s in steps.values() for d in s.get("datasets") or []), None)
    if not dataset or not dataset.get("uri"):
        raise ValueError("pipeline body: no step declares a dataset with a uri (steps[].datasets)")
    candidates: dict[str, dict[str, Any]] = {}
    for name in ("train-a", "train-b", "train-c"):
        if name not in steps:
            raise ValueError(f"pipeline body: step {name!r} is missing (the Prefect pipeline "
                             "flow has exactly train-a, train-b, train-c)")
        w = (steps[name].get("operation") or {}).get("workload") or {}
        candidates[name] = {"kind": w.get("kind", "train"), **(w.get("params") or {})}
    ev = ((steps.get("evaluate") or {}).get("operation") or {}).get("workload") or {}
    return {"dataset_name": dataset.get("name") or "", "dataset_uri": dataset["uri"],
            "dataset_sha256": dataset.get("sha256") or "", "candidates": candidates,
            "min_candidates": int((ev.get("params") or {}).get("min_candidates") or 0),
            "lose_register_answer": True, "s3_endpoint": s3_endpoint, "bucket": bucket,
            "spec": body}


def flow_events(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The flow's ``@event`` lines: {time, kind, data}, in time order."""
    out = []
    for row in logs:
        body = parse_event(row.get("message") or "")
        if body is not None:
            out.append({"time": row["timestamp"], "kind": str(body.get("kind", "log")),
                        "data": dict(body.get("data") or {})})
    return sorted(out, key=lambda e: e["time"])


def cache_key(tr: dict[str, Any]) -> str | None:
    """The task run's cache key: ``cache_key`` when Prefect sets it, else the name its result
    record is stored under (``state.data.storage_key``: <result storage>/<cache key>)."""
    if tr.get("cache_key"):
        return str(tr["cache_key"])
    data = (tr.get("state") or {}).get("data")
    key = data.get("storage_key") if isinstance(data, dict) else None
    return str(key).rstrip("/").rsplit("/", 1)[-1] if key else None


def _step_state(tr: dict[str, Any]) -> str:
    state = tr.get("state") or {}
    typ, name = state.get("type") or tr.get("state_type"), state.get("name") or tr.get("state_name")
    if typ == "COMPLETED":
        return "reused" if name == "Cached" else "succeeded"
    if typ in ("FAILED", "CRASHED"):
        return "failed"
    if typ == "CANCELLED":
        return "canceled"
    return "running" if typ in ("RUNNING", "AWAITINGRETRY", "PENDING", "SCHEDULED") else "waiting"


def pipeline_records(fr: dict[str, Any], task_runs: list[dict[str, Any]],
                     logs: list[dict[str, Any]], registry: list[dict[str, Any]] | None,
                     accepted: dict[str, dict[str, Any]] | None = None,
                     ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]],
                                list[dict[str, Any]]]:
    """(pipeline, steps, events, side effects) of one flow run. ``registry``: the objects under
    ``registry/<flow_run_id>/`` as {key, last_modified, body}; ``accepted``: cache key -> the
    first step (of any pipeline) that produced a result under it (names a reuse's source)."""
    pid = fr["id"]
    params = fr.get("parameters") or {}
    ftype = (fr.get("state") or {}).get("type") or "SCHEDULED"
    flow_done = ftype in TERMINAL
    evs = flow_events(logs)
    results = {e["data"].get("step"): e for e in evs if e["kind"] == "step_result"}
    refused = next((e for e in evs if e["kind"] == "release_refused"), None)
    report_ev = next((e for e in reversed(evs) if e["kind"] == "pipeline_report"), None)
    runs: dict[str, dict[str, Any]] = {}
    for tr in sorted(task_runs, key=lambda t: t.get("created") or ""):
        runs.setdefault(tr.get("name") or "", tr)  # the first task run of a step name
    prepared = results.get("prepare", {}).get("data", {})
    events: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    for pos, name in enumerate(STEP_ORDER):
        tr = runs.get(name)
        res = results.get(name, {}).get("data")
        row: dict[str, Any] = {"pipeline_id": pid, "name": name, "position": pos,
                               "state": "waiting", "state_reason": None, "operation_id": None,
                               "cache_key": None, "inputs": None, "manifest": None,
                               "report": None, "started_at": None, "finished_at": None}
        if tr is None:
            if name == "register" and refused is not None:
                checks = ", ".join(refused["data"].get("failed_checks") or [])
                row.update(state="failed", finished_at=refused["time"],
                           state_reason=f"release refused: check(s) {checks} of step evaluate "
                                        "failed (flow code; Prefect has no release gate)")
            elif flow_done:
                row.update(state="skipped", state_reason=f"no task run (flow run {ftype})")
            steps.append(row)
            continue
        state = tr.get("state") or {}
        row.update(state=_step_state(tr), state_reason=state.get("message") or state.get("name"),
                   operation_id=pid, cache_key=cache_key(tr),
                   started_at=tr.get("start_time") or tr.get("expected_start_time")
                   or tr.get("created"),
                   finished_at=tr.get("end_time") or (state.get("timestamp")
                                                      if row["state"] not in ("running",
                                                                              "waiting")
                                                      else None))
        if name == "prepare" and params.get("dataset_sha256"):
            row["inputs"] = {"digests": [params["dataset_sha256"]],
                             "datasets": [{"name": params.get("dataset_name"),
                                           "uri": params.get("dataset_uri"),
                                           "sha256": params["dataset_sha256"]}]}
        elif name.startswith("train-") and prepared.get("output_sha256"):
            row["inputs"] = {"digests": [prepared["output_sha256"]]}
        manifest: dict[str, Any] = {}
        if res is not None and isinstance(res.get("consumed"), list):
            manifest["inputs"] = res["consumed"]
        if res is not None and isinstance(res.get("checks"), dict):
            manifest["checks"] = res["checks"]
        if res is not None and isinstance(res.get("report"), dict):
            row["report"] = res["report"]
        if row["state"] == "reused":
            src = (accepted or {}).get(row["cache_key"] or "")
            manifest["reused_from"] = ({"source_pipeline_id": src["pipeline_id"],
                                        "source_step": src["name"]} if src else {})
            events.append({"id": f"{pid}:{name}:reused", "pipeline_id": pid,
                           "time": row["started_at"], "actor": "prefect", "kind": "cache_reused",
                           "reason": f"task run {tr.get('id')} Cached",
                           "data": {"step": name, "cache_key": row["cache_key"],
                                    **manifest["reused_from"]}})
        row["manifest"] = manifest or None
        steps.append(row)
    for i, e in enumerate(evs):
        events.append({"id": f"{pid}:{i}", "pipeline_id": pid, "time": e["time"],
                       "actor": "flow", "kind": e["kind"], "reason": None, "data": e["data"]})
    events.sort(key=lambda e: e["time"] or "")
    report = dict(report_ev["data"]) if report_ev else None
    pipeline = {"id": pid, "project": "prefect", "name": (params.get("spec") or {}).get("name")
                or fr.get("name"), "idempotency_key": fr.get("idempotency_key"),
                "state": FLOW_STATE.get(ftype, "running"),
                "state_reason": (fr.get("state") or {}).get("message"), "report": report,
                "spec": params.get("spec") or {}, "created_at": fr["created"],
                "updated_at": fr.get("updated")}
    effects = [side_effect(pid, o) for o in (registry or [])]
    return pipeline, steps, events, effects


def side_effect(pid: str, obj: dict[str, Any]) -> dict[str, Any]:
    body = obj.get("body") or {}
    return {"operation_id": pid, "action_id": str(body.get("action_id") or obj["key"]),
            "kind": str(body.get("kind") or "model_registration"),
            "payload": {"key": obj["key"], "model": body.get("model"),
                        "task_attempt": body.get("task_attempt")},
            "receipt": {}, "created_at": obj["last_modified"]}


def accepted_results(steps: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """cache key -> the earliest step that produced (not reused) a result under it."""
    out: dict[str, dict[str, Any]] = {}
    for s in sorted(steps, key=lambda s: s.get("finished_at") or ""):
        if s["state"] == "succeeded" and s.get("cache_key"):
            out.setdefault(s["cache_key"], s)
    return out


def view(pipeline: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The shape of our control plane's ``GET /v1/pipelines/{id}`` the chaos actions read."""
    return {**pipeline, "timing": None,
            "steps": [{k: s[k] for k in ("name", "state", "state_reason", "operation_id",
                                         "cache_key", "started_at", "finished_at")}
                      for s in steps]}

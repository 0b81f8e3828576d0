"""Pipelines: submit (one Idempotency-Key for the whole DAG), read, and progression.

Progression (:func:`advance`, called by every reconciler pass) locks each running pipeline
with ``FOR UPDATE SKIP LOCKED``: two reconcilers never advance the same pipeline at once, and
each step's operation is submitted under the deterministic key ``pipeline:<id>:<step>``, so even
a repeated pass cannot create a second operation for a step. A step starts only when its
upstream steps' completion manifests were accepted (controlplane/pipelines/manifest.py) and
receives them explicitly in its operation's ``pipeline.inputs``.

Pipeline events are rows of the ``events`` table whose ``operation_id`` is the pipeline's id.
"""

from __future__ import annotations

import copy
import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from controlplane import defects
from controlplane.pipelines import cache_key, manifest, policy
from controlplane.pipelines.spec import PipelineSpec
from controlplane.store import Conflict, NotFound, columns
from controlplane.store.submissions import SubmitItem, payload_hash, submit_many
from controlplane.store.transitions import record_event

log = logging.getLogger("controlplane.pipelines")
# named columns, never `*` (controlplane/store/columns.py); no release renames a pipelines column
_P = columns.of("pipelines")

ACTIVE_STEP = ("waiting", "running")
OK_STEP = ("succeeded", "reused")
_PHASE_OF_COMPUTATION = {"prepare": "data_preparation", "evaluate": "evaluation"}


@dataclass(frozen=True)
class PipelineSubmit:
    pipeline: dict[str, Any]
    created: bool


def document(spec: PipelineSpec) -> dict[str, Any]:
    """The stored document: the validated spec plus, per step, the operation document it
    will submit and whether reuse is on. Progression reads these and never validates the spec
    again (a workload class's defaults, once applied, would read as forbidden overrides)."""
    doc = spec.model_dump(mode="json")
    for step, d in zip(spec.steps, doc["steps"], strict=True):
        d["operation_doc"] = spec.operation_doc(step)
        d["cache_enabled"] = step.cache_enabled
        if d.get("on_source_unavailable") is None:  # added later: the payload hash of a
            d.pop("on_source_unavailable", None)     # pipeline without it stays the same
    return doc


async def submit(conn: AsyncConnection, *, project_id: str, key: str, spec: PipelineSpec,
                 actor: str) -> PipelineSubmit:
    """Commit the pipeline and its steps in one transaction before anyone acknowledges it.
    The same key and payload again -> the same pipeline; another payload -> Conflict."""
    doc = document(spec)
    h = payload_hash(doc)
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            "INSERT INTO pipelines (project_id, idempotency_key, payload_hash, name, spec, state,"
            " state_reason) VALUES (%s, %s, %s, %s, %s, 'running', 'submission committed')"
            f" ON CONFLICT (project_id, idempotency_key) DO NOTHING RETURNING {_P}",
            (project_id, key, h, spec.name, Jsonb(doc)))
        row = await cur.fetchone()
        if row is None:
            await cur.execute(f"SELECT {_P} FROM pipelines WHERE project_id = %s"
                              " AND idempotency_key = %s", (project_id, key))
            existing = await cur.fetchone()
            assert existing is not None  # ON CONFLICT: it exists and is committed
            if existing["payload_hash"] != h:
                raise Conflict(f"Idempotency-Key {key!r} was already used for a different "
                               f"pipeline payload (pipeline {existing['id']}); use a new key")
            return PipelineSubmit(existing, False)
        await cur.executemany(
            "INSERT INTO pipeline_steps (pipeline_id, name, position, state, state_reason)"
            " VALUES (%s, %s, %s, 'waiting', 'waiting for upstream manifests')",
            [(row["id"], s.name, i, ) for i, s in enumerate(spec.steps)])
        await record_event(conn, row["id"], actor=actor, kind="pipeline_submitted",
                           reason="submission committed",
                           data={"idempotency_key": key, "steps": [s.name for s in spec.steps]})
        await cur.execute("SELECT pg_notify('controlplane_work', 'submitted')")
    return PipelineSubmit(row, True)


async def get(conn: AsyncConnection, pipeline_id: str, project_id: str | None) -> dict[str, Any]:
    async with conn.cursor(row_factory=dict_row) as cur:
        try:
            await cur.execute(f"SELECT {_P} FROM pipelines WHERE id = %s::uuid"
                              " AND (%s::uuid IS NULL OR project_id = %s)",
                              (pipeline_id, project_id, project_id))
        except Exception as exc:  # a malformed id is simply not found
            if "invalid input syntax for type uuid" in str(exc):
                raise NotFound(f"pipeline {pipeline_id} not found") from exc
            raise
        row = await cur.fetchone()
    if row is None:
        raise NotFound(f"pipeline {pipeline_id} not found")
    return row


async def steps(conn: AsyncConnection, pipeline_id: Any) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"SELECT {columns.of('pipeline_steps', 's')}, o.state AS op_state,"
            " o.result AS op_result, o.last_error AS op_error,"
            " (SELECT max(number) FROM attempts a WHERE a.operation_id = o.id"
            "  AND a.state = 'succeeded') AS succeeded_attempt"
            " FROM pipeline_steps s LEFT JOIN operations o ON o.id = s.operation_id"
            " WHERE s.pipeline_id = %s ORDER BY s.position", (pipeline_id,))
        return await cur.fetchall()


async def events(conn: AsyncConnection, pipeline_id: Any) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(f"SELECT {columns.of('events')} FROM events WHERE operation_id = %s"
                          " ORDER BY id", (pipeline_id,))
        return await cur.fetchall()


# -- progression -----------------------------------------------------------------------------


async def advance(conn: AsyncConnection, *, actor: str = "reconciler", limit: int = 50) -> int:
    """One pass over running pipelines nobody else is advancing; returns how many steps
    changed state. Each pipeline is advanced in a savepoint: one that cannot be advanced (a
    bug, a conflict) is logged and left for the next pass, the others go on."""
    changed = 0
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(f"SELECT {_P} FROM pipelines WHERE state = 'running' ORDER BY created_at"
                          " LIMIT %s FOR UPDATE SKIP LOCKED", (limit,))
        for p in await cur.fetchall():
            try:
                async with conn.transaction():
                    changed += await _advance(conn, p, actor)
            except Exception:
                log.exception("pipeline %s could not be advanced", p["id"])
    return changed


async def _advance(conn: AsyncConnection, p: dict[str, Any], actor: str) -> int:
    spec: dict[str, Any] = p["spec"]
    by_name = {s["name"]: s for s in spec["steps"]}
    rows = {r["name"]: r for r in await steps(conn, p["id"])}
    changed = 0
    # 1. running steps whose operation ended: accept the manifest, or fail the step
    for name, r in rows.items():
        if r["state"] != "running" or r["op_state"] not in ("succeeded", "failed", "canceled"):
            continue
        if r["op_state"] == "succeeded":
            try:
                doc = manifest.validate(r["op_result"], operation_id=str(r["operation_id"]),
                                        attempt=int(r["succeeded_attempt"] or 0),
                                        expected_inputs=(r["inputs"] or {}).get("digests", []),
                                        given_inputs=r["inputs"])
            except manifest.ManifestInvalid as exc:
                await _set(conn, p, r, "failed", f"completion manifest rejected: {exc}", actor)
            else:
                left_out = manifest.excluded_sources(doc)
                if left_out and defects.enabled("excluded-source-unnamed"):
                    # seeded defect: the degraded result is accepted without the names of the
                    # sources it left out: it reads as a complete one on fewer sources
                    doc["sources"] = {**doc["sources"], "excluded": {}}
                    left_out = {}
                reason = "completion manifest accepted" + (
                    f"; degraded: {len(left_out)} source(s) left out ("
                    + ", ".join(f"{n}: {why}" for n, why in sorted(left_out.items())) + ")"
                    if left_out else "")
                await _set(conn, p, r, "succeeded", reason[:1000], actor, manifest=doc)
                # a degraded result is never reused: its key names every declared source
                if r["cache_key"] and by_name[name]["cache_enabled"] and not (
                        doc.get("sources") or {}).get("excluded"):
                    await _remember(conn, p, r, doc)
        else:
            err = (r["op_error"] or {}).get("message") or r["op_state"]
            await _set(conn, p, r, "failed", f"operation {r['op_state']}: {err}", actor)
        changed += 1
    if changed:
        rows = {x["name"]: x for x in await steps(conn, p["id"])}
    # 2. waiting steps whose upstream steps all ended
    running = sum(1 for r in rows.values() if r["state"] == "running")
    for step in spec["steps"]:
        r = rows[step["name"]]
        if r["state"] != "waiting":
            continue
        ups = [rows[n] for n in step["needs"]]
        if any(u["state"] in ACTIVE_STEP for u in ups):
            continue
        included = [u["name"] for u in ups if u["state"] in OK_STEP]
        report: dict[str, Any] | None = None
        if step["role"] == "aggregate":
            pol = step["on_upstream_failure"]
            d = policy.decide(pol["policy"], pol["min_successful"],
                              {u["name"]: (u["state"] in OK_STEP, _why(u)) for u in ups})
            report = {**d.report, "decision": d.reason}
            if not d.run:
                await _set(conn, p, r, "failed", d.reason, actor, report=report)
                changed += 1
                rows = {x["name"]: x for x in await steps(conn, p["id"])}
                continue
            included = d.included
        elif len(included) != len(ups):
            bad = [u["name"] for u in ups if u["state"] not in OK_STEP]
            await _set(conn, p, r, "skipped", f"upstream step(s) {', '.join(bad)} did not "
                       "succeed", actor)
            changed += 1
            rows = {x["name"]: x for x in await steps(conn, p["id"])}
            continue
        if step["role"] == "release":
            refusal = _release_refusal(ups)
            if refusal:
                await _set(conn, p, r, "failed", refusal, actor)
                changed += 1
                rows = {x["name"]: x for x in await steps(conn, p["id"])}
                continue
        if running >= spec["max_parallel_steps"]:
            reason = f"pipeline concurrency limit ({spec['max_parallel_steps']} running steps)"
            if r["state_reason"] != reason:
                await conn.execute("UPDATE pipeline_steps SET state_reason = %s, updated_at ="
                                   " now() WHERE pipeline_id = %s AND name = %s",
                                   (reason, p["id"], step["name"]))
            continue
        started = await _start(conn, p, step, r, {n: rows[n] for n in included}, report,
                               actor)
        running += 1 if started == "running" else 0
        changed += 1
        rows = {x["name"]: x for x in await steps(conn, p["id"])}
    # 3. the pipeline ends when every step has ended
    if all(r["state"] not in ACTIVE_STEP for r in rows.values()):
        await _finish(conn, p, rows, actor)
    return changed


def _why(r: dict[str, Any]) -> str:
    return f"{r['state']}: {r['state_reason']}"


def _release_refusal(ups: list[dict[str, Any]]) -> str | None:
    """A release step requires successful checks: every upstream manifest's checks passed,
    and at least one check was published at all."""
    checks = 0
    for u in ups:
        m = u["manifest"] or {}
        failed = manifest.failed_checks(m)
        if failed and not defects.enabled("release-after-failed-check"):  # seeded defect
            return (f"release refused: check(s) {', '.join(failed)} of step {u['name']} "
                    "failed")
        checks += len(m.get("checks") or {})
    if checks == 0:
        return "release refused: no upstream step published checks"
    return None


async def _start(conn: AsyncConnection, p: dict[str, Any], step: dict[str, Any],
                 r: dict[str, Any], upstream: dict[str, dict[str, Any]],
                 report: dict[str, Any] | None, actor: str) -> str:
    """Reuse a cached manifest, or submit the step's operation. Returns the new step state."""
    pid, name = str(p["id"]), step["name"]
    given = [{"step": n, **u["manifest"]} for n, u in upstream.items()]
    digests = sorted({d["sha256"] for d in step["datasets"]}
                     | {x for u in upstream.values() for x in manifest.file_digests(u["manifest"])})
    inputs = {"steps": given, "datasets": step["datasets"], "digests": digests}
    if step.get("on_source_unavailable"):  # what the workload does with a bad source
        inputs["sources"] = step["on_source_unavailable"]
    op_doc = copy.deepcopy(step["operation_doc"])
    key: cache_key.CacheKey | None = None
    base = {"step": name}
    if not step["cache_enabled"]:
        await record_event(conn, p["id"], actor=actor, kind="cache_disabled",
                           reason=f"step {name}: reuse disabled", data=base)
    else:
        try:
            keyed = digests
            if defects.enabled("cache-key-without-data"):  # seeded defect: names, not bytes
                data = {d["sha256"] for d in step["datasets"]}
                keyed = [x for x in digests if x not in data] + sorted(
                    hashlib.sha256(d["name"].encode()).hexdigest() for d in step["datasets"])
            key = cache_key.compute(
                input_digests=keyed, image=op_doc["workload"]["image"],
                code_digest=step["code_digest"], kind=op_doc["workload"]["kind"],
                params=op_doc["workload"]["params"],
                environment={"resources": op_doc["resources"],
                             "workload_class": op_doc.get("workload_class"),
                             "declared": step["environment"]})
        except cache_key.NotCacheable as exc:
            await record_event(conn, p["id"], actor=actor, kind="cache_skipped",
                               reason=f"step {name}: {exc}", data=base)
    if key is not None:
        hit = await _cached(conn, p["project_id"], key.key)
        if hit is not None:
            source = {"cache_key": key.key, "source_pipeline_id": str(hit["source_pipeline_id"]),
                      "source_step": hit["source_step"],
                      "source_operation_id": str(hit["source_operation_id"])}
            await record_event(conn, p["id"], actor=actor, kind="cache_reused",
                               reason=f"step {name}: reused the result of step "
                               f"{hit['source_step']} of pipeline {hit['source_pipeline_id']}",
                               data={**base, **source})
            await _set(conn, p, r, "reused", f"cache hit {key.key}", actor,
                       manifest={**hit["manifest"], "reused_from": source},
                       cache_key=key.key, inputs=inputs, report=report, started=True)
            return "reused"
        await record_event(conn, p["id"], actor=actor, kind="cache_miss",
                           reason=f"step {name}: no stored result for {key.key}",
                           data={**base, "cache_key": key.key, "components": key.components})
    op_doc["labels"] = {**op_doc["labels"], "pipeline": pid, "pipeline-step": name}
    op_doc["pipeline"] = {
        "pipeline_id": pid, "step": name, "phase": step["phase"], "role": step["role"],
        "inputs": inputs, "cache_key": key.key if key else None,
        "excluded": (report or {}).get("excluded", {}),
    }
    if step["side_effect"] is not None:  # the registration's stable action identity
        kind = step["side_effect"]["kind"]
        op_doc["pipeline"]["side_effect"] = {
            "kind": kind, "action_id": f"pipeline:{pid}:step:{name}:{kind}"}
    [res] = await submit_many(conn, [SubmitItem(str(p["project_id"]), f"pipeline:{pid}:{name}",
                                                op_doc, actor)])
    if isinstance(res, Exception):
        await _set(conn, p, r, "failed", f"step operation not submitted: {res}", actor)
        return "failed"
    await _set(conn, p, r, "running", "operation submitted", actor,
               operation_id=res.operation["id"], cache_key=key.key if key else None,
               inputs=inputs, report=report, started=True)
    return "running"


async def _cached(conn: AsyncConnection, project_id: Any, key: str) -> dict[str, Any] | None:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(f"SELECT {columns.of('pipeline_cache')} FROM pipeline_cache"
                          " WHERE project_id = %s AND cache_key = %s", (project_id, key))
        return await cur.fetchone()


async def _remember(conn: AsyncConnection, p: dict[str, Any], r: dict[str, Any],
                    doc: dict[str, Any]) -> None:
    spec_components = (r["inputs"] or {}).get("digests", [])
    await conn.execute(
        "INSERT INTO pipeline_cache (project_id, cache_key, components, manifest,"
        " source_pipeline_id, source_step, source_operation_id) VALUES (%s, %s, %s, %s, %s, %s,"
        " %s) ON CONFLICT DO NOTHING",
        (p["project_id"], r["cache_key"], Jsonb({"inputs": spec_components}), Jsonb(doc),
         p["id"], r["name"], r["operation_id"]))


async def _set(conn: AsyncConnection, p: dict[str, Any], r: dict[str, Any], state: str,
               reason: str, actor: str, *, manifest: dict[str, Any] | None = None,
               operation_id: Any = None, cache_key: str | None = None,
               inputs: dict[str, Any] | None = None, report: dict[str, Any] | None = None,
               started: bool = False) -> None:
    terminal = state not in ACTIVE_STEP
    await conn.execute(
        "UPDATE pipeline_steps SET state = %s, state_reason = %s, updated_at = now(),"
        " manifest = coalesce(%s, manifest), operation_id = coalesce(%s, operation_id),"
        " cache_key = coalesce(%s, cache_key), inputs = coalesce(%s, inputs),"
        " report = coalesce(%s, report),"
        " started_at = CASE WHEN %s THEN now() ELSE started_at END,"
        " finished_at = CASE WHEN %s THEN now() ELSE finished_at END"
        " WHERE pipeline_id = %s AND name = %s",
        (state, reason, Jsonb(manifest) if manifest is not None else None, operation_id,
         cache_key, Jsonb(inputs) if inputs is not None else None,
         Jsonb(report) if report is not None else None, started, terminal, p["id"], r["name"]))
    data: dict[str, Any] = {"step": r["name"], "state": state}
    if operation_id is not None:
        data["operation_id"] = str(operation_id)
    if report is not None:
        data["report"] = report
    await record_event(conn, p["id"], actor=actor, kind="step_transition", reason=reason,
                       data=data)


async def _finish(conn: AsyncConnection, p: dict[str, Any], rows: dict[str, dict[str, Any]],
                  actor: str) -> None:
    """Succeeded when every step succeeded or was reused, or failed only as a candidate an
    aggregation step excluded under its declared policy; failed otherwise. The report names
    every excluded candidate and why."""
    excluded: dict[str, str] = {}
    sources: dict[str, dict[str, str]] = {}  # step -> source left out -> why
    for r in rows.values():
        if r["state"] in OK_STEP and r["report"]:
            excluded.update(r["report"].get("excluded") or {})
        if r["state"] in OK_STEP and manifest.excluded_sources(r["manifest"]):
            sources[r["name"]] = manifest.excluded_sources(r["manifest"])
    not_ok = [r["name"] for r in rows.values() if r["state"] not in OK_STEP]
    blocking = [n for n in not_ok if n not in excluded]
    state = "failed" if blocking else "succeeded"
    if blocking:
        failed = [rows[n] for n in blocking if rows[n]["state"] == "failed"] or [
            rows[blocking[0]]]
        reason = "; ".join(f"step {r['name']} {r['state']}: {r['state_reason']}"
                           for r in failed)
    elif excluded:
        reason = (f"succeeded incomplete: {len(excluded)} candidate(s) excluded "
                  f"({', '.join(sorted(excluded))})")
    else:
        reason = f"all {len(rows)} steps succeeded"
    if sources and not blocking:
        reason += "; degraded: " + ", ".join(
            f"step {n} left out {len(v)} source(s) ({', '.join(sorted(v))})"
            for n, v in sorted(sources.items()))
    report = {"steps": {n: r["state"] for n, r in rows.items()}, "excluded": excluded,
              "incomplete": bool(excluded) and not blocking}
    if sources:  # only then: the report of a pipeline without sources left out is unchanged
        report["excluded_sources"] = sources
        report["degraded"] = not blocking
    await conn.execute("UPDATE pipelines SET state = %s, state_reason = %s, report = %s,"
                       " updated_at = now() WHERE id = %s", (state, reason, Jsonb(report), p["id"]))
    await record_event(conn, p["id"], actor=actor, kind="pipeline_finished", reason=reason,
                       data={"state": state, **report})


# -- timing ----------------------------------------------------------------------------------


async def timing(conn: AsyncConnection, pipeline_id: Any) -> dict[str, Any]:
    """Per-step and per-phase seconds from the steps' operations and attempts, where the data
    exists (a reused step has none: it did not run). queue_wait: submitted -> first claim;
    recovery: first claim -> last claim (time lost to attempts that did not succeed); startup:
    last claim -> workload started; computation: the succeeded attempt's start -> finish, counted as data_preparation for prepare steps and evaluation for evaluate
    steps."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            "SELECT s.name, o.created_at AS submitted_at, t.number, t.state, t.claimed_at,"
            " t.started_at, t.finished_at FROM pipeline_steps s"
            " JOIN operations o ON o.id = s.operation_id"
            " JOIN attempts t ON t.operation_id = o.id"
            " WHERE s.pipeline_id = %s ORDER BY s.position, t.number", (pipeline_id,))
        rows = await cur.fetchall()
        await cur.execute("SELECT spec FROM pipelines WHERE id = %s", (pipeline_id,))
        prow = await cur.fetchone()
    phases_of = {s["name"]: s["phase"] for s in (prow["spec"]["steps"] if prow else [])}
    by_step: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_step.setdefault(row["name"], []).append(row)
    per_step: dict[str, dict[str, float | None]] = {}
    totals: dict[str, float | None] = dict.fromkeys(
        ("queue_wait", "startup", "data_preparation", "computation", "recovery", "evaluation"))
    for name, atts in by_step.items():
        first, last = atts[0], atts[-1]
        done = next((a for a in atts if a["state"] == "succeeded"), None)
        t = {
            "queue_wait": _secs(first["submitted_at"], first["claimed_at"]),
            "startup": _secs(last["claimed_at"], last["started_at"]),
            "recovery": (_secs(first["claimed_at"], last["claimed_at"])
                         if len(atts) > 1 else None),
            "computation": _secs(done["started_at"], done["finished_at"]) if done else None,
        }
        per_step[name] = t
        phase = _PHASE_OF_COMPUTATION.get(phases_of.get(name, ""), "computation")
        for k, v in (("queue_wait", t["queue_wait"]), ("startup", t["startup"]),
                     ("recovery", t["recovery"]), (phase, t["computation"])):
            if v is not None:
                totals[k] = round((totals[k] or 0.0) + v, 3)
    return {"phases": totals, "steps": per_step}


def _secs(a: Any, b: Any) -> float | None:
    if a is None or b is None:
        return None
    return round((b - a).total_seconds(), 3)

"""Prefect flow run + task runs + logs + registry objects -> pipeline evidence, judged by the same
pipeline invariants as our control plane (slo/pipelines.py). Records are shaped as Prefect 3's
REST API returns them (``/flow_runs/{id}``, ``/task_runs/filter``, ``/logs/filter``)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from platforms import prefect_pipeline_records as pipes
from slo import pipelines as pl
from slo.evidence import PipelineRecord, PipelineStepRecord, SideEffectRecord
from slo.sli import ts

V1, V2 = "a" * 64, "b" * 64
OUT1 = "c" * 64
BODY = {"name": "pipeline-recovery-base", "steps": [
    {"name": "prepare", "phase": "prepare",
     "datasets": [{"name": "churn-rows", "uri": "datasets/x/rows.csv", "sha256": V1}],
     "operation": {"workload": {"kind": "prepare", "params": {"seconds": 0.2}}}},
    {"name": "train-a", "phase": "train", "needs": ["prepare"],
     "operation": {"workload": {"kind": "train", "params": {"steps": 80, "seed": 1}}}},
    {"name": "train-b", "phase": "train", "needs": ["prepare"],
     "operation": {"workload": {"kind": "train", "params": {"steps": 20, "seed": 2}}}},
    {"name": "train-c", "phase": "train", "needs": ["prepare"],
     "operation": {"workload": {"kind": "fail", "params": {"exit_code": 2}}}},
    {"name": "evaluate", "phase": "evaluate", "role": "aggregate",
     "needs": ["train-a", "train-b", "train-c"],
     "on_upstream_failure": {"policy": "continue-incomplete"},
     "operation": {"workload": {"kind": "evaluate", "params": {"seconds": 0.1}}}},
    {"name": "register", "phase": "register", "role": "release", "needs": ["evaluate"],
     "side_effect": {"kind": "model_registration"},
     "operation": {"workload": {"kind": "sleep", "params": {}}}},
]}


def _t(sec: int) -> str:
    return f"2026-12-01T10:{sec // 60:02d}:{sec % 60:02d}+00:00"


def _flow(fid: str, t0: int, state: str, sha: str, min_candidates: int = 0) -> dict[str, Any]:
    body = json.loads(json.dumps(BODY))
    body["steps"][0]["datasets"][0]["sha256"] = sha
    if min_candidates:
        body["steps"][4]["operation"]["workload"]["params"]["min_candidates"] = min_candidates
    return {"id": fid, "name": f"flow-{fid}", "created": _t(t0), "updated": _t(t0 + 50),
            "idempotency_key": f"key-{fid}", "state": {"type": state, "name": state.title()},
            "parameters": pipes.submission(body, None, "ml-artifacts")}


def _tr(name: str, t: int, typ: str = "COMPLETED", sname: str = "Completed",
        key: str | None = None) -> dict[str, Any]:
    return {"id": f"tr-{name}-{t}", "name": name, "created": _t(t), "start_time": _t(t),
            "end_time": _t(t + 2), "cache_key": None,  # Prefect 3.9.1 leaves it null
            "state": {"type": typ, "name": sname, "timestamp": _t(t + 2),
                      "data": {"storage_key": f"/home/w/storage/{key}"} if key else None}}


def _log(t: int, kind: str, **data: Any) -> dict[str, Any]:
    return {"timestamp": _t(t), "message": "@event " + json.dumps(
        {"kind": kind, "message": kind, "data": data})}


def _run(fid: str, t0: int, *, prepare_state: str, given: str, consumed: str,
         flow_state: str = "COMPLETED", refused: bool = False,
         registry: int = 1) -> tuple[dict, list, list, list]:
    fr = _flow(fid, t0, flow_state, given, 3 if refused else 0)
    cached = prepare_state == "Cached"
    trs = [_tr("prepare", t0 + 1, sname=prepare_state, key="K-prepare"),
           _tr("train-a", t0 + 3, key=f"K-a-{fid}"),  # base: interrupted, ran each time
           _tr("train-b", t0 + 3, sname="Cached" if cached else "Completed", key="K-b"),
           _tr("train-c", t0 + 3, "FAILED", "Failed"),
           _tr("evaluate", t0 + 10)]
    logs = [_log(t0 + 2, "step_result", step="prepare", consumed=[consumed], output_sha256=OUT1),
            _log(t0 + 8, "step_result", step="train-a", consumed=[OUT1]),
            _log(t0 + 8, "step_result", step="train-b", consumed=[OUT1])]
    checks = {"scored_any": {"passed": True}}
    if refused:
        checks["enough_candidates"] = {"passed": False}
    report = {"candidates": ["train-a", "train-b", "train-c"], "scored": {"train-a": 1.0},
              "excluded": {"train-c": "did not complete: RuntimeError"}, "checks": checks}
    logs.append(_log(t0 + 12, "step_result", step="evaluate", report=report, checks=checks))
    if refused:
        logs.append(_log(t0 + 13, "release_refused", step="register",
                         failed_checks=["enough_candidates"]))
    else:
        trs.append(_tr("register", t0 + 13))
    logs.append(_log(t0 + 14, "pipeline_report", excluded=report["excluded"]))
    reg = [{"key": f"registry/{fid}/version-{i}.json", "last_modified": _t(t0 + 14 + i),
            "body": {"action_id": f"tr-register-{t0 + 13}", "kind": "model_registration",
                     "task_attempt": i + 1}} for i in range(0 if refused else registry)]
    return fr, trs, logs, reg


def _evidence(runs: list[tuple[dict, list, list, list]]) -> tuple[list, list, list]:
    first = [pipes.pipeline_records(*r) for r in runs]
    accepted = pipes.accepted_results([s for rec in first for s in rec[1]])
    ps, steps, effects = [], [], []
    for r in runs:
        p, st, _, fx = pipes.pipeline_records(*r, accepted)
        ps.append(PipelineRecord.model_validate(p))
        steps += [PipelineStepRecord.model_validate(s) for s in st]
        effects += [SideEffectRecord.model_validate(e) for e in fx]
    return ps, steps, effects


WINDOW = (ts(datetime.fromisoformat(_t(0))), ts(datetime.fromisoformat(_t(3599))))


def _game_day(base_registry: int = 2) -> tuple[list, list, list]:
    return _evidence([
        _run("base", 0, prepare_state="Completed", given=V1, consumed=V1, registry=base_registry),
        _run("same", 100, prepare_state="Cached", given=V1, consumed=V1),
        # same dataset name and uri, other bytes: Prefect's INPUTS key does not change
        _run("changed", 200, prepare_state="Cached", given=V2, consumed=V1, flow_state="FAILED",
             refused=True)])


def test_stale_cache_hit_is_a_stale_cache_reuse_violation() -> None:
    _, steps, _ = _game_day()
    r = pl.stale_cache_reuse(steps, *WINDOW)
    assert r.no_data is None
    assert r.judged == 4  # prepare + train-b of the unchanged and of the changed pipeline
    [v] = r.violations
    assert "pipeline changed step prepare" in v and "pipeline base" in v


def test_cached_steps_are_reused_and_the_unchanged_hit_is_judged() -> None:
    _, steps, _ = _game_day()
    states = {(s.pipeline_id, s.name): s.state for s in steps}
    assert states[("same", "prepare")] == "reused" and states[("base", "prepare")] == "succeeded"
    r = pl.cache_hit_when_unchanged(steps, *WINDOW)
    assert r.no_data is None and r.judged == 4 and not r.violations


def test_a_second_registration_is_a_side_effect_once_violation() -> None:
    _, _, effects = _game_day(base_registry=2)
    r = pl.side_effect_once(effects, *WINDOW)
    assert r.judged == 2 and len(r.violations) == 1 and "operation base" in r.violations[0]
    assert all(e.receipt == {} for e in effects)  # Prefect gives no receipt
    _, _, once = _game_day(base_registry=1)
    assert not pl.side_effect_once(once, *WINDOW).violations


def test_partial_failure_and_refused_release_are_judged() -> None:
    ps, steps, _ = _game_day()
    pf = pl.partial_failure_visibility(ps, steps, *WINDOW)
    assert pf.no_data is None and pf.judged == 3 and not pf.violations
    rel = pl.release_after_checks(ps, steps, *WINDOW)
    assert rel.no_data is None and rel.judged == 1 and not rel.violations
    reg = next(s for s in steps if s.pipeline_id == "changed" and s.name == "register")
    assert reg.state == "failed" and reg.operation_id is None
    assert "release refused" in (reg.state_reason or "")


def test_release_that_ran_after_a_failed_check_is_a_violation() -> None:
    fr, trs, logs, reg = _run("changed", 200, prepare_state="Completed", given=V2, consumed=V2,
                              refused=True)
    logs = [x for x in logs if "release_refused" not in x["message"]]
    trs.append(_tr("register", 213))
    ps, steps, _ = _evidence([(fr, trs, logs, reg)])
    rel = pl.release_after_checks(ps, steps, *WINDOW)
    assert rel.judged == 1 and len(rel.violations) == 1


def test_missing_evidence_is_no_data_never_a_pass() -> None:
    # the flow's step_result lines were lost (e.g. logs dropped during an API outage): a reused
    # step without the digests its result consumed cannot be judged
    fr, trs, logs, _ = _run("same", 100, prepare_state="Cached", given=V1, consumed=V1)
    logs = [x for x in logs if "step_result" not in x["message"]]
    _, steps, _ = _evidence([(fr, trs, logs, [])])
    r = pl.stale_cache_reuse(steps, *WINDOW)
    assert r.judged == 0 and r.no_data and "carry no input digests" in r.no_data
    # no registry objects found: side-effect-once has no data
    assert pl.side_effect_once([], *WINDOW).no_data
    # and no pipeline_steps file at all
    assert pl.stale_cache_reuse(None, *WINDOW).no_data


def test_cache_key_is_the_result_record_name_when_prefect_leaves_it_null() -> None:
    assert pipes.cache_key(_tr("prepare", 1, key="abc")) == "abc"
    assert pipes.cache_key({**_tr("prepare", 1, key="abc"), "cache_key": "set"}) == "set"
    assert pipes.cache_key(_tr("evaluate", 1)) is None


def test_steps_without_task_runs() -> None:
    running = _flow("r", 0, "RUNNING", V1)
    p, steps, _, _ = pipes.pipeline_records(running, [_tr("prepare", 1, key="K")], [], [])
    assert p["state"] == "running"
    assert [s["state"] for s in steps] == ["succeeded"] + ["waiting"] * 5
    crashed = _flow("x", 0, "CRASHED", V1)
    p, steps, _, _ = pipes.pipeline_records(crashed, [_tr("prepare", 1, key="K")], [], [])
    assert p["state"] == "failed" and steps[-1]["state"] == "skipped"
    v = pipes.view(p, steps)
    assert [s["name"] for s in v["steps"]] == list(pipes.STEP_ORDER)


def test_submission_translates_the_experiment_body_and_names_what_is_missing() -> None:
    params = pipes.submission(BODY, None, "b")
    assert params["dataset_uri"] == "datasets/x/rows.csv" and params["dataset_sha256"] == V1
    assert params["candidates"]["train-c"]["kind"] == "fail"
    assert params["candidates"]["train-a"]["steps"] == 80 and params["spec"] is BODY
    with pytest.raises(ValueError, match="datasets"):
        pipes.submission({"steps": [{"name": "prepare"}]}, None, "b")
    broken = {"steps": [BODY["steps"][0]]}
    with pytest.raises(ValueError, match="train-a"):
        pipes.submission(broken, None, "b")

"""Pipeline invariants and the time to a usable result per phase (slo/pipelines.py) on
hand-made snapshot records: each rule passes on a healthy record set, catches its violation,
and says "no data" (never pass) when the evidence is missing or the promise was not exercised.
Also: the snapshot's pipeline files are read into the evidence, and are None when absent."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from slo.evidence import (
    PipelineRecord,
    PipelineStepRecord,
    SideEffectRecord,
    load_evidence,
)
from slo.invariants import KNOWN_INVARIANTS, check_invariant
from slo.pipelines import (
    PIPELINE_INVARIANTS,
    cache_hit_when_unchanged,
    partial_failure_visibility,
    release_after_checks,
    side_effect_once,
    stale_cache_reuse,
    usable_result_seconds,
)

T0 = datetime(2025, 1, 6, 10, 0, tzinfo=UTC)
START, END = T0.timestamp(), T0.timestamp() + 600
D1, D2, P1 = "1" * 64, "2" * 64, "a" * 64  # dataset v1, dataset v2, a prepared file


def _at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def _step(pid: str, name: str, state: str = "succeeded", start: float = 10, end: float = 20,
          key: str | None = None, given: list[str] | None = None,
          consumed: list[str] | None = None, op: str | None = "op", **extra: Any,
          ) -> PipelineStepRecord:
    manifest = extra.pop("manifest", None)
    if manifest is None and consumed is not None:
        manifest = {"inputs": consumed, "files": {}}
    return PipelineStepRecord(
        pipeline_id=pid, name=name, state=state, cache_key=key,
        operation_id=None if op is None else f"{op}-{pid}-{name}",
        inputs={"digests": given} if given is not None else None, manifest=manifest,
        started_at=_at(start), finished_at=_at(end) if end is not None else None, **extra)


SPEC = {"steps": [
    {"name": "prepare", "phase": "prepare", "role": "task", "needs": []},
    {"name": "train-a", "phase": "train", "role": "task", "needs": ["prepare"]},
    {"name": "train-c", "phase": "train", "role": "task", "needs": ["prepare"]},
    {"name": "evaluate", "phase": "evaluate", "role": "aggregate",
     "needs": ["train-a", "train-c"]},
    {"name": "register", "phase": "register", "role": "release", "needs": ["evaluate"]},
]}


def _pipeline(pid: str = "p1", state: str = "succeeded", created: float = 5,
              report: dict[str, Any] | None = None) -> PipelineRecord:
    return PipelineRecord(id=pid, name="churn", state=state, spec=SPEC, created_at=_at(created),
                          report=report if report is not None else
                          {"excluded": {"train-c": "failed: operation failed: exit 2"}})


EXCLUDED_REPORT = {"policy": "continue-incomplete", "candidates": ["train-a", "train-c"],
                   "included": ["train-a"],
                   "excluded": {"train-c": "failed: operation failed: exit 2"}}


def _run(checks: dict[str, Any] | None = None, register: str = "succeeded",
         eval_report: dict[str, Any] | None = None, pid: str = "p1") -> list[PipelineStepRecord]:
    return [
        _step(pid, "prepare", given=[D1], consumed=[D1], key="k-prep"),
        _step(pid, "train-a", given=[P1], consumed=[P1], key="k-a"),
        _step(pid, "train-c", state="failed", key="k-c", given=[P1]),
        _step(pid, "evaluate", key="k-eval", report=eval_report or EXCLUDED_REPORT,
              manifest={"inputs": [], "checks": checks if checks is not None else
                        {"candidates_scored": {"passed": True}}}),
        _step(pid, "register", state=register,
              op=None if register == "failed" else "op"),
    ]


# -- stale-cache-reuse ----------------------------------------------------------------------

def test_stale_cache_reuse_passes_when_the_reused_result_consumed_the_same_bytes() -> None:
    steps = [_step("p2", "prepare", "reused", 100, 100, "k-prep", [D1], [D1])]
    r = stale_cache_reuse(steps, START, END)
    assert (r.judged, r.violations, r.no_data) == (1, (), None)


def test_stale_cache_reuse_catches_a_hit_on_other_bytes_behind_the_same_name() -> None:
    steps = [_step("p3", "prepare", "reused", 200, 200, "k-prep", [D2], [D1],
                   manifest={"inputs": [D1], "reused_from": {"source_step": "prepare",
                                                              "source_pipeline_id": "p1"}})]
    r = stale_cache_reuse(steps, START, END)
    assert r.judged == 1 and len(r.violations) == 1
    assert "p3" in r.violations[0] and "source" not in r.violations[0]
    assert "pipeline p1" in r.violations[0]


def test_stale_cache_reuse_is_no_data_without_records_or_reuse_or_digests() -> None:
    assert "missing" in (stale_cache_reuse(None, START, END).no_data or "")
    ran = [_step("p1", "prepare", given=[D1], consumed=[D1])]
    assert "never exercised" in (stale_cache_reuse(ran, START, END).no_data or "")
    blind = [_step("p2", "prepare", "reused", 100, 100, "k", None, None)]
    r = stale_cache_reuse(blind, START, END)
    assert r.judged == 0 and r.no_data and not r.violations


# -- cache-hit-when-unchanged ---------------------------------------------------------------

def test_cache_hit_when_unchanged_passes_on_a_hit_and_catches_a_rerun() -> None:
    first = _step("p1", "prepare", key="k", start=10, end=20)
    hit = _step("p2", "prepare", "reused", 30, 30, "k")
    r = cache_hit_when_unchanged([first, hit], START, END)
    assert (r.judged, r.violations, r.no_data) == (1, (), None)
    rerun = _step("p2", "prepare", "succeeded", 30, 40, "k")
    r = cache_hit_when_unchanged([first, rerun], START, END)
    assert r.judged == 1 and len(r.violations) == 1 and "ran again" in r.violations[0]


def test_cache_hit_when_unchanged_ignores_misses_on_new_keys_and_results_not_yet_accepted(
        ) -> None:
    first = _step("p1", "prepare", key="k", start=10, end=50)
    concurrent = _step("p2", "prepare", key="k", start=30, end=60)  # first not accepted yet
    other = _step("p3", "prepare", key="k2", start=70, end=80)  # bytes changed: a new key
    r = cache_hit_when_unchanged([first, concurrent, other], START, END)
    assert r.judged == 0 and r.no_data and not r.violations
    assert "missing" in (cache_hit_when_unchanged(None, START, END).no_data or "")


# -- side-effect-once -----------------------------------------------------------------------

def _effect(op: str, action: str, s: float = 50) -> SideEffectRecord:
    return SideEffectRecord(operation_id=op, action_id=action, kind="model_registration",
                            created_at=_at(s))


def test_side_effect_once_passes_one_per_action_and_catches_a_duplicate() -> None:
    ok = [_effect("op-1", "pipeline:p1:step:register:model_registration"),
          _effect("op-2", "pipeline:p2:step:register:model_registration")]
    r = side_effect_once(ok, START, END)
    assert (r.judged, r.violations, r.no_data) == (2, (), None)
    dup = [*ok, _effect("op-1", "pipeline:p1:step:register:model_registration:r2", 60)]
    r = side_effect_once(dup, START, END)
    assert r.judged == 2 and len(r.violations) == 1 and "2 times" in r.violations[0]


def test_side_effect_once_is_no_data_when_missing_or_nothing_recorded_in_the_window() -> None:
    assert "missing" in (side_effect_once(None, START, END).no_data or "")
    r = side_effect_once([_effect("op-1", "a", s=-100)], START, END)
    assert r.judged == 0 and r.no_data and not r.violations
    assert side_effect_once([], START, END).no_data


# -- partial-failure-visibility -------------------------------------------------------------

def test_partial_failure_visibility_passes_when_every_excluded_candidate_is_named() -> None:
    r = partial_failure_visibility([_pipeline()], _run(), START, END)
    assert (r.judged, r.violations, r.no_data) == (1, (), None)


def test_partial_failure_visibility_catches_an_unnamed_or_reasonless_candidate() -> None:
    for report in ({**EXCLUDED_REPORT, "excluded": {}},
                   {**EXCLUDED_REPORT, "excluded": {"train-c": " "}},
                   {**EXCLUDED_REPORT, "candidates": ["train-a"]}):
        r = partial_failure_visibility([_pipeline()], _run(eval_report=report), START, END)
        assert r.judged == 1 and len(r.violations) == 1 and "train-c" in r.violations[0], report
    # the pipeline succeeded incomplete but its own report does not say which was left out
    r = partial_failure_visibility([_pipeline(report={"excluded": {}})], _run(), START, END)
    assert len(r.violations) == 1 and "succeeded without naming" in r.violations[0]


def test_partial_failure_visibility_is_no_data_without_records_or_a_partial_failure() -> None:
    assert "missing" in (partial_failure_visibility(None, _run(), START, END).no_data or "")
    assert "missing" in (partial_failure_visibility([_pipeline()], None, START, END).no_data
                         or "")
    complete = [s if s.name != "train-c" else _step("p1", "train-c", key="k-c")
                for s in _run()]
    r = partial_failure_visibility([_pipeline()], complete, START, END)
    assert r.judged == 0 and r.no_data and not r.violations


# -- release-after-checks -------------------------------------------------------------------

FAILED = {"candidates_scored": {"passed": True},
          "enough_candidates": {"passed": False, "value": 2, "minimum": 3}}


def test_release_after_checks_passes_when_a_failed_check_refused_the_release() -> None:
    r = release_after_checks([_pipeline(state="failed")], _run(FAILED, register="failed"),
                             START, END)
    assert (r.judged, r.violations, r.no_data) == (1, (), None)


def test_release_after_checks_catches_a_release_that_ran_after_a_failed_check() -> None:
    r = release_after_checks([_pipeline()], _run(FAILED, register="succeeded"), START, END)
    assert r.judged == 1 and len(r.violations) == 1
    assert "enough_candidates" in r.violations[0]
    r = release_after_checks([_pipeline()], _run({}, register="succeeded"), START, END)
    assert len(r.violations) == 1 and "no upstream check" in r.violations[0]


def test_release_after_checks_is_no_data_when_no_check_failed_or_records_are_missing() -> None:
    r = release_after_checks([_pipeline()], _run(), START, END)
    assert r.judged == 0 and r.no_data and not r.violations
    assert "missing" in (release_after_checks([_pipeline()], None, START, END).no_data or "")
    # a pipeline that ended before the window is not judged; one submitted before it and
    # still changing in it is
    r = release_after_checks([_pipeline(created=-50)], _run(FAILED), START, END)
    assert r.judged == 0 and r.no_data
    live = _pipeline(created=-50).model_copy(update={"updated_at": _at(30)})
    r = release_after_checks([live], _run(FAILED), START, END)
    assert r.judged == 1 and len(r.violations) == 1


# -- time to a usable result per phase ------------------------------------------------------

def test_usable_result_seconds_per_phase_from_submission() -> None:
    steps = _run(FAILED, register="failed")
    out = usable_result_seconds([_pipeline()], steps, START, END)
    # created at 5 s, every succeeded step finished at 20 s; register never produced one
    assert out == {"p1": {"prepare": 15.0, "train": 15.0, "evaluate": 15.0, "register": None}}
    assert usable_result_seconds(None, steps, START, END) is None
    assert usable_result_seconds([_pipeline()], None, START, END) is None


# -- evidence: the snapshot's pipeline files ------------------------------------------------

def test_pipeline_snapshot_files_are_read_and_absent_files_are_no_data(make_run) -> None:
    run = make_run().path
    for name in ("pipelines", "pipeline_steps", "pipeline_events", "side_effects"):
        (run / "snapshot" / f"{name}.jsonl").unlink(missing_ok=True)
    ev = load_evidence(run)
    assert ev.pipelines is None and ev.pipeline_steps is None and ev.side_effects is None
    for name in PIPELINE_INVARIANTS:
        assert name in KNOWN_INVARIANTS
        r = check_invariant(name, ev, START, END)
        assert r.judged == 0 and r.no_data and "missing" in r.no_data and not r.violations, name

    effect = {"operation_id": "op-1", "action_id": "x", "kind": "model_registration",
              "payload": {}, "receipt": {}, "created_at": _at(50).isoformat()}
    (run / "snapshot" / "side_effects.jsonl").write_text(
        "\n".join(json.dumps(effect) for _ in range(2)) + "\n")
    (run / "snapshot" / "pipeline_steps.jsonl").write_text("")
    ev = load_evidence(run)
    assert ev.side_effects is not None and len(ev.side_effects) == 2
    assert ev.pipeline_steps == ()
    r = check_invariant("side-effect-once", ev, START, END)
    assert r.judged == 1 and len(r.violations) == 1
    r = check_invariant("stale-cache-reuse", ev, START, END)
    assert r.no_data and "never exercised" in r.no_data

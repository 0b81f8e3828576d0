"""The invariant sources-accounted (slo/pipelines.py) on hand-made snapshot records: it passes
on what a healthy platform records (a degraded step naming the corrupt source, a failed step
naming the missing one), fails on each way of running on less or other data than declared,
and is "no data" (never a pass) when no source was broken or nothing declared a policy."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from slo.evidence import FaultRecord, PipelineRecord, PipelineStepRecord
from slo.pipelines import SOURCE_FAULT, sources_accounted

T0 = datetime(2025, 1, 6, 10, 0, tzinfo=UTC)
START, END = T0.timestamp(), T0.timestamp() + 600
DS = [{"name": f"s{i:02d}", "sha256": f"{i:x}" * 64, "uri": f"datasets/x/s{i:02d}.csv"}
      for i in range(10)]
DS_B = [{**d, "uri": d["uri"].replace("/x/", "/y/")} for d in DS]  # another pipeline's
DIGESTS = sorted(d["sha256"] for d in DS)
DEGRADE = {"policy": "degrade", "min_sources": 9}
FAIL = {"policy": "fail", "min_sources": None}


def _at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def fault(source: int, mode: str = "corrupt", start: float = 5, end: float | None = 100,
          ds: list[dict[str, Any]] = DS) -> list[FaultRecord]:
    d = {"source": f"s{source:02d}", "uri": ds[source]["uri"], "mode": mode}
    out = [FaultRecord(time=_at(start), event="fault_start", fault=SOURCE_FAULT,
                       target=d["uri"], details=d)]
    if end is not None:
        out.append(FaultRecord(time=_at(end), event="fault_end", fault=SOURCE_FAULT,
                               target=d["uri"], details=d))
    return out


def pipeline(pid: str, policy: dict[str, Any], state: str = "succeeded",
             report: dict[str, Any] | None = None) -> PipelineRecord:
    return PipelineRecord(id=pid, name=pid, state=state, report=report, created_at=_at(8),
                          updated_at=_at(30), spec={"steps": [
                              {"name": "prepare", "role": "task", "needs": [],
                               "on_source_unavailable": policy}]})


def step(pid: str, state: str = "succeeded", excluded: dict[str, str] | None = None,
         read: dict[str, str] | None = None, consumed: list[str] | None = None,
         reason: str | None = None, sources: bool = True, ds: list[dict[str, Any]] = DS,
         ) -> PipelineStepRecord:
    excluded = excluded or {}
    if read is None:
        read = {d["name"]: d["sha256"] for d in DS if d["name"] not in excluded}
    if consumed is None:
        consumed = sorted(read.values())
    manifest = None
    if state == "succeeded":
        manifest = {"inputs": consumed, "files": {}}
        if sources:
            manifest["sources"] = {"read": read, "excluded": excluded}
    return PipelineStepRecord(pipeline_id=pid, name="prepare", state=state, state_reason=reason,
                              inputs={"datasets": ds, "digests": DIGESTS}, manifest=manifest,
                              started_at=_at(10), finished_at=_at(20))


def judge(pipes: list[PipelineRecord], steps: list[PipelineStepRecord],
          faults: list[FaultRecord]) -> Any:
    return sources_accounted(pipes, steps, faults, START, END)


def test_a_healthy_platform_names_the_corrupt_and_the_missing_source() -> None:
    why = "sha256 mismatch: its bytes changed behind the name"
    pipes = [pipeline("deg", DEGRADE, report={"excluded_sources": {"prepare": {"s03": why}}}),
             pipeline("fail", FAIL, state="failed")]
    steps = [step("deg", excluded={"s03": why}),
             step("fail", "failed", reason="operation failed: workload exited 2: data "
                  "unavailable at start: policy fail: 1 of 10 sources unusable: s07 (object "
                  "missing: datasets/y/s07.csv)", ds=DS_B)]
    r = judge(pipes, steps, fault(3) + fault(7, "missing", ds=DS_B))
    assert r.judged == 2 and r.violations == () and r.no_data is None


def test_running_on_corrupt_bytes_fails_the_invariant() -> None:
    """The seeded defect source-digest-unchecked's evidence: nothing excluded, the corrupt
    source's read digest is not the declared one."""
    read = {d["name"]: d["sha256"] for d in DS} | {"s03": "e" * 64}
    r = judge([pipeline("deg", DEGRADE)], [step("deg", read=read, consumed=DIGESTS)],
              fault(3))
    assert r.judged == 1
    assert any("ran on source s03 with other bytes than declared" in v for v in r.violations)
    assert any("completed while source s03 was corrupt" in v for v in r.violations)


def test_a_silent_shrink_fails_the_invariant() -> None:
    """The seeded defect excluded-source-unnamed's evidence: s03 neither read nor named, the
    pipeline report silent."""
    read = {d["name"]: d["sha256"] for d in DS if d["name"] != "s03"}
    r = judge([pipeline("deg", DEGRADE)], [step("deg", read=read)], fault(3))
    assert r.judged == 1
    assert any("without source s03 and without naming it" in v for v in r.violations), r
    assert any("consumed 9 of 10 declared sources, naming 0 excluded" in v
               for v in r.violations), r


def test_the_declared_policy_is_held_against_what_happened() -> None:
    # excluded under policy fail
    r = judge([pipeline("f", FAIL)], [step("f", excluded={"s03": "x"})], fault(3))
    assert any("under policy fail" in v for v in r.violations)
    # a degrade step that failed although one bad source of ten was allowed
    r = judge([pipeline("d", DEGRADE, state="failed")],
              [step("d", "failed", reason="operation failed: s03 sha256 mismatch")], fault(3))
    assert any("failed although its policy degrade allows" in v for v in r.violations)
    # a failure that does not say which source
    r = judge([pipeline("f", FAIL, state="failed")],
              [step("f", "failed", reason="operation failed: exit 2")], fault(7, "missing"))
    assert any("failed without naming the source s07 (missing)" in v for v in r.violations)
    # degraded, named in the step but not in the pipeline's report
    r = judge([pipeline("d", DEGRADE, report={})], [step("d", excluded={"s03": "why"})],
              fault(3))
    assert any("without naming the sources left out (s03) in its report" in v
               for v in r.violations)
    # no account at all
    r = judge([pipeline("d", DEGRADE)], [step("d", sources=False)], fault(3))
    assert any("no account of its 10 sources" in v for v in r.violations)


def test_no_broken_source_or_no_policy_is_no_data_never_a_pass() -> None:
    r = judge([pipeline("d", DEGRADE)], [step("d")], [])
    assert r.judged == 0 and r.no_data and SOURCE_FAULT in r.no_data
    nopol = pipeline("n", DEGRADE)
    nopol.spec["steps"][0].pop("on_source_unavailable")
    r = judge([nopol], [step("n")], fault(3))
    assert r.judged == 0 and r.no_data and "declared source policy" in r.no_data
    r = sources_accounted(None, None, fault(3), START, END)
    assert r.judged == 0 and r.no_data and "missing" in r.no_data
    # a source fault over before the step started does not count against it
    r = judge([pipeline("d", DEGRADE)], [step("d")], fault(3, end=9))
    assert r.judged == 1 and r.violations == ()

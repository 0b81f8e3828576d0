"""Fixtures where something is MISSING: fixtures that always contain every experiment, fault
and write report hide the fail-open paths. Each must produce its documented exit code."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from slo.cli import evaluate_cmd
from slo.evaluate import (
    EXIT_EVIDENCE,
    EXIT_EXPERIMENT,
    EXIT_OBJECTIVE,
    EXIT_PASS,
    evaluate_run,
)
from slo.evidence import FaultRecord
from slo.experiment import fault_window
from slo.fixtures import ExperimentFixture as X
from slo.fixtures import example_experiments
from slo.report import write_reports


def _check(verdict, check_id: str):
    return next(c for c in verdict.checks if c.id == check_id)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_rows(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize(
    ("experiments", "options", "code", "result", "reason"),
    [
        pytest.param(
            (X("api-replica-loss"), X("node-pool-exhausted", journal=False),
             X("db-primary-loss")), {}, EXIT_EVIDENCE, "error",
            "missing from the evidence: node-pool-exhausted (no journal; runner: no journal "
            "(chaos exited 1))", id="3 experiments, 2 journals"),
        pytest.param(
            (X("api-replica-loss", steady_state_before=False),), {}, EXIT_EXPERIMENT, "fail",
            "not measured: api-replica-loss (steady state not met before the method)",
            id="steady state not met before"),
        pytest.param(
            (X("api-replica-loss", record_fault=False),), {}, EXIT_EXPERIMENT, "fail",
            "not measured: api-replica-loss (no fault recorded", id="no fault_start"),
        pytest.param(
            (X("api-replica-loss"),), {"report_writes": False}, EXIT_OBJECTIVE, "fail",
            "key objective(s) missed: sli.artifact-write-success", id="key SLI without outcomes"),
        pytest.param(
            (X("api-replica-loss", stuck_after_fault=20.0),), {}, EXIT_OBJECTIVE, "fail",
            "key objective(s) missed: api-replica-loss.rto", id="stuck after the fault"),
    ],
)
def test_missing_evidence_has_its_documented_exit_code(
    make_run, experiments, options, code: int, result: str, reason: str
) -> None:
    run = make_run(*experiments, **options)
    out = CliRunner().invoke(evaluate_cmd, [str(run.path)], env={"COLUMNS": "250"})
    assert out.exit_code == code, out.output
    verdict = json.loads((run.path / "verdict.json").read_text())
    assert verdict["exit_code"] == code and verdict["result"] == result
    assert reason in verdict["reason"]
    assert "PASS" not in out.output


def test_every_expected_experiment_is_reported_in_run_order(make_run) -> None:
    run = make_run(X("db-primary-loss"), X("registry-failure", journal=False,
                                           runner_status="refused: system unhealthy before "
                                           "injection (unhealthy: ['api'])"),
                   X("api-replica-loss"))
    verdict = evaluate_run(run.path)
    assert [e.name for e in verdict.experiments] == [
        "db-primary-loss", "registry-failure", "api-replica-loss"]
    missing = verdict.experiments[1]
    assert not missing.journal_present and missing.rto_seconds is not None
    assert missing.runner_status.startswith("refused: system unhealthy")
    # its objectives are rows too, never a pass and never a number
    rows = [c for c in verdict.checks if c.experiment == "registry-failure"]
    assert {c.id for c in rows} >= {"registry-failure.rto", "registry-failure.experiment",
                                    "registry-failure.invariant.bounded-retries",
                                    "registry-failure.alert.StartupSuccessBurnRate"}
    assert all(c.status == "not_measured" and c.measured is None for c in rows)
    paths = write_reports(verdict, run.path)
    assert "**Not measured: no journal; runner: refused: system unhealthy" in (
        paths["report.md"].read_text())


def test_not_applicable_experiments_are_not_expected(make_run) -> None:
    run = make_run(X("api-replica-loss"))
    info = json.loads((run.path / "run.json").read_text())
    info["experiments"] = ["api-replica-loss", "registry-failure"]
    info["not_applicable"] = {"registry-failure": "no image pull"}
    (run.path / "run.json").write_text(json.dumps(info))
    assert evaluate_run(run.path).exit_code == EXIT_PASS


def test_older_run_dirs_expect_every_experiment_directory(make_run) -> None:
    run = make_run(X("api-replica-loss"), list_experiments=False)
    assert evaluate_run(run.path).exit_code == EXIT_PASS  # the journals present are the set
    (run.path / "experiments" / "db-primary-loss").mkdir()  # the runner's dir, no journal
    (run.path / "experiments" / "db-primary-loss" / "chaos.out").write_text("Traceback ...\n")
    verdict = evaluate_run(run.path)
    assert verdict.exit_code == EXIT_EVIDENCE
    assert "db-primary-loss (no journal; no runner status in run.json)" in verdict.reason


def test_fault_window_spans_every_fault_of_the_experiment() -> None:
    def f(t: int, event: str, fault: str) -> FaultRecord:
        return FaultRecord.model_validate(
            {"time": f"2025-01-06T10:00:{t:02d}Z", "event": event, "fault": fault})

    base = f(0, "note", "x").time.timestamp()
    faults = [f(10, "fault_start", "kill-api"), f(12, "fault_start", "partition"),
              f(20, "fault_end", "kill-api"), f(40, "fault_end", "partition"),
              f(55, "fault_start", "after-the-journal")]
    window = fault_window(faults, base + 5, base + 50)
    assert window is not None
    assert (window.start - base, window.end - base) == (10, 40)
    assert window.name == "kill-api, partition"
    # a fault never ended lasts until the journal end; none recorded: no window at all
    unended = fault_window(faults[:2] + faults[2:3], base + 5, base + 50)
    assert unended is not None and unended.end - base == 50
    assert fault_window(faults, base + 41, base + 50) is None


def test_rto_without_any_recovery_data_fails_no_data(make_run) -> None:
    run = make_run(X("artifact-store-unavailable", alerts={"ArtifactWriteSuccessBurnRate": 5}),
                   report_writes=False)
    verdict = evaluate_run(run.path)
    rto = _check(verdict, "artifact-store-unavailable.rto")
    assert rto.status == "fail" and rto.measured is None
    assert rto.message.startswith("no data: artifact-write-success had no data")
    assert verdict.exit_code == EXIT_OBJECTIVE


def test_invariant_fixture_passes_and_each_invariant_can_fail(make_run) -> None:
    suite = [x for x in example_experiments() if x.name in (
        "agent-connectivity-loss", "registry-failure", "ineligible-fallback-region")]
    run = make_run(*suite)
    verdict = evaluate_run(run.path)
    assert verdict.exit_code == EXIT_PASS, verdict.reason
    fencing = _check(verdict, "agent-connectivity-loss.invariant.fencing")
    assert fencing.status == "pass" and fencing.measured == 0 and fencing.key
    assert verdict.experiments[0].automation["stale_reports_rejected"] == 1

    # the cut-off agent's report is recorded as accepted progress after its lease expired
    events_path = run.path / "snapshot" / "events.jsonl"
    events = _rows(events_path)
    expired = next(e for e in events if e["kind"] == "lease_expired")
    one_second_later = datetime.fromisoformat(expired["time"]) + timedelta(seconds=1)
    late = {**expired, "id": "ev-late", "kind": "progress", "actor": "agent:agent-cpu-1",
            "time": one_second_later.isoformat(), "data": {"step": 51}}
    _write_rows(events_path, [*events, late])
    (run.path / "snapshot" / "agents.jsonl").unlink()
    ops_path = run.path / "snapshot" / "operations.jsonl"
    _write_rows(ops_path, [{k: v for k, v in o.items() if k != "max_retries"}
                           for o in _rows(ops_path)])
    verdict = evaluate_run(run.path)
    assert verdict.exit_code == EXIT_OBJECTIVE
    fencing = _check(verdict, "agent-connectivity-loss.invariant.fencing")
    assert fencing.status == "fail" and fencing.measured == 1
    assert "progress by agent:agent-cpu-1" in fencing.message
    placement = _check(verdict, "ineligible-fallback-region.invariant.eligible-placement")
    assert placement.status == "fail" and placement.measured is None
    assert placement.message == "no data: snapshot/agents.jsonl is missing from the evidence"
    retries = _check(verdict, "registry-failure.invariant.bounded-retries")
    assert retries.status == "fail" and retries.message.startswith("no data: ")
    for check_id in (fencing.id, placement.id, retries.id):
        assert check_id in verdict.reason


def test_dropped_evidence_is_a_warning_shown_everywhere(make_run) -> None:
    run = make_run(X("api-replica-loss"))
    events_path = run.path / "snapshot" / "events.jsonl"
    events = _rows(events_path)
    drop = {**events[0], "id": "ev-drop", "operation_id": None, "attempt_id": None,
            "kind": "evidence_dropped", "actor": "agent:agent-cpu-1", "data": {"count": 7}}
    _write_rows(events_path, [*events, drop])
    (run.path / "prometheus" / "evidence_dropped.json").write_text(json.dumps({
        "query": "sum by (agent) (controlplane_agent_events_dropped_total)",
        "response": {"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"agent": "agent-gpu-1"}, "values": [[0, "2"], [5, "5"]]}]}}}))
    verdict = evaluate_run(run.path)
    check = _check(verdict, "evidence.dropped")
    assert check.status == "warning" and check.measured == 10 and not check.key
    assert verdict.evidence_dropped_by_agent == {"agent-cpu-1": 7, "agent-gpu-1": 3}
    assert verdict.exit_code == EXIT_PASS and verdict.result in ("pass", "warning")
    paths = write_reports(verdict, run.path)
    assert "Dropped evidence: 10 events (agent-cpu-1 7, agent-gpu-1 3)" in (
        paths["report.md"].read_text())
    assert "dropped evidence: 10 events" in paths["report.html"].read_text()
    out = CliRunner().invoke(evaluate_cmd, [str(run.path)], env={"COLUMNS": "250"})
    assert "dropped evidence" in out.output and "10 events" in out.output


def test_ack_answered_under_a_new_operation_id_is_reported(make_run) -> None:
    run = make_run(X("api-replica-loss"))
    ledger_path = run.path / "ledger.jsonl"
    ledger = _rows(ledger_path)
    ledger[-1]["operation_id"] = "op-that-the-store-never-had"
    _write_rows(ledger_path, ledger)
    verdict = evaluate_run(run.path)
    exp = verdict.experiments[0]
    assert exp.acknowledged_matched_by_key_only == 1 and exp.acknowledged_duplicated == 0
    assert "1 answer under a new operation id" in _check(
        verdict, "api-replica-loss.rpo.acknowledged_submissions").message
    text = write_reports(verdict, run.path)["report.md"].read_text()
    assert "1 answering under a new operation id" in text

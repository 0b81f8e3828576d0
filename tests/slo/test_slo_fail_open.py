"""Regressions for four fail-open bugs users found: each run directory is a real fixture
edited the way the bad evidence looked, so the test states the evidence, not our flags."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from click.testing import CliRunner

from slo.cli import evaluate_cmd
from slo.evaluate import EXIT_EVIDENCE, EXIT_EXPERIMENT, EXIT_OBJECTIVE, evaluate_run
from slo.fixtures import FAULT_SECONDS, ExperimentFixture
from slo.scoring import Scored, Status, gate_outcome
from slo.specs import load_specs

LOCAL = load_specs("local")
WINDOW = LOCAL.evaluation.sample_window_seconds


def _check(verdict, check_id: str):
    return next(c for c in verdict.checks if c.id == check_id)


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _filter_jsonl(path: Path, keep) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows if keep(r)))


def test_bug1_expected_experiment_without_a_journal_exits_3(make_run) -> None:
    run = make_run(ExperimentFixture("api-replica-loss"), ExperimentFixture("db-primary-loss"))

    def suite_of_three(info: dict) -> None:
        info["experiments"] = ["api-replica-loss", "node-pool-exhausted", "db-primary-loss"]
        info["experiment_status"] = {
            "api-replica-loss": {"status": "completed", "seconds": 120.0, "detail": ""},
            "node-pool-exhausted": {
                "status": "refused: system unhealthy before injection (unhealthy: ['api'])",
                "seconds": 0.0,
                "detail": "",
            },
            "db-primary-loss": {"status": "completed", "seconds": 120.0, "detail": ""},
        }

    _edit_json(run.path / "run.json", suite_of_three)
    result = CliRunner().invoke(evaluate_cmd, [str(run.path)])
    assert result.exit_code == EXIT_EVIDENCE, result.output
    verdict = json.loads((run.path / "verdict.json").read_text())
    assert verdict["result"] == "error" and verdict["exit_code"] == EXIT_EVIDENCE
    assert "node-pool-exhausted" in verdict["reason"]
    assert "system unhealthy before injection" in verdict["reason"]
    missing = next(e for e in verdict["experiments"] if e["name"] == "node-pool-exhausted")
    assert missing["measured"] is False and missing["journal_present"] is False
    assert [e["name"] for e in verdict["experiments"]] == [
        "api-replica-loss", "node-pool-exhausted", "db-primary-loss"]
    assert "all objectives met" not in result.output


def test_bug2_steady_state_not_met_is_not_measured_and_never_pass(make_run) -> None:
    run = make_run(ExperimentFixture("api-replica-loss"))

    def refused(journal: dict) -> None:
        journal["steady_states"]["before"]["steady_state_met"] = False
        journal["steady_states"]["after"] = None
        journal["run"] = []  # Chaos Toolkit skips the method

    _edit_json(run.path / "experiments" / "api-replica-loss" / "journal.json", refused)
    _filter_jsonl(run.path / "faults.jsonl", lambda r: False)  # no fault was injected
    result = CliRunner().invoke(evaluate_cmd, [str(run.path)])
    assert result.exit_code == EXIT_EXPERIMENT, result.output
    verdict = evaluate_run(run.path)
    assert verdict.result == "fail"
    for suffix in ("rto", "rpo.acknowledged_submissions", "rpo.checkpoint_progress",
                   "rpo.artifacts", "experiment"):
        check = _check(verdict, f"api-replica-loss.{suffix}")
        assert check.status == "not_measured", check
        assert check.measured is None
        assert "steady state not met before the method" in check.message
    assert "not measured: api-replica-loss (steady state not met before the method)" in (
        verdict.reason)
    exp = verdict.experiments[0]
    assert exp.measured is False and exp.recovery_seconds is None and exp.fault_start is None
    # the CLI shows check statuses in lower case; only a headline would say PASS
    assert "PASS" not in result.output and "(exit 1)" in result.output


def test_bug3_key_sli_without_data_fails_the_gate(make_run) -> None:
    # the scoring itself: a key check without a status must not leave the score quietly
    assert gate_outcome([Scored(None, 1.0, True), Scored(Status.PASS, 1.0, False)],
                        90, 75).status is Status.FAIL
    run = make_run(ExperimentFixture("api-replica-loss"))
    # nothing reported a checkpoint or artifact write: artifact-write-success has no outcome
    _filter_jsonl(run.path / "snapshot" / "events.jsonl",
                  lambda e: e["kind"] not in ("checkpoint_written", "artifact_written"))
    verdict = evaluate_run(run.path)
    assert "artifact-write-success" in LOCAL.gate.key_slis
    check = _check(verdict, "sli.artifact-write-success")
    assert check.status == "fail" and check.measured is None and check.message == "no data"
    assert verdict.exit_code == EXIT_OBJECTIVE and verdict.result == "fail"


def test_bug4_stuck_for_good_after_the_fault_never_recovered(make_run) -> None:
    run = make_run(ExperimentFixture("api-replica-loss"))
    fault_end = run.fault_starts["api-replica-loss"] + FAULT_SECONDS
    stuck_from = fault_end + 2 * WINDOW  # well after the old "fault end + one window" cut-off

    def stuck(r: dict) -> bool:
        t = datetime.fromisoformat(r["time"]).timestamp()
        if t >= stuck_from:
            r["status"] = 503
        return True

    _filter_jsonl(run.path / "requests.jsonl", stuck)
    verdict = evaluate_run(run.path)
    rto = _check(verdict, "api-replica-loss.rto")
    assert verdict.experiments[0].recovery_seconds is None
    assert rto.status == "fail" and rto.message == "never recovered within the evidence"
    assert verdict.exit_code == EXIT_OBJECTIVE


def test_a_failed_method_activity_fails_the_experiment(tmp_path: Path) -> None:
    """Chaos Toolkit carries on past a failed action and still writes status "completed": an
    experiment whose own check of its fault failed (the kill missed the checkpoint write, the
    outage met no write) must not read as passed."""
    from slo.evidence import _parse_journal

    raw = {"experiment": {"title": "t", "x-gameday": {"recovery_objective": "x", "runbook": "x"}},
           "status": "completed", "deviated": False, "start": "2025-01-06T10:00:00",
           "end": "2025-01-06T10:01:00",
           "steady_states": {"before": {"steady_state_met": True}},
           "run": [{"activity": {"name": "inject", "type": "action"}, "status": "succeeded"},
                   {"activity": {"name": "kill-inside-write", "type": "action"},
                    "status": "failed"}]}
    journal = _parse_journal(raw, "journal.json")
    assert journal.failed_activities == ["kill-inside-write"] and not journal.experiment_ok
    raw["run"][1]["status"] = "succeeded"
    assert _parse_journal(raw, "journal.json").experiment_ok

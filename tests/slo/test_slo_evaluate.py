"""Seeded run directories with known answers prove the evaluator right."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slo.cli import evaluate_cmd
from slo.evaluate import EXIT_EVIDENCE, EXIT_EXPERIMENT, EXIT_OBJECTIVE, EXIT_PASS, evaluate_run
from slo.fixtures import FAULT_SECONDS, REQUEST_EVERY, ExperimentFixture
from slo.specs import load_specs

LOCAL = load_specs("local")
STEP = LOCAL.evaluation.sample_interval_seconds
WINDOW = LOCAL.evaluation.sample_window_seconds


def _check(verdict, check_id: str):
    return next(c for c in verdict.checks if c.id == check_id)


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_clean_run_passes_with_exit_0(make_run) -> None:
    run = make_run(ExperimentFixture("api-replica-loss"))
    verdict = evaluate_run(run.path)
    assert verdict.exit_code == EXIT_PASS and verdict.result == "pass"
    assert all(c.status == "pass" for c in verdict.checks)
    assert all(s.value == 1.0 for s in verdict.slis)


def test_three_of_a_thousand_lost_fails_durability_with_exit_2(make_run) -> None:
    lost = 3
    run = make_run(ExperimentFixture("api-replica-loss"), submissions=1000, lost_acks=lost)
    result = CliRunner().invoke(evaluate_cmd, [str(run.path)])
    assert result.exit_code == EXIT_OBJECTIVE, result.output
    verdict = json.loads((run.path / "verdict.json").read_text())
    durability = next(s for s in verdict["slis"] if s["name"] == "submission-durability")
    assert durability["total"] == run.spec.submissions
    assert durability["value"] == pytest.approx(
        (run.spec.submissions - lost) / run.spec.submissions
    )
    assert verdict["result"] == "fail" and "sli.submission-durability" in verdict["reason"]
    check = next(
        c for c in verdict["checks"] if c["id"] == "api-replica-loss.rpo.acknowledged_submissions"
    )
    assert check["measured"] == lost and check["status"] == "fail"


def test_detection_and_recovery_of_an_api_outage(make_run) -> None:
    outage = 3 * STEP  # a multiple of the sample step, so the expected times are exact
    run = make_run(ExperimentFixture("db-primary-loss", api_error_seconds=outage))
    verdict = evaluate_run(run.path)
    exp = verdict.experiments[0]
    # first failing request completes just after the fault sample, so the next sample sees it
    assert exp.detection_seconds == pytest.approx(STEP)
    assert exp.detected_by == "SLI breach"
    # back within objective once the rolling window has slid past the last failed request
    assert exp.recovery_seconds == pytest.approx(outage + WINDOW)
    assert exp.failed_requests == pytest.approx(outage / REQUEST_EVERY)
    rto = LOCAL.recovery_objectives["db-primary-loss"].rto_seconds
    assert _check(verdict, "db-primary-loss.rto").status == (
        "pass" if outage + WINDOW <= rto else "fail"
    )


def test_recovery_past_rto_fails_the_gate(make_run) -> None:
    rto = LOCAL.recovery_objectives["api-replica-loss"].rto_seconds
    outage = min(FAULT_SECONDS, rto + 2 * STEP)
    run = make_run(ExperimentFixture("api-replica-loss", api_error_seconds=outage))
    verdict = evaluate_run(run.path)
    assert _check(verdict, "api-replica-loss.rto").status == "fail"
    assert verdict.exit_code == EXIT_OBJECTIVE


def test_expected_alert_fired_or_silent(make_run) -> None:
    delay = 4 * STEP
    run = make_run(
        ExperimentFixture("node-pool-exhausted", alerts={"QueueAgeBurnRate": delay}),
        ExperimentFixture("registry-failure"),
        ExperimentFixture("db-primary-loss", api_error_seconds=3 * STEP),
    )
    verdict = evaluate_run(run.path)
    fired = _check(verdict, "node-pool-exhausted.alert.QueueAgeBurnRate")
    assert fired.status == "pass" and fired.measured == pytest.approx(delay)
    # the SLO it guards was breached and the alert never fired: a detection gap
    silent = _check(verdict, "db-primary-loss.alert.ApiAvailabilityBurnRate")
    assert silent.status == "fail" and silent.measured is None
    assert any("ApiAvailabilityBurnRate stayed silent" in f for f in verdict.findings)
    assert verdict.experiments[0].detection_seconds == pytest.approx(delay)  # no SLI breached first


def test_silent_alert_is_correct_when_its_slo_was_never_breached(make_run) -> None:
    # no startup failed: a burn-rate alert on startup success has nothing to page on
    verdict = evaluate_run(make_run(ExperimentFixture("registry-failure")).path)
    check = _check(verdict, "registry-failure.alert.StartupSuccessBurnRate")
    assert check.status == "pass" and check.measured is None
    assert "silent, correctly: startup-success stayed within its objective" in check.message
    (alert,) = verdict.experiments[0].alerts
    assert alert.required is False and not alert.fired
    assert not any("stayed silent" in f for f in verdict.findings)


def test_deviated_experiment_exits_1(make_run) -> None:
    run = make_run(ExperimentFixture("api-replica-loss", deviated=True))
    verdict = evaluate_run(run.path)
    # never "pass" above a non-zero exit code
    assert verdict.result == "fail" and verdict.exit_code == EXIT_EXPERIMENT
    check = _check(verdict, "api-replica-loss.experiment")
    assert check.status == "fail" and "deviated" in check.message and not check.key
    assert "experiment(s) failed: api-replica-loss (journal status completed, deviated)" in (
        verdict.reason)


@pytest.mark.parametrize(("at_step", "resume"), [(50, 40), (70, 60), (55, 20)])
def test_checkpoint_progress_lost_is_measured_in_intervals(
    make_run, at_step: int, resume: int
) -> None:
    run = make_run(
        ExperimentFixture(
            "node-interruption-checkpoint",
            interrupted_at_step=at_step,
            resume_from_step=resume,
            alerts={"ActiveProgressBurnRate": STEP},
        )
    )
    verdict = evaluate_run(run.path)
    exp = verdict.experiments[0]
    every = run.spec.checkpoint_every
    assert exp.checkpoint_steps_recomputed == at_step - resume
    assert exp.checkpoint_intervals_lost == pytest.approx((at_step - resume) / every)
    allowed = LOCAL.recovery_objectives[
        "node-interruption-checkpoint"
    ].rpo.checkpoint_progress_intervals
    expected = "pass" if (at_step - resume) / every <= allowed else "fail"
    assert (
        _check(verdict, "node-interruption-checkpoint.rpo.checkpoint_progress").status == expected
    )
    assert exp.automation["lease_expiries"] == 1 and exp.automation["resumes"] == 1


def test_resuming_from_a_torn_checkpoint_is_an_rpo_failure(make_run) -> None:
    run = make_run(
        ExperimentFixture(
            "node-interruption-checkpoint",
            interrupted_at_step=50,
            resume_from_step=40,
            torn_resume=True,
            alerts={"ActiveProgressBurnRate": STEP},
        )
    )
    verdict = evaluate_run(run.path)
    assert verdict.experiments[0].torn_checkpoints_used == 1
    assert _check(verdict, "node-interruption-checkpoint.rpo.checkpoint_progress").status == "fail"
    assert verdict.exit_code == EXIT_OBJECTIVE


def test_artifact_reported_but_missing_is_caught(make_run) -> None:
    run = make_run(
        ExperimentFixture(
            "artifact-store-unavailable", alerts={"ArtifactWriteSuccessBurnRate": STEP}
        )
    )
    objects = run.path / "snapshot" / "objects.jsonl"
    rows = [json.loads(line) for line in objects.read_text().splitlines()]
    victim = next(r for r in rows if r["key"].endswith("/model.npy"))
    objects.write_text("".join(json.dumps(r) + "\n" for r in rows if r is not victim))
    verdict = evaluate_run(run.path)
    writes = next(s for s in verdict.slis if s.name == "artifact-write-success")
    assert writes.total - writes.good == 1
    consistency = next(s for s in verdict.slis if s.name == "terminal-state-consistency")
    assert consistency.total - consistency.good == 1
    assert verdict.experiments[0].artifacts_missing >= 1
    assert verdict.exit_code == EXIT_OBJECTIVE


def test_relative_criteria_against_last_passing_runs(make_run) -> None:
    base = make_run(
        ExperimentFixture(
            "db-primary-loss", api_error_seconds=STEP, alerts={"ApiAvailabilityBurnRate": STEP}
        )
    )
    CliRunner().invoke(evaluate_cmd, [str(base.path)])
    slower = make_run(
        ExperimentFixture(
            "db-primary-loss", api_error_seconds=4 * STEP, alerts={"ApiAvailabilityBurnRate": STEP}
        )
    )
    verdict = evaluate_run(slower.path, baseline_dirs=[base.path], relative_last=3)
    rto = _check(verdict, "db-primary-loss.rto")
    assert verdict.baseline_runs and rto.baseline == pytest.approx(STEP + WINDOW)
    # still within the absolute RTO, but much slower than the baseline: a warning
    assert rto.measured == pytest.approx(4 * STEP + WINDOW) and rto.status == "warning"


def test_evaluate_writes_outputs_and_never_touches_evidence(make_run) -> None:
    run = make_run(ExperimentFixture("api-replica-loss", api_error_seconds=STEP))
    before = _digest(run.path)
    result = CliRunner().invoke(evaluate_cmd, [str(run.path)])
    assert result.exit_code in (EXIT_PASS, EXIT_OBJECTIVE), result.output
    after = _digest(run.path)
    assert {k: v for k, v in after.items() if k in before} == before
    assert set(after) - set(before) == {"verdict.json", "junit.xml", "report.md", "report.html"}
    assert "gameday verdict" in result.output


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda p: (p / "ledger.jsonl").unlink(), "ledger.jsonl: missing"),
        (
            lambda p: (p / "snapshot" / "attempts.jsonl").write_text('{"id": "a"}\n'),
            "attempts.jsonl: line 1: field",
        ),
        (
            lambda p: (p / "requests.jsonl").write_text("not json\n"),
            "requests.jsonl: line 1: not valid JSON",
        ),
        (lambda p: (p / "prometheus" / "alerts.json").unlink(), "prometheus/alerts.json: missing"),
        (lambda p: (p / "run.json").write_text("{}"), "run.json: field run_id"),
    ],
)
def test_unusable_evidence_exits_3_with_a_clear_message(make_run, breakage, message: str) -> None:
    run = make_run(ExperimentFixture("db-primary-loss", alerts={"ApiAvailabilityBurnRate": STEP}))
    breakage(run.path)
    result = CliRunner().invoke(evaluate_cmd, [str(run.path)])
    assert result.exit_code == EXIT_EVIDENCE
    assert message in result.output
    assert not (run.path / "verdict.json").exists()


def test_journal_without_gameday_extension_is_unusable(make_run) -> None:
    run = make_run()
    path = run.path / "experiments" / "api-replica-loss" / "journal.json"
    journal = json.loads(path.read_text())
    del journal["experiment"]["x-gameday"]
    path.write_text(json.dumps(journal))
    result = CliRunner().invoke(evaluate_cmd, [str(run.path)])
    assert result.exit_code == EXIT_EVIDENCE
    assert "experiment.x-gameday: missing" in result.output


def test_extension_may_also_be_a_chaostoolkit_extensions_entry(make_run) -> None:
    run = make_run()
    path = run.path / "experiments" / "api-replica-loss" / "journal.json"
    journal = json.loads(path.read_text())
    ext = journal["experiment"].pop("x-gameday")
    journal["experiment"]["extensions"] = [{"name": "x-gameday", **ext}]
    path.write_text(json.dumps(journal))
    assert evaluate_run(run.path).experiments[0].failure_class == "api-replica-loss"


def test_next_experiments_outage_is_never_charged_to_the_previous_one(make_run, monkeypatch) -> None:
    """Back-to-back experiments (no gap): the second one's API outage falls inside the first
    one's alert grace, yet the first one never breached and recovered at once."""
    import slo.fixtures

    # the first fault ends 3 s before its experiment; the next experiment's fault starts 2 s
    # after that: its errors land inside the first one's breach/recovery search window
    monkeypatch.setattr(slo.fixtures, "GAP_SECONDS", 0.0)
    monkeypatch.setattr(slo.fixtures, "FAULT_OFFSET", 2.0)
    monkeypatch.setattr(slo.fixtures, "EXPERIMENT_SECONDS", 35.0)
    run = make_run(ExperimentFixture("api-replica-loss"),
                   ExperimentFixture("db-primary-loss", api_error_seconds=20.0), submissions=400)
    verdict = evaluate_run(run.path)
    first, second = verdict.experiments
    assert first.name == "api-replica-loss" and second.name == "db-primary-loss"
    assert second.detection_seconds is not None  # the outage is seen, by the right experiment
    assert _check(verdict, "api-replica-loss.rto").status == "pass"
    assert first.recovery_seconds == 0.0


def test_not_applicable_experiments_are_reported_not_silently_skipped(make_run) -> None:
    from slo.report import write_reports

    run = make_run(ExperimentFixture("api-replica-loss"))
    info = json.loads((run.path / "run.json").read_text())
    info["not_applicable"] = {"registry-failure": "no image pull: process workers"}
    (run.path / "run.json").write_text(json.dumps(info))
    verdict = evaluate_run(run.path)
    assert verdict.not_applicable == {"registry-failure": "no image pull: process workers"}
    assert verdict.exit_code == EXIT_PASS  # not applicable is neither a pass nor a failure
    paths = write_reports(verdict, run.path)
    junit = paths["junit.xml"].read_text()
    assert 'name="registry-failure.experiment"' in junit and "not applicable" in junit
    assert "registry-failure: no image pull: process workers" in paths["report.md"].read_text()
    assert "no image pull: process workers" in paths["report.html"].read_text()


def test_side_by_side_comparison_of_two_runs(make_run) -> None:
    from slo.compare import comparison_rows, load_verdicts
    from slo.report import write_reports

    good = make_run(ExperimentFixture("api-replica-loss"),
                    ExperimentFixture("db-primary-loss", steady_state_before=False))
    bad = make_run(ExperimentFixture("api-replica-loss", lost_acks=3))
    for run, platform in ((good, "controlplane"), (bad, "prefect")):
        info = json.loads((run.path / "run.json").read_text())
        info["platform"] = platform
        if platform == "prefect":
            info["not_applicable"] = {"registry-failure": "no image pull"}
        (run.path / "run.json").write_text(json.dumps(info))
        write_reports(evaluate_run(run.path), run.path)
    rows = dict(comparison_rows(load_verdicts([good.path, bad.path])))
    assert rows["experiment api-replica-loss"][0].endswith("0 acks lost")
    assert rows["experiment api-replica-loss"][1].endswith("3 acks lost")
    assert rows["experiment registry-failure"] == ["not run", "not applicable: no image pull"]
    assert rows["experiment db-primary-loss"] == [
        "not measured: steady state not met before the method", "not run"]
    assert rows["gate"][0].startswith("fail") and rows["gate"][0].endswith("exit 1)")
    assert rows["gate"][1].startswith("fail") and rows["gate"][1].endswith("exit 2)")
    out = CliRunner().invoke(main_cli(), ["slo", "compare", str(good.path), str(bad.path)])
    assert out.exit_code == 0 and "| SLI submission-durability |" in out.output


def test_comparison_lists_an_experiments_invariants_side_by_side(make_run) -> None:
    from slo.compare import comparison_rows
    from slo.verdict import InvariantOutcome

    a = make_run(ExperimentFixture("api-replica-loss"))
    b = make_run(ExperimentFixture("api-replica-loss"))
    verdicts = [evaluate_run(r.path) for r in (a, b)]
    ours, theirs = verdicts
    theirs.experiments[0].invariants = [
        InvariantOutcome(name="stale-cache-reuse", judged=5,
                         violations=["pipeline p step prepare: reused ... inputs differ"]),
        InvariantOutcome(name="side-effect-once", judged=0, no_data="no side effect"),
    ]
    ours.experiments[0].invariants = [InvariantOutcome(name="stale-cache-reuse", judged=7)]
    rows = dict(comparison_rows(verdicts))
    assert rows["experiment api-replica-loss invariant stale-cache-reuse"] == [
        "0 violations (judged 7)",
        "1 violation(s) (judged 5): pipeline p step prepare: reused ... inputs differ"]
    assert rows["experiment api-replica-loss invariant side-effect-once"] == [
        "not judged", "no data: no side effect"]
    # an experiment only one run judged gets no invariant rows
    rows = dict(comparison_rows([ours]))
    assert not any(" invariant " in r for r in rows)


def main_cli():
    from gameday.cli import main

    return main

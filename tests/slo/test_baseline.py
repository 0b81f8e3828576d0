"""Relative criteria against run history (slo/baseline.py): the per-objective comparison, the
choice of the baseline run, and a regression reported the same way by every output."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import slo.specs
from slo.archive import LocalArchive
from slo.baseline import (
    ArchivedObjective,
    IndexEntry,
    Kind,
    Tolerances,
    compare,
    compare_objective,
    entry_of,
    kind_of,
    last_passing,
    recent_passing,
)
from slo.evaluate import evaluate_run
from slo.fixtures import ExperimentFixture
from slo.report import fmt_secs, headline, write_reports
from slo.verdict import Check, Verdict

TOL = Tolerances(percent=20.0, points=0.1)


def _check(id_: str, measured: float | None, status: str | None = "pass") -> Check:
    return Check(id=id_, experiment=id_.split(".")[0] if not id_.startswith("sli.") else None,
                 objective=id_, measured=measured, expected="", status=status, weight=1.0,
                 key=False, message="")


def _past(id_: str, measured: float | None, status: str | None = "pass") -> ArchivedObjective:
    return ArchivedObjective(id=id_, measured=measured, status=status)


def _result(id_: str, current: float | None, base: float | None, status: str = "pass",
            base_status: str = "pass") -> str:
    return compare_objective(_check(id_, current, status), _past(id_, base, base_status), TOL).result


def test_kinds_follow_the_check_ids() -> None:
    assert kind_of("sli.api-availability") is Kind.RATIO
    assert kind_of("x.rto") is Kind.DURATION
    assert kind_of("x.alert.ApiDown") is Kind.DURATION
    assert kind_of("x.rpo.artifacts") is Kind.COUNT
    assert kind_of("x.rpo.checkpoint_progress") is Kind.INTERVALS
    assert kind_of("x.invariant.single-terminal-state") is Kind.COUNT
    assert kind_of("evidence.dropped") is Kind.COUNT
    assert kind_of("x.experiment") is Kind.OUTCOME


@pytest.mark.parametrize(("base", "within", "beyond", "faster"), [(10.0, 12.0, 12.5, 7.9),
                                                                  (50.0, 60.0, 60.5, 39.0)])
def test_durations_regress_beyond_the_percent_tolerance(
        base: float, within: float, beyond: float, faster: float) -> None:
    # the figures are the tolerance applied to the baseline: +20 % is the edge
    assert within == base * (1 + TOL.percent / 100)
    assert _result("x.rto", within, base) == "same"
    assert _result("x.rto", beyond, base) == "regressed"
    assert _result("x.rto", faster, base) == "better"
    assert _result("x.alert.A", beyond, base) == "regressed"


def test_a_duration_over_a_zero_baseline_regresses() -> None:
    assert _result("x.rto", 0.0, 0.0) == "same"
    assert _result("x.rto", 0.5, 0.0) == "regressed"


def test_a_duration_within_the_seconds_slack_is_the_same() -> None:
    """Measured: registry-failure recovered in 44.1 s and 79.3 s in two healthy runs of the
    same code (the breaker's 30 s cooldown); with the local 45 s slack that is the same, and a
    recovery one more cooldown and hold later is a regression."""
    tol = Tolerances(percent=20.0, points=0.1, seconds=45.0)

    def result(cur: float, base: float) -> str:
        return compare_objective(_check("x.rto", cur), _past("x.rto", base), tol).result

    assert _result("x.rto", 79.3, 44.1) == "regressed"  # the percentage alone
    assert result(79.3, 44.1) == "same"
    assert result(89.2, 44.1) == "regressed"
    assert result(0.0, 44.1) == "same"  # better needs more than the slack too
    assert result(300.0, 200.0) == "regressed"  # long durations: the percentage, 60 s
    assert result(239.0, 200.0) == "same"


def test_checkpoint_progress_regresses_by_a_whole_interval() -> None:
    """Where a kill lands between two checkpoints is chance: 0 to 1 interval recomputed."""
    assert _result("x.rpo.checkpoint_progress", 0.4, 0.0) == "same"
    assert _result("x.rpo.checkpoint_progress", 1.0, 0.0) == "same"
    assert _result("x.rpo.checkpoint_progress", 1.3, 0.2) == "regressed"
    assert _result("x.rpo.checkpoint_progress", 0.0, 1.5) == "better"


def test_ratios_regress_by_percentage_points() -> None:
    base = 0.999
    assert _result("sli.api-availability", base - TOL.points / 100 / 2, base) == "same"
    assert _result("sli.api-availability", base - 2 * TOL.points / 100, base) == "regressed"
    assert _result("sli.api-availability", 1.0, 0.99) == "better"


def test_counts_regress_on_any_increase() -> None:
    assert _result("x.rpo.acknowledged_submissions", 1.0, 0.0) == "regressed"
    assert _result("x.rpo.acknowledged_submissions", 0.0, 0.0) == "same"
    assert _result("x.invariant.fencing", 0.0, 2.0) == "better"
    assert _result("x.rpo.checkpoint_progress", float("inf"), 1.0) == "regressed"
    assert _result("evidence.dropped", 3.0, 3.0) == "same"


def test_outcomes_compare_statuses() -> None:
    assert _result("x.experiment", None, None, "fail", "pass") == "regressed"
    assert _result("x.experiment", None, None, "pass", "pass") == "same"
    assert _result("x.experiment", None, None, "pass", "warning") == "better"
    assert _result("x.experiment", None, None, "not_measured", "pass") == "not measured"


def test_a_missing_current_value_is_not_measured_never_compared() -> None:
    for status in ("not_measured", "no_data", "fail"):
        row = compare_objective(_check("x.rto", None, status), _past("x.rto", 10.0), TOL)
        assert row.result == "not measured"
        assert row.current is None


def test_an_objective_the_baseline_lacks_has_no_baseline() -> None:
    assert compare_objective(_check("x.rto", 10.0), None, TOL).result == "no baseline"
    # present in the baseline, but without a value there
    assert _result("x.rto", 10.0, None) == "no baseline"


def _entry(run_id: str, suite: str, env: str, started: float, result: str = "pass",
           exit_code: int = 0, objectives: list[ArchivedObjective] | None = None) -> IndexEntry:
    return IndexEntry(run_id=run_id, suite=suite, env=env, platform="p", started_at=started,
                      ended_at=started + 60, result=result, exit_code=exit_code, score=100.0,
                      archived_at=started + 61, location=f"/a/{run_id}",
                      objectives=objectives or [])


def test_last_passing_run_of_the_same_suite_and_env_before_this_one() -> None:
    entries = [
        _entry("old-pass", "ci", "local", 100.0),
        _entry("newer-pass", "ci", "local", 200.0),
        _entry("newest-warning", "ci", "local", 300.0, result="warning"),
        _entry("newest-fail", "ci", "local", 310.0, result="fail", exit_code=2),
        _entry("other-suite", "core", "local", 320.0),
        _entry("other-env", "ci", "dev", 330.0),
        _entry("later-pass", "ci", "local", 900.0),
    ]
    chosen = last_passing(entries, "ci", "local", "current", started_at=400.0)
    assert chosen is not None and chosen.run_id == "newer-pass"
    # the run itself is never its own baseline (re-evaluated after it was archived)
    itself = last_passing(entries, "ci", "local", "later-pass", started_at=900.5)
    assert itself is not None and itself.run_id == "newer-pass"
    assert last_passing(entries, "ci", "staging", "current", 400.0) is None


def test_several_baseline_runs_each_objective_against_the_worst_of_them() -> None:
    """Measured on identical code: registry-failure recovered in 43.4, 48.5, 14.1 and 88.8 s
    in four consecutive healthy core runs (the fault lasts until the probe's bounded retries
    are spent, 3.6 to 33.8 s, and a 30 s breaker cooldown may need one more round). Against
    the fast run alone, 88.8 s is a regression; against the worst of the last three, it is not."""
    tol = Tolerances(percent=20.0, points=0.1, seconds=45.0)

    def past(run_id: str, started: float, rto: float, avail: float,
             status: str = "pass") -> IndexEntry:
        return _entry(run_id, "core", "local", started, objectives=[
            _past("registry-failure.rto", rto, status), _past("sli.queue-age", avail)])

    runs = [past("r3", 300.0, 14.1, 1.0), past("r2", 200.0, 48.5, 0.98),
            past("r1", 100.0, 43.4, 0.99, "warning")]
    checks = [_check("registry-failure.rto", 88.8), _check("sli.queue-age", 0.9795)]
    several = compare(checks, runs, "/archive", "worst of the last 3", tol)
    assert several.run_id == "r3" and several.run_ids == ["r3", "r2", "r1"]
    rto, queue = several.objectives
    assert (rto.baseline, rto.result) == (48.5, "same")
    assert (queue.baseline, queue.result) == (0.98, "same")  # the lowest ratio is the bar
    assert rto.baseline_status == "warning"  # the worst status
    newest_only = compare(checks, runs[:1], "/archive", "last passing run", tol)
    assert [o.result for o in newest_only.objectives] == ["regressed", "regressed"]
    # worse than the worst of them beyond the tolerance still regresses
    slower = compare([_check("registry-failure.rto", 94.0)], runs, "/a", "", tol)
    assert slower.objectives[0].result == "regressed"
    # recent_passing: newest first, at most n, the same choice as last_passing
    entries = [*runs, _entry("fail", "core", "local", 350.0, result="fail", exit_code=2)]
    assert [e.run_id for e in recent_passing(entries, "core", "local", "cur", 400.0, 2)] == [
        "r3", "r2"]


def test_without_a_baseline_run_every_measured_objective_says_why() -> None:
    checks = [_check("x.rto", 10.0), _check("x.rpo.artifacts", None, "not_measured")]
    cmp = compare(checks, [], "/archive", "no passing run of suite ci in env local", TOL)
    assert cmp.run_id is None
    assert [o.result for o in cmp.objectives] == ["no baseline", "not measured"]
    assert cmp.objectives[0].change == "no passing run of suite ci in env local"


# --------------------------------------------------------------- evaluated fixtures, end to end


def _archive_as_baseline(archive: LocalArchive, run_dir: Path, verdict: Verdict,
                         run_id: str, days_before: float = 1.0) -> None:
    """Archive an evaluated fixture under another id, started `days_before` the fixtures' T0
    (every fixture starts at the same instant)."""
    earlier = verdict.model_copy(update={"run_id": run_id,
                                         "started_at": verdict.started_at - days_before * 86400})
    archive.put(run_dir, earlier)


def _outputs(run_dir: Path) -> tuple[dict, ET.Element, str, str]:
    return (json.loads((run_dir / "verdict.json").read_text()),
            ET.parse(run_dir / "junit.xml").getroot(),
            (run_dir / "report.md").read_text(), (run_dir / "report.html").read_text())


def _specs_without_seconds_slack(tmp_path: Path) -> Path:
    """The packaged specs with the local env's duration slack in seconds taken out: a fixture's
    recovery a few seconds slower is then a regression (local RTOs are shorter than the slack)."""
    specs = tmp_path / "specs"
    shutil.copytree(Path(slo.specs.__file__).parent, specs,
                    ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    local = specs / "env" / "local.yaml"
    text = local.read_text()
    assert "baselineToleranceSeconds: 45" in text
    local.write_text(text.replace("baselineToleranceSeconds: 45", "baselineToleranceSeconds: 0"))
    return specs


def test_a_regressed_run_is_a_warning_in_every_output(make_run, tmp_path: Path) -> None:
    specs = _specs_without_seconds_slack(tmp_path)
    archive = LocalArchive(tmp_path / "archive")
    base_run = make_run(ExperimentFixture("api-replica-loss"))
    base = evaluate_run(base_run.path, spec_dir=specs)
    assert (base.result, base.exit_code) == ("pass", 0)
    _archive_as_baseline(archive, base_run.path, base, "baseline-1")
    # same suite, the API now fails for a while after the fault: recovery is worse than the
    # baseline, yet within its absolute objective (the failed requests lie inside the fault's
    # impact window, so the run-wide availability is the experiment's to judge: same)
    cur_run = make_run(ExperimentFixture("api-replica-loss", api_error_seconds=2.0))
    assert evaluate_run(cur_run.path, spec_dir=specs).result == "pass"  # without history
    verdict = evaluate_run(cur_run.path, baseline_archive=archive, spec_dir=specs)
    write_reports(verdict, cur_run.path)

    assert verdict.baseline is not None and verdict.baseline.run_id == "baseline-1"
    regressed = verdict.baseline.ids("regressed")
    assert regressed == ["api-replica-loss.rto"], regressed
    # with the packaged local slack (45 s) the same two runs are the same
    packaged = evaluate_run(cur_run.path, baseline_archive=archive)
    assert packaged.baseline is not None and packaged.baseline.ids("regressed") == []
    assert packaged.baseline.tolerance_seconds == 45
    assert (verdict.result, verdict.exit_code) == ("warning", 0)
    assert "regressed against last passing run baseline-1" in verdict.reason
    data, junit, md, html = _outputs(cur_run.path)
    assert (data["result"], data["exit_code"]) == ("warning", 0)
    assert data["baseline"]["run_id"] == "baseline-1"
    assert (junit.get("result"), junit.get("exit_code")) == ("warning", "0")
    assert junit.get("baseline_run") == "baseline-1"
    assert junit.get("failures") == "0"  # a regression never fails the gate
    suite = junit.find("testsuite[@name='baseline']")
    assert suite is not None
    rto = suite.find("testcase[@name='api-replica-loss.rto.baseline']")
    assert rto is not None and rto.find("system-out").text.startswith("WARNING: regressed")
    line = headline(verdict)
    assert line.startswith("WARNING") and line.endswith("(exit 0)")
    for text in (md, html):
        assert line in text
    base_rto = next(c.measured for c in base.checks if c.id == "api-replica-loss.rto")
    cur_rto = next(c.measured for c in verdict.checks if c.id == "api-replica-loss.rto")
    assert cur_rto > base_rto * (1 + TOL.percent / 100)
    assert (f"| api-replica-loss.rto | {fmt_secs(base_rto)} | {fmt_secs(cur_rto)} | "
            f"{cur_rto - base_rto:+.1f}s") in md and "| **regressed** |" in md
    assert '<span class="badge warning">regressed</span>' in html


def test_a_run_without_baseline_passes_and_says_so_everywhere(make_run, tmp_path: Path) -> None:
    archive = LocalArchive(tmp_path / "archive")
    other = make_run(ExperimentFixture("api-replica-loss"))
    v = evaluate_run(other.path)
    # only a failing run of the suite and a passing run of another env are archived
    _archive_as_baseline(archive, other.path, v.model_copy(update={"result": "fail",
                                                                   "exit_code": 2}), "failed-1")
    _archive_as_baseline(archive, other.path, v.model_copy(update={"env": "dev"}), "dev-1")
    cur = make_run(ExperimentFixture("api-replica-loss"))
    verdict = evaluate_run(cur.path, baseline_archive=archive)
    write_reports(verdict, cur.path)

    assert verdict.baseline is not None and verdict.baseline.run_id is None
    assert {o.result for o in verdict.baseline.objectives} == {"no baseline"}
    assert (verdict.result, verdict.exit_code) == ("pass", 0)
    data, junit, md, html = _outputs(cur.path)
    assert (data["result"], data["exit_code"], data["baseline"]["run_id"]) == ("pass", 0, None)
    assert (junit.get("result"), junit.get("exit_code"), junit.get("baseline_run")) == ("pass", "0", "")
    suite = junit.find("testsuite[@name='baseline']")
    assert suite.get("skipped") == suite.get("tests") == str(len(verdict.checks))
    assert "no passing run of suite fixture in env local" in md
    for text in (md, html):
        assert headline(verdict) in text and "No baseline" in text


def test_an_experiment_missing_from_the_baseline_has_no_baseline(make_run, tmp_path: Path) -> None:
    archive = LocalArchive(tmp_path / "archive")
    base_run = make_run(ExperimentFixture("api-replica-loss"))
    _archive_as_baseline(archive, base_run.path, evaluate_run(base_run.path), "baseline-1")
    cur = make_run(ExperimentFixture("api-replica-loss"), ExperimentFixture("db-primary-loss"))
    verdict = evaluate_run(cur.path, baseline_archive=archive)

    assert verdict.baseline is not None
    rows = {o.id: o for o in verdict.baseline.objectives}
    db = [o for o in rows.values() if o.experiment == "db-primary-loss"]
    # every db-primary-loss objective with a value (its RTO, RPOs, its own outcome) has no
    # baseline; its correctly silent alert has no value to compare: not measured
    assert {o.id for o in db if o.result == "no baseline"} >= {
        "db-primary-loss.experiment", "db-primary-loss.rto",
        "db-primary-loss.rpo.acknowledged_submissions"}
    assert {o.result for o in db} <= {"no baseline", "not measured"}
    assert all(o.result == "no baseline" for o in db if o.current is not None)
    assert rows["api-replica-loss.rto"].result == "same"
    assert verdict.result == "pass"


def test_a_regression_does_not_hide_a_failure(make_run, tmp_path: Path) -> None:
    archive = LocalArchive(tmp_path / "archive")
    base_run = make_run(ExperimentFixture("api-replica-loss"))
    _archive_as_baseline(archive, base_run.path, evaluate_run(base_run.path), "baseline-1")
    cur = make_run(ExperimentFixture("api-replica-loss", lost_acks=2))
    verdict = evaluate_run(cur.path, baseline_archive=archive)
    assert (verdict.result, verdict.exit_code) == ("fail", 2)
    rows = {o.id: o for o in verdict.baseline.objectives}
    assert rows["api-replica-loss.rpo.acknowledged_submissions"].result == "regressed"
    assert "regressed against last passing run baseline-1" in verdict.reason


def test_the_archived_entry_keeps_what_a_later_comparison_needs(make_run) -> None:
    run = make_run(ExperimentFixture("api-replica-loss"))
    v = evaluate_run(run.path)
    entry = entry_of(v, "/somewhere", ["run.json"], archived_at=1.0)
    again = IndexEntry.model_validate_json(entry.model_dump_json(by_alias=True))
    assert {o.id: o.measured for o in again.objectives} == {c.id: c.measured for c in v.checks}
    assert again.passed and again.run_id == v.run_id


def test_tolerances_are_declared_in_the_env_spec(make_run, tmp_path: Path, spec_copy: Path) -> None:
    local = spec_copy / "env" / "local.yaml"
    text = local.read_text()
    assert "baselineToleranceSeconds: 45\n" in text
    local.write_text(text.replace(
        "baselineToleranceSeconds: 45\n",
        "baselineToleranceSeconds: 0\n    baselineTolerancePoints: 5\n"
        "    relativeTolerancePercent: 50\n", 1))
    archive = LocalArchive(tmp_path / "archive")
    base_run = make_run(ExperimentFixture("api-replica-loss"))
    _archive_as_baseline(archive, base_run.path, evaluate_run(base_run.path), "baseline-1")
    cur = make_run(ExperimentFixture("api-replica-loss", api_error_seconds=2.0))
    default = evaluate_run(cur.path, baseline_archive=archive)
    strict = evaluate_run(cur.path, spec_dir=spec_copy, baseline_archive=archive)
    assert (default.baseline.tolerance_seconds, default.baseline.tolerance_percent,
            default.baseline.tolerance_points) == (45, 20, 0.1)
    assert (strict.baseline.tolerance_seconds, strict.baseline.tolerance_percent,
            strict.baseline.tolerance_points) == (0, 50, 5)
    # a recovery a few seconds slower than a recovery at once: within the packaged 45 s, and
    # beyond any percentage of a zero baseline once the seconds are taken out
    assert "api-replica-loss.rto" in default.baseline.ids("same")
    assert "api-replica-loss.rto" in strict.baseline.ids("regressed")

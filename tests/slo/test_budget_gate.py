"""Budget-aware scheduling in slo/: which SLOs an experiment touches (from the specs), the
remaining-budget math, the judging, and both sources: Prometheus (a stdlib HTTP server in the
test answering /api/v1/query with the JSON shape Prometheus returns, not a real Prometheus)
and the run archive (fixture archives on disk)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from slo.archive import LocalArchive
from slo.baseline import skipped_entry
from slo.budget import remaining_after_runs, remaining_budget
from slo.budget_gate import (
    EXIT_SKIPPED,
    BudgetCheck,
    BudgetStatus,
    judge,
    touched_slos,
)
from slo.budget_sources import archive_budgets, prometheus_budgets
from slo.evaluate import evaluate_run
from slo.fixtures import ExperimentFixture
from slo.report import render_markdown
from slo.rules import generate_rules, window_error_ratio_query
from slo.specs import SpecError, load_specs
from slo.verdict import Verdict
from tests.slo.prom_stub import PromStub, serving

SPECS = load_specs("local")


# ------------------------------------------------------------------ which SLOs are touched


def test_an_experiment_touches_its_own_slos_and_its_recovery_objectives() -> None:
    ro = SPECS.recovery_objectives["db-primary-loss"]
    extra = next(n for n in SPECS.slo_names if n not in ro.slos)
    touched = touched_slos(SPECS, {"db-primary-loss": ("db-primary-loss", [extra])})
    assert set(touched) == {extra, *ro.slos}
    assert all(exps == ["db-primary-loss"] for exps in touched.values())
    assert list(touched) == [n for n in SPECS.slo_names if n in touched]  # specs order


def test_a_suite_touches_the_union_and_names_the_experiments_per_slo() -> None:
    a, b = "api-replica-loss", "artifact-store-unavailable"
    touched = touched_slos(SPECS, {a: (a, []), b: (b, [])})
    ra, rb = SPECS.recovery_objectives[a].slos, SPECS.recovery_objectives[b].slos
    assert set(touched) == set(ra) | set(rb)
    for name, exps in touched.items():
        assert exps == [e for e, slos in ((a, ra), (b, rb)) if name in slos]


def test_unknown_objective_or_slo_is_an_error_naming_experiment_and_field() -> None:
    with pytest.raises(SpecError, match=r"experiment x: field recovery_objective: unknown 'nope'"):
        touched_slos(SPECS, {"x": ("nope", [])})
    with pytest.raises(SpecError, match=r"experiment x: field slos: unknown SLO 'nope'"):
        touched_slos(SPECS, {"x": ("db-primary-loss", ["nope"])})


# ------------------------------------------------------------------------------- the math


def test_remaining_budget_from_an_error_ratio() -> None:
    target = 0.99
    assert remaining_budget(0.0, target) == 1.0
    assert math.isclose(remaining_budget(1 - target, target), 0.0, abs_tol=1e-12)
    assert math.isclose(remaining_budget((1 - target) / 4, target), 0.75)
    assert remaining_budget(2 * (1 - target), target) < 0  # overspent
    with pytest.raises(ValueError):
        remaining_budget(-0.1, target)


def test_remaining_after_runs_adds_what_each_run_spent() -> None:
    target, window = 0.99, 3600.0
    # one run at twice the budget rate for a quarter of the window spends half of it
    assert math.isclose(remaining_after_runs([(1 - 2 * (1 - target), window / 4)], target, window),
                        0.5)
    assert remaining_after_runs([], target, window) == 1.0
    assert remaining_after_runs([(1.0, window)], target, window) == 1.0


def test_judging_and_the_decision() -> None:
    floor = SPECS.gate.min_remaining_budget
    ok = judge("a", ["e"], floor, floor)
    low = judge("b", ["e"], floor - 0.01, floor)
    none = judge("c", ["e"], None, floor, detail="no series")
    untracked = judge("d", ["e"], None, floor, tracked=False)
    assert [x.status for x in (ok, low, none, untracked)] == [
        BudgetStatus.OK, BudgetStatus.BELOW_FLOOR, BudgetStatus.NO_DATA, BudgetStatus.NOT_TRACKED]

    def check(*budgets, forced=False):
        return BudgetCheck(env="local", suite="ci", source="test", floor=floor, checked_at=0.0,
                           budgets=list(budgets), forced=forced)

    assert not check(ok, untracked).skip  # not tracked never blocks
    assert check(ok, low).skip and "b " in check(ok, low).reason
    assert check(ok, none).skip and "no data (no series)" in check(none).reason
    forced = check(ok, low, forced=True)
    assert not forced.skip and forced.blocking == [low] and forced.reason.startswith("forced")


def test_the_floor_is_declared_per_environment_with_a_sensible_default(spec_copy: Path) -> None:
    assert 0 < SPECS.gate.min_remaining_budget < 1
    env = spec_copy / "env" / "local.yaml"
    env.write_text(env.read_text().replace("  gate:\n", "  gate:\n    minRemainingBudget: 0.6\n"))
    assert load_specs("local", spec_copy).gate.min_remaining_budget == 0.6
    env.write_text(env.read_text().replace("minRemainingBudget: 0.6", "minRemainingBudget: 1.5"))
    with pytest.raises(SpecError) as err:
        load_specs("local", spec_copy)
    assert "env/local.yaml" in str(err.value) and "minRemainingBudget" in str(err.value)


# -------------------------------------------------------------------- Prometheus source


@pytest.fixture
def prom() -> Iterator[PromStub]:
    with serving() as p:
        yield p


def _tracked_and_evidence_only() -> tuple[list[str], list[str]]:
    tracked = [s.name for s in SPECS.slos if window_error_ratio_query(s, SPECS) is not None]
    evidence_only = [s.name for s in SPECS.slos if s.indicator.prometheus is None]
    return tracked, evidence_only


def test_the_window_query_reads_a_series_the_generated_rules_record() -> None:
    recorded = {r["record"] for g in generate_rules(SPECS)["groups"] for r in g["rules"]
                if "record" in r}
    tracked, _ = _tracked_and_evidence_only()
    assert tracked
    for name in tracked:
        query = window_error_ratio_query(SPECS.slo(name), SPECS)
        assert query is not None
        assert query.split("{")[0].removeprefix("avg_over_time(") in recorded
        assert query.endswith(f"[{_window(name)}])")


def _window(name: str) -> str:
    from slo.durations import format_duration

    return format_duration(SPECS.slo(name).window_seconds)


def test_prometheus_source_budgets_no_series_and_evidence_only(prom: PromStub) -> None:
    tracked, evidence_only = _tracked_and_evidence_only()
    healthy, burnt, absent, idle = tracked[0], tracked[1], tracked[2], tracked[3]
    floor = SPECS.gate.min_remaining_budget
    budget_of = {n: 1 - SPECS.slo(n).objective.target for n in tracked}
    prom.answers = {healthy: str(budget_of[healthy] / 10), burnt: str(budget_of[burnt] * 0.9),
                    idle: "NaN"}
    names = [healthy, burnt, absent, idle, evidence_only[0]]
    got = {b.slo: b for b in prometheus_budgets(prom.url, SPECS, {n: ["e"] for n in names},
                                                floor, 1e9)}
    assert got[healthy].status is BudgetStatus.OK
    assert math.isclose(got[healthy].remaining, 0.9)
    assert got[burnt].status is BudgetStatus.BELOW_FLOOR
    assert math.isclose(got[burnt].remaining, 0.1)
    # an absent series and NaN (no traffic) are no data, never a full budget
    for n in (absent, idle):
        assert got[n].status is BudgetStatus.NO_DATA and got[n].remaining is None
    assert "no series for avg_over_time(" in got[absent].detail
    assert got[evidence_only[0]].status is BudgetStatus.NOT_TRACKED
    assert len(prom.queries) == 4  # nothing asked for the evidence-only SLI


def test_several_series_the_worst_one_counts(prom: PromStub) -> None:
    tracked, _ = _tracked_and_evidence_only()
    budget = 1 - SPECS.slo(tracked[0]).objective.target
    prom.answers = {tracked[0]: [str(budget * 0.1), str(budget * 0.9)]}
    (b,) = prometheus_budgets(prom.url, SPECS, {tracked[0]: ["e"]}, 0.25, 1e9)
    assert math.isclose(b.remaining, 0.1) and b.status is BudgetStatus.BELOW_FLOOR


def test_an_unreachable_prometheus_is_no_data(prom: PromStub) -> None:
    url = prom.url
    prom.close()
    tracked, _ = _tracked_and_evidence_only()
    (b,) = prometheus_budgets(url, SPECS, {tracked[0]: ["e"]}, 0.25, 1e9, timeout=2)
    assert b.status is BudgetStatus.NO_DATA and "query failed" in b.detail


# ------------------------------------------------------------------------ archive source


@pytest.fixture
def archived(make_run, tmp_path: Path) -> tuple[LocalArchive, Verdict]:
    run = make_run(ExperimentFixture("api-replica-loss"))
    verdict = evaluate_run(run.path)
    return LocalArchive(tmp_path / "archive"), verdict


def _with(verdict: Verdict, run_id: str, values: dict[str, float | None],
          hours_later: float = 0.0) -> Verdict:
    """The fixture verdict as another run: `values` replaces run-level SLI values (None drops
    the SLI: the run did not measure it)."""
    checks = [c.model_copy(update={"measured": values[c.id[4:]]})
              if c.id[4:] in values and values[c.id[4:]] is not None else c
              for c in verdict.checks if not (c.id[4:] in values and values[c.id[4:]] is None)]
    return verdict.model_copy(update={"run_id": run_id, "checks": checks,
                                      "started_at": verdict.started_at + hours_later * 3600,
                                      "ended_at": verdict.ended_at + hours_later * 3600})


def test_archive_source_spends_each_runs_burn_within_the_window(archived, make_run) -> None:
    archive, verdict = archived
    slo = SPECS.slo("api-availability")
    bad = 1 - 3 * (1 - slo.objective.target)  # three times the sustainable error ratio
    duration = verdict.ended_at - verdict.started_at
    path = Path(archive.root.parent / "run-0")
    old_hours = slo.window_seconds / 3600 + 1  # an earlier run outside the window
    for run_id, values, hours in (("old", {"api-availability": 0.0}, -old_hours),
                                  ("r1", {"api-availability": bad}, 0.0),
                                  ("r2", {"api-availability": bad,
                                          "artifact-write-success": None}, 0.01)):
        v = _with(verdict, run_id, values, hours)
        archive.put(path, v)
    at = verdict.ended_at + 3600 * 0.02
    touched = {"api-availability": ["e"], "artifact-write-success": ["e"]}
    got = {b.slo: b for b in archive_budgets(archive.entries(), SPECS, "local", touched,
                                             0.25, at)}
    expected = 1 - 2 * (3 * duration / slo.window_seconds)
    assert math.isclose(got["api-availability"].remaining, expected)
    assert "2 archived run(s)" in got["api-availability"].detail
    # r2 did not measure it, r1 did: one run
    aws = got["artifact-write-success"]
    assert aws.status is BudgetStatus.OK and "1 archived run(s)" in aws.detail
    # another env's runs never count; an archive with no run measuring it: no data
    other = archive_budgets(archive.entries(), SPECS, "staging", touched, 0.25, at)
    assert {b.status for b in other} == {BudgetStatus.NO_DATA}


def test_an_archive_without_the_slo_measured_has_no_data(archived) -> None:
    archive, verdict = archived
    archive.put(Path(archive.root.parent / "run-0"),
                _with(verdict, "r1", {"artifact-write-success": None}))
    (b,) = archive_budgets(archive.entries(), SPECS, "local",
                           {"artifact-write-success": ["e"]}, 0.25, verdict.ended_at + 1)
    assert b.status is BudgetStatus.NO_DATA and b.remaining is None
    assert "measured sli.artifact-write-success" in b.detail


def test_a_skipped_run_is_archived_as_skipped_and_spends_nothing(archived, tmp_path) -> None:
    archive, verdict = archived
    check = BudgetCheck(env="local", suite="ci", source="archive x", floor=0.25,
                        checked_at=verdict.started_at,
                        budgets=[judge("api-availability", ["e"], None, 0.25, "none")])
    run_dir = tmp_path / "skipped-run"
    run_dir.mkdir()
    (run_dir / "skipped.json").write_text(check.model_dump_json(by_alias=True))
    archive.put_run(run_dir, "s1", lambda loc, files, at: skipped_entry(
        check, "s1", "controlplane", loc, files, at))
    (e,) = archive.entries()
    assert (e.result, e.exit_code, e.score, e.passed) == ("skipped", EXIT_SKIPPED, None, False)
    assert e.files == ["skipped.json"] and "no data" in e.reason
    (b,) = archive_budgets([e], SPECS, "local", {"api-availability": ["e"]}, 0.25,
                           verdict.ended_at)
    assert b.status is BudgetStatus.NO_DATA


# ------------------------------------------------------------ a forced run's verdict says so


def test_a_forced_runs_verdict_and_report_record_the_budget(make_run) -> None:
    run = make_run(ExperimentFixture("api-replica-loss"))
    check = BudgetCheck(env="local", suite="fixture", source="archive x", floor=0.25,
                        checked_at=0.0, forced=True,
                        budgets=[judge("api-availability", ["api-replica-loss"], 0.1, 0.25)])
    (run.path / "budget-check.json").write_text(check.model_dump_json(by_alias=True))
    verdict = evaluate_run(run.path)
    assert verdict.budget_check is not None and verdict.budget_check.forced
    md = render_markdown(verdict)
    assert "FORCED" in md and "api-availability 10% left" in md
    reread = Verdict.model_validate_json(verdict.model_dump_json(by_alias=True))
    assert reread.budget_check == verdict.budget_check
    (run.path / "budget-check.json").write_text("{not json")
    with pytest.raises(Exception, match="budget-check.json: unreadable"):
        evaluate_run(run.path)

"""`gameday selftest` counts a seeded defect as caught only when the gate failed on objectives
(exit 2) with the named objective among the failed checks: a probe failure (exit 1), another
objective, or a run that never produced a verdict are reported, never taken for a catch."""

from __future__ import annotations

from controlplane import defects
from gameday.selftest import MATRIX, Case, judge, select
from gameday.suites import SUITES
from slo.specs import FAILURE_CLASSES

CASE = Case("agent-connectivity-loss", "fencing-off", "agent-connectivity-loss",
            "agent-connectivity-loss.invariant.fencing")


def _verdict(*failed: str) -> dict:
    return {"checks": [{"id": c, "status": "fail", "experiment": c.split(".")[0]} for c in failed]
            + [{"id": "agent-connectivity-loss.rto", "status": "pass",
                "experiment": "agent-connectivity-loss"}]}


def test_caught_only_by_the_named_objective_with_exit_2() -> None:
    assert judge(CASE, 2, _verdict(CASE.objective))[0]
    caught, failed, note = judge(CASE, 2, _verdict("agent-connectivity-loss.rpo.artifacts"))
    assert not caught and "did not fail" in note and failed == ["agent-connectivity-loss.rpo.artifacts"]
    caught, _, note = judge(CASE, 1, _verdict(CASE.objective))
    assert not caught and "exited 1" in note
    assert judge(CASE, 3, None) == (False, [], "no verdict (exit 3)")


def test_the_matrix_covers_every_defect_and_every_failure_class() -> None:
    assert {c.defect for c in MATRIX} == set(defects.KNOWN)
    assert {c.failure_class for c in MATRIX} == set(FAILURE_CLASSES)
    for c in MATRIX:
        assert c.experiment in SUITES["full"] and c.objective.startswith(c.experiment + ".")


def test_a_suite_selects_the_defects_of_its_experiments_and_a_named_defect_any(
        monkeypatch) -> None:
    full_only = Case("db-primary-loss", "x", "db-restore-from-backup", "db-restore-from-backup.rto")
    monkeypatch.setattr("gameday.selftest.MATRIX", (*MATRIX, full_only))
    core = select((), "core")
    assert core and all(c.experiment in SUITES["core"] for c in core)
    assert full_only in select((), "full") and full_only in select(("x",), "core")
    assert {c.defect for c in select((), "full")} == {c.defect for c in MATRIX} | {"x"}
    assert [c.defect for c in select(("fencing-off",), "core")] == ["fencing-off"]


def test_an_unknown_defect_name_is_refused_not_ignored() -> None:
    import pytest

    assert defects.parse(" readyz-lies , fencing-off ") == {"readyz-lies", "fencing-off"}
    assert defects.parse("") == frozenset()
    with pytest.raises(defects.UnknownDefect, match="readyz-lie'"):
        defects.parse("readyz-lie")

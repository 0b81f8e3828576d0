"""The seeded defects of the outcome invariants (slo/outcome_invariants.py), each a promise
broken in another code path than the one its experiment was tuned to, from a fresh clone:
each must be caught by the objective that judges the outcome (gameday/selftest.py). `tier2`:
`make test` leaves them to `make test-tier2` for its time budget (test_selftest_core.py runs
the other core rows)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.gameday.freshclone import FreshClone, fresh_clone

pytestmark = pytest.mark.slow

OUTCOME_DEFECTS = ("result-not-read-back", "liveness-ignored", "revocation-cached",
                   "agent-revocation-ignored")


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshClone]:
    yield from fresh_clone(tmp_path_factory)


@pytest.mark.tier2
@pytest.mark.timeout(1800)
def test_outcome_defects_are_caught_by_the_outcome_invariants(clone: FreshClone) -> None:
    runs = clone.path / "runs-outcome-selftest"
    r = clone.gameday("selftest", *(a for d in OUTCOME_DEFECTS for a in ("--defect", d)),
                      "--runs-dir", str(runs), timeout=1700)
    tests = list(runs.glob("selftest-*"))
    assert len(tests) == 1, r.stdout[-4000:] + r.stderr[-3000:]
    matrix = json.loads((tests[0] / "selftest.json").read_text())
    assert {m["defect"]: (m["caught"], m["exit_code"]) for m in matrix} == {
        d: (True, 2) for d in OUTCOME_DEFECTS}, json.dumps(matrix, indent=1) + r.stdout[-3000:]
    assert {m["objective"].rsplit(".", 1)[1] for m in matrix} == {
        "artifacts-complete", "routed-to-live-agents", "retired-credentials-refused"}
    assert r.returncode == 0, r.stdout[-4000:]

"""`gameday selftest --suite core` from a fresh clone: every seeded control-plane defect of the
core classes must be caught by its named objective (the matrix in gameday/selftest.py). The
classes only in the `full` suite have their own modules (test_gameday_full*.py); the rows of the
outcome invariants run in make test-tier2 (test_selftest_outcomes.py), for make test's time
budget."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from gameday.selftest import select
from tests.gameday.freshclone import FreshClone, fresh_clone
from tests.gameday.test_selftest_outcomes import OUTCOME_DEFECTS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshClone]:
    yield from fresh_clone(tmp_path_factory)


@pytest.mark.timeout(2400)
def test_selftest_catches_every_seeded_defect_by_its_named_objective(clone: FreshClone) -> None:
    rows = [c.defect for c in select((), "core") if c.defect not in OUTCOME_DEFECTS]
    r = clone.gameday("selftest", *(a for d in rows for a in ("--defect", d)), timeout=2300)
    runs = sorted((clone.path / "runs").glob("selftest-*"))
    assert runs, r.stdout[-4000:] + r.stderr[-3000:]
    matrix = json.loads((runs[-1] / "selftest.json").read_text())
    missed = [m for m in matrix if not m["caught"]]
    assert not missed, json.dumps(missed, indent=1) + r.stdout[-3000:]
    assert {m["defect"] for m in matrix} == set(rows), (
        r.stdout[-3000:] + r.stderr[-3000:])
    assert r.returncode == 0, r.stdout[-4000:]

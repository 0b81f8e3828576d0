"""The gray-failure classes on one environment from a fresh clone: the healthy platform
passes network-gray and artifact-store-brownout measured (leases held through late, reset and
silent connections; no retry storm against a throttling store), and each seeded defect is
caught by its named objective (gameday/selftest.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.gameday.freshclone import FreshClone, fresh_clone, journal
from tests.gameday.localrun import only_run

pytestmark = pytest.mark.slow

GRAY = ("network-gray", "artifact-store-brownout")
DEFECTS = ("deadline-beyond-lease", "storage-retry-no-backoff", "verify-starves-lease")


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshClone]:
    yield from fresh_clone(tmp_path_factory)


@pytest.mark.timeout(900)
def test_the_healthy_platform_passes_both_gray_classes_measured(clone: FreshClone) -> None:
    runs = clone.root / "gray-runs"
    args = [a for name in GRAY for a in ("--experiment", name)]
    r = clone.gameday("run", *args, "--runs-dir", str(runs), timeout=800)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    run_dir = only_run(runs)
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["exit_code"] == 0, verdict["reason"]
    assert sorted(e["name"] for e in verdict["experiments"]) == sorted(GRAY)
    checks = {c["id"]: c for c in verdict["checks"]}
    for cid in ("network-gray.invariant.leases-held", "network-gray.invariant.lease-granted-once",
                "artifact-store-brownout.invariant.leases-held",
                "artifact-store-brownout.invariant.bounded-retry-amplification",
                "artifact-store-brownout.rpo.artifacts"):
        assert checks[cid]["status"] == "pass" and checks[cid]["measured"] == 0, checks[cid]
    for name in GRAY:
        j = journal(run_dir, name)
        assert j["status"] == "completed" and not j["deviated"], name
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines() if x]
    toxics = [f for f in faults if f["fault"] == "network_gray"]
    assert {f["target"] for f in toxics if f["event"] == "fault_start"} == {
        "agents/slow-answers", "agents/connections-reset", "agents/silent-connections",
        "agents/all-silent"}
    assert sum(f["event"] == "fault_end" for f in toxics) == 4
    brownout = [f for f in faults if f["fault"] == "s3_brownout"]
    assert [f["event"] for f in brownout] == ["fault_start", "note", "fault_end"]
    start, end = brownout[0]["details"], brownout[-1]["details"]
    assert start["baseline"]["requests"] > 0  # the rate the storm check compares with
    assert end["counters"]["injected"]["SlowDown"] > 0  # the store really throttled
    # no lease ran out anywhere in the run (claims whose answer was lost came back by claim id)
    events = [json.loads(x) for x in (run_dir / "snapshot" / "events.jsonl").read_text()
              .splitlines() if x]
    assert not [e for e in events if e["kind"] == "lease_expired"]


@pytest.mark.timeout(1200)
def test_each_gray_defect_is_caught_by_its_named_objective(clone: FreshClone) -> None:
    runs = clone.root / "gray-selftest"
    args = [a for d in DEFECTS for a in ("--defect", d)]
    r = clone.gameday("selftest", *args, "--runs-dir", str(runs), timeout=1100)
    [selftest] = sorted(runs.glob("selftest-*"))
    matrix = json.loads((selftest / "selftest.json").read_text())
    assert sorted(m["defect"] for m in matrix) == sorted(DEFECTS), matrix
    missed = [m for m in matrix if not m["caught"]]
    assert not missed, json.dumps(missed, indent=1) + r.stdout[-3000:]
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]

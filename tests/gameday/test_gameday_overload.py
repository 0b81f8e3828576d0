"""The overload class from a fresh clone, alone on its environment (its load takes most of a
2-core machine): the healthy platform passes overload-metastability measured (load at 80 % of
the capacity the experiment probed, a 30 s latency trigger on the database route, goodput back
within the RTO after it, requests per acknowledged submission bounded, nothing acknowledged
lost), and the seeded defects admission-unbounded (no admission control for user requests) and
admission-wait-unbounded (bounded slots, unbounded wait for one) are each caught by their named
objective, goodput-recovered, with exit 2. Both in `make test-tier2`
(README, Development): an overload must not share the machine with another test."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.gameday.freshclone import FreshClone, assert_selftest_caught, fresh_env, journal
from tests.gameday.localrun import only_run

pytestmark = [pytest.mark.slow, pytest.mark.tier2]

NAME = "overload-metastability"


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshClone]:
    yield from fresh_env(tmp_path_factory)


@pytest.mark.timeout(900)
def test_the_healthy_platform_recovers_its_goodput_after_the_trigger(clone: FreshClone) -> None:
    runs = clone.root / "overload-runs"
    r = clone.gameday("run", "--experiment", NAME, "--runs-dir", str(runs), timeout=800)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    run_dir = only_run(runs)
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["exit_code"] == 0, verdict["reason"]
    checks = {c["id"]: c for c in verdict["checks"]}
    for cid in (f"{NAME}.invariant.goodput-recovered",
                f"{NAME}.invariant.bounded-request-amplification",
                f"{NAME}.rpo.acknowledged_submissions", f"{NAME}.rto"):
        assert checks[cid]["status"] == "pass", checks[cid]
    assert journal(run_dir, NAME)["status"] == "completed"
    # the load step: the capacity it probed, the rate it offered, what it sent
    step = json.loads((run_dir / "experiments" / NAME / "overload.json").read_text())
    assert step["rate_per_s"] == pytest.approx(0.8 * step["capacity_per_s"], rel=0.01)
    assert step["counts"]["acked"] > 0 and step["counts"]["stopped"]
    exp = next(e for e in verdict["experiments"] if e["name"] == NAME)
    assert exp["goodput_before"] > 0.5 * step["rate_per_s"]
    assert exp["goodput_recovery_seconds"] is not None
    # the trigger is the experiment's only fault; the load step is noted beside it
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines() if x]
    assert {f["event"] for f in faults if f["fault"] == "overload started"} == {"note"}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("defect", ["admission-unbounded", "admission-wait-unbounded"])
def test_an_unbounded_queue_is_caught_by_goodput_recovered(clone: FreshClone,
                                                           defect: str) -> None:
    assert_selftest_caught(clone, defect, f"{NAME}.invariant.goodput-recovered", f"overload-selftest-{defect}")

"""model-store-unavailable from a fresh clone on an environment with model serving (`env up
--serving`): the healthy platform passes it (the loaded replicas keep answering through the
store's outage, no wrong answer, the scaled-up replica unready saying why and out of HAProxy,
then ready within the RTO once the store is back), and each seeded defect is caught by its
named objective with exit 2: a model server that goes ready on a failed load
(serve-partial-model, no-half-loaded-model) and a scale-up that lets the new replica in
without its readiness check (scale-up-skips-readiness, store-outage-availability).
tier2: an environment of its own plus three game days (`make test` has no minutes to spare)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.gameday.freshclone import (
    FreshClone,
    assert_selftest_caught,
    journal,
    serving_env,
    verdict_checks,
)
from tests.gameday.localrun import only_run

pytestmark = [pytest.mark.slow, pytest.mark.tier2]

NAME = "model-store-unavailable"
CHECKS = ("store-outage-availability", "no-half-loaded-model", "unready-with-reason",
          "scaled-up-ready-within-rto")


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshClone]:
    yield from serving_env(tmp_path_factory)


@pytest.mark.timeout(600)
def test_the_healthy_platform_keeps_serving_while_the_store_is_out(clone: FreshClone) -> None:
    runs = clone.root / "model-store-runs"
    r = clone.gameday("run", "--experiment", NAME, "--runs-dir", str(runs), timeout=500)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    run_dir = only_run(runs)
    checks = verdict_checks(run_dir)
    for cid in CHECKS:
        assert checks[f"{NAME}.invariant.{cid}"]["status"] == "pass", checks[f"{NAME}.invariant.{cid}"]
    # n and the bound beside the pass
    availability = checks[f"{NAME}.invariant.store-outage-availability"]["message"]
    assert "answered during the" in availability and "at least 0.99)" in availability
    assert journal(run_dir, NAME)["status"] == "completed"
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines() if x]
    scales = [f["details"] for f in faults if f["fault"] == "serving_scale"]
    assert [(s["started"], s["stopped"]) for s in scales] == [(["model-3"], []), ([], ["model-3"])]
    # looked at while the store was out: unready, saying the store is out of reach, not in
    # HAProxy; then ready once it was back
    seen = [f["details"] for f in faults if f["fault"] == "serving_replica_state"]
    assert [s["state"] for s in seen] == ["unready", "unready", "ready"], seen
    assert all(s["reason"].startswith("artifact store unreachable") for s in seen[:2]), seen
    assert all(s["haproxy"]["op_state"] == "0" for s in seen[:2]), seen
    # scaled back: env status shows the two replicas of `up`
    status = json.loads(clone.gameday("env", "status", "--json", timeout=120).stdout)
    assert sorted(n for n, c in status["components"].items() if c["kind"] == "model-server") == [
        "model-1", "model-2"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("defect,objective", [
    ("serve-partial-model", "no-half-loaded-model"),
    ("scale-up-skips-readiness", "store-outage-availability"),
])
def test_a_replica_answering_without_its_model_is_caught(clone: FreshClone, defect: str,
                                                         objective: str) -> None:
    assert_selftest_caught(clone, defect, f"{NAME}.invariant.{objective}", f"model-store-selftest-{defect}")

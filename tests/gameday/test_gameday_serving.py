"""serving-replica-loss from a fresh clone on an environment with model serving (`env up
--serving`): the healthy platform passes it (predictions answered, p99 bounded, the replica
back with its model loaded within the RTO), and each seeded defect that lets a loading replica
take predictions, in the generated HAProxy check (serving-check-liveness) and in the model
server's readiness (ready-before-loaded), is caught by serving-availability with exit 2.
bad-model-rollout on the same environment: the healthy platform rolls each bad version back
within the RTO with at most its first step's share answered by it, and each seeded defect of
the rollout controller is caught by its named objective with exit 2 (rollback-off by
rolled-back-within-rto, canary-weight-ignored by bad-version-share).
tier2: an environment of its own plus six game days (`make test` has no minutes to spare)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from environments.local import serving
from tests.gameday.freshclone import (
    FreshClone,
    assert_selftest_caught,
    journal,
    serving_env,
    verdict_checks,
)
from tests.gameday.localrun import only_run

pytestmark = [pytest.mark.slow, pytest.mark.tier2]

NAME = "serving-replica-loss"


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshClone]:
    yield from serving_env(tmp_path_factory)


@pytest.mark.timeout(600)
def test_the_healthy_platform_keeps_serving_through_a_replica_loss(clone: FreshClone) -> None:
    runs = clone.root / "serving-runs"
    r = clone.gameday("run", "--experiment", NAME, "--runs-dir", str(runs), timeout=500)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    run_dir = only_run(runs)
    checks = verdict_checks(run_dir)
    for cid in ("serving-availability", "serving-latency-p99", "restarted-within-rto"):
        assert checks[f"{NAME}.invariant.{cid}"]["status"] == "pass", checks[f"{NAME}.invariant.{cid}"]
    # n and the bound are said, beside the pass
    assert "answered (" in checks[f"{NAME}.invariant.serving-availability"]["message"]
    assert "at least 0.99)" in checks[f"{NAME}.invariant.serving-availability"]["message"]
    assert journal(run_dir, NAME)["status"] == "completed"
    # the fault was the replica's: killed, then started again once its model was loaded
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines() if x]
    kills = [f for f in faults if f["fault"] == "kill" and f["target"] == "model-1"]
    assert [f["event"] for f in kills] == ["fault_start", "fault_end"]
    # a new process of the replica said its model is loaded
    said = json.loads(serving.status_file(clone.path / ".gameday" / "envs" / "local",
                                          "model-1").read_text())
    assert said["state"] == "ready" and said["pid"] not in kills[0]["details"]["pids"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("defect", ["serving-check-liveness", "ready-before-loaded"])
def test_a_loading_replica_taking_predictions_is_caught(clone: FreshClone, defect: str) -> None:
    assert_selftest_caught(clone, defect, f"{NAME}.invariant.serving-availability", f"serving-selftest-{defect}")


ROLLOUT = "bad-model-rollout"
BAD_VERSIONS = ["v2-errors", "v2-garbage", "v2-slow"]


@pytest.mark.timeout(600)
def test_the_healthy_platform_rolls_each_bad_version_back(clone: FreshClone) -> None:
    runs = clone.root / "rollout-runs"
    r = clone.gameday("run", "--experiment", ROLLOUT, "--runs-dir", str(runs), timeout=500)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    run_dir = only_run(runs)
    checks = verdict_checks(run_dir)
    rolled = checks[f"{ROLLOUT}.invariant.rolled-back-within-rto"]
    share = checks[f"{ROLLOUT}.invariant.bad-version-share"]
    assert rolled["status"] == "pass" and share["status"] == "pass", (rolled, share)
    assert all(f"{v} rollback after serving " in rolled["message"] for v in BAD_VERSIONS), rolled
    # the bound is the policy's own cost: 10 % for 4 s per bad version, twice
    assert ": 2x 1.2 s of all traffic over " in share["message"], share
    # each bad version: a fault from its rollout's start until it was rolled back, and the
    # controller's decision noted with the failing signal
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines() if x]
    spans = [f["event"] for f in faults if f["fault"] == "rollout"]
    assert spans == ["fault_start", "fault_end"] * 3, spans
    ends = [f["details"] for f in faults if f["fault"] == "rollout_end"]
    assert [(e["version"], e["outcome"]) for e in ends] == [(v, "rollback") for v in BAD_VERSIONS]
    assert all(e["reasons"] for e in ends)
    # the clients saw each bad version answer (the Inferrer's ledger), then only v1 again
    lines = [json.loads(x) for x in (run_dir / "inference.jsonl").read_text().splitlines() if x]
    assert {"v2-garbage", "v2-slow"} <= {x.get("version") for x in lines}
    assert {x["version"] for x in lines[-50:] if x.get("version")} == {"v1"}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("defect, objective", [
    ("rollback-off", "rolled-back-within-rto"),
    ("canary-weight-ignored", "bad-version-share"),
])
def test_a_bad_rollout_kept_or_overexposed_is_caught(clone: FreshClone, defect: str,
                                                      objective: str) -> None:
    assert_selftest_caught(clone, defect, f"{ROLLOUT}.invariant.{objective}", f"rollout-selftest-{defect}")

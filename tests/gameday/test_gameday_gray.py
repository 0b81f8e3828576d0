"""The gray-failure classes on one environment from a fresh clone, brought up with the storage
fault layer (`gameday env up --storage-faults`): the healthy platform passes network-gray,
artifact-store-brownout, db-slow-disk and db-disk-full in one game day, measured (leases held
through late, reset and silent connections; no retry storm against a throttling store; every
request answered with a bounded p99 and no failover on a slow WAL disk; writes refused, nothing
acknowledged lost and one failover on a full one; an agent host's power lost mid-checkpoint:
nothing reported lost, no resume from bytes that were not durable, the loss named). Each
seeded defect of these classes is
caught by its named objective (gameday/selftest.py) in the `tier2` test, which `make test`
leaves to `make test-tier2` (README, Development)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.gameday.freshclone import FreshClone, fresh_clone, journal
from tests.gameday.localrun import only_run

pytestmark = pytest.mark.slow

GRAY = ("network-gray", "artifact-store-brownout", "db-slow-disk", "db-disk-full",
        "checkpoint-power-loss")
DEFECTS = ("deadline-beyond-lease", "claim-redelivery-skipped", "storage-retry-no-backoff",
           "verify-starves-lease",
           "readyz-commit-deadline", "ack-unknown-outcome", "checkpoint-no-fsync",
           "local-checkpoint-unverified")


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshClone]:
    for c in fresh_clone(tmp_path_factory):
        up = c.gameday("env", "up", "--storage-faults", "--json", timeout=400)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        status = json.loads(up.stdout)
        assert status["storage_faults"] is True and status["healthy"]
        assert {n for n, x in status["components"].items() if x["kind"] == "faultfs"} == {
            "disk-0", "disk-1"}
        assert status["components"]["node-disk-cpu-2"]["kind"] == "node-disk"
        yield c


def _faults(run_dir: object, fault: str) -> list[dict]:
    lines = (run_dir / "faults.jsonl").read_text().splitlines()  # type: ignore[operator]
    return [f for f in map(json.loads, filter(None, lines)) if f["fault"] == fault]


@pytest.mark.timeout(1200)
def test_the_healthy_platform_passes_the_gray_classes_measured(clone: FreshClone) -> None:
    runs = clone.root / "gray-runs"
    args = [a for name in GRAY for a in ("--experiment", name)]
    r = clone.gameday("run", *args, "--runs-dir", str(runs), timeout=1100)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    run_dir = only_run(runs)
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["exit_code"] == 0, verdict["reason"]
    assert sorted(e["name"] for e in verdict["experiments"]) == sorted(GRAY)
    checks = {c["id"]: c for c in verdict["checks"]}
    for cid in ("network-gray.invariant.leases-held", "network-gray.invariant.lease-granted-once",
                "artifact-store-brownout.invariant.leases-held",
                "artifact-store-brownout.invariant.bounded-retry-amplification",
                "artifact-store-brownout.rpo.artifacts",
                "db-slow-disk.invariant.served-after-detection",
                "db-slow-disk.invariant.bounded-latency", "db-slow-disk.invariant.no-failover",
                "db-slow-disk.rpo.acknowledged_submissions",
                "db-disk-full.invariant.at-most-one-failover",
                "db-disk-full.rpo.acknowledged_submissions",
                "checkpoint-power-loss.invariant.reported-checkpoints-durable",
                "checkpoint-power-loss.invariant.durable-resume",
                "checkpoint-power-loss.invariant.power-loss-visible",
                "checkpoint-power-loss.rpo.artifacts"):
        assert checks[cid]["status"] == "pass" and checks[cid]["measured"] == 0, checks[cid]
    assert checks["db-disk-full.rto"]["status"] == "pass", checks["db-disk-full.rto"]
    for name in GRAY:
        j = journal(run_dir, name)
        assert j["status"] == "completed" and not j["deviated"], name
    # network: four toxics on the agents' routes, each started and ended
    toxics = _faults(run_dir, "network_gray")
    assert {f["target"] for f in toxics if f["event"] == "fault_start"} == {
        "agents/slow-answers", "agents/connections-reset", "agents/silent-connections",
        "agents/all-silent"}
    assert sum(f["event"] == "fault_end" for f in toxics) == 4
    # object store: brownout, change, end, with the store's own counts
    brownout = _faults(run_dir, "s3_brownout")
    assert [f["event"] for f in brownout] == ["fault_start", "note", "fault_end"]
    assert brownout[0]["details"]["baseline"]["requests"] > 0
    assert brownout[-1]["details"]["counters"]["injected"]["SlowDown"] > 0
    # disks: a slow one, then a full one; PostgreSQL's leader stopped and the standby was
    # promoted once on the full disk, never on the slow one
    disk = _faults(run_dir, "disk")
    assert [f["event"] for f in disk] == ["fault_start", "fault_end", "note"] * 2
    slow_start, slow_end = disk[0]["details"], disk[1]["details"]
    assert slow_start["mode"] == "slow" and slow_end["injected"]["delays"] > 0
    assert slow_start["cluster"]["timeline"] == disk[2]["details"]["cluster"]["timeline"]
    full_start, full_end = disk[3]["details"], disk[4]["details"]
    assert full_start["mode"] == "full" and full_end["injected"]["errors"] > 0  # ENOSPC seen
    assert disk[5]["details"]["cluster"]["timeline"] == full_start["cluster"]["timeline"] + 1
    assert disk[5]["details"]["settled"] is True
    # power: cpu-2's host lost power inside a checkpoint write; what it dropped is on the
    # timeline (the last file of the checkpoint being written, not yet fsynced), and the job
    # lost at most that checkpoint
    assert checks["checkpoint-power-loss.rpo.checkpoint_progress"]["measured"] <= 1
    power = _faults(run_dir, "power_loss")
    assert [f["event"] for f in power] == ["fault_start", "fault_end"]
    assert power[0]["details"]["checkpoint_step"] >= 70
    assert power[1]["details"]["crash"]["dropped_bytes"] > 0
    assert power[1]["details"]["dropped_checkpoint_files"]
    # no lease ran out in the gray network (claims whose answer was lost came back by id)
    gray = next(e for e in verdict["experiments"] if e["name"] == "network-gray")
    events = [json.loads(x) for x in (run_dir / "snapshot" / "events.jsonl").read_text()
              .splitlines() if x]
    assert not [e for e in events if e["kind"] == "lease_expired"
                and gray["fault_start"] <= _epoch(e["time"]) <= gray["fault_end"]]


def _epoch(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()


@pytest.mark.tier2
@pytest.mark.timeout(1800)
def test_each_gray_defect_is_caught_by_its_named_objective(clone: FreshClone) -> None:
    runs = clone.root / "gray-selftest"
    args = [a for d in DEFECTS for a in ("--defect", d)]
    r = clone.gameday("selftest", *args, "--runs-dir", str(runs), timeout=1700)
    [selftest] = sorted(runs.glob("selftest-*"))
    matrix = json.loads((selftest / "selftest.json").read_text())
    assert sorted(m["defect"] for m in matrix) == sorted(DEFECTS), matrix
    missed = [m for m in matrix if not m["caught"]]
    assert not missed, json.dumps(missed, indent=1) + r.stdout[-3000:]
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]

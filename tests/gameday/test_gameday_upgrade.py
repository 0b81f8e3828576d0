"""The rolling upgrade (docs/upgrades.md) and telemetry loss, `full`-only classes, from a fresh
clone: the healthy platform passes each measured (make test), and each seeded defect
(`contract-too-early`, `readyz-needs-telemetry`) is caught by its named objective
(gameday/selftest.py) in its own `tier2` test, which `make test` leaves to `make test-tier2`
(README, Development). The defect tests use their own runs directories and do not need the
healthy tests to have run."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.gameday.freshclone import FreshClone, fresh_clone, journal

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshClone]:
    yield from fresh_clone(tmp_path_factory)


@pytest.mark.timeout(1500)
def test_upgrade_rehearsal_passes(clone: FreshClone) -> None:
    """The `full`-only upgrade class (docs/upgrades.md): rolling N -> N+1 with the expand
    migration under load, then one step back, passes with the experiment measured and every
    step on the timeline (the migration that renames a column N still reads: the tier2 test
    below)."""
    runs = clone.path / "runs"
    before = set(runs.iterdir()) if runs.exists() else set()
    r = clone.gameday("run", "--experiment", "upgrade", timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    (run_dir,) = [p for p in runs.iterdir() if p not in before and p.is_dir()]
    verdict = json.loads((run_dir / "verdict.json").read_text())
    (e,) = verdict["experiments"]
    assert e["name"] == "upgrade" and e["fault_source"] == "faults.jsonl"
    assert e["recovery_seconds"] is not None and e["recovery_seconds"] <= e["rto_seconds"]
    j = journal(run_dir, "upgrade")
    assert j["status"] == "completed" and not j["deviated"]
    checks = {c["id"]: c for c in verdict["checks"] if c["experiment"] == "upgrade"}
    served = checks["upgrade.invariant.served-after-detection"]
    assert served["status"] == "pass" and "judged" in served["message"], served
    assert checks["upgrade.rpo.acknowledged_submissions"]["status"] == "pass"
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines() if x]
    steps = [(f["event"], f["target"]) for f in faults if f["fault"] == "roll_release"]
    info = json.loads((clone.path / ".gameday" / "envs" / "local" / "env.json").read_text())
    order = [n for k in ("api", "reconciler", "agent")
             for n, c in info["components"].items() if c["kind"] == k]
    forward = ["schema", *order]  # every step started and ended before the next began
    assert steps[:2 * len(forward)] == [(ev, t) for t in forward
                                        for ev in ("fault_start", "fault_end")], steps
    assert {t for _, t in steps[2 * len(forward):]} == {"api-2", "cpu-1"}  # one step back
    assert any(f["fault"] == "release_skew" and f["event"] == "fault_end" for f in faults)
    assert all("CONTROLPLANE_RELEASE" not in c.get("env", {})
               for c in info["components"].values()), "restore_all must return to release N"


@pytest.mark.tier2
@pytest.mark.timeout(900)
def test_upgrade_seeded_defect_contract_too_early_is_caught(clone: FreshClone) -> None:
    """The N+1 migration that renames a column release N still reads (`contract-too-early`)
    is caught by `upgrade.invariant.served-after-detection`; `make test-tier2`."""
    runs = clone.path / "runs-upgrade-selftest"
    s = clone.gameday("selftest", "--defect", "contract-too-early", "--runs-dir", str(runs),
                      timeout=600)
    root = max(runs.glob("selftest-*"))
    (row,) = json.loads((root / "selftest.json").read_text())
    assert row["caught"], json.dumps(row, indent=1) + s.stdout[-3000:]
    assert row["failed_checks"] and s.returncode == 0, s.stdout[-3000:]


@pytest.mark.timeout(1200)
def test_telemetry_loss_passes_without_prometheus(clone: FreshClone) -> None:
    """Prometheus stopped under load for 90 s: the platform keeps serving, the verdict says the
    Prometheus evidence of that stretch is lost (never "healthy"), durability is still decided
    from the ledger and the store (an API whose readiness needs Prometheus: the tier2 test
    below)."""
    runs = clone.path / "runs-telemetry"
    r = clone.gameday("run", "--experiment", "telemetry-loss", "--runs-dir", str(runs),
                      timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    verdict = json.loads((run_dir / "verdict.json").read_text())
    (e,) = verdict["experiments"]
    assert e["name"] == "telemetry-loss" and e["measured"] and e["fault_source"] == "faults.jsonl"
    assert e["telemetry_lost"] and "scraped nothing" in e["telemetry_lost"], e["telemetry_lost"]
    assert e["failed_requests"] == 0 and e["acknowledged_lost"] == 0
    checks = {c["id"]: c for c in verdict["checks"] if c["experiment"] == "telemetry-loss"}
    assert checks["telemetry-loss.rpo.acknowledged_submissions"]["status"] == "pass"
    assert checks["telemetry-loss.rto"]["status"] == "pass", checks["telemetry-loss.rto"]


@pytest.mark.tier2
@pytest.mark.timeout(1200)
def test_telemetry_loss_seeded_defect_readyz_needs_telemetry_is_caught(
        clone: FreshClone) -> None:
    """An API whose readiness also needs Prometheus (`readyz-needs-telemetry`) fails the
    RTO: caught by `telemetry-loss.rto`; `make test-tier2`."""
    s = clone.gameday("selftest", "--defect", "readyz-needs-telemetry", "--runs-dir",
                      str(clone.path / "runs-telemetry-selftest"), timeout=900)
    (root,) = sorted((clone.path / "runs-telemetry-selftest").glob("selftest-*"))
    (row,) = json.loads((root / "selftest.json").read_text())
    assert row["defect"] == "readyz-needs-telemetry" and row["caught"], (row, s.stdout[-4000:])
    assert "telemetry-loss.rto" in row["failed_checks"] and s.returncode == 0, s.stdout[-3000:]

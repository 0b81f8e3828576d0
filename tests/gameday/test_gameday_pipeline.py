"""pipeline-recovery and data-source-unavailable (`full` suite only) from a fresh clone: each
healthy run judges its pipeline invariants on real records (not "no data") (make test), and
their seeded defects are each caught by their named objective, one selftest invocation per
class (gameday/selftest.py), in the `tier2` tests, which `make test` leaves to `make
test-tier2` (README, Development). Both classes share the module's environment, so the data
class's healthy run adds its own run only; the defect tests use their own runs directories and
do not need the healthy tests to have run."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.gameday.freshclone import FreshClone, fresh_clone, journal
from tests.gameday.localrun import only_run

pytestmark = pytest.mark.slow

PIPELINE_DEFECTS = ("cache-key-without-data", "registration-without-receipt",
                    "release-after-failed-check")
SOURCE_DEFECTS = ("source-digest-unchecked", "excluded-source-unnamed")


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshClone]:
    yield from fresh_clone(tmp_path_factory)


@pytest.mark.timeout(1500)
def test_pipeline_recovery_passes_measured(clone: FreshClone) -> None:
    """pipeline-recovery is in the `full` suite only: its healthy run (every pipeline invariant
    judged on real records, not "no data") is proven here, on the module's environment (its
    seeded defects in the tier2 test below)."""
    runs = clone.root / "pipeline-recovery-runs"
    r = clone.gameday("run", "--experiment", "pipeline-recovery", "--runs-dir", str(runs),
                      timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    run_dir = only_run(runs)
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["exit_code"] == 0, verdict["reason"]
    [e] = verdict["experiments"]
    assert e["name"] == "pipeline-recovery" and e["fault_source"] == "faults.jsonl"
    j = journal(run_dir, "pipeline-recovery")
    assert j["status"] == "completed" and not j["deviated"]
    after = {p["activity"]["name"]: p for p in j["steady_states"]["after"]["probes"]}
    assert all(p["tolerance_met"] for p in after.values())
    resumed = after["interrupted-candidate-resumed-from-checkpoint"]["output"]
    assert resumed["attempts"] >= 2 and max(resumed["from_steps"]) > 0, resumed
    checks = {c["id"]: c for c in verdict["checks"] if c["experiment"] == "pipeline-recovery"}
    for name in ("stale-cache-reuse", "cache-hit-when-unchanged", "side-effect-once",
                 "partial-failure-visibility", "release-after-checks"):
        c = checks[f"pipeline-recovery.invariant.{name}"]
        assert c["status"] == "pass" and c["measured"] == 0, c
    inv = {i["name"]: i for i in e["invariants"]}
    assert all(i["judged"] > 0 and i["no_data"] is None for i in inv.values()), inv
    assert checks["pipeline-recovery.rpo.checkpoint_progress"]["status"] == "pass"
    # the cache decided both ways: the unchanged resubmission reused, the changed one ran
    steps = [json.loads(x) for x in (run_dir / "snapshot" / "pipeline_steps.jsonl")
             .read_text().splitlines() if x]
    prepare = {s["pipeline_id"]: s["state"] for s in steps if s["name"] == "prepare"}
    assert sorted(prepare.values()) == ["reused", "succeeded", "succeeded"], prepare
    # the retried registration got the first receipt back
    replay = next(x for x in j["run"]
                  if x["activity"]["name"] == "registration-retried-after-lost-answer")
    assert replay["output"]["created"] is False, replay["output"]
    phases = e["pipeline_usable_result_seconds"]
    assert len(phases) == 3 and all(v["prepare"] is not None for v in phases.values()), phases


@pytest.mark.tier2
@pytest.mark.timeout(1500)
def test_pipeline_recovery_seeded_defects_are_caught(clone: FreshClone) -> None:
    """pipeline-recovery's three seeded defects (PIPELINE_DEFECTS), in one selftest
    invocation, are each caught by their named objective; `make test-tier2`."""
    runs = clone.root / "pipeline-recovery-selftest"
    args = [a for d in PIPELINE_DEFECTS for a in ("--defect", d)]
    caught = clone.gameday("selftest", *args, "--runs-dir", str(runs), timeout=1200)
    [selftest] = sorted(runs.glob("selftest-*"))
    matrix = json.loads((selftest / "selftest.json").read_text())
    assert [m["defect"] for m in matrix] == list(PIPELINE_DEFECTS), matrix
    assert all(m["caught"] for m in matrix), json.dumps(matrix, indent=1) + caught.stdout[-3000:]
    assert caught.returncode == 0, caught.stdout[-4000:] + caught.stderr[-2000:]


@pytest.mark.timeout(900)
def test_data_source_unavailable_passes_with_the_declared_policy(clone: FreshClone) -> None:
    """data-source-unavailable's healthy run: of ten sources, the corrupt one is left out and
    named under degrade (its bytes never used), the missing one stops the fail pipeline at
    start naming it; sources-accounted judged both steps on real records and passed."""
    runs = clone.root / "data-source-runs"
    r = clone.gameday("run", "--experiment", "data-source-unavailable", "--runs-dir", str(runs),
                      timeout=600)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    run_dir = only_run(runs)
    verdict = json.loads((run_dir / "verdict.json").read_text())
    [e] = verdict["experiments"]
    assert e["name"] == "data-source-unavailable" and e["fault_source"] == "faults.jsonl"
    [inv] = e["invariants"]
    assert inv["name"] == "sources-accounted" and inv["judged"] == 2 and not inv["violations"]
    assert inv["no_data"] is None, inv
    checks = {c["id"]: c for c in verdict["checks"]
              if c["experiment"] == "data-source-unavailable"}
    assert checks["data-source-unavailable.invariant.sources-accounted"]["status"] == "pass"
    j = journal(run_dir, "data-source-unavailable")
    assert j["status"] == "completed" and not j["deviated"]
    after = {p["activity"]["name"]: p["output"] for p in j["steady_states"]["after"]["probes"]}
    degraded = after["degrade-pipeline-names-the-corrupt-source"]
    assert degraded["as_declared"] is True and "sha256 mismatch" in (
        degraded["excluded_sources"]["s03"])
    failed = after["fail-pipeline-stops-naming-the-missing-source"]
    assert failed["as_declared"] is True and "s07 (object missing" in (
        failed["prepare"]["state_reason"])
    steps = [json.loads(x) for x in (run_dir / "snapshot" / "pipeline_steps.jsonl")
             .read_text().splitlines() if x]
    prepared = [s for s in steps if s["name"] == "prepare" and s["state"] == "succeeded"]
    [m] = [s["manifest"] for s in prepared if (s.get("inputs") or {}).get("sources")]
    assert sorted(m["sources"]["read"]) == [f"s{i:02d}" for i in range(10) if i != 3]
    assert len(m["inputs"]) == 9
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines() if x]
    broken = {f["details"]["source"]: f["details"]["mode"] for f in faults
              if f["fault"] == "data_source_unavailable" and f["event"] == "fault_start"}
    assert broken == {"s03": "corrupt", "s07": "missing"}, broken


@pytest.mark.tier2
@pytest.mark.timeout(900)
def test_data_source_unavailable_seeded_defects_are_caught(clone: FreshClone) -> None:
    """data-source-unavailable's two seeded defects (SOURCE_DEFECTS: the digest never compared
    in the workload, the excluded source's name dropped by the control plane), in one selftest
    invocation, are each caught by sources-accounted with exit 2; `make test-tier2`."""
    runs = clone.root / "data-source-selftest"
    args = [a for d in SOURCE_DEFECTS for a in ("--defect", d)]
    caught = clone.gameday("selftest", *args, "--runs-dir", str(runs), timeout=800)
    [selftest] = sorted(runs.glob("selftest-*"))
    matrix = json.loads((selftest / "selftest.json").read_text())
    assert [m["defect"] for m in matrix] == list(SOURCE_DEFECTS), matrix
    for m in matrix:
        assert m["caught"] and m["exit_code"] == 2, json.dumps(matrix, indent=1)
        assert "data-source-unavailable.invariant.sources-accounted" in m["failed_checks"]
    assert caught.returncode == 0, caught.stdout[-4000:] + caught.stderr[-2000:]

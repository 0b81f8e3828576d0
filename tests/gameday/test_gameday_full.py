"""The `full`-only classes clock-skew and credential-rotation, on one environment from a fresh
clone: the healthy platform passes both experiments measured in one game day (make test: one
run's fixed cost, baseline and evidence, paid once for the two classes), and each
seeded defect (`lease-from-agent-clock`, `token-cached-forever`) is caught by its named
objective (gameday/selftest.py) in its own `tier2` test, which `make test` leaves to
`make test-tier2` (README, Development). The defect tests use their own runs directories and
do not need the healthy tests to have run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gameday.freshclone import FreshClone, fresh_clone, journal
from tests.gameday.localrun import env_secrets, leaked_secrets, only_run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshClone]:
    yield from fresh_clone(tmp_path_factory)


HEALTHY = ("clock-skew", "credential-rotation")


@pytest.fixture(scope="module")
def healthy(clone: FreshClone) -> tuple[Path, dict[str, Any]]:
    """One game day of both classes on the healthy platform: its run directory and verdict."""
    runs = clone.root / "healthy-runs"
    r = clone.gameday("run", *(a for x in HEALTHY for a in ("--experiment", x)), "--runs-dir",
                      str(runs), timeout=1100)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    run_dir = only_run(runs)
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["exit_code"] == 0, verdict["reason"]
    assert [e["name"] for e in verdict["experiments"]] == list(HEALTHY), verdict["experiments"]
    return run_dir, verdict


@pytest.mark.timeout(1200)
def test_clock_skew_passes_measured(healthy: tuple[Path, dict[str, Any]]) -> None:
    """clock-skew is in the `full` suite only: its healthy run is proven here, on the module's
    environment (its seeded defect in the tier2 test below)."""
    run_dir, verdict = healthy
    [e] = [x for x in verdict["experiments"] if x["name"] == "clock-skew"]
    assert e["fault_source"] == "faults.jsonl"
    assert e["recovery_seconds"] is not None and e["recovery_seconds"] <= e["rto_seconds"]
    j = journal(run_dir, "clock-skew")
    assert j["status"] == "completed" and not j["deviated"]
    assert all(p["tolerance_met"] for p in j["steady_states"]["after"]["probes"])
    # the skews really were jumps of both clocks, forward and backward, recorded with start/end
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines() if x]
    skews = [f for f in faults if f["fault"] == "clock_skew"]
    starts = {(f["target"], f["details"]["offset_seconds"]) for f in skews
              if f["event"] == "fault_start"}
    assert starts == {("cpu-1", -30.0), ("cpu-1", 30.0), ("reconciler", 30.0),
                      ("reconciler", -30.0)}
    assert sum(f["event"] == "fault_end" for f in skews) == 4  # restore_all undid the last ones
    checks = {c["id"]: c for c in verdict["checks"]}
    for name in ("lease-granted-once", "fencing"):
        c = checks[f"clock-skew.invariant.{name}"]
        assert c["status"] == "pass" and c["measured"] == 0, c
    # the agent's claims carried its skewed clock (the probe's evidence, in the store snapshot)
    claims = [json.loads(x) for x in (run_dir / "snapshot" / "events.jsonl").read_text()
              .splitlines() if x and json.loads(x)["kind"] == "claimed"]
    offsets = [c["data"].get("agent_clock_offset") for c in claims]
    assert any(o is not None and abs(o) >= 25 for o in offsets), offsets


@pytest.mark.tier2
@pytest.mark.timeout(1200)
def test_clock_skew_seeded_defect_lease_from_agent_clock_is_caught(clone: FreshClone) -> None:
    """clock-skew's seeded defect (`lease-from-agent-clock`: a lease measured from the agent's
    own clock) is caught by `clock-skew.invariant.lease-granted-once`; `make test-tier2`."""
    runs = clone.root / "clock-skew-selftest"
    caught = clone.gameday("selftest", "--defect", "lease-from-agent-clock", "--runs-dir",
                           str(runs), timeout=900)
    [selftest] = sorted(runs.glob("selftest-*"))
    matrix = json.loads((selftest / "selftest.json").read_text())
    assert [m["defect"] for m in matrix] == ["lease-from-agent-clock"], matrix
    assert matrix[0]["caught"], json.dumps(matrix, indent=1) + caught.stdout[-3000:]
    assert caught.returncode == 0, caught.stdout[-4000:] + caught.stderr[-2000:]


@pytest.mark.timeout(1200)
def test_credential_rotation_passes(clone: FreshClone,
                                    healthy: tuple[Path, dict[str, Any]]) -> None:
    """Issue 17 item 5: agent token, project token and database password rotated under load,
    no failed acknowledged submission, no lost lease, the old ones refused (the agent that
    keeps its first token forever: the tier2 test below)."""
    run_dir, verdict = healthy
    [e] = [x for x in verdict["experiments"] if x["name"] == "credential-rotation"]
    assert e["recovery_seconds"] is not None, e
    checks = {c["id"]: c for c in verdict["checks"] if c["experiment"] == "credential-rotation"}
    assert checks["credential-rotation.invariant.leases-held"]["status"] == "pass", checks
    refused = checks["credential-rotation.invariant.retired-credentials-refused"]
    assert refused["status"] == "pass" and "request(s) with a retired" in refused["message"], (
        refused)
    assert checks["credential-rotation.rpo.acknowledged_submissions"]["status"] == "pass", checks
    j = journal(run_dir, "credential-rotation")
    assert j["status"] == "completed" and not j["deviated"], j["status"]
    after = {p["activity"]["name"]: p["output"] for p in j["steady_states"]["after"]["probes"]}
    proof = after["retired-credentials-refused"]
    assert proof["refused"] is True and proof["db_password"].startswith("refused"), proof
    assert all(v["retired"].startswith("401") for k, v in proof.items() if "@" in k), proof
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines() if x]
    assert [f["event"] for f in faults if f["fault"] == "credential_rotation"] == [
        "fault_start", "fault_end"]
    # neither the current secrets nor the retired ones in any log, evidence file or report
    state = clone.path / ".gameday" / "envs" / "local"
    secrets = env_secrets(state)
    retired = json.loads((state / "secrets" / "retired.json").read_text())
    secrets.update({f"retired.{k}": v for k, v in retired.items()
                    if k in ("agent_token", "pg_app", "project_token")})
    assert leaked_secrets([state / "logs", run_dir], secrets) == []


@pytest.mark.tier2
@pytest.mark.timeout(900)
def test_credential_rotation_seeded_defect_token_cached_forever_is_caught(
        clone: FreshClone) -> None:
    """An agent that keeps its first token forever is caught by
    `credential-rotation.invariant.leases-held`; `make test-tier2`."""
    runs = clone.path / "runs-credrot-selftest"
    r = clone.gameday("selftest", "--defect", "token-cached-forever", "--runs-dir", str(runs),
                      timeout=600)
    tests = list(runs.glob("selftest-*"))
    assert len(tests) == 1, r.stdout[-4000:] + r.stderr[-3000:]
    matrix = json.loads((tests[0] / "selftest.json").read_text())
    assert [(m["defect"], m["caught"]) for m in matrix] == [("token-cached-forever", True)], (
        json.dumps(matrix, indent=1) + r.stdout[-3000:])
    assert r.returncode == 0, r.stdout[-4000:]

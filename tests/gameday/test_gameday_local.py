"""The README's main command, literally, and the proof that every failure class can fail.

1. `gameday run --suite core` exactly as a new user runs it: the working directory is a fresh
   clone, GAMEDAY_HOME is unset, HOME is an empty directory, and the clone sits in a directory
   only its owner may enter (root's home is 0700). It must pass the gate with every experiment
   measured: completed, its fault on the timeline, its recovery measured. This is also the
   false-alarm check: the healthy platform must pass every failure class.
2. `gameday selftest --suite core` on the same environment: every seeded control-plane defect
   of the core classes must be caught by its named objective (the matrix in gameday/selftest.py;
   the classes only in the `full` suite have their own end-to-end tests).

One environment serves both (CI time); it dies with this test session whatever happens
(GAMEDAY_OWNER_PID, tests/conftest.py) and is taken down and checked at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gameday.selftest import select
from gameday.suites import SUITES
from tests.gameday.localrun import assert_no_processes, env_secrets, leaked_secrets, only_run

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
GAMEDAY = str(Path(sys.executable).with_name("gameday"))  # what `make run` runs
EVIDENCE = ["run.json", "ledger.jsonl", "requests.jsonl", "load_stats.json", "faults.jsonl",
            "snapshot/operations.jsonl", "snapshot/attempts.jsonl", "snapshot/events.jsonl",
            "snapshot/objects.jsonl", "snapshot/agents.jsonl", "prometheus/alerts.json"]
OUTPUTS = ["verdict.json", "junit.xml", "report.md", "report.html"]


class FreshClone:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / "clone"
        self.home = root / "home"

    def env(self) -> dict[str, str]:
        """The environment of a new user's shell: no GAMEDAY_* settings of ours, HOME empty
        (the test session's owner pid stays: servers must die with this session)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("GAMEDAY_") or k == "GAMEDAY_OWNER_PID"}
        env["HOME"] = str(self.home)
        return env

    def gameday(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run([GAMEDAY, *args], cwd=self.path, env=self.env(), text=True,
                              capture_output=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshClone]:
    root = tmp_path_factory.mktemp("newuser")
    root.chmod(0o700)  # like /root: the postgres OS user cannot enter it
    c = FreshClone(root)
    c.home.mkdir()
    subprocess.run(["git", "clone", "-q", str(REPO), str(c.path)], check=True)
    try:
        yield c
    finally:
        down = c.gameday("env", "down", "--purge", timeout=180)
        assert_no_processes(c.path)
        assert down.returncode in (0, 1), down.stdout + down.stderr


def _epoch(text: str) -> float:
    t = datetime.fromisoformat(text)  # Chaos Toolkit writes naive UTC
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def _journal(run_dir: Path, name: str) -> dict:
    return json.loads((run_dir / "experiments" / name / "journal.json").read_text())


@pytest.mark.timeout(2400)
def test_core_suite_from_a_fresh_clone_passes_with_every_experiment_measured(
        clone: FreshClone) -> None:
    r = clone.gameday("run", "--suite", "core", timeout=2300)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    state = clone.path / ".gameday" / "envs" / "local"
    assert (state / "env.json").exists(), "the environment must live in the clone (cwd)"
    if os.geteuid() == 0:  # the clone's parent is 0700: database files live elsewhere
        info = json.loads((state / "env.json").read_text())
        assert info["db_root"] != str(state)
    run_dir = only_run(clone.path / "runs")
    for name in EVIDENCE + OUTPUTS:
        assert (run_dir / name).exists(), name
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["exit_code"] == 0 and verdict["result"] in ("pass", "warning"), verdict["reason"]
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines() if x]
    results = {e["name"]: e for e in verdict["experiments"]}
    assert set(results) == set(SUITES["core"])
    for name in SUITES["core"]:
        j = _journal(run_dir, name)
        assert j["status"] == "completed" and not j["deviated"], name
        assert j["steady_states"]["before"]["steady_state_met"] is True, name
        assert all(rb["status"] == "succeeded" for rb in j["rollbacks"]), name
        e = results[name]
        assert e["fault_source"] == "faults.jsonl", (name, e["fault_source"])
        start, end = _epoch(j["start"]), _epoch(j["end"])
        assert any(f["event"] == "fault_start" and start <= _epoch(f["time"]) <= end
                   for f in faults), f"{name}: no fault on the timeline"
        assert e["recovery_seconds"] is not None, name
        assert e["recovery_seconds"] <= e["rto_seconds"], name
    for c in verdict["checks"]:
        assert c["status"] != "not_measured", c
        # key objectives all hold; a non-key SLI may miss while faults are injected on purpose
        # (queue age during node-pool-exhausted), which the gate scores, as documented
        assert not c["key"] or c["status"] == "pass", c
    # this run's operations only (the store outlives runs)
    started = json.loads((run_dir / "run.json").read_text())["started_at"]
    for line in (run_dir / "snapshot" / "operations.jsonl").read_text().splitlines():
        assert json.loads(line)["created_at"] >= started[:19]
    # no secret of the environment in any log, evidence file, report or archived copy
    secrets = env_secrets(state)
    assert {"secrets.pg_app", "secrets.agent_token", "secrets.admin_token"} <= set(secrets)
    roots = [state / "logs", run_dir] + [p for p in [clone.path / "archive"] if p.exists()]
    assert leaked_secrets(roots, secrets) == []


@pytest.mark.timeout(2400)
def test_selftest_catches_every_seeded_defect_by_its_named_objective(clone: FreshClone) -> None:
    r = clone.gameday("selftest", "--suite", "core", timeout=2300)
    runs = sorted((clone.path / "runs").glob("selftest-*"))
    assert runs, r.stdout[-4000:] + r.stderr[-3000:]
    matrix = json.loads((runs[-1] / "selftest.json").read_text())
    missed = [m for m in matrix if not m["caught"]]
    assert not missed, json.dumps(missed, indent=1) + r.stdout[-3000:]
    assert {m["defect"] for m in matrix} == {c.defect for c in select((), "core")}, (
        r.stdout[-3000:] + r.stderr[-3000:])
    assert r.returncode == 0, r.stdout[-4000:]


@pytest.mark.timeout(1200)
def test_clock_skew_passes_measured_and_its_seeded_defect_is_caught(clone: FreshClone) -> None:
    """clock-skew is in the `full` suite only: its healthy run and its seeded defect
    (`lease-from-agent-clock`) are proven here, on the module's environment."""
    runs = clone.root / "clock-skew-runs"
    r = clone.gameday("run", "--experiment", "clock-skew", "--runs-dir", str(runs), timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    run_dir = only_run(runs)
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["exit_code"] == 0, verdict["reason"]
    [e] = verdict["experiments"]
    assert e["name"] == "clock-skew" and e["fault_source"] == "faults.jsonl"
    assert e["recovery_seconds"] is not None and e["recovery_seconds"] <= e["rto_seconds"]
    j = _journal(run_dir, "clock-skew")
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

    caught = clone.gameday("selftest", "--defect", "lease-from-agent-clock", "--runs-dir",
                           str(runs), timeout=900)
    [selftest] = sorted(runs.glob("selftest-*"))
    matrix = json.loads((selftest / "selftest.json").read_text())
    assert [m["defect"] for m in matrix] == ["lease-from-agent-clock"], matrix
    assert matrix[0]["caught"], json.dumps(matrix, indent=1) + caught.stdout[-3000:]
    assert caught.returncode == 0, caught.stdout[-4000:] + caught.stderr[-2000:]


@pytest.mark.timeout(900)
def test_credential_rotation_passes_and_a_token_cached_forever_is_caught(
        clone: FreshClone) -> None:
    """Issue 17 item 5: agent token, project token and database password rotated under load,
    no failed acknowledged submission, no lost lease, the old ones refused; and an agent that
    keeps its first token forever is caught by `leases-held`."""
    runs = clone.path / "runs-credrot"
    r = clone.gameday("run", "--experiment", "credential-rotation", "--runs-dir", str(runs),
                      timeout=600)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    run_dir = only_run(runs)
    verdict = json.loads((run_dir / "verdict.json").read_text())
    (e,) = verdict["experiments"]
    assert e["name"] == "credential-rotation" and e["recovery_seconds"] is not None, e
    checks = {c["id"]: c for c in verdict["checks"] if c["experiment"] == "credential-rotation"}
    assert checks["credential-rotation.invariant.leases-held"]["status"] == "pass", checks
    assert checks["credential-rotation.rpo.acknowledged_submissions"]["status"] == "pass", checks
    j = _journal(run_dir, "credential-rotation")
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

    r = clone.gameday("selftest", "--defect", "token-cached-forever", "--runs-dir", str(runs),
                      timeout=600)
    tests = list(runs.glob("selftest-*"))
    assert len(tests) == 1, r.stdout[-4000:] + r.stderr[-3000:]
    matrix = json.loads((tests[0] / "selftest.json").read_text())
    assert [(m["defect"], m["caught"]) for m in matrix] == [("token-cached-forever", True)], (
        json.dumps(matrix, indent=1) + r.stdout[-3000:])
    assert r.returncode == 0, r.stdout[-4000:]


@pytest.mark.timeout(1500)
def test_zone_outage_passes_measured_and_its_seeded_defect_is_caught(clone: FreshClone) -> None:
    """zone-outage (full suite only): the healthy platform passes with the experiment measured,
    the lost zone's work really moved to the other zone, and `zone-sticky-retry` is caught."""
    runs = clone.path / "runs-zone-outage"
    r = clone.gameday("run", "--experiment", "zone-outage", "--runs-dir", str(runs), timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    run_dir = only_run(runs)
    verdict = json.loads((run_dir / "verdict.json").read_text())
    (e,) = verdict["experiments"]
    assert e["name"] == "zone-outage" and e["fault_source"] == "faults.jsonl", e
    assert e["recovery_seconds"] is not None and e["recovery_seconds"] <= e["rto_seconds"], e
    checks = {c["id"]: c for c in verdict["checks"]}
    for check in ("zone-outage.rto", "zone-outage.rpo.acknowledged_submissions",
                  "zone-outage.invariant.eligible-placement"):
        assert checks[check]["status"] == "pass", checks[check]
    j = _journal(run_dir, "zone-outage")
    assert j["status"] == "completed" and not j["deviated"]
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines() if x]
    (start,) = [f for f in faults if f["event"] == "fault_start" and f["fault"] == "zone_outage"]
    lost_zone = start["target"]  # the synchronous standby's zone
    parts = start["details"]
    zones = json.loads((clone.path / ".gameday" / "envs" / "local" / "env.json").read_text())[
        "zones"]
    assert {k: parts[k] for k in ("api", "database", "agents", "routes")} == zones[lost_zone]
    assert len(parts["api"]) == 1 and len(parts["database"]) == 1 and parts["agents"]
    assert parts["primary_lost"] is False
    (end,) = [f for f in faults if f["event"] == "fault_end" and f["fault"] == "zone_outage"]
    # every part of the zone was really down: restore_zone had to start each one again
    assert set(end["details"]["restarted"]) == {*parts["api"], *parts["database"],
                                                *parts["agents"]}, end
    # the lost zone's work moved: an attempt lost in the lost zone, then success in the other
    agents = {a["name"]: a for a in map(json.loads, (run_dir / "snapshot" / "agents.jsonl")
                                        .read_text().splitlines())}
    attempts = [json.loads(x) for x in
                (run_dir / "snapshot" / "attempts.jsonl").read_text().splitlines() if x]
    lost = {a["operation_id"] for a in attempts
            if a["state"] == "lost" and agents[a["agent_name"]]["zone"] == lost_zone}
    moved = {a["operation_id"] for a in attempts if a["operation_id"] in lost
             and a["state"] == "succeeded" and agents[a["agent_name"]]["zone"] != lost_zone}
    assert moved, f"no work lost in {lost_zone} was completed in the other zone"

    r = clone.gameday("selftest", "--defect", "zone-sticky-retry", "--runs-dir",
                      str(clone.path / "runs-zone-selftest"), timeout=900)
    (root,) = sorted((clone.path / "runs-zone-selftest").glob("selftest-*"))
    (row,) = json.loads((root / "selftest.json").read_text())
    assert row["defect"] == "zone-sticky-retry" and row["caught"], (row, r.stdout[-4000:])
    assert r.returncode == 0, r.stdout[-4000:]


@pytest.mark.timeout(1500)
def test_upgrade_rehearsal_passes_and_a_contract_too_early_is_caught(clone: FreshClone) -> None:
    """The `full`-only upgrade class (docs/upgrades.md): rolling N -> N+1 with the expand
    migration under load, then one step back, passes with the experiment measured and every
    step on the timeline; the migration that renames a column N still reads is caught."""
    runs = clone.path / "runs"
    before = set(runs.iterdir()) if runs.exists() else set()
    r = clone.gameday("run", "--experiment", "upgrade", timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    (run_dir,) = [p for p in runs.iterdir() if p not in before and p.is_dir()]
    verdict = json.loads((run_dir / "verdict.json").read_text())
    (e,) = verdict["experiments"]
    assert e["name"] == "upgrade" and e["fault_source"] == "faults.jsonl"
    assert e["recovery_seconds"] is not None and e["recovery_seconds"] <= e["rto_seconds"]
    j = _journal(run_dir, "upgrade")
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

    s = clone.gameday("selftest", "--defect", "contract-too-early", timeout=600)
    root = max(runs.glob("selftest-*"))
    (row,) = json.loads((root / "selftest.json").read_text())
    assert row["caught"], json.dumps(row, indent=1) + s.stdout[-3000:]
    assert row["failed_checks"] and s.returncode == 0, s.stdout[-3000:]


PIPELINE_DEFECTS = ("cache-key-without-data", "registration-without-receipt",
                    "release-after-failed-check")


@pytest.mark.timeout(1500)
def test_pipeline_recovery_passes_measured_and_its_seeded_defects_are_caught(
        clone: FreshClone) -> None:
    """pipeline-recovery is in the `full` suite only: its healthy run (every pipeline invariant
    judged on real records, not "no data") and its three seeded defects, in one selftest
    invocation, are proven here, on the module's environment."""
    runs = clone.root / "pipeline-recovery-runs"
    r = clone.gameday("run", "--experiment", "pipeline-recovery", "--runs-dir", str(runs),
                      timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    run_dir = only_run(runs)
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["exit_code"] == 0, verdict["reason"]
    [e] = verdict["experiments"]
    assert e["name"] == "pipeline-recovery" and e["fault_source"] == "faults.jsonl"
    j = _journal(run_dir, "pipeline-recovery")
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

    args = [a for d in PIPELINE_DEFECTS for a in ("--defect", d)]
    caught = clone.gameday("selftest", *args, "--runs-dir", str(runs), timeout=1200)
    [selftest] = sorted(runs.glob("selftest-*"))
    matrix = json.loads((selftest / "selftest.json").read_text())
    assert [m["defect"] for m in matrix] == list(PIPELINE_DEFECTS), matrix
    assert all(m["caught"] for m in matrix), json.dumps(matrix, indent=1) + caught.stdout[-3000:]
    assert caught.returncode == 0, caught.stdout[-4000:] + caught.stderr[-2000:]

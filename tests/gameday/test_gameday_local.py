"""`gameday run` for real against the local environment: the ci suite passes the gate, its
verdict is recomputable offline from the run directory, and a deliberately broken control plane
(acknowledging before commit, a test-only flag) fails the durability objective."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gameday.localrun import assert_no_processes, gameday, only_run

pytestmark = pytest.mark.slow

EVIDENCE = ["run.json", "ledger.jsonl", "requests.jsonl", "load_stats.json", "faults.jsonl",
            "snapshot/operations.jsonl", "snapshot/attempts.jsonl", "snapshot/events.jsonl",
            "snapshot/objects.jsonl", "prometheus/alerts.json"]
OUTPUTS = ["verdict.json", "junit.xml", "report.md", "report.html"]


def test_ci_suite_passes_the_gate_and_is_recomputable(home: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    try:
        r = gameday("run", "--suite", "ci", "--runs-dir", str(runs), "--down-after", home=home)
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    finally:
        gameday("env", "down", home=home, timeout=120)
    assert_no_processes(home)
    run_dir = only_run(runs)
    for name in EVIDENCE + OUTPUTS:
        assert (run_dir / name).exists(), name
    for name in ("api-replica-loss", "db-primary-loss", "agent-connectivity-loss"):
        journal = json.loads((run_dir / "experiments" / name / "journal.json").read_text())
        assert journal["status"] == "completed" and not journal["deviated"], name
        assert journal["steady_states"]["before"]["steady_state_met"] is True
        assert all(r["status"] == "succeeded" for r in journal["rollbacks"]), name
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["exit_code"] == 0
    durability = next(c for c in verdict["checks"] if c["id"] == "sli.submission-durability")
    assert durability["status"] == "pass"
    ledger = (run_dir / "ledger.jsonl").read_text().splitlines()
    assert len(ledger) >= 20  # load + experiment submissions were acknowledged and audited
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()]
    assert {f["fault"] for f in faults if f["event"] == "fault_start"} >= {
        "kill", "partition_agent"}
    # the verdict is recomputable offline from the run directory alone
    again = gameday("evaluate", str(run_dir), home=home)
    assert again.returncode == 0, again.stdout[-2000:]
    assert json.loads((run_dir / "verdict.json").read_text())["score"] == verdict["score"]


def test_ack_before_commit_fails_the_durability_objective(home: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    try:
        r = gameday("run", "--experiment", "api-replica-loss", "--runs-dir", str(runs),
                    "--down-after", home=home,
                    extra_env={"CONTROLPLANE_UNSAFE_ACK_BEFORE_COMMIT": "1"})
    finally:
        gameday("env", "down", home=home, timeout=120)
    assert_no_processes(home)
    assert r.returncode == 2, r.stdout[-4000:] + r.stderr[-4000:]
    verdict = json.loads((only_run(runs) / "verdict.json").read_text())
    durability = next(c for c in verdict["checks"] if c["id"] == "sli.submission-durability")
    assert durability["status"] == "fail"
    rpo = [c for c in verdict["checks"] if c["id"].startswith("api-replica-loss.rpo")]
    assert any(c["status"] == "fail" for c in rpo), rpo

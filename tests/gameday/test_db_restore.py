"""Restore from backup, for real on the local environment (Patroni/PostgreSQL, moto, the API):
the rehearsal passes the gate through `gameday run`, and the CLI's restore order fails closed,
quarantines what the restored store does not know and - only with the client ledger - gets
every acknowledged submission back. Without the ledger the loss is visible, not hidden.
The rehearsal is in make test, the CLI's test in make test-tier2."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest

from tests.gameday.localrun import assert_no_processes, gameday, only_run

pytestmark = pytest.mark.slow


def test_restore_rehearsal_passes_the_gate_with_nothing_acknowledged_lost(home: Path,
                                                                          tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    try:
        r = gameday("run", "--experiment", "db-restore-from-backup", "--runs-dir", str(runs),
                    "--down-after", home=home)
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    finally:
        gameday("env", "down", home=home, timeout=120)
    assert_no_processes(home)
    run_dir = only_run(runs)
    exp = run_dir / "experiments" / "db-restore-from-backup"
    journal = json.loads((exp / "journal.json").read_text())
    assert journal["status"] == "completed" and not journal["deviated"]
    assert all(p["tolerance_met"] for p in journal["steady_states"]["after"]["probes"])
    report = json.loads((exp / "restore.json").read_text())
    rec = report["reconciliation"]
    # the two operations acknowledged after the backup were lost by the restore ...
    assert rec["lost_acknowledged"] >= 2 and rec["lost_before_restore_point"] == []
    assert rec["quarantined_objects"] >= 2 and rec["consistent"]
    # ... and came back under the ids their clients hold once intake re-opened
    replayed = report["reopen"]["replayed"]
    assert len(replayed) == rec["lost_acknowledged"]
    assert {x["status"] for x in replayed} == {201}
    assert all(x["new_id"] == x["old_id"] and x["identity"] == "same_id" for x in replayed)
    assert report["restore"]["fencing_token_floor"] >= 1_000_000
    verdict = json.loads((run_dir / "verdict.json").read_text())
    checks = {c["id"]: c["status"] for c in verdict["checks"]}
    assert checks["sli.submission-durability"] == "pass"
    assert checks["db-restore-from-backup.rpo.acknowledged_submissions"] == "pass"
    state = home / ".gameday" / "envs" / "local"
    assert list((state / "pg-0").glob("data.lost-*")) and list((state / "pg-1").glob("data.lost-*"))


def _submit(adapter: object, ledger: Path, n: int) -> list[str]:
    from platforms import SubmitRequest, Workload
    from slo.ledger import LedgerEntry, LedgerWriter

    ids = []
    for _ in range(n):
        ack = adapter.submit(SubmitRequest(Workload(steps=10, step_delay=0.02),  # type: ignore[attr-defined]
                                           f"restore-test-{uuid.uuid4()}"))
        LedgerWriter(ledger).append([LedgerEntry(
            operation_id=ack.operation_id, idempotency_key=ack.idempotency_key,
            acked_at=ack.acked_at, project=adapter.project,  # type: ignore[attr-defined]
            status=ack.status, request=ack.request)])
        ids.append(ack.operation_id)
    return ids


def _wait_succeeded(adapter: object, ids: list[str], timeout: float = 90) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(adapter.get(i).state == "succeeded" for i in ids):  # type: ignore[attr-defined]
            return
        time.sleep(0.5)
    raise AssertionError(f"not all succeeded: {[adapter.get(i).state for i in ids]}")  # type: ignore[attr-defined]


# make test-tier2 (about 100 s with its own environment, moved for make test's 45 minutes):
# make test keeps the rehearsal above, which goes through the same restore order
@pytest.mark.tier2
def test_restore_cli_fails_closed_and_replays_only_what_a_ledger_holds(home: Path,
                                                                       tmp_path: Path) -> None:
    from chaos.restore import acknowledged_submissions_present
    from environments.local.env import LocalEnvironment
    from platforms.controlplane import ControlPlaneAdapter

    run_dir = tmp_path / "client"
    run_dir.mkdir()
    ledger = run_dir / "ledger-experiments.jsonl"
    config = {"gameday_env": "local", "gameday_home": str(home), "gameday_run_dir": str(run_dir)}
    try:
        assert gameday("env", "up", home=home, timeout=300).returncode == 0
        env = LocalEnvironment.load("local", home)
        adapter = ControlPlaneAdapter.from_env(env.endpoints, env.tokens)
        before = _submit(adapter, ledger, 1)
        _wait_succeeded(adapter, before)
        r = gameday("env", "backup", home=home)
        assert r.returncode == 0, r.stderr
        after = _submit(adapter, ledger, 2)
        _wait_succeeded(adapter, after)

        assert gameday("fault", "lose-db", home=home).returncode == 0
        r = gameday("env", "restore-db", "--keep-closed", home=home, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        report = json.loads(r.stdout)
        # their artifacts are quarantined, but nothing tells the store they were acknowledged
        assert report["reconciliation"]["quarantined_objects"] >= 2
        assert report["reconciliation"]["lost_acknowledged"] == 0
        assert "reopen" not in report
        assert httpx.post(f"{env.endpoints['api']}/v1/operations", json={}).status_code == 503
        seen = acknowledged_submissions_present(configuration=config)
        assert seen["missing_count"] == 2 and not seen["all_present"]  # the loss is visible

        assert gameday("fault", "restore-all", home=home, timeout=300).returncode == 0
        r = gameday("env", "restore-db", "--ledger", str(ledger), home=home, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        report = json.loads(r.stdout)
        assert report["reconciliation"]["lost_acknowledged"] == 2
        assert [x["status"] for x in report["replayed"]] == [201, 201]
        # the ids the client was given answer again: re-created under them, not as new ids
        assert [(x["old_id"], x["new_id"], x["identity"]) for x in report["replayed"]] == [
            (i, i, "same_id") for i in after]
        for op_id in after:
            assert adapter.http.get(f"/v1/operations/{op_id}").status_code == 200  # type: ignore[attr-defined]
        assert acknowledged_submissions_present(configuration=config)["all_present"]
        assert adapter.get(before[0]).state == "succeeded"  # from the backup, untouched
        _wait_succeeded(adapter, after)
    finally:
        gameday("env", "down", home=home, timeout=120)
    assert_no_processes(home)

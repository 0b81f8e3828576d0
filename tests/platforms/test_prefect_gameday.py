"""`gameday run --platform prefect --suite ci` for real: Prefect 3 server + process workers beside
the shared local components, the applicable experiments under load, evidence in the generic
format, the verdict computed by the same evaluator. The verdict itself may fail (findings about
Prefect are findings); what must hold is a complete run directory, an evaluator exit code of
0/1/2 (never 3, evidence unusable), not-applicable experiments reported with their reason, and a
report that names the platform.

Then, on the same environment (one bring-up), pipeline-recovery against the Prefect pipeline
flow (platforms/prefect_pipeline.py): every pipeline invariant is judged from Prefect's own
records (not no data), and the findings about Prefect 3.9.1 it exists to show are in the
verdict and the report (docs/adapters.md section 6).

Marked `tier2`: `make test` leaves this game day to `make test-tier2` for its time budget
(README, Development); the Prefect adapter's own tests (test_adapter_contract.py,
test_prefect_pipeline_records.py) stay in `make test`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from environments.local import prefect as pf
from environments.local import procs

pytestmark = [pytest.mark.slow, pytest.mark.tier2]

EVIDENCE = ["run.json", "ledger.jsonl", "requests.jsonl", "load_stats.json", "faults.jsonl",
            "snapshot/operations.jsonl", "snapshot/attempts.jsonl", "snapshot/events.jsonl",
            "snapshot/objects.jsonl", "prometheus/alerts.json"]
OUTPUTS = ["verdict.json", "junit.xml", "report.md", "report.html"]


def gameday(*args: str, home: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GAMEDAY_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "gameday.cli", *args], env=env, text=True,
                          capture_output=True, timeout=timeout, check=False)


@pytest.fixture
def home() -> Path:
    path = Path(tempfile.mkdtemp(prefix="gameday-prefect-"))
    path.chmod(0o755)  # the postgres OS user must enter the state directory
    yield path  # type: ignore[misc]
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(1500)
def test_prefect_ci_game_day(home: Path, tmp_path: Path) -> None:
    if pf.missing():
        if os.environ.get("CI"):
            pytest.fail(pf.missing())
        pytest.skip(pf.missing())
    runs, pipe_runs = tmp_path / "runs", tmp_path / "pipeline-runs"
    litter = _prefect_litter()
    try:
        r = gameday("run", "--platform", "prefect", "--suite", "ci", "--runs-dir", str(runs),
                    "--keep-env", "--no-archive", home=home)
        p = gameday("run", "--platform", "prefect", "--experiment", "pipeline-recovery",
                    "--runs-dir", str(pipe_runs), "--down-after", "--no-archive", home=home)
    finally:
        gameday("env", "down", home=home, timeout=120)
    state = home / ".gameday" / "envs" / "local"
    deadline = time.monotonic() + 10
    while procs.marked_processes(state) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert procs.marked_processes(state) == []
    # Prefect's runner leaves per-run temporary directories when its worker is killed: they
    # belong in the environment's state (purged), never in the system's temporary directory
    assert _prefect_litter() - litter == set()
    out = r.stdout[-6000:] + r.stderr[-3000:]
    assert r.returncode in (0, 1, 2), out  # 3 = evidence unusable, 4 = refused
    (run_dir,) = list(runs.iterdir())
    for name in EVIDENCE + OUTPUTS:
        assert (run_dir / name).exists(), name
    info = json.loads((run_dir / "run.json").read_text())
    assert info["platform"] == "prefect"
    # not applicable experiments are reported with the reason, not silently skipped
    assert "agent-connectivity-loss" in info["not_applicable"]
    assert "fencing" in info["not_applicable"]["agent-connectivity-loss"]
    applicable = sorted(n for n in info["experiments"] if n not in info["not_applicable"])
    assert applicable == ["api-replica-loss", "db-primary-loss"]
    assert not (run_dir / "experiments" / "agent-connectivity-loss" / "journal.json").exists()
    for name in applicable:
        journal = json.loads((run_dir / "experiments" / name / "journal.json").read_text())
        assert all(x["status"] == "succeeded" for x in journal["rollbacks"]), name
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["exit_code"] in (0, 1, 2) and verdict["exit_code"] == r.returncode
    assert verdict["platform"] == "prefect"
    assert "platform `prefect`" in (run_dir / "report.md").read_text()
    # the same SLIs were computed from Prefect's evidence
    ids = {c["id"] for c in verdict["checks"]}
    assert {"sli.submission-durability", "sli.api-availability"} <= ids
    ops = (run_dir / "snapshot" / "operations.jsonl").read_text().splitlines()
    assert ops and all(json.loads(x)["project"] == "prefect" for x in ops)
    ledger = (run_dir / "ledger.jsonl").read_text().splitlines()
    assert len(ledger) >= 5
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()]
    started = {(f["fault"], f["target"]) for f in faults if f["event"] == "fault_start"}
    assert ("kill", "prefect-server") in started
    _assert_pipeline_findings(p, pipe_runs)


def _prefect_litter() -> set[Path]:
    tmp = Path(tempfile.gettempdir())
    return {*tmp.glob("prefect-workspace-attempt-*"), *tmp.glob("tmp*prefect")}


def _assert_pipeline_findings(r: subprocess.CompletedProcess[str], runs: Path) -> None:
    out = r.stdout[-6000:] + r.stderr[-3000:]
    assert r.returncode in (0, 1, 2), out
    (run_dir,) = list(runs.iterdir())
    info = json.loads((run_dir / "run.json").read_text())
    assert info["platform"] == "prefect" and "pipeline-recovery" not in info["not_applicable"]
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["exit_code"] == r.returncode
    [e] = verdict["experiments"]
    inv = {i["name"]: i for i in e["invariants"]}
    # judged from Prefect's evidence, not "no data"
    assert set(inv) == {"stale-cache-reuse", "cache-hit-when-unchanged", "side-effect-once",
                        "partial-failure-visibility", "release-after-checks"}
    assert all(i["judged"] > 0 and i["no_data"] is None for i in inv.values()), inv
    steps = [json.loads(x) for x in (run_dir / "snapshot" / "pipeline_steps.jsonl")
             .read_text().splitlines() if x]
    prepare = sorted(s["state"] for s in steps if s["name"] == "prepare")
    # finding 1: INPUTS + TASK_SOURCE keys the dataset's name/uri, not its bytes: the changed
    # resubmission reused prepare's result made from the old bytes
    assert prepare == ["reused", "reused", "succeeded"], prepare
    [stale] = inv["stale-cache-reuse"]["violations"]
    assert "step prepare" in stale and "inputs differ" in stale
    # finding 2: register's retry after a lost answer (Prefect's task retry) registered twice
    assert any("model_registration 2 times" in v for v in inv["side-effect-once"]["violations"])
    # the unchanged resubmission hit the cache; the excluded candidate was named; the failed
    # check refused the release
    for name in ("cache-hit-when-unchanged", "partial-failure-visibility", "release-after-checks"):
        assert not inv[name]["violations"], inv[name]
    # finding 3: the flow run whose worker was killed was marked crashed by the zombie
    # automation (environments/local/prefect.py), never resumed; its train-a task run stays RUNNING
    pipes = {json.loads(x)["name"]: json.loads(x) for x in
             (run_dir / "snapshot" / "pipelines.jsonl").read_text().splitlines() if x}
    base = pipes["pipeline-recovery-base"]
    assert base["state"] == "failed" and "heartbeats stopped" in base["state_reason"], base
    train_a = next(s for s in steps if s["pipeline_id"] == base["id"] and s["name"] == "train-a")
    assert train_a["state"] == "running", train_a
    j = json.loads((run_dir / "experiments" / "pipeline-recovery" / "journal.json").read_text())
    after = {x["activity"]["name"]: x for x in j["steady_states"]["after"]["probes"]}
    assert after["base-pipeline-succeeded"]["tolerance_met"] is False
    report = (run_dir / "report.md").read_text()
    assert "stale-cache-reuse" in report and "side-effect-once" in report

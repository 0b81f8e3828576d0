"""`gameday bench tracking-peer`: the plain MLflow client under the tracking-outage faults.

Three training scripts written as a user writes them with the ``mlflow`` library
(scripts/mlflow_peer_trainer.py, run by .venv-mlflow's python: the harness never imports
mlflow) log to the local environment's tracking server while the same faults as the game day
hit it (the database primary crashed, then the server killed and restarted 15 s later). What
they did (each call that took over 0.5 s or raised, how far training got, whether the run was
ended) and what MLflow holds afterwards are the evidence; the four tracking invariants
(slo/tracking_invariants.py) judge it as they judge our workload's sink.

Evidence in ``<out>/``: ``trainers/<n>.json`` (each script's ledger), ``tracking_runs.jsonl``
(MLflow read back, same rows as a game day's snapshot), ``faults.jsonl`` (the environment's
fault timeline over the measurement), ``summary.json`` (figures and invariants) and
``verdict.json`` (the invariants as a verdict: `gameday slo compare <game day> <this>`)."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from environments.local import tracking as lt
from gameday import tracking_collect
from slo.evidence import Attempt, Event, TrackingRun
from slo.tracking_invariants import (
    metric_points_kept,
    one_run_per_attempt,
    runs_terminated,
    tracked,
    training_unaffected,
)
from slo.verdict import ExperimentResult, InvariantOutcome, Verdict

REPO = Path(__file__).resolve().parent.parent
TRAINER = REPO / "scripts" / "mlflow_peer_trainer.py"
EXPERIMENT = "gameday-peer-mlflow-client"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def judge(ledgers: list[dict[str, Any]], runs: list[TrackingRun], started: float,
          ended: float) -> list[dict[str, Any]]:
    """The four invariants over the peer's ledgers, each trainer an attempt (pure)."""
    attempts, events = [], []
    for i, led in enumerate(ledgers):
        op, _, number = str(led["attempt_id"]).rpartition("/attempt-")
        attempts.append(Attempt(id=f"peer-{i}", operation_id=op, number=int(number),
                                state="succeeded" if led["outcome"] == "succeeded" else "failed",
                                created_at=_iso(started), finished_at=_iso(ended)))
        end = [c for c in led.get("calls", []) if c["call"] == "end_run"]
        # every MLflow call the script made held its training for as long as it took
        logs = [c["seconds"] for c in led.get("calls", [])]
        events.append(Event(attempt_id=f"peer-{i}", operation_id=op, time=_iso(ended),
                            kind="log", data={"tracking": {
                                "points_logged": led["points_logged"], "points_dropped": 0,
                                "finish_wait_seconds": end[0]["seconds"] if end else 0.0,
                                "longest_log_call_seconds": max(logs, default=0.0)}}))
    subjects = tracked(attempts, events, runs, started, ended)
    return [{"name": r.name, "judged": r.judged, "violations": list(r.violations),
             "no_data": r.no_data, "measured": r.measured}
            for r in (f(subjects, runs) for f in (metric_points_kept, one_run_per_attempt,
                                                  runs_terminated, training_unaffected))]


def peer_verdict(run_id: str, started: float, ended: float, fault_start: float,
                 fault_end: float, invariants: list[dict[str, Any]],
                 trainers: dict[str, dict[str, Any]]) -> Verdict:
    """The measurement as a verdict with one experiment, tracking-outage, carrying the four
    invariants, so `gameday slo compare` puts it beside a game day's (pure). No SLI, no load,
    no RTO: only what was measured is in it."""
    held = [InvariantOutcome(**i) for i in invariants]
    ok = all(not i.violations and i.no_data is None for i in held)
    failed = [i.name for i in held if i.violations or i.no_data]
    findings = [f"{name}: {f['outcome']} in {f['seconds']} s, {f['points_logged']} points "
                f"logged, longest log_metric {f['longest_log_metric_s']} s"
                + (f", error: {f['error']}" if f["error"] else "")
                for name, f in sorted(trainers.items())]
    return Verdict(
        run_id=run_id, env="local", suite="tracking-peer", platform="mlflow-client",
        started_at=started, ended_at=ended, result="pass" if ok else "fail", score=None,
        key_failed=not ok, exit_code=0 if ok else 2,
        reason="every tracking invariant held" if ok else
        "tracking invariant(s) broken: " + ", ".join(failed),
        slis=[], checks=[], findings=findings,
        experiments=[ExperimentResult(
            name="tracking-outage", failure_class="tracking-outage", experiment_ok=ok,
            title="plain MLflow client under the tracking-outage faults",
            start=started, end=ended, fault_name="database primary crash + tracking server kill",
            fault_start=fault_start, fault_end=fault_end, fault_source="faults.jsonl",
            invariants=held, invariant_names=[i.name for i in held])])


def figures(led: dict[str, Any]) -> dict[str, Any]:
    """What one trainer went through (pure)."""
    calls = led.get("calls", [])
    metric = [c for c in calls if c["call"] == "log_metric"]
    return {"outcome": led["outcome"], "seconds": led.get("seconds"),
            "points_logged": led["points_logged"], "ended": led["ended"],
            "slow_or_failed_calls": len(calls),
            "longest_log_metric_s": max((c["seconds"] for c in metric), default=0.0),
            "log_metric_blocked_s": round(sum(c["seconds"] for c in metric), 3),
            "error": (led.get("error") or "").strip()[-300:] or None}


def under_way(url: str, trainers: int, since: float, procs: list[subprocess.Popen[bytes]],
              steps: int = 20, timeout: float = 180.0) -> None:
    """Wait until MLflow holds every trainer's run with at least ``steps`` points: the client's
    import takes seconds on a loaded machine, and faults that hit before training began
    measure the start, not training."""
    from controlplane.workload.mlflow_rest import MlflowRest, TrackingError

    client = MlflowRest(url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                raise click.ClickException("a peer trainer exited before the faults (its log "
                                           "is in trainers/)")
            try:
                runs = client.runs_since(client.experiment_id(EXPERIMENT), int(since * 1000))
            except TrackingError:
                runs = []
            steps_of = [max((m.get("step", 0) for m in (r.get("data") or {}).get("metrics") or []),
                            default=0) for r in runs]
            if len(runs) >= trainers and min(steps_of) >= steps:
                return
            time.sleep(0.5)
    finally:
        client.close()
    raise click.ClickException(f"the peer trainers did not reach step {steps} in {timeout:.0f} s")


@click.command("tracking-peer")
@click.option("--home", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="GAMEDAY_HOME of the running environment (default: $GAMEDAY_HOME or cwd).")
@click.option("--trainers", default=3, show_default=True)
@click.option("--steps", default=200, show_default=True)
@click.option("--step-delay", default=0.1, show_default=True)
@click.option("--server-down", default=15.0, show_default=True,
              help="Seconds between killing the tracking server and restarting it.")
@click.option("--timeout", default=900.0, show_default=True,
              help="Seconds to wait for the trainers after the faults.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Evidence directory (default: runs/tracking-peer-<time>).")
def tracking_peer_cmd(home: Path | None, trainers: int, steps: int, step_delay: float,
                      server_down: float, timeout: float, out: Path | None) -> None:
    """The plain MLflow client's trainers under the tracking-outage faults (local environment
    brought up with --tracking); prints and writes the figures and the invariants."""
    from environments.local.env import LocalEnvironment
    from environments.schedule import GameDayLock

    env = LocalEnvironment.load("local", home)
    url = env.endpoints.get("mlflow")
    if not url:
        raise click.ClickException(f"no tracking server in this environment: {lt.HINT}")
    python = lt.VENV / "bin" / "python"
    if lt.missing():
        raise click.ClickException(str(lt.missing()))
    out = out or Path("runs") / ("tracking-peer-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))
    (out / "trainers").mkdir(parents=True, exist_ok=True)
    lock = GameDayLock(env.state_dir / "gameday.lock")
    lock.acquire({"run_id": out.name, "run_dir": str(out)})
    started = time.time()
    try:
        nonce = uuid.uuid4().hex[:8]
        procs = [subprocess.Popen(
            [str(python), str(TRAINER), "--uri", url, "--experiment", EXPERIMENT,
             "--attempt-id", f"peer-{nonce}-{i}/attempt-1", "--steps", str(steps),
             "--step-delay", str(step_delay), "--out", str(out / "trainers" / f"{i}.json")],
            stdout=subprocess.DEVNULL, stderr=open(out / "trainers" / f"{i}.log", "wb"))
            for i in range(trainers)]
        under_way(url, len(procs), started, procs)  # the faults hit training, not its start
        killed = env.driver.kill("primary/postgres")
        writable = env.wait_db_writable(45.0)
        env.note("failover", {"automation": "failover", "writable_after_s": round(writable, 3),
                              "killed": killed.get("target")})
        env.driver.kill(lt.SERVER)
        time.sleep(server_down)
        env.driver.start(lt.SERVER)
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        ended = time.time()
        ledgers = [json.loads(f.read_text()) for f in sorted((out / "trainers").glob("*.json"))]
        count = tracking_collect.tracking_runs(url, EXPERIMENT, out / "tracking_runs.jsonl",
                                               datetime.fromtimestamp(started, UTC))
        runs = [TrackingRun.model_validate_json(line)
                for line in (out / "tracking_runs.jsonl").read_text().splitlines()]
        faults = [line for line in Path(env.endpoints["fault_timeline"]).read_text().splitlines()
                  if line and json.loads(line)["time"] >= _iso(started)]
        (out / "faults.jsonl").write_text("".join(f + "\n" for f in faults))
    finally:
        lock.release()
    summary = {"mlflow": ledgers[0].get("mlflow") if ledgers else None,
               "client_defaults": ledgers[0].get("defaults") if ledgers else None,
               "trainers": {led["attempt_id"]: figures(led) for led in ledgers},
               "runs_read_back": count, "seconds": round(ended - started, 1),
               "invariants": judge(ledgers, runs, started, ended)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    spans = [json.loads(f) for f in faults if '"fault_start"' in f or '"fault_end"' in f]
    times = [datetime.fromisoformat(f["time"]).timestamp() for f in spans]
    verdict = peer_verdict(out.name, started, ended, min(times, default=started),
                           max(times, default=ended), summary["invariants"],
                           summary["trainers"])
    (out / "verdict.json").write_text(verdict.model_dump_json(indent=2, by_alias=True))
    click.echo(json.dumps(summary, indent=2))
    click.echo(f"evidence: {out}")

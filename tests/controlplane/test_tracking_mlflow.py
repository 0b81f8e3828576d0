"""The workload's tracking sink against a real MLflow 3.17.2 server (.venv-mlflow) on a private
PostgreSQL, its artifacts in a moto S3 server: the promise of controlplane/workload/tracking.py
kept while the server is killed and restarted, and each seeded defect breaking its part.

Skipped, with the reason, when scripts/setup-mlflow.sh has not installed MLflow (in CI it has:
scripts/setup.sh runs it, and there a missing MLflow fails instead)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from controlplane import defects
from controlplane.workload.mlflow_rest import ATTEMPT_TAG, MlflowRest
from controlplane.workload.tracking import FINISHED, TrackingSink, TrackingSummary
from controlplane.workload.tracking_buffer import TrackingPolicy
from environments.local import motoserver
from environments.local import tracking as lt
from environments.local.pgserver import PostgresServer, free_port

pytestmark = pytest.mark.tier2  # a real MLflow server: ~15 s to start on two loaded cores


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120.0) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: exited {proc.returncode}: {log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return time.monotonic() - began
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url}: not ready after {timeout} s: {log.read_text()[-3000:]}")


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, **env},
                                start_new_session=True)


def _kill(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        proc.wait(20)


@dataclass
class Tracking:
    url: str
    spec_argv: list[str]
    spec_env: dict[str, str]
    health: str
    log: Path
    proc: subprocess.Popen[bytes]
    start_seconds: float

    def kill(self) -> None:
        _kill(self.proc)

    def restart(self) -> float:
        self.proc = _start(self.spec_argv, self.spec_env, self.log)
        return _wait(self.health, self.proc, self.log)


@pytest.fixture(scope="module")
def mlflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tracking]:
    why = lt.missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    logdir = tmp_path_factory.mktemp("mlflow")
    pg = PostgresServer(fsync=False)
    pg.start()
    moto = None
    server = None
    try:
        pg.create_database(lt.DB_NAME)
        s3_port = free_port()
        moto = _start(motoserver.command(s3_port), {"AWS_ACCESS_KEY_ID": "testing",
                                                    "AWS_SECRET_ACCESS_KEY": "testing"},
                      logdir / "moto.log")
        s3 = f"http://127.0.0.1:{s3_port}"
        _wait(s3 + "/moto-api/", moto, logdir / "moto.log", 30)
        httpx.put(f"{s3}/ml-artifacts", timeout=5).raise_for_status()
        port = free_port()
        spec = lt.server_spec(f"postgresql+psycopg2://postgres@127.0.0.1:{pg.port}/{lt.DB_NAME}",
                              port, s3)
        log = logdir / "mlflow.log"
        server = _start(spec.argv, spec.env, log)
        took = _wait(spec.health.url, server, log)
        t = Tracking(lt.url(port), spec.argv, spec.env, spec.health.url, log, server, took)
        yield t
        server = t.proc
    finally:
        for p in (server, moto):
            if p is not None:
                _kill(p, signal.SIGTERM)
        pg.stop()


POLICY = TrackingPolicy(flush_seconds=0.1, call_timeout=2.0, max_backoff=1.0,
                        finish_wait_seconds=90.0)


def _sink(url: str, attempt: str) -> TrackingSink:
    return TrackingSink(MlflowRest(url, timeout=POLICY.call_timeout), experiment="test-tracking",
                        attempt_id=attempt, run_name=attempt, policy=POLICY)


def _held(url: str, run_id: str) -> int:
    return len({(m["step"], m["timestamp"]) for m in MlflowRest(url).metric_history(run_id, "loss")})


def _runs(url: str, attempt: str) -> list[dict[str, object]]:
    client = MlflowRest(url)
    return client.runs_tagged(client.experiment_id("test-tracking"), ATTEMPT_TAG, attempt)


def _train(sink: TrackingSink, steps: int, delay: float) -> float:
    """Log one point per step like the workload; the longest any log call took (s)."""
    worst = 0.0
    for step in range(1, steps + 1):
        began = time.monotonic()
        sink.log_metric("loss", 1.0 / step, step)
        worst = max(worst, time.monotonic() - began)
        time.sleep(delay)
    return worst


def test_healthy_run_holds_every_point_param_and_artifact(mlflow: Tracking) -> None:
    sink = _sink(mlflow.url, "healthy/attempt-1")
    sink.start({"steps": 300, "seed": 7})
    _train(sink, 300, 0.0)
    sink.log_artifact("metrics.json", b'{"steps": 300}')
    summary = sink.finish(FINISHED)
    assert (summary.points_logged, summary.points_acknowledged) == (300, 300), summary
    assert summary.status_sent == FINISHED and summary.run_id
    run = MlflowRest(mlflow.url).get_run(summary.run_id)
    assert run["info"]["status"] == "FINISHED"
    assert {p["key"]: p["value"] for p in run["data"]["params"]} == {"steps": "300", "seed": "7"}
    assert _held(mlflow.url, summary.run_id) == 300
    assert MlflowRest(mlflow.url).artifacts(summary.run_id) == ["metrics.json"]


def test_a_batch_sent_twice_is_the_same_rows_in_mlflow(mlflow: Tracking) -> None:
    """The identity the sink relies on: log-batch of points already held adds no row (what makes
    a resend after a lost answer harmless)."""
    client = MlflowRest(mlflow.url)
    run = client.create_run(client.experiment_id("test-tracking"), "resend", 1, {})
    rid = run["info"]["run_id"]
    batch = [{"key": "loss", "value": 0.5, "step": s, "timestamp": 1000 + s} for s in range(50)]
    client.log_batch(rid, metrics=batch)
    client.log_batch(rid, metrics=batch)
    assert len(client.metric_history(rid, "loss")) == 50


def _outage(mlflow: Tracking, attempt: str) -> tuple[TrackingSink, float, float]:
    """Train 240 steps at 25 ms; the server is killed after 2 s and restarted 5 s later (then
    takes its start time); the run ends while it may still be starting."""
    sink = _sink(mlflow.url, attempt)
    sink.start({"steps": 240})
    worst = _train(sink, 80, 0.025)
    mlflow.kill()
    began = time.monotonic()
    worst = max(worst, _train(sink, 160, 0.025))
    trained = time.monotonic() - began
    mlflow.restart()
    return sink, worst, trained


def test_server_killed_mid_training_loses_nothing_and_never_stalls(mlflow: Tracking) -> None:
    sink, worst, trained = _outage(mlflow, "outage/attempt-1")
    summary = sink.finish(FINISHED)
    assert worst < 0.05, f"a log call waited {worst:.3f} s for tracking"
    assert summary.longest_log_call_seconds < 0.05, summary  # the sink's own account agrees
    assert trained < 10, f"160 steps took {trained:.1f} s while tracking was away"
    assert summary.unavailable_calls > 0, "the outage was never seen: the test proves nothing"
    assert summary.points_acknowledged == summary.points_logged == 240, summary
    assert summary.status_sent == FINISHED
    assert _held(mlflow.url, summary.run_id or "") == 240
    assert len(_runs(mlflow.url, "outage/attempt-1")) == 1


@pytest.fixture
def defect(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param:
        monkeypatch.setenv(defects.ENV, request.param)
    defects.active.cache_clear()
    yield request.param
    monkeypatch.delenv(defects.ENV, raising=False)
    defects.active.cache_clear()


@pytest.mark.parametrize("defect", ["tracking-flush-drops-batch"], indirect=True)
def test_defect_flush_drops_batch_loses_the_outages_points(mlflow: Tracking, defect: str) -> None:
    sink, _, _ = _outage(mlflow, "drops/attempt-1")
    summary = sink.finish(FINISHED)
    held = _held(mlflow.url, summary.run_id or "")
    assert held < 240 and summary.points_logged == 240, (held, summary)


@pytest.mark.parametrize("defect", ["", "tracking-finish-once"], indirect=True)
def test_a_run_ending_while_tracking_is_away(mlflow: Tracking, defect: str) -> None:
    """Healthy: training's finish waits, and the run is FINISHED once the server is back, after
    the points buffered meanwhile. With tracking-finish-once the end is sent at once, while the
    server is away, and never again: the run stays RUNNING for good, its points all there."""
    attempt = f"finish-{defect or 'healthy'}/attempt-1"
    sink = _sink(mlflow.url, attempt)
    sink.start({"steps": 10})
    _train(sink, 10, 0.0)
    time.sleep(1.0)  # run created and points sent while the server is up
    mlflow.kill()
    for step in range(11, 21):  # logged while the server is away: buffered at the end
        sink.log_metric("loss", 1.0 / step, step)
    done: list[object] = []
    finisher = threading.Thread(target=lambda: done.append(sink.finish(FINISHED)))
    finisher.start()
    time.sleep(2.0)
    mlflow.restart()
    finisher.join(POLICY.finish_wait_seconds)
    time.sleep(1.0)
    runs = _runs(mlflow.url, attempt)
    summary = done[0]
    assert isinstance(summary, TrackingSummary)
    # either way every point arrives: the defect breaks the run's end only
    assert _held(mlflow.url, summary.run_id or "") == summary.points_logged == 20
    if defect:
        assert summary.status_sent is None
        assert [r["info"]["status"] for r in runs] == ["RUNNING"]
    else:
        assert summary.status_sent == FINISHED, summary
        assert [r["info"]["status"] for r in runs] == ["FINISHED"]
        assert summary.finish_wait_seconds >= 2.0, "finish did not wait for the server"


class LoseFirstCreateAnswer(httpx.HTTPTransport):
    """Forwards every request to the real server; the answer of the first runs/create is lost
    after the server committed it (what a reset connection or a timeout does)."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.url.path.endswith("/runs/create") and not self.lost:
            response.read()
            self.lost += 1
            raise httpx.ReadTimeout("answer lost after the commit", request=request)
        return response


def test_a_create_whose_answer_was_lost_makes_no_second_run(mlflow: Tracking) -> None:
    transport = LoseFirstCreateAnswer()
    client = MlflowRest(mlflow.url, timeout=POLICY.call_timeout, transport=transport)
    sink = TrackingSink(client, experiment="test-tracking", attempt_id="lost-create/attempt-1",
                        run_name="lost-create", policy=POLICY)
    sink.start({"steps": 5})
    _train(sink, 5, 0.0)
    summary = sink.finish(FINISHED)
    assert transport.lost == 1 and summary.unavailable_calls >= 1, summary
    runs = _runs(mlflow.url, "lost-create/attempt-1")
    assert [r["info"]["status"] for r in runs] == ["FINISHED"], runs
    assert _held(mlflow.url, summary.run_id or "") == 5

"""`gameday gate --env staging --target FILE` end to end through the cloud path, with no cloud:

- the platform is a real control plane (API + reconciler on a real PostgreSQL, the
  tests/conftest.py ``cp_stack``) that the target file points at, with its DSN and tokens in
  the environment variables the target names; the background load (Locust) really runs;
- Kubernetes is the stubbed API of tests/chaos/fake_kube.py (recorded EKS objects) and the
  Lease stub of test_cloud_lease.py; AWS (the S3 listing of the evidence) is moto;
- Prometheus is a stub answering every query with an empty result;
- the experiment is stubbed in-process (no agents run here, so a real Chaos Toolkit experiment
  would wait for work that never starts): it injects through chaos.actions exactly as the
  experiment's actions do (Context -> CloudEnvironment -> CloudFaults), leaves a fault active
  on purpose and writes a journal, so the runner's own rollback and evidence are what is tested.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from moto import mock_aws
from rich.console import Console

from environments.cloud.lock import LEASE_NAME
from environments.cloud.recorded import RecordedCloudFaults
from environments.local.launch import ControlPlane
from gameday import run as gameday_run
from gameday.run import EXIT_INTERRUPTED, Options, run_gameday
from gameday.suites import load_experiment
from tests.chaos.fake_kube import FakeCluster
from tests.gameday.test_cloud_lease import StubLeaseApi

NS = "mlp-controlplane"
BUCKET = "mlplatform-staging-artifacts"
EVIDENCE = ["run.json", "ledger.jsonl", "requests.jsonl", "load_stats.json", "faults.jsonl",
            "snapshot/operations.jsonl", "snapshot/attempts.jsonl", "snapshot/events.jsonl",
            "snapshot/objects.jsonl", "prometheus/alerts.json", "collection-gaps.json"]
OUTPUTS = ["verdict.json", "junit.xml", "report.md", "report.html"]


class _Prometheus(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/api/v1/query_range"):
            body = {"status": "success", "data": {"resultType": "matrix", "result": []}}
        else:
            body = {"status": "ready"}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cp_stack: ControlPlane,
          prometheus: str) -> Iterator[dict[str, Any]]:
    """A 'staging' stack: target file, credentials, stubbed cluster and AWS."""
    fake = FakeCluster()
    for name in fake.objects["deployments"]:  # every control-plane Deployment fully ready
        d = fake.objects["deployments"][name]
        d["status"] = {"readyReplicas": d["spec"]["replicas"], "replicas": d["spec"]["replicas"]}
    for api in ("CoreV1Api", "AppsV1Api", "NetworkingV1Api"):
        monkeypatch.setattr(client, api, lambda *_a, **_k: fake)
    leases = StubLeaseApi()
    monkeypatch.setattr(client, "CoordinationV1Api", lambda *_a, **_k: leases)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.delenv("CHAOSTOOLKIT_IN_POD", raising=False)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(var, "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("GAMEDAY_ADMIN_DSN", cp_stack.dsn)
    monkeypatch.setenv("GAMEDAY_PROJECT_TOKEN", cp_stack.user_token)
    monkeypatch.setenv("GAMEDAY_AGENT_TOKEN", cp_stack.agent_token)
    # recovery hold of staging is minutes; the evaluator's settings are not under test here
    monkeypatch.setattr(gameday_run, "settle_seconds", lambda env, experiment: 0.0)
    target = tmp_path / "target.json"
    target.write_text(json.dumps({
        "environment": "staging", "region": "eu-west-1", "project": "mlplatform",
        "stack": "staging", "artifactBucket": BUCKET, "controlPlaneNamespace": NS,
        "apiUrl": cp_stack.api_url, "prometheusUrl": prometheus,
        "workloadImage": "127.0.0.1:5000/ml/trainer:1.0", "platformProject": cp_stack.project}))
    with mock_aws():
        import boto3

        s3 = boto3.client("s3", region_name="eu-west-1")
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        s3.put_object(Bucket=BUCKET, Key="artifacts/op-1/COMPLETE.json",
                      Body=json.dumps({"files": {}}).encode())
        yield {"fake": fake, "leases": leases, "target": target, "home": tmp_path / "home"}


def _journal(name: str, started: datetime) -> dict[str, Any]:
    exp = load_experiment(name)
    now = datetime.now(UTC).replace(tzinfo=None).isoformat()
    start = started.replace(tzinfo=None).isoformat()
    return {"experiment": exp.doc, "status": "completed", "deviated": False, "start": start,
            "end": now, "steady_states": {"before": {"steady_state_met": True},
                                          "after": {"steady_state_met": True}},
            "run": [{"activity": {"name": "kill-one-api-replica", "type": "action"},
                     "status": "succeeded", "start": start, "end": now}],
            "rollbacks": []}


def _stub_experiment(monkeypatch: pytest.MonkeyPatch, *, interrupt: bool) -> list[str]:
    """In place of `chaos run`: the experiment's fault actions, through chaos.actions."""
    from chaos import actions

    seen: list[str] = []

    def run_experiment(name: str, run_dir: Path, env_vars: dict[str, str], progress: Any,
                       task: Any, record: Any) -> None:
        for k, v in env_vars.items():  # as the chaos subprocess would see them
            monkeypatch.setenv(k, v)
        cfg = {"gameday_env": env_vars["GAMEDAY_ENV"], "gameday_run_dir": str(run_dir),
               "gameday_platform": "controlplane", "gameday_experiment": name}
        started = datetime.now(UTC)
        actions.kill(target="api-replica", configuration=cfg)
        actions.start(target="api-replica", configuration=cfg)
        # left active on purpose: the runner's rollback must undo it
        actions.stop(target="reconciler", configuration=cfg)
        seen.append(name)
        exp_dir = run_dir / "experiments" / name
        exp_dir.mkdir(parents=True, exist_ok=True)
        (exp_dir / "journal.json").write_text(json.dumps(_journal(name, started)))
        if interrupt:
            raise KeyboardInterrupt
        record.status = "completed"

    monkeypatch.setattr(gameday_run, "run_experiment", run_experiment)
    return seen


def _spy_restore_all(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []
    real = RecordedCloudFaults.restore_all

    def spy(self: RecordedCloudFaults) -> list[str]:
        out = real(self)
        calls.append(out)
        return out

    monkeypatch.setattr(RecordedCloudFaults, "restore_all", spy)
    return calls


def _gate(cloud: dict[str, Any], tmp_path: Path) -> tuple[int, Path]:
    opts = Options(env="staging", env_name="staging", suite="ci",
                   experiments=("api-replica-loss",), runs_dir=tmp_path / "runs",
                   target=cloud["target"], freeze_file=tmp_path / "no-freeze.yaml",
                   home=cloud["home"])
    code = run_gameday(opts, Console(width=200, record=True))
    (run_dir,) = list((tmp_path / "runs").iterdir())
    return code, run_dir


def _assert_rolled_back_and_unlocked(cloud: dict[str, Any], calls: list[list[str]],
                                     run_dir: Path) -> None:
    fake: FakeCluster = cloud["fake"]
    # rollback: the reconciler scaled back to its recorded replicas, nothing left in the state
    assert ["stop:controlplane-reconciler"] in calls
    reconciler = fake.objects["deployments"][(NS, "controlplane-reconciler")]
    assert reconciler["spec"]["replicas"] == 1
    state = cloud["home"] / ".gameday" / "cloud" / "staging" / "cloud-faults.json"
    assert json.loads(state.read_text())["faults"] == {}
    # the Lease was taken by this run and released at the end
    lease = cloud["leases"].leases[(NS, LEASE_NAME)]
    assert lease["spec"].get("holderIdentity") is None
    assert json.loads(lease["metadata"]["annotations"]["gameday.platform/run"])["run_dir"] == str(run_dir)
    # the fault timeline in the run directory has both faults, each with its end
    faults = [json.loads(x) for x in (run_dir / "faults.jsonl").read_text().splitlines()]
    assert [(f["event"], f["fault"], f["target"]) for f in faults] == [
        ("fault_start", "kill", "api-1"), ("fault_end", "kill", "api-1"),
        ("fault_start", "stop", "reconciler"), ("fault_end", "stop", "reconciler")]


def test_cloud_gate_end_to_end_stubbed_kubernetes_and_aws_real_local_control_plane(
        cloud: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _stub_experiment(monkeypatch, interrupt=False)
    calls = _spy_restore_all(monkeypatch)
    code, run_dir = _gate(cloud, tmp_path)
    assert seen == ["api-replica-loss"]
    for name in EVIDENCE + OUTPUTS:
        assert (run_dir / name).exists(), name
    verdict = json.loads((run_dir / "verdict.json").read_text())
    # evidence complete and usable (not 3), started (not 4): the gate's own verdict decides
    assert code == verdict["exit_code"] and code in (0, 1, 2)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["env"] == "staging" and info["interrupted"] is False
    assert info["target"]["api"].startswith("http://127.0.0.1:") and "dsn" not in info["target"]
    # the bucket's only object belongs to no operation of this run: not this run's evidence
    assert info["snapshot"]["objects"] == 0 and info["snapshot"]["rollback"]["restored"] == []
    assert info["load"]["acknowledged"] >= 1 and info["ledger_entries"] >= 1
    # no credential reaches the run directory
    for path in run_dir.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".md", ".html", ".xml"):
            text = path.read_text(errors="replace")
            assert os.environ["GAMEDAY_PROJECT_TOKEN"] not in text, path
            assert os.environ["GAMEDAY_ADMIN_DSN"] not in text, path
    gaps = json.loads((run_dir / "collection-gaps.json").read_text())
    assert "component logs" in gaps and "snapshot/objects.jsonl" not in gaps
    # the API's own request counter stands in for HAProxy's (issue 49 item 4): no gap
    assert "prometheus/api_requests.json" not in gaps
    objects = [json.loads(x) for x in (run_dir / "snapshot" / "objects.jsonl").read_text().splitlines()]
    assert objects == []  # listed through AWS (no gap), op-1's object is not this run's
    _assert_rolled_back_and_unlocked(cloud, calls, run_dir)


def test_cloud_gate_interrupted_still_rolls_back_stubbed_kubernetes_and_aws(
        cloud: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stub_experiment(monkeypatch, interrupt=True)
    calls = _spy_restore_all(monkeypatch)
    code, run_dir = _gate(cloud, tmp_path)
    assert code == EXIT_INTERRUPTED
    info = json.loads((run_dir / "run.json").read_text())
    assert info["interrupted"] is True
    for name in EVIDENCE:
        assert (run_dir / name).exists(), name
    _assert_rolled_back_and_unlocked(cloud, calls, run_dir)


def test_cloud_gate_refused_while_another_run_holds_the_lease_stubbed_kubernetes(
        cloud: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from environments.cloud.lock import LeaseLock

    LeaseLock(cloud["leases"], NS, "other-run", renew_every=0).acquire({"run_id": "other-run"})
    seen = _stub_experiment(monkeypatch, interrupt=False)
    opts = Options(env="staging", env_name="staging", experiments=("api-replica-loss",),
                   runs_dir=tmp_path / "runs", target=cloud["target"],
                   freeze_file=tmp_path / "no-freeze.yaml", home=cloud["home"])
    console = Console(width=300, record=True)
    assert run_gameday(opts, console) == gameday_run.EXIT_REFUSED
    assert "other-run" in console.export_text() and seen == []
    assert not (tmp_path / "runs").exists()
    assert cloud["leases"].leases[(NS, LEASE_NAME)]["spec"]["holderIdentity"] == "other-run"


def test_a_failed_restore_between_experiments_still_ends_in_a_verdict_stubbed_kubernetes(
        cloud: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the runner's safety net after an experiment raised (e.g. a restarted agent that would not
    # come up) and the game day died without a verdict; now the run goes on to one, and says so
    _stub_experiment(monkeypatch, interrupt=False)
    real = RecordedCloudFaults.restore_all
    calls: list[str] = []

    def first_fails(self: RecordedCloudFaults) -> list[str]:
        calls.append("restore_all")
        if len(calls) == 1:
            raise RuntimeError("component 'gpu-1' did not become healthy")
        return real(self)

    monkeypatch.setattr(RecordedCloudFaults, "restore_all", first_fails)
    code, run_dir = _gate(cloud, tmp_path)
    assert calls == ["restore_all", "restore_all"]  # between experiments, then at the end
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert code == verdict["exit_code"]
    status = json.loads((run_dir / "run.json").read_text())["experiment_status"]["api-replica-loss"]
    assert "restore after the experiment failed: component 'gpu-1'" in status["detail"]

"""The sample workload's pipeline steps as real subprocesses against moto: inputs are read from
the prefixes their manifests name and checked by sha256, COMPLETE.json lists the inputs
consumed by digest, and bytes changed behind a dataset name stop the step."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

from agenttest import S3Server

from controlplane import storage


def run(kind: str, op: str, s3: S3Server, inputs: dict[str, Any] | None,
        *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-u", "-m", "controlplane.workload", "--kind", kind,
            "--operation-id", op, "--attempt", "1", "--seconds", "0", "--s3-endpoint",
            s3.endpoint, "--bucket", s3.bucket, *extra]
    if inputs is not None:
        argv += ["--pipeline-inputs", json.dumps(inputs)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def given(step: str, op: str, manifest: dict[str, Any]) -> dict[str, Any]:
    return {"step": step, "artifacts_prefix": storage.artifact_prefix(op, 1),
            "files": manifest["files"]}


def _run(claim: Any, api: Any, tmp_path: Any, moto: S3Server) -> Any:
    """One attempt through the real runner and local runtime, to its end (60 s at most)."""
    import threading

    from controlplane.agent.attempt import AttemptRunner, RunnerSettings
    from controlplane.agent.capacity import Capacity
    from controlplane.agent.delivery import Courier
    from controlplane.agent.metrics import AgentMetrics
    from controlplane.agent.spool import Spool
    from controlplane.runtimes.local import LocalRuntime

    capacity, metrics = Capacity(1), AgentMetrics()
    assert capacity.reserve(claim.attempt_id, claim.demand()) is None
    spool = Spool(tmp_path, max_bytes=1 << 20, max_age_seconds=3600, metrics=metrics)
    runner = AttemptRunner(
        claim, api=api, runtime=LocalRuntime(), capacity=capacity,
        metrics=metrics, settings=RunnerSettings(moto.endpoint, moto.bucket, tick=0.05),
        heartbeat_seconds=1.0, shutdown=threading.Event(),
        store_factory=lambda: moto.store(deadline=1.0),
        courier=Courier(api, spool, metrics))
    runner.start()
    runner.join(60)
    return runner


def test_prepare_train_evaluate_chain_through_manifests(moto: S3Server) -> None:
    store = moto.store()
    uri = f"datasets/{uuid.uuid4()}/rows.csv"
    rows = b"b,2\na,1\nb,2\n"
    store.put(uri, rows)
    ds = {"name": "rows", "sha256": storage.sha256_hex(rows), "uri": uri}
    prep = f"prep-{uuid.uuid4()}"
    done = run("prepare", prep, moto, {"steps": [], "datasets": [ds],
                                       "digests": [ds["sha256"]]})
    assert done.returncode == 0, done.stdout + done.stderr
    m, reason = storage.verify_artifacts(store, prep, 1)
    assert reason is None and m is not None and m["inputs"] == [ds["sha256"]]
    assert store.get(storage.artifact_prefix(prep, 1) + "prepared.txt") == b"a,1\nb,2\n"
    # a candidate trains from prepare's manifest, given explicitly
    up = given("prepare", prep, m)
    digests = sorted({f["sha256"] for f in m["files"].values()})
    train = f"train-{uuid.uuid4()}"
    done = run("train", train, moto, {"steps": [up], "datasets": [], "digests": digests},
               "--steps", "6", "--checkpoint-every", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    tm, _ = storage.verify_artifacts(store, train, 1)
    assert tm is not None and tm["inputs"] == digests
    ev = f"eval-{uuid.uuid4()}"
    tdigests = sorted({f["sha256"] for f in tm["files"].values()})
    done = run("evaluate", ev, moto, {"steps": [given("train-0", train, tm)], "datasets": [],
                                      "digests": tdigests})
    assert done.returncode == 0, done.stdout + done.stderr
    em, _ = storage.verify_artifacts(store, ev, 1)
    assert em is not None and em["checks"]["candidates_scored"] == {"passed": True, "value": 1}
    # an input file whose bytes no longer match its manifest is refused (exit 2)
    store.put(storage.artifact_prefix(train, 1) + "model.npy", b"tampered")
    bad = run("evaluate", f"eval-{uuid.uuid4()}", moto, {
        "steps": [given("train-0", train, tm)], "datasets": [], "digests": tdigests})
    assert bad.returncode == 2 and "sha256 differs from its completion manifest" in bad.stdout


def test_changed_bytes_behind_a_dataset_name_stop_prepare(moto: S3Server) -> None:
    store = moto.store()
    uri = f"datasets/{uuid.uuid4()}/rows.csv"
    store.put(uri, b"v1\n")
    declared = storage.sha256_hex(b"v1\n")
    store.put(uri, b"v2\n")  # same name, different bytes
    done = run("prepare", f"prep-{uuid.uuid4()}", moto, {
        "steps": [], "datasets": [{"name": "rows", "sha256": declared, "uri": uri}],
        "digests": [declared]})
    assert done.returncode == 2 and "bytes changed behind the name" in done.stdout


def test_agent_gives_a_step_its_inputs_and_reports_the_consumed_digests(
        moto: S3Server, registry: Any, tmp_path: Any) -> None:
    """The real attempt runner and local runtime: the claim's ``pipeline.inputs`` reach the
    workload, and the success report carries COMPLETE.json's inputs for the control plane."""

    from test_agent_runner import FakeApi

    from controlplane.agent.attempt import Claim, Ending

    class Recording(FakeApi):
        def __init__(self) -> None:
            super().__init__()
            self.results: list[dict[str, Any] | None] = []

        def report(self, attempt_id: str, token: int, state: str, reason: str,
                   error: Any = None, result: Any = None, events: Any = None) -> None:
            self.results.append(result)
            super().report(attempt_id, token, state, reason, error, result, events)

    store = moto.store()
    uri = f"datasets/{uuid.uuid4()}/rows.csv"
    store.put(uri, b"x,1\n")
    digest = storage.sha256_hex(b"x,1\n")
    claim = Claim(attempt_id=str(uuid.uuid4()), operation_id=str(uuid.uuid4()), number=1,
                  fencing_token=1, lease_seconds=5.0, project="p", spec={
                      "workload": {"kind": "prepare", "image": registry.trainer_image,
                                   "params": {"seconds": 0}},
                      "resources": {"cpu": 1},
                      "pipeline": {"step": "prepare", "inputs": {
                          "steps": [], "digests": [digest],
                          "datasets": [{"name": "rows", "sha256": digest, "uri": uri}]}}})
    api = Recording()
    runner = _run(claim, api, tmp_path, moto)
    assert runner.ending is Ending.SUCCEEDED, api.reports
    result = api.results[-1]
    assert result is not None and result["inputs"] == [digest] and result["checks"] == {}
    assert "prepared.txt" in result["files"]


def test_release_step_registers_once_when_the_first_answer_is_lost(
        moto: S3Server, registry: Any, tmp_path: Any) -> None:
    """The agent records a release step's registration under the step's action identity; the
    first answer is lost (the effect was recorded), the retry gets the same receipt back."""

    from test_agent_runner import FakeApi

    from controlplane.agent.api import ApiUnavailable
    from controlplane.agent.attempt import Claim, Ending

    class Registry(FakeApi):
        """Keeps effects by action id, as the control plane's side_effects table does."""

        def __init__(self) -> None:
            super().__init__()
            self.effects: dict[str, dict[str, Any]] = {}
            self.calls = 0
            self.results: list[Any] = []

        def side_effect(self, op: str, action_id: str, kind: str,
                        payload: dict[str, Any]) -> dict[str, Any]:
            self.calls += 1
            created = action_id not in self.effects
            if created:
                self.effects[action_id] = {"receipt_id": str(uuid.uuid4()), "payload": payload}
            assert self.effects[action_id]["payload"] == payload
            if self.calls == 1:
                raise ApiUnavailable("answer lost after commit")
            return {"receipt": self.effects[action_id], "created": created}

        def report(self, attempt_id: str, token: int, state: str, reason: str,
                   error: Any = None, result: Any = None, events: Any = None) -> None:
            self.results.append(result)
            super().report(attempt_id, token, state, reason, error, result, events)

    digest = "e" * 64
    action = "pipeline:p1:step:register:model_registration"
    claim = Claim(attempt_id=str(uuid.uuid4()), operation_id=str(uuid.uuid4()), number=1,
                  fencing_token=1, lease_seconds=5.0, project="p", spec={
                      "workload": {"kind": "sleep", "image": registry.trainer_image,
                                   "params": {"seconds": 0}},
                      "resources": {"cpu": 1},
                      "pipeline": {"step": "register", "inputs": {
                          "steps": [], "digests": [digest],
                          "datasets": [{"name": "model", "sha256": digest}]},
                          "side_effect": {"kind": "model_registration", "action_id": action}}})
    api = Registry()
    runner = _run(claim, api, tmp_path, moto)
    assert runner.ending is Ending.SUCCEEDED, api.reports
    assert api.calls == 2 and list(api.effects) == [action]
    effect = api.results[-1]["side_effect"]
    assert effect["action_id"] == action and effect["created"] is False
    assert effect["receipt"]["payload"] == {"inputs": [digest]}


def _ten_sources(store: Any) -> list[dict[str, Any]]:
    base = f"datasets/{uuid.uuid4()}"
    out = []
    for i in range(10):
        rows = f"source-{i},{i}\n".encode()
        store.put(f"{base}/s{i:02d}.csv", rows)
        out.append({"name": f"s{i:02d}", "sha256": storage.sha256_hex(rows),
                    "uri": f"{base}/s{i:02d}.csv"})
    return out


def test_ten_sources_one_corrupt_degrade_names_it_and_fail_stops_at_start(
        moto: S3Server) -> None:
    """Data at start on the real S3 server: under ``degrade`` the step runs on the nine good
    sources and COMPLETE.json names the corrupt one (its bytes are never used); under ``fail``
    a missing object is an explicit start failure naming it (exit 2), and nothing is written."""
    store = moto.store()
    ds = _ten_sources(store)
    store.put(ds[3]["uri"], b"corrupt bytes\n")
    digests = sorted(d["sha256"] for d in ds)
    op = f"prep-{uuid.uuid4()}"
    done = run("prepare", op, moto, {"steps": [], "datasets": ds, "digests": digests,
                                     "sources": {"policy": "degrade", "min_sources": 9}})
    assert done.returncode == 0, done.stdout + done.stderr
    m, reason = storage.verify_artifacts(store, op, 1)
    assert reason is None and m is not None
    assert list(m["sources"]["excluded"]) == ["s03"]
    assert "sha256 mismatch" in m["sources"]["excluded"]["s03"]
    assert sorted(m["sources"]["read"]) == [d["name"] for d in ds if d["name"] != "s03"]
    assert m["inputs"] == sorted(d["sha256"] for d in ds if d["name"] != "s03")
    prepared = store.get(storage.artifact_prefix(op, 1) + "prepared.txt")
    assert b"corrupt" not in prepared and prepared.count(b"\n") == 9
    assert '"source_excluded": "s03"' in done.stdout
    # policy fail: a missing object stops the step at start, with its reason
    store.put(ds[3]["uri"], b"source-3,3\n")
    store.client.delete_object(Bucket=moto.bucket, Key=ds[7]["uri"])
    op2 = f"prep-{uuid.uuid4()}"
    failed = run("prepare", op2, moto, {"steps": [], "datasets": ds, "digests": digests,
                                        "sources": {"policy": "fail", "min_sources": None}})
    assert failed.returncode == 2, failed.stdout + failed.stderr
    assert '"reason": "data_unavailable"' in failed.stdout
    assert "s07 (object missing" in failed.stdout
    assert storage.verify_artifacts(store, op2, 1)[0] is None


def test_seeded_defect_source_digest_unchecked_runs_on_corrupt_bytes(moto: S3Server) -> None:
    """The seeded defect source-digest-unchecked (what data-source-unavailable must catch):
    the corrupt bytes are used, and COMPLETE.json records the digest actually read."""
    import os

    store = moto.store()
    ds = _ten_sources(store)
    store.put(ds[3]["uri"], b"corrupt bytes\n")
    op = f"prep-{uuid.uuid4()}"
    argv = [sys.executable, "-u", "-m", "controlplane.workload", "--kind", "prepare",
            "--operation-id", op, "--attempt", "1", "--seconds", "0", "--s3-endpoint",
            moto.endpoint, "--bucket", moto.bucket, "--pipeline-inputs", json.dumps(
                {"steps": [], "datasets": ds, "digests": sorted(d["sha256"] for d in ds),
                 "sources": {"policy": "degrade", "min_sources": 9}})]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "CONTROLPLANE_DEFECTS": "source-digest-unchecked"})
    assert done.returncode == 0, done.stdout + done.stderr
    m, _ = storage.verify_artifacts(store, op, 1)
    assert m is not None and m["sources"]["excluded"] == {}
    assert m["sources"]["read"]["s03"] == storage.sha256_hex(b"corrupt bytes\n")
    assert m["sources"]["read"]["s03"] != ds[3]["sha256"]


def test_a_training_step_draws_its_data_from_the_bytes_it_verified(moto: S3Server) -> None:
    """Data at start is real input: the same candidate on other prepared bytes trains another
    model; on the same bytes, the same model."""
    store = moto.store()
    weights = []
    for rows in (b"a,1\n", b"a,1\n", b"b,2\n"):
        uri = f"datasets/{uuid.uuid4()}/rows.csv"
        store.put(uri, rows)
        ds = {"name": "rows", "sha256": storage.sha256_hex(rows), "uri": uri}
        op = f"train-{uuid.uuid4()}"
        done = run("train", op, moto, {"steps": [], "datasets": [ds], "digests": [ds["sha256"]]},
                   "--steps", "4", "--checkpoint-every", "2")
        assert done.returncode == 0, done.stdout + done.stderr
        m, _ = storage.verify_artifacts(store, op, 1)
        assert m is not None
        weights.append(m["files"]["model.npy"]["sha256"])
    assert weights[0] == weights[1] != weights[2]

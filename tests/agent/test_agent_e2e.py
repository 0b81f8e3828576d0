"""End to end: real PostgreSQL + API + reconciler (``cp_stack``), agent processes with the
local runtime, the workload subprocess, a moto server and the Debian docker-registry."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from agenttest import Proc, ProcessSupervisor, Registry, S3Server, free_port, workload_argv

from controlplane import storage
from controlplane.agent.api import AgentApi, ApiRejected
from controlplane.agent.attempt import Claim
from controlplane.agent.metrics import AgentMetrics
from controlplane.agent.spool import Spool

# serial: leases of 3 s and workloads of a few seconds; next to two game days on 2 cores an
# agent's heartbeat or a workload's events came late (make test's two-worker phase, 2026-12-01)
pytestmark = [pytest.mark.slow, pytest.mark.serial]
STEPS, EVERY = 60, 10


class Client:
    def __init__(self, cp: Any) -> None:
        self.cp = cp
        self.http = httpx.Client(base_url=cp.api_url, timeout=5.0,
                                 headers={"Authorization": f"Bearer {cp.user_token}"})

    def submit(self, image: str, params: dict[str, Any], *, max_retries: int = 3,
               kind: str = "train") -> str:
        body = {"name": "train-e2e", "queue": "default",
                "workload": {"kind": kind, "image": image, "params": params},
                "resources": {"cpu": 1}, "max_retries": max_retries, "timeout_seconds": 600}
        r = self.http.post("/v1/operations", json=body, headers={"Idempotency-Key": uuid.uuid4().hex})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def op(self, op_id: str) -> dict[str, Any]:
        return dict(self.http.get(f"/v1/operations/{op_id}").json())

    def events(self, op_id: str) -> list[dict[str, Any]]:
        return list(self.http.get(f"/v1/operations/{op_id}/events").json()["items"])

    def attempts(self, op_id: str) -> list[dict[str, Any]]:
        return list(self.http.get(f"/v1/operations/{op_id}/attempts").json()["items"])

    def wait(self, op_id: str, states: set[str], timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            op = self.op(op_id)
            if op["state"] in states:
                return op
            time.sleep(0.2)
        raise AssertionError(f"operation {op_id} still {op['state']} ({op.get('state_reason')}) "
                             f"after {timeout}s; events: {[e['kind'] for e in self.events(op_id)]}")

    def wait_event(self, op_id: str, pred: Any, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events(op_id):
                if pred(event):
                    return event
            time.sleep(0.1)
        raise AssertionError(f"event not seen for {op_id}: {[e['kind'] for e in self.events(op_id)]}")


def start_agent(procs: ProcessSupervisor, cp: Any, tmp_path: Path, name: str, s3: S3Server,
                registry: Registry, cpu_slots: int = 1, metrics_port: int | None = None,
                extra: tuple[str, ...] = ()) -> Proc:
    argv = [sys.executable, "-m", "controlplane.agent", "--api", cp.api_url, "--name", name,
            "--pool", "cpu", "--zone", "zone-a", "--region", "region-a",
            "--cpu-slots", str(cpu_slots), "--registry", registry.host, "--runtime", "local",
            "--s3-endpoint", s3.endpoint, "--bucket", s3.bucket, "--poll-seconds", "0.2",
            "--image-timeout", "1", "--metrics-port", str(metrics_port or free_port()),
            "--spool-dir", str(tmp_path / f"{name}-spool"), *extra]
    return procs.start(name, argv, tmp_path / f"{name}.log",
                       env={"CONTROLPLANE_AGENT_TOKEN": cp.agent_token})


def workload_pids(operation_id: str, attempt: int) -> list[int]:
    """Workload processes of one attempt, found by their command line."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"controlplane.workload" in argv and operation_id.encode() in argv \
                and argv[argv.index(b"--attempt") + 1] == str(attempt).encode():
            pids.append(int(entry.name))
    return pids


def wait_gone(operation_id: str, attempt: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while workload_pids(operation_id, attempt):
        assert time.monotonic() < deadline, f"workload of attempt {attempt} still running"
        time.sleep(0.05)


def reference_weights(s3: S3Server, steps: int, every: int) -> bytes:
    op = "ref-" + uuid.uuid4().hex
    subprocess.run(workload_argv(op, 1, s3, steps=steps, every=every), check=True,
                   capture_output=True, timeout=60)
    return s3.store().get(storage.artifact_prefix(op, 1) + "model.npy")


def warm_parents_of(agent_pid: int) -> list[int]:
    """The local runtime's warm parents (runtimes/zygote.py) started by this agent."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"controlplane.runtimes.zygote" in argv and b"--agent-pid" in argv \
                and argv[argv.index(b"--agent-pid") + 1] == str(agent_pid).encode():
            found.append(int(entry.name))
    return found


def test_the_warm_parent_is_started_with_the_agent_not_at_its_first_attempt(
        cp_stack: Any, procs: ProcessSupervisor, tmp_path: Path, moto: S3Server,
        registry: Registry) -> None:
    agent = start_agent(procs, cp_stack, tmp_path, "agent-idle", moto, registry)
    deadline = time.monotonic() + 30
    while not warm_parents_of(agent.pid):
        assert agent.popen.poll() is None, "the agent exited"
        assert time.monotonic() < deadline, "no warm parent 30 s after the agent started"
        time.sleep(0.1)
    assert len(warm_parents_of(agent.pid)) == 1  # no attempt was ever claimed
    agent.popen.terminate()
    agent.popen.wait(timeout=20)
    deadline = time.monotonic() + 10
    while warm_parents_of(agent.pid):  # it dies with its agent
        assert time.monotonic() < deadline, "the warm parent outlived its agent"
        time.sleep(0.1)


def test_submit_claim_run_checkpoint_succeed(cp_stack: Any, procs: ProcessSupervisor, tmp_path: Path,
                                             moto: S3Server, registry: Registry) -> None:
    client = Client(cp_stack)
    metrics_port = free_port()
    start_agent(procs, cp_stack, tmp_path, "agent-a", moto, registry, metrics_port=metrics_port)
    op_id = client.submit(registry.trainer_image, {"steps": 30, "checkpoint_every": 10, "seed": 7})

    op = client.wait(op_id, {"succeeded", "failed"})

    assert op["state"] == "succeeded", op
    kinds = [e["kind"] for e in client.events(op_id)]
    for kind in ("claimed", "progress", "checkpoint_written", "artifact_written"):
        assert kind in kinds
    [attempt] = client.attempts(op_id)
    assert attempt["state"] == "succeeded" and attempt["agent_name"] == "agent-a"
    result = attempt["result"]
    assert result["image"].startswith(f"{registry.host}/ml/trainer@sha256:")
    manifest, reason = storage.verify_artifacts(moto.store(), op_id, 1)
    assert reason is None and manifest is not None
    assert result["completion_manifest"] == f"artifacts/{op_id}/attempt-1/COMPLETE.json"
    assert result["weights_sha256"] == manifest["files"]["model.npy"]["sha256"]
    loaded, torn = storage.latest_complete_checkpoint(moto.store(), op_id)
    assert loaded is not None and loaded.ref.step == 30 and torn == []
    scrape = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    assert 'controlplane_agent_attempts_finished_total{outcome="succeeded"} 1.0' in scrape
    assert 'controlplane_agent_slots{kind="cpu",state="total"} 1.0' in scrape


def test_agent_sigkill_mid_run_resumes_elsewhere_with_identical_weights(
    cp_stack: Any, procs: ProcessSupervisor, tmp_path: Path, moto: S3Server, registry: Registry,
) -> None:
    client = Client(cp_stack)
    expected = reference_weights(moto, STEPS, EVERY)
    agent_a = start_agent(procs, cp_stack, tmp_path, "agent-a", moto, registry)
    op_id = client.submit(registry.trainer_image, {"steps": STEPS, "checkpoint_every": EVERY,
                                                   "seed": 7, "step_delay": 0.05})
    client.wait_event(op_id, lambda e: e["kind"] == "checkpoint_written" and e["data"]["step"] >= 20)
    assert workload_pids(op_id, 1), "workload of attempt 1 should be running"

    agent_a.kill()  # node loss: SIGKILL of the agent ...
    wait_gone(op_id, 1)  # ... takes its workload with it (PR_SET_PDEATHSIG)

    start_agent(procs, cp_stack, tmp_path, "agent-b", moto, registry)
    op = client.wait(op_id, {"succeeded", "failed"}, timeout=90)

    assert op["state"] == "succeeded", op
    attempts = {a["number"]: a for a in client.attempts(op_id)}
    assert attempts[1]["state"] == "lost" and attempts[2]["state"] == "succeeded"
    assert attempts[2]["agent_name"] == "agent-b"
    assert attempts[2]["fencing_token"] > attempts[1]["fencing_token"]
    events = client.events(op_id)
    first = [e for e in events if e["attempt_id"] == attempts[1]["id"]]
    last_checkpoint = max(e["data"]["step"] for e in first if e["kind"] == "checkpoint_written")
    last_progress = max(e["data"]["step"] for e in first if e["kind"] == "progress")
    [resumed] = [e for e in events if e["kind"] == "resumed"]
    assert resumed["data"]["from_step"] == last_checkpoint  # newest complete checkpoint
    assert last_progress - resumed["data"]["from_step"] <= EVERY  # <= one interval recomputed
    assert attempts[2]["result"]["resumed_from_step"] == last_checkpoint
    final = moto.store().get(storage.artifact_prefix(op_id, 2) + "model.npy")
    assert final == expected  # bit-identical to the uninterrupted run


def test_store_frozen_during_checkpoint_run_completes_after_sigcont(
    cp_stack: Any, procs: ProcessSupervisor, tmp_path: Path, private_moto: S3Server,
    registry: Registry,
) -> None:
    client = Client(cp_stack)
    start_agent(procs, cp_stack, tmp_path, "agent-a", private_moto, registry)
    op_id = client.submit(registry.trainer_image, {"steps": 40, "checkpoint_every": 10, "seed": 7,
                                                   "step_delay": 0.1})
    # Freeze just before step 20's checkpoint begins; it then starts against a frozen store.
    client.wait_event(op_id, lambda e: e["kind"] == "checkpoint_written" and e["data"]["step"] == 10)
    time.sleep(0.6)
    private_moto.proc.freeze()
    thaw = threading.Timer(7.0, private_moto.proc.thaw)  # > 2 leases: the agent must hold on
    thaw.start()
    try:
        client.wait_event(op_id, lambda e: e["kind"] == "log" and e["data"].get("storage_unavailable"),
                          timeout=15)
        assert client.op(op_id)["state"] == "running"  # paused, not failed, not succeeded
        op = client.wait(op_id, {"succeeded", "failed"}, timeout=60)
    finally:
        thaw.cancel()
        private_moto.proc.thaw()

    assert op["state"] == "succeeded", op
    assert [a["state"] for a in client.attempts(op_id)] == ["succeeded"]
    assert "checkpoint_skipped_torn" not in [e["kind"] for e in client.events(op_id)]
    loaded, torn = storage.latest_complete_checkpoint(private_moto.store(), op_id)
    assert torn == [] and loaded is not None and loaded.ref.step == 40
    assert storage.verify_artifacts(private_moto.store(), op_id, 1)[1] is None


def test_registry_down_bounded_attempts_reason_kept(
    cp_stack: Any, procs: ProcessSupervisor, tmp_path: Path, moto: S3Server,
    private_registry: Registry,
) -> None:
    client = Client(cp_stack)
    start_agent(procs, cp_stack, tmp_path, "agent-a", moto, private_registry)
    private_registry.proc.kill()
    op_id = client.submit(private_registry.trainer_image, {"steps": 10}, max_retries=2)

    op = client.wait(op_id, {"succeeded", "failed"}, timeout=60)

    assert op["state"] == "failed"
    attempts = client.attempts(op_id)
    assert len(attempts) == 3  # first attempt + max_retries, no more
    for attempt in attempts:
        assert attempt["error"]["kind"] == "transient"
        assert attempt["error"]["message"].startswith("registry_unreachable")
    assert "registry" in op["state_reason"] and "unreachable" in op["state_reason"]
    start_failed = [e for e in client.events(op_id) if e["kind"] == "start_failed"]
    assert len(start_failed) == 3 and all(e["data"]["reason"] == "registry_unreachable"
                                          for e in start_failed)


def test_missing_tag_fails_without_retries(
    cp_stack: Any, procs: ProcessSupervisor, tmp_path: Path, moto: S3Server, registry: Registry,
) -> None:
    client = Client(cp_stack)
    start_agent(procs, cp_stack, tmp_path, "agent-a", moto, registry)
    op_id = client.submit(f"{registry.host}/ml/trainer:does-not-exist", {"steps": 10}, max_retries=3)

    op = client.wait(op_id, {"succeeded", "failed"}, timeout=30)

    assert op["state"] == "failed"
    [attempt] = client.attempts(op_id)
    assert attempt["error"]["kind"] == "deterministic"
    assert attempt["error"]["message"].startswith("image_not_found")
    assert "does-not-exist" in op["state_reason"]


def test_stale_agent_is_fenced_and_stops_its_workload(
    cp_stack: Any, procs: ProcessSupervisor, tmp_path: Path, moto: S3Server, registry: Registry,
) -> None:
    """Lost connectivity (SIGSTOP of the agent): work moves; on SIGCONT the old agent stops its
    workload instead of finishing it, and there is exactly one terminal success."""
    client = Client(cp_stack)
    agent_a = start_agent(procs, cp_stack, tmp_path, "agent-a", moto, registry)
    op_id = client.submit(registry.trainer_image, {"steps": 80, "checkpoint_every": 10, "seed": 7,
                                                   "step_delay": 0.05})
    client.wait_event(op_id, lambda e: e["kind"] == "checkpoint_written")
    os.killpg(agent_a.pid, signal.SIGSTOP)  # the agent only: its workload keeps running
    start_agent(procs, cp_stack, tmp_path, "agent-b", moto, registry)
    client.wait(op_id, {"running"}, timeout=30)
    client.wait_event(op_id, lambda e: e["kind"] == "claimed" and "attempt 2" in e["reason"])
    assert workload_pids(op_id, 1), "the stale workload is still running while its agent is frozen"

    os.killpg(agent_a.pid, signal.SIGCONT)
    wait_gone(op_id, 1, timeout=10)  # fenced: the old agent stopped its workload

    op = client.wait(op_id, {"succeeded", "failed"}, timeout=90)
    assert op["state"] == "succeeded"
    states = sorted(a["state"] for a in client.attempts(op_id))
    assert states == ["lost", "succeeded"]


def claim_attempts(cp: Any, name: str, registry: Registry, client: Client, count: int,
                   ) -> tuple[AgentApi, str, list[Claim]]:
    """Register ``name`` from the test and claim ``count`` fresh operations (no retries)."""
    api = AgentApi(cp.api_url, cp.agent_token, agent_name=name)
    reg = api.register(name, "cpu", "zone-a", "region-a",
                       {"cpu_slots": count, "accelerator_type": None, "accelerator_count": 0,
                        "datasets": [], "registries": [registry.host]})
    for _ in range(count):
        client.submit(registry.trainer_image, {"steps": 10}, max_retries=0)
    claims: list[Claim] = []
    deadline = time.monotonic() + 30
    while len(claims) < count:
        assert time.monotonic() < deadline, f"claimed only {len(claims)} of {count}"
        claims += [Claim.from_api(item) for item in api.claim(reg.agent_id, count)]
        time.sleep(0.1)
    return api, reg.agent_id, claims


def scrape(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {f"{s.name}{sorted(s.labels.items())}": s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_restarted_agent_delivers_refuses_and_announces_what_its_killed_predecessor_left(
    cp_stack: Any, procs: ProcessSupervisor, tmp_path: Path, moto: S3Server, registry: Registry,
) -> None:
    """A killed agent left three spool segments: one of a live claim (delivered with its own
    token), one whose lease has gone (refused), one past the age bound (dropped, announced)."""
    client = Client(cp_stack)
    api, agent_id, (live, gone, old) = claim_attempts(cp_stack, "agent-r", registry, client, 3)
    # The agent-level endpoint takes only evidence_dropped, only on attempts this agent held.
    stranger = AgentApi(cp_stack.api_url, cp_stack.agent_token, agent_name="agent-s")
    stranger_id = stranger.register("agent-s", "cpu", "zone-a", "region-a",
                                    {"cpu_slots": 1, "registries": [registry.host]}).agent_id
    evidence = [{"kind": "evidence_dropped", "message": "", "data": {"count": 0}}]
    with pytest.raises(ApiRejected, match="404"):
        stranger.agent_events(stranger_id, old.attempt_id, evidence)
    with pytest.raises(ApiRejected, match="422"):
        api.agent_events(agent_id, old.attempt_id, [{"kind": "log", "message": "", "data": {}}])
    now = [time.time()]
    spool = Spool(tmp_path / "agent-r-spool", max_bytes=1 << 20, max_age_seconds=60,
                  metrics=AgentMetrics(), clock=lambda: now[0])
    spool.append(live.key(), [{"kind": "log", "message": f"left {i}", "data": {"i": i}}
                              for i in range(3)])
    spool.append(gone.key(), [{"kind": "log", "message": "too late", "data": {}}] * 2)
    now[0] -= 120
    spool.append(old.key(), [{"kind": "log", "message": "too old", "data": {}}] * 4)
    spool.close()
    holding = threading.Event()

    def hold_live_lease() -> None:  # the live claim is still held (by its runner, say)
        while not holding.wait(0.5):
            api.attempt_heartbeat(live.attempt_id, live.fencing_token, None)

    keeper = threading.Thread(target=hold_live_lease, daemon=True)
    keeper.start()
    try:
        client.wait(gone.operation_id, {"failed"}, timeout=30)  # lease expired, no retries
        port = free_port()
        agent = start_agent(procs, cp_stack, tmp_path, "agent-r", moto, registry,
                            metrics_port=port, extra=("--spool-max-age", "60"))
        announced = client.wait_event(old.operation_id, lambda e: e["kind"] == "evidence_dropped")
        delivered = [e for e in client.events(live.operation_id) if e["kind"] == "log"]
    finally:
        holding.set()
        keeper.join(timeout=5)

    assert [e["data"]["i"] for e in delivered] == [0, 1, 2]  # in order, with the claim's token
    assert {e["actor"] for e in delivered} == {"agent:agent-r"}
    assert announced["data"] == {"count": 4, "reason": "expired", "agent": "agent-r"}
    assert announced["attempt_id"] == old.attempt_id and announced["actor"] == "agent:agent-r"
    gone_kinds = [e["kind"] for e in client.events(gone.operation_id)]
    assert "stale_report_refused" in gone_kinds and "log" not in gone_kinds
    metrics = scrape(port)
    assert metrics["controlplane_agent_events_refused_total[]"] == 2
    assert metrics["controlplane_agent_events_dropped_total[('reason', 'expired')]"] == 4
    assert metrics["controlplane_agent_events_dropped_total[('reason', 'spool_full')]"] == 0
    counters = json.loads((tmp_path / "agent-r-spool" / "counters.json").read_text())
    assert counters["unreported"] == {"spool_full": 0, "expired": 0, "unreadable": 0}

    agent.kill()  # a restarted agent keeps counting from counters.json
    port = free_port()
    start_agent(procs, cp_stack, tmp_path, "agent-r", moto, registry, metrics_port=port)
    deadline = time.monotonic() + 15
    while True:
        try:
            metrics = scrape(port)
            break
        except httpx.HTTPError:
            assert time.monotonic() < deadline, "restarted agent serves no metrics"
            time.sleep(0.1)
    assert metrics["controlplane_agent_events_refused_total[]"] == 2
    assert metrics["controlplane_agent_events_dropped_total[('reason', 'expired')]"] == 4
    assert len([e for e in client.events(old.operation_id) if e["kind"] == "evidence_dropped"]) == 1


def test_an_operation_runs_on_its_declared_datasets_or_fails_at_start_naming_them(
    cp_stack: Any, procs: ProcessSupervisor, tmp_path: Path, moto: S3Server, registry: Registry,
) -> None:
    """Data at start for a plain operation (docs/CONTRACTS.md section 5): each declared
    dataset is read from the artifact bucket and checked by sha256 before training. Other
    bytes train another model and the digest is in the result; other bytes behind a declared
    name, or no object, fail the operation at start (one attempt, no retries) with the dataset
    and the reason in its state_reason; the same key with another dataset is a 409."""
    client = Client(cp_stack)
    store = moto.store()
    base = f"datasets/e2e/{uuid.uuid4().hex}"
    rows = {"v1": b"a,1\nb,2\n", "v2": b"a,1\nb,3\n"}
    for tag, data in rows.items():
        store.put(f"{base}/{tag}.csv", data)
    digest = {tag: storage.sha256_hex(data) for tag, data in rows.items()}

    def submit(key: str, tag: str, uri: str) -> httpx.Response:
        body = {"name": f"train-{tag}", "max_retries": 3, "timeout_seconds": 600,
                "workload": {"kind": "train", "image": registry.trainer_image,
                             "params": {"steps": 4, "checkpoint_every": 2, "seed": 7}},
                "datasets": [{"name": "rows", "sha256": digest[tag], "uri": uri}]}
        return client.http.post("/v1/operations", json=body, headers={"Idempotency-Key": key})

    s3_uri = f"s3://{moto.bucket}/{base}/v1.csv"
    ok = {tag: submit(f"ok-{tag}", tag, uri) for tag, uri in
          (("v1", s3_uri), ("v2", f"{base}/v2.csv"))}
    assert {r.status_code for r in ok.values()} == {201}, [r.text for r in ok.values()]
    assert ok["v1"].json()["datasets"][0]["uri"] == s3_uri
    clash = submit("ok-v1", "v2", s3_uri)  # the same key, another dataset
    assert clash.status_code == 409 and "different payload" in clash.text
    start_agent(procs, cp_stack, tmp_path, "agent-a", moto, registry, cpu_slots=2)
    weights = {}
    for tag, r in ok.items():
        op = client.wait(r.json()["id"], {"succeeded", "failed"})
        assert op["state"] == "succeeded", op
        assert op["result"]["inputs"] == [digest[tag]]
        # (under load an attempt may lose its lease before its start: the succeeded one's)
        [done] = [a for a in client.attempts(op["id"]) if a["state"] == "succeeded"]
        manifest, why = storage.verify_artifacts(store, op["id"], done["number"])
        assert manifest is not None and manifest["inputs"] == [digest[tag]], why
        weights[tag] = op["result"]["weights_sha256"]
    assert weights["v1"] != weights["v2"]  # the same job on other bytes: another model

    store.put(f"{base}/v1.csv", rows["v2"])  # other bytes behind the declared name
    store.client.delete_object(Bucket=moto.bucket, Key=f"{base}/v2.csv")
    bad = {"sha256 mismatch": submit("changed", "v1", s3_uri).json()["id"],
           "object missing": submit("missing", "v2", f"{base}/v2.csv").json()["id"]}
    for why, op_id in bad.items():
        op = client.wait(op_id, {"succeeded", "failed"})
        assert op["state"] == "failed" and op["result"] is None, op
        assert f"rows ({why}" in op["state_reason"], op["state_reason"]
        # deterministic: never retried on the same data (a lease lost under load aside)
        attempts = client.attempts(op_id)
        [attempt] = [a for a in attempts if a["state"] != "lost"]
        assert attempt["state"] == "failed" and attempt["error"]["kind"] == "deterministic"
        [event] = [e for e in client.events(op_id) if e["kind"] == "start_failed"]
        assert event["data"]["reason"] == "data_unavailable", event
        for a in attempts:  # nothing trained
            assert storage.verify_artifacts(store, op_id, a["number"])[0] is None

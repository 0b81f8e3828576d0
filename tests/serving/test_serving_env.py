"""Model serving in a real local environment (`env up --serving`): two KServe replicas behind
HAProxy's serving frontend. tier2: it brings up an environment of its own (about 40 s)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from controlplane.serving.catalog import GOLDEN, MODEL_NAME
from controlplane.serving.rollout import Action, Policy
from environments.local import haproxy_admin, procs, serving
from environments.local.env import LocalEnvironment
from environments.local.serving_rollout import RolloutController, reset
from environments.timeline import utcnow

pytestmark = pytest.mark.tier2


@pytest.fixture(scope="module")
def env() -> Iterator[LocalEnvironment]:
    home = Path(tempfile.mkdtemp(prefix="gameday-serving-"))
    os.chmod(home, 0o755)  # the postgres OS user enters it
    env = LocalEnvironment("pytest-serving", home, serving=True)
    problems = env.preflight() + serving.preflight()
    if problems:
        pytest.skip("serving cannot run here: " + "; ".join(problems))
    env.up()
    try:
        yield env
    finally:
        env.down()
        assert procs.marked_processes(env.state_dir) == [], "processes left after down"
        shutil.rmtree(home, ignore_errors=True)


class Load:
    """Four clients posting golden rows to the serving frontend until stopped."""

    def __init__(self, url: str) -> None:
        self.url, self.results = url, []  # (status or error, version)
        self.times: list[float] = []  # when each result's request was sent (epoch seconds)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run) for _ in range(4)]

    def run(self) -> None:
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64",
                            "data": list(GOLDEN.inputs[1])}]}
        with httpx.Client(timeout=5) as client:
            while not self.stop.is_set():
                sent = time.time()
                try:
                    r = client.post(f"{self.url}/v2/models/{MODEL_NAME}/infer", json=body)
                    result = (r.status_code, r.headers.get("x-model-version"))
                except httpx.HTTPError as exc:
                    result = (type(exc).__name__, None)
                self.times.append(sent)  # before the result: results never outnumber times
                self.results.append(result)
                time.sleep(0.01)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def test_up_serves_the_model_through_haproxy_from_both_replicas(env: LocalEnvironment) -> None:
    status = env.status()
    for name in serving.replica_names():
        comp = status["components"][name]
        assert comp["healthy"], comp
        assert comp["model"]["state"] == "ready" and comp["model"]["version"] == "v1"
    states = haproxy_admin.servers(env.endpoints["haproxy_socket"], serving.BACKEND)
    # the third replica, declared for a scale-up (environments/local/serving_scale.py), is in
    # maintenance: no check, no request
    assert {n: s["srv_op_state"] for n, s in states.items()} == {
        "model-1": "2", "model-2": "2", "model-3": "0"}


def test_a_replica_killed_under_load_costs_no_request(env: LocalEnvironment) -> None:
    try:
        with Load(env.endpoints["serving"]) as load:
            time.sleep(2)
            env.faults.kill("model-1")
            time.sleep(5)
    finally:
        env.faults.restore_all()
    env.wait_healthy(["model-1"], 60)
    outcomes = Counter(status for status, _ in load.results)
    assert outcomes[200] == len(load.results) > 100, outcomes


def test_a_replica_that_cannot_read_the_store_stays_out_saying_why(env: LocalEnvironment) -> None:
    socket = env.endpoints["haproxy_socket"]
    env.faults.artifact_store_unreachable()
    try:
        env.faults.kill("model-2")
        env.spawn("model-2")  # a scale-up while the store is cut off
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            said = serving.model_status(env.state_dir, "model-2", env.main_pid("model-2"))
            if said and said["state"] == "unready":
                break
            time.sleep(0.25)
        assert said and said["state"] == "unready", said
        assert said["reason"].startswith("artifact store unreachable"), said
        assert env.check("model-2") == (False, (
            f"GET {env.components['model-2'].health.url} -> HTTP 503"))
        with Load(env.endpoints["serving"]) as load:
            time.sleep(2)
        # every request answered, all by the replica whose model is loaded
        assert Counter(s for s, _ in load.results) == Counter({200: len(load.results)})
        assert haproxy_admin.servers(socket, serving.BACKEND)["model-2"]["srv_op_state"] == "0"
    finally:
        env.faults.restore_all()
    env.wait_healthy(["model-2"], 60)
    assert serving.model_status(env.state_dir, "model-2", env.main_pid("model-2"))["state"] == "ready"


def test_weights_through_the_admin_socket_split_the_traffic(env: LocalEnvironment) -> None:
    socket = env.endpoints["haproxy_socket"]
    for name in serving.replica_names():
        env.wait_healthy([name], 60)
    def split(weight_2: int) -> tuple[int, int]:
        haproxy_admin.set_weight(socket, serving.BACKEND, "model-2", weight_2)
        before = haproxy_admin.sessions(socket, serving.BACKEND)
        with Load(env.endpoints["serving"]) as load:
            time.sleep(2)
        after = haproxy_admin.sessions(socket, serving.BACKEND)
        assert Counter(s for s, _ in load.results) == Counter({200: len(load.results)})
        return after["model-1"] - before["model-1"], after["model-2"] - before["model-2"]

    try:
        one, two = split(0)
        assert one > 20 and two == 0, (one, two)
        assert haproxy_admin.servers(socket, serving.BACKEND)["model-2"]["srv_uweight"] == "0"
        one, two = split(25)  # a canary's 20 %: 25 against 100
        assert 0.08 < two / (one + two) < 0.35, (one, two)
    finally:
        haproxy_admin.set_weight(socket, serving.BACKEND, "model-2", 100)
    with pytest.raises(ValueError, match="HAProxy takes 0..256"):
        haproxy_admin.set_weight(socket, serving.BACKEND, "model-2", 300)


def _share_notes(env: LocalEnvironment, since: str) -> list[tuple[int, str, float]]:
    """(canary share, its version, epoch time) of each rollout_share note after ``since``."""
    out = []
    for line in env.timeline_file.read_text().splitlines():
        entry = json.loads(line)
        if entry["fault"] == "rollout_share" and entry["time"] > since:
            at = datetime.fromisoformat(entry["time"]).timestamp()
            out.append((entry["details"]["share"], entry["details"]["version"], at))
    return out


def _shares_since(env: LocalEnvironment, since: str) -> list[tuple[int, str]]:
    return [(share, version) for share, version, _ in _share_notes(env, since)]


POLICY = Policy(steps=(10, 50, 100), min_requests=10)


def test_a_good_version_is_rolled_out_to_every_replica(env: LocalEnvironment) -> None:
    since = utcnow()
    controller = RolloutController(env.state, env.processes)
    try:
        with Load(env.endpoints["serving"]) as load:
            result = controller.run("v2", POLICY, step_seconds=3.0)
        assert result.outcome is Action.DONE, result
        assert [s["decision"] for s in result.steps] == ["step", "step", "done"]
        assert {controller.deployed(r) for r in serving.replica_names()} == {"v2"}
        assert Counter(s for s, _ in load.results) == Counter({200: len(load.results)})
        assert {v for _, v in load.results} == {"v1", "v2"}
        assert [s for s, _ in _shares_since(env, since)] == [0, 10, 50, 100, 50]
    finally:
        reset(env.state, env.processes)


@pytest.mark.parametrize("bad", ["v2-errors", "v2-slow", "v2-garbage"])
def test_a_bad_version_is_rolled_back_and_few_requests_meet_it(env: LocalEnvironment,
                                                               bad: str) -> None:
    since = utcnow()
    controller = RolloutController(env.state, env.processes)
    try:
        with Load(env.endpoints["serving"]) as load:
            result = controller.run(bad, POLICY, step_seconds=3.0)
            time.sleep(1)
        assert result.outcome is Action.ROLLBACK, result
        assert {controller.deployed(r) for r in serving.replica_names()} == {"v1"}
        # the canary had 10 % for one step of 3 s, then none
        answered_by_bad = sum(1 for _, v in load.results if v == bad)
        assert 0 < answered_by_bad / len(load.results) < 0.1, Counter(v for _, v in load.results)
        assert _shares_since(env, since) == [(0, "v1"), (10, bad), (0, bad), (50, "v1")]
        # while the canary had its 10 %, it answered about that share (HAProxy's weights)
        times = [t for _, _, t in _share_notes(env, since)]
        opened, closed = times[1], times[2]  # share 10 set, share 0 set again
        during = [v for (_, v), t in zip(load.results, load.times) if opened <= t <= closed]
        canary_share = sum(1 for v in during if v == bad) / len(during)
        assert 0.03 < canary_share < 0.2, (canary_share, len(during))
    finally:
        reset(env.state, env.processes)


def test_with_rollback_off_the_bad_version_keeps_serving(env: LocalEnvironment) -> None:
    """What the defect "rollback off" looks like: the controller holds a failing canary at its
    share until it gives up, so the bad version keeps answering a share of the requests."""
    controller = RolloutController(env.state, env.processes)
    try:
        result = controller.run("v2-garbage", dataclasses.replace(POLICY, rollback=False),
                                step_seconds=2.0, max_holds=1)
        assert result.outcome is Action.HOLD and "rollback is off" in result.reasons
        assert controller.deployed("model-2") == "v2-garbage"
        with Load(env.endpoints["serving"]) as load:  # after the controller gave up
            time.sleep(3)
        share = sum(1 for _, v in load.results if v == "v2-garbage") / len(load.results)
        assert 0.05 < share < 0.2, share  # the canary's 10 %, held
    finally:
        reset(env.state, env.processes)

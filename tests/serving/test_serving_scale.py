"""Scaling the serving replicas (environments/local/serving_scale.py) against a real HAProxy
with the generated ``serving`` section: the third replica is declared in maintenance, a
scale-up lets it in only once its readiness check passes (HAProxy 2.6 counts a server leaving
maintenance UP until a check fails), the seeded defect ``scale-up-skips-readiness`` lets it in
at once, a scale-down takes it out; and the refusals of a count out of range.

The replicas are small HTTP servers in this process answering the v2 readiness and infer
routes as the model server does (503 until the model is loaded): what is under test is the
load balancer's gate, not KServe (tests/serving/test_model_server.py has the real one). No
environment, a few seconds."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from chaos.serving import argument_problems
from environments.local import haproxy_admin, serving
from environments.local.serving_scale import ScaleRefused, ServingScale, plan
from environments.local.state import EnvState

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Replica:
    """Answers like a model server: ready (200) only once ``loaded``; infer 503 until then."""

    def __init__(self, name: str, port: int, loaded: bool) -> None:
        self.name, self.loaded = name, loaded
        replica = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                ok = replica.loaded
                body = json.dumps({"replica": replica.name, "ready": ok}).encode()
                self.send_response(200 if ok else 503)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self._answer()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class FakeProcesses:
    """The process side is not under test here: what was spawned and terminated."""

    def __init__(self) -> None:
        self.live: set[str] = set()
        self.terminated: list[str] = []

    def spawn(self, component: str) -> int:
        self.live.add(component)
        return os.getpid()

    def main_pid(self, component: str) -> int | None:
        return os.getpid() if component in self.live else None

    def terminate(self, components: list[str], grace: float) -> dict[str, list[int]]:
        self.live -= set(components)
        self.terminated += components
        return {c: [] for c in components}


class Stack:
    def __init__(self, root: Path, defects: list[str]) -> None:
        (root / "run").mkdir()
        self.ports = {"haproxy_serving": _free_port(), "proxy_s3": _free_port(),
                      **{f"model{i}": _free_port() for i in (1, 2, 3)}}
        self.replicas = {f"model-{i}": Replica(f"model-{i}", self.ports[f"model{i}"], i < 3)
                         for i in (1, 2, 3)}
        sock = root / "run" / "haproxy.sock"
        cfg = root / "haproxy.cfg"
        cfg.write_text(f"global\n  stats socket {sock} mode 600 level admin\n\ndefaults\n"
                       "  timeout connect 1s\n  timeout check 1s\n"
                       + serving.haproxy_section(self.ports))
        self.haproxy = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.state = EnvState("scale-test", root)
        self.state.info = {"ports": self.ports, "endpoints": {"haproxy_socket": str(sock)},
                           "defects": defects}
        store = f"http://127.0.0.1:{self.ports['proxy_s3']}"
        self.state.components = {r: serving.component(root, r, self.ports[serving.port_name(r)],
                                                      store) for r in serving.replica_names()}
        self.processes = FakeProcesses()
        self.processes.live |= set(serving.replica_names())
        self.scaler = ServingScale(self.state, self.processes)  # type: ignore[arg-type]
        self.socket = str(sock)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # both started replicas up behind their check
            try:
                states = self.op_states()
                if states.get("model-1") == states.get("model-2") == "2":
                    return
            except haproxy_admin.HaproxyAdminError:
                pass
            time.sleep(0.1)
        raise AssertionError("HAProxy did not come up with model-1 and model-2 up")

    def op_states(self) -> dict[str, str]:
        return {n: s["srv_op_state"] for n, s in
                haproxy_admin.servers(self.socket, serving.BACKEND).items()}

    def predict(self, n: int) -> Counter[tuple[int, str]]:
        """(status, replica) of ``n`` predictions through the frontend, one after another."""
        import urllib.error
        import urllib.request

        seen: Counter[tuple[int, str]] = Counter()
        url = f"http://127.0.0.1:{self.ports['haproxy_serving']}/v2/models/fraud-score/infer"
        for _ in range(n):
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data=b"{}"), timeout=5) as r:
                    seen[(r.status, json.loads(r.read())["replica"])] += 1
            except urllib.error.HTTPError as exc:
                seen[(exc.code, json.loads(exc.read() or b"{}").get("replica", "?"))] += 1
        return seen

    def close(self) -> None:
        self.haproxy.terminate()
        self.haproxy.wait(5)
        for r in self.replicas.values():
            r.server.shutdown()
            r.server.server_close()


@pytest.fixture
def stack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Stack]:
    if not Path(HAPROXY).exists():
        pytest.skip("no haproxy binary (apt-get install haproxy; scripts/setup.sh does)")
    s = Stack(tmp_path, getattr(request, "param", []))
    try:
        yield s
    finally:
        s.close()


def test_the_third_replica_is_declared_in_maintenance(stack: Stack) -> None:
    states = haproxy_admin.servers(stack.socket, serving.BACKEND)
    assert states["model-3"]["srv_op_state"] == "0"
    assert int(states["model-3"]["srv_admin_state"]) & 0x01  # SRV_ADMF_FMAINT: from the config
    assert {c for (_, c) in stack.predict(20)} == {"model-1", "model-2"}


def test_a_scaled_up_replica_gets_no_prediction_until_its_model_is_ready(stack: Stack) -> None:
    out = stack.scaler.scale(3)
    assert out["started"] == ["model-3"] and out["check"] == "readiness"
    assert stack.processes.live == {"model-1", "model-2", "model-3"}
    seen = stack.predict(60)  # model-3 listening, its model not loaded: 503 if it were asked
    assert all(status == 200 for status, _ in seen), seen
    assert stack.op_states()["model-3"] == "0"
    stack.replicas["model-3"].loaded = True
    deadline = time.monotonic() + 10
    while stack.op_states()["model-3"] != "2" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stack.predict(30)[(200, "model-3")] > 0  # in once its check passed
    notes = [json.loads(x) for x in stack.state.timeline_file.read_text().splitlines()]
    assert [n["fault"] for n in notes] == ["serving_scale"]
    assert notes[0]["details"]["after"] == ["model-1", "model-2", "model-3"]


@pytest.mark.parametrize("stack", [["scale-up-skips-readiness"]], indirect=True)
def test_the_seeded_defect_lets_it_in_before_its_model_is_ready(stack: Stack) -> None:
    out = stack.scaler.scale(3)
    assert out["check"] == "none: forced up (seeded defect)"
    seen = stack.predict(60)
    assert seen[(503, "model-3")] >= 15, seen  # a third of the predictions, unanswered


def test_watch_notes_the_model_state_and_haproxys_view(stack: Stack) -> None:
    stack.scaler.scale(3)
    serving.status_file(stack.state.dir, "model-3").write_text(json.dumps({
        "state": "unready", "reason": "artifact store unreachable: Read timeout",
        "version": "v1", "time": time.time(), "pid": os.getpid()}))
    seen = stack.scaler.watch("model-3", ["unready", "ready"], timeout=2)
    assert seen["reached"] and seen["state"] == "unready"
    assert seen["reason"].startswith("artifact store unreachable")
    assert seen["haproxy"]["op_state"] == "0"
    last = json.loads(stack.state.timeline_file.read_text().splitlines()[-1])
    assert last["fault"] == "serving_replica_state" and last["details"] == seen
    with pytest.raises(ScaleRefused, match="replica: 'model-9' is not one of model-1, model-2, "
                                           "model-3"):
        stack.scaler.watch("model-9", ["ready"])


def test_scale_down_takes_it_out_first_and_restore_all_scales_back(stack: Stack) -> None:
    stack.scaler.scale(3)
    assert stack.scaler.restore_all() == ["serving_scale:model-3"]
    assert stack.processes.terminated == ["model-3"] and "model-3" not in stack.state.components
    assert int(haproxy_admin.servers(stack.socket, serving.BACKEND)["model-3"]
               ["srv_admin_state"]) & 0x01
    assert stack.scaler.restore_all() == []  # nothing more to undo


def test_plan_starts_and_stops_in_order_and_refuses_a_count_out_of_range() -> None:
    declared = ["model-1", "model-2", "model-3"]
    assert plan(["model-1", "model-2"], 3, declared, 2) == (["model-3"], [])
    assert plan(declared, 2, declared, 2) == ([], ["model-3"])
    assert plan(declared, 3, declared, 2) == ([], [])
    with pytest.raises(ScaleRefused, match=r"replicas: 4 is outside 2\.\.3 \(the 2 started at "
                                           r"`up` stay; 3 are declared: model-1, model-2, model-3\)"):
        plan(declared, 4, declared, 2)
    with pytest.raises(ScaleRefused, match="replicas: 1 is outside 2..3"):
        plan(declared, 1, declared, 2)
    with pytest.raises(ScaleRefused, match="replicas: '3' is not a whole number"):
        plan(declared, "3", declared, 2)  # type: ignore[arg-type]


def test_an_environment_without_the_third_port_is_refused_by_name(tmp_path: Path) -> None:
    state = EnvState("old", tmp_path)
    ports = {"proxy_s3": 1, "model1": 2, "model2": 3}
    state.info = {"ports": ports, "endpoints": {}}
    state.components = {r: serving.component(tmp_path, r, 2, "http://x") for r in
                        serving.replica_names()}
    with pytest.raises(ScaleRefused, match="environment 'old' has no port for model-3"):
        ServingScale(state, FakeProcesses()).scale(3)  # type: ignore[arg-type]
    state.components = {}
    with pytest.raises(ScaleRefused, match="environment 'old' serves no model"):
        ServingScale(state, FakeProcesses()).scale(3)  # type: ignore[arg-type]


def test_the_actions_arguments_are_checked_before_anything_runs() -> None:
    assert argument_problems("scale_serving", {"replicas": 3}) == []
    assert argument_problems("scale_serving", {"replicas": "three"}) == [
        ("replicas", "'three' is not a positive whole number")]
    assert argument_problems("watch_serving_replica", {"replica": "model-3",
                                                       "states": ["unready", "ready"]}) == []
    assert argument_problems("watch_serving_replica", {"states": ["loaded"], "timeout": 0}) == [
        ("states", "'loaded' is not a model state (starting, loading, ready, unready, stopped)"),
        ("timeout", "0 is not a positive number of seconds")]

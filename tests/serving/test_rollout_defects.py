"""The rollout controller's two seeded defects (environments/local/serving_rollout.py) and a
rollout as a fault of the local environment (environments/local/rollout_faults.py), against a
real HAProxy's admin socket (the weights are HAProxy's own, read back), with the replicas'
restarts recorded instead of run (no model server: the end-to-end proof is tier2,
tests/gameday/test_gameday_serving.py), and the chaos action's argument checks."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.serving import argument_problems
from controlplane.serving.catalog import GOOD
from controlplane.serving.rollout import Action, Analysis, Policy
from environments.local import haproxy_admin, serving
from environments.local.fault_ledger import FaultLedger
from environments.local.rollout_faults import Rollouts
from environments.local.serving_rollout import CANARY, STABLE, RolloutController
from environments.local.state import EnvState

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
# what the canary does in each step: half its requests fail (v2-errors' shape)
FAILING = Analysis(requests=40, errors=20, p99_ms=12.0, golden_total=40, golden_wrong=0)


@pytest.fixture
def socket_path(tmp_path: Path) -> Iterator[str]:
    if not Path(HAPROXY).exists():
        pytest.skip("no haproxy binary (apt-get install haproxy)")
    sock = tmp_path / "admin.sock"
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(f"""global
  stats socket {sock} mode 600 level admin
defaults
  mode http
  timeout connect 1s
  timeout client 1s
  timeout server 1s
backend {serving.BACKEND}
  server {STABLE} 127.0.0.1:9 weight 50
  server {CANARY} 127.0.0.1:9 weight 50
""")
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sock.exists(), proc.stderr.read() if proc.poll() is not None else "no socket"
    yield str(sock)
    proc.terminate()
    proc.wait(10)


class Restarts:
    """Processes' restart, recorded: which replica, on which version (its record's label)."""

    def __init__(self, state: EnvState) -> None:
        self.state, self.done = state, []

    def restart(self, components: list[str], timeout: float = 60.0) -> None:
        self.done += [(c, self.state.components[c].labels["version"]) for c in components]


def _state(tmp_path: Path, socket_path: str, defects: list[str]) -> EnvState:
    state = EnvState("local", tmp_path / "env")
    state.dir.mkdir(parents=True)
    state.info = {"endpoints": {"haproxy_socket": socket_path}, "defects": defects}
    for i, name in enumerate((STABLE, CANARY), start=1):
        state.components[name] = serving.component(state.dir, name, 18000 + i,
                                                   "http://127.0.0.1:1")
    state.save()
    return state


def _weights(socket_path: str) -> dict[str, int]:
    return {name: int(s["srv_uweight"])
            for name, s in haproxy_admin.servers(socket_path, serving.BACKEND).items()}


def _controller(state: EnvState) -> RolloutController:
    controller = RolloutController(state, Restarts(state))  # type: ignore[arg-type]
    controller.analyse = lambda seconds: FAILING  # type: ignore[method-assign]
    return controller


def _notes(state: EnvState, what: str) -> list[dict]:
    lines = [json.loads(x) for x in state.timeline_file.read_text().splitlines()]
    return [x["details"] for x in lines if x["fault"] == what]


@pytest.mark.parametrize("defects, canary", [([], 10), (["canary-weight-ignored"], 100)])
def test_the_canary_gets_its_steps_weight_and_the_defect_a_full_shares(
        tmp_path: Path, socket_path: str, defects: list[str], canary: int) -> None:
    controller = _controller(_state(tmp_path, socket_path, defects))
    controller.set_share(10)
    assert _weights(socket_path) == {STABLE: 90, CANARY: canary}
    controller.set_share(0)  # share 0 stays 0 with the defect too: a rollback still drains it
    assert _weights(socket_path) == {STABLE: 100, CANARY: 0}
    assert [n["share"] for n in _notes(controller.state, "rollout_share")] == [10, 0]


def test_a_failing_canary_is_rolled_back_and_with_rollback_off_held(
        tmp_path: Path, socket_path: str) -> None:
    healthy = _controller(_state(tmp_path / "a", socket_path, []))
    result = healthy.run("v2-errors", Policy(steps=(10, 50, 100)), step_seconds=0,
                         expect="rollback")
    assert result.outcome is Action.ROLLBACK and healthy.deployed(CANARY) == GOOD
    assert healthy.processes.done == [(CANARY, "v2-errors"), (CANARY, GOOD)]
    assert _notes(healthy.state, "rollout_start")[0]["expect"] == "rollback"

    broken = _controller(_state(tmp_path / "b", socket_path, ["rollback-off"]))
    result = broken.run("v2-errors", Policy(steps=(10, 50, 100)), step_seconds=0)
    # the policy asked for rollback; the defect turned it off: held, the bad version serving
    assert result.outcome is Action.HOLD and broken.deployed(CANARY) == "v2-errors"
    assert "rollback is off" in result.reasons
    assert _weights(socket_path) == {STABLE: 90, CANARY: 10}
    assert _notes(broken.state, "rollout_start")[0]["rollback"] is False
    assert _notes(broken.state, "rollout_end")[0]["outcome"] == "hold"


def _timeline(state: EnvState) -> list[tuple[str, str]]:
    lines = [json.loads(x) for x in state.timeline_file.read_text().splitlines()]
    return [(x["event"], x["fault"]) for x in lines if x["event"] != "note"]


def test_a_rollout_is_a_fault_until_the_canary_no_longer_serves_it(
        tmp_path: Path, socket_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    state = _state(tmp_path, socket_path, [])
    ledger = FaultLedger(state.timeline_file, state.dir / "faults_active.json")
    rollouts = Rollouts(state, Restarts(state), ledger)  # type: ignore[arg-type]
    monkeypatch.setattr(RolloutController, "analyse", lambda self, seconds: FAILING)
    out = rollouts.rollout("v2-garbage", Policy(steps=(10, 100)), 0, expect="rollback")
    assert out["outcome"] == "rollback" and ledger.active() == {}
    assert _timeline(state) == [("fault_start", "rollout"), ("fault_end", "rollout")]

    state.info["defects"] = ["rollback-off"]
    out = rollouts.rollout("v2-slow", Policy(steps=(10, 100)), 0, expect="rollback")
    assert out["outcome"] == "hold" and list(ledger.active()) == ["rollout:model-2"]
    # the environment going down: the canary's record back on the stable version
    rollouts.close(ledger.active()["rollout:model-2"])
    assert state.components[CANARY].labels["version"] == GOOD
    state.components[CANARY] = serving.component(state.dir, CANARY, 18002,
                                                 "http://127.0.0.1:1", "v2-slow")
    # restore_all: the good version back on the canary for real, the fault over
    rollouts.restore(ledger.active()["rollout:model-2"])
    assert ledger.active() == {} and state.components[CANARY].labels["version"] == GOOD
    assert rollouts.processes.done[-1] == (CANARY, GOOD)
    assert _timeline(state)[-2:] == [("fault_start", "rollout"), ("fault_end", "rollout")]


def test_a_rollout_without_serving_or_with_an_unknown_expectation_is_refused(
        tmp_path: Path, socket_path: str) -> None:
    state = _state(tmp_path, socket_path, [])
    rollouts = Rollouts(state, Restarts(state),  # type: ignore[arg-type]
                        FaultLedger(state.timeline_file, state.dir / "active.json"))
    with pytest.raises(ValueError, match="rollout expect 'maybe': one of rollback, done"):
        rollouts.rollout("v2", Policy(), 0, expect="maybe")
    del state.components[CANARY]
    with pytest.raises(ValueError, match="serves no model: start it with `gameday env up "):
        rollouts.rollout("v2", Policy(), 0)
    assert not state.timeline_file.exists()  # refused before anything was recorded


def test_the_actions_arguments_are_checked_before_anything_runs() -> None:
    good = {"version": "v2-errors", "expect": "rollback", "steps": [10, 50, 100],
            "step_seconds": 4}
    assert argument_problems("rollout_version", good) == []
    assert argument_problems("rollout_version", {**good, "version": "v3"}) == [
        ("version", ("'v3' is no published model version (known: v1, v2, v2-errors, v2-slow, "
                    "v2-garbage)"))]
    assert argument_problems("rollout_version", {**good, "expect": "pass"}) == [
        ("expect", "'pass': one of rollback, done")]
    assert argument_problems("rollout_version", {**good, "steps": [50, 10]}) == [
        ("", "rollout steps (50, 10): strictly increasing percents in 1..100")]
    assert argument_problems("rollout_version", {**good, "steps": "10,50"}) == [
        ("steps", "'10,50': a list of integer percents")]
    assert argument_problems("rollout_version", {**good, "step_seconds": 0}) == [
        ("step_seconds", "0: a number of seconds above 0")]

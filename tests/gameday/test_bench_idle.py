"""`gameday bench idle`: the arithmetic, and that /proc readings see a busy process as busy
and a sleeping one as idle (so the benchmark cannot report "quiet" for a spinning loop)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.local import bringup, procs
from environments.local import env as env_module
from gameday.bench_idle import (
    OTHER,
    core_percent,
    measure_idle,
    measure_round,
    missing_parts,
    owners,
    spent,
)


def test_core_percent() -> None:
    assert core_percent(100, 10.0, 100) == pytest.approx(10.0)
    assert core_percent(0, 1.0, 100) == 0.0
    with pytest.raises(ValueError):
        core_percent(1, 0.0, 100)


def test_spent_counts_new_processes_and_ignores_gone_or_reused_pids() -> None:
    before = {1: 100, 2: 50, 3: 500}
    after = {1: 130, 4: 7, 3: 20}  # 2 ended, 4 started, 3 is a reused pid (ticks went down)
    assert spent(before, after) == 30 + 7


def test_owners_maps_components_and_buckets_the_rest() -> None:
    got = owners({"api-1": [10, 11], "pg-1": [20]}, [10, 11, 20, 30])
    assert got == {10: "api-1", 11: "api-1", 20: "pg-1", 30: OTHER}


@pytest.fixture
def spinner_and_sleeper() -> Iterator[tuple[int, int]]:
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    nap = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # the sleeper's own start (the interpreter importing itself) must not be in the round:
        # on a loaded machine it was 3 % of the 1 s round; wait until its CPU stops moving
        deadline = time.monotonic() + 30
        last = procs.cpu_ticks(nap.pid)
        while time.monotonic() < deadline:
            time.sleep(0.3)
            now = procs.cpu_ticks(nap.pid)
            if now == last:
                break
            last = now
        yield spin.pid, nap.pid
    finally:
        for p in (spin, nap):
            p.kill()
            p.wait()


def test_a_spinning_process_reads_busy_and_a_sleeping_one_idle(
        spinner_and_sleeper: tuple[int, int]) -> None:
    spin, nap = spinner_and_sleeper
    assert procs.cpu_ticks(spin) is not None
    by = measure_round(lambda: {spin: "spin", nap: "nap"}, 1.0, os.sysconf("SC_CLK_TCK"))
    # one core is 100 %; on a 2-core machine loaded by 15 runnable processes a spinning loop
    # got 4 %: still far from the asleep one's 0 (one tick is 1 % of the round)
    assert by["spin"] > 2.0, by
    assert by["nap"] <= 1.0, by
    assert by["total"] == pytest.approx(by["spin"] + by["nap"])


def test_cpu_ticks_of_a_missing_process_is_none() -> None:
    assert procs.cpu_ticks(2**22 + 12345) is None


class FakeEnvironment:
    """Stands in for LocalEnvironment: records how the benchmark leaves it."""

    def __init__(self, name: str, home: Path | None, *, running: bool) -> None:
        assert home is not None
        self.state_dir = home / ".gameday" / "envs" / name
        self.components: list[str] = []
        self.running, self.ups, self.downs = running, 0, []  # type: ignore[var-annotated]
        self.info: dict[str, object] = {"controlplane": {"included": True, "agents": True},
                                        "agents": [{"name": "cpu-1"}]}

    def is_running(self) -> bool:
        return self.running

    def up(self, reporter: object) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.ups += 1

    def component_pids(self, component: str) -> list[int]:
        return []

    def down(self, purge: bool = False) -> None:
        self.downs.append(purge)


@pytest.mark.parametrize(("had_state", "running", "ups", "downs"), [
    (False, False, 1, [True]),   # created here: nothing is left behind
    (True, False, 1, [False]),   # an environment with state keeps it
    (True, True, 0, []),         # already up: left up
])
def test_only_an_environment_the_benchmark_created_is_purged(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, had_state: bool, running: bool,
        ups: int, downs: list[bool]) -> None:
    made: list[FakeEnvironment] = []

    def fake(name: str, home: Path | None) -> FakeEnvironment:
        made.append(FakeEnvironment(name, home, running=running))
        return made[-1]
    monkeypatch.setattr(env_module, "LocalEnvironment", fake)
    if had_state:
        (tmp_path / ".gameday" / "envs" / "local").mkdir(parents=True)
    figures = measure_idle("local", tmp_path, seconds=0.05, rounds=1, settle=0.0,
                           say=lambda _: None)
    assert (made[0].ups, made[0].downs) == (ups, downs)
    assert figures["rounds"] == 1


def test_missing_parts_names_what_an_environment_runs_without() -> None:
    whole = {"controlplane": {"included": True, "agents": True}, "agents": [{"name": "cpu-1"}]}
    assert missing_parts(whole) == []
    assert missing_parts({**whole, "agents": []}) == ["agents"]
    assert missing_parts({**whole, "controlplane": {"included": True, "agents": False}}) == ["agents"]
    assert missing_parts({**whole, "controlplane": {"included": False}}) == [
        "the control plane (API, reconciler)", "agents"]
    assert missing_parts({}) == ["the control plane (API, reconciler)", "agents"]  # no env.json


def test_an_environment_without_its_control_plane_is_not_reported_as_the_whole(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An up without the control plane measured 5.7 % and 23 processes, against about 10 % and
    46 for the whole environment: a figure that reads as a target met."""
    def fake(name: str, home: Path | None) -> FakeEnvironment:
        env = FakeEnvironment(name, home, running=True)
        env.info = {"controlplane": {"included": False, "agents": False}, "agents": []}
        return env
    monkeypatch.setattr(env_module, "LocalEnvironment", fake)
    said: list[str] = []
    figures = measure_idle("local", tmp_path, seconds=0.05, rounds=1, settle=0.0, say=said.append)
    assert figures["whole_environment"] is False
    assert figures["missing"] == ["the control plane (API, reconciler)", "agents"]
    assert "NOT the whole environment" in said[-1]


def test_a_control_plane_that_fails_to_import_stops_env_up_instead_of_being_left_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI imported against an older controlplane.db (a checkout changed under a running
    process) raised ImportError, and `env up` started without API, reconciler or agents."""
    def broken(name: str) -> object:
        raise ImportError("cannot import name 'connect_once' from 'controlplane.db'")
    monkeypatch.setattr(bringup.importlib, "import_module", broken)
    with pytest.raises(bringup.EnvError, match="control plane cannot be imported.*connect_once"):
        bringup.controlplane_commands()

    def absent(name: str) -> object:  # a checkout without the control plane: none, as before
        raise ModuleNotFoundError(f"No module named {name!r}", name="controlplane")
    monkeypatch.setattr(bringup.importlib, "import_module", absent)
    assert bringup.controlplane_commands() == set()

"""The local driver's clock-skew fault on a stand-in environment (no processes needed): the
offset file it writes is what controlplane/clock.py reads, every jump is on the fault timeline
with a start and an end, and restore_all / close_all put the clock back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from controlplane import clock
from environments.local.clock_faults import Clocks
from environments.local.components import CLOCK_ENV, clock_offset_file
from environments.local.errors import EnvError, UnknownTarget
from environments.local.fault_ledger import FaultLedger
from environments.local.faults import FaultInjector
from environments.local.process_faults import ProcessFaults


def _spec(kind: str, env: dict[str, str]) -> SimpleNamespace:
    return SimpleNamespace(kind=kind, env=env)


@pytest.fixture
def faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultInjector]:
    monkeypatch.setattr("environments.local.clock_faults.CLOCK_RECHECK_SECONDS", 0.0)
    monkeypatch.setattr(clock, "RECHECK_SECONDS", 0.0)
    components = {
        "cpu-1": _spec("agent", {CLOCK_ENV: str(clock_offset_file(tmp_path, "cpu-1"))}),
        "reconciler": _spec("reconciler",
                            {CLOCK_ENV: str(clock_offset_file(tmp_path, "reconciler"))}),
        "api-1": _spec("api", {}),
        "old-agent": _spec("agent", {}),  # an environment brought up before the clock existed
    }
    state = SimpleNamespace(components=components)
    ledger = FaultLedger(tmp_path / "faults.jsonl", tmp_path / "faults_active.json")
    processes = ProcessFaults(state, None, None, ledger)  # type: ignore[arg-type]
    yield FaultInjector(ledger, {"processes": processes,
                                 "clocks": Clocks(state, ledger, processes.resolve)})  # type: ignore[arg-type]
    clock.configure(None)


def _timeline(f: FaultInjector) -> list[tuple[str, str, float | None]]:
    lines = [json.loads(x) for x in f.timeline.path.read_text().splitlines() if x]
    return [(x["event"], x["target"], x["details"].get("offset_seconds")) for x in lines]


def test_skew_forward_then_backward_then_restore(faults: FaultInjector, tmp_path: Path) -> None:
    path = clock_offset_file(tmp_path, "cpu-1")
    clock.configure(str(path))  # what the agent process does with CONTROLPLANE_CLOCK_OFFSET_FILE
    assert faults.skew_clock("cpu-1", 30)["offset_seconds"] == 30.0
    assert clock.offset() == 30.0
    assert faults.skew_clock("cpu-1", 30)["already"] is True  # same offset: nothing new
    faults.skew_clock("cpu-1", -30)  # a jump of 60 s backward: a new span
    assert clock.offset() == -30.0
    faults.restore_clock("cpu-1")
    assert clock.offset() == 0.0 and not path.exists()
    assert faults.restore_clock("cpu-1")["time"] is None  # idempotent, records nothing
    assert _timeline(faults) == [("fault_start", "cpu-1", 30.0), ("fault_end", "cpu-1", -30.0),
                                 ("fault_start", "cpu-1", -30.0), ("fault_end", "cpu-1", 0.0)]
    assert faults.active() == {}


def test_restore_all_and_close_all_put_every_clock_back(faults: FaultInjector,
                                                        tmp_path: Path) -> None:
    faults.skew_clock("cpu-1", -30)
    faults.skew_clock("reconciler", 30)
    assert sorted(faults.restore_all()) == ["clock_skew:cpu-1", "clock_skew:reconciler"]
    assert not list(tmp_path.glob("clock/*.json")) and faults.active() == {}
    faults.skew_clock("reconciler", 45)
    assert faults.close_all("env down") == ["clock_skew:reconciler"]
    assert not clock_offset_file(tmp_path, "reconciler").exists()  # a later `up` starts true


def test_only_processes_with_an_injectable_clock_can_be_skewed(faults: FaultInjector) -> None:
    with pytest.raises(UnknownTarget, match="'api-1' \\(api\\) has no injectable clock"):
        faults.skew_clock("api-1", 30)
    with pytest.raises(UnknownTarget, match="restart the environment"):
        faults.skew_clock("old-agent", 30)
    with pytest.raises(UnknownTarget, match="unknown target 'nope'"):
        faults.skew_clock("nope", 30)
    with pytest.raises(EnvError, match="non-zero offset"):
        faults.skew_clock("cpu-1", 0)
    assert faults.active() == {}

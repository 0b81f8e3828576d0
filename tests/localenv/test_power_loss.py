"""The power-loss fault part (environments/local/power_loss.py) without a kernel mount: the order a
real power loss gives (every process gone, then the unsynced writes dropped, then power back),
one fault on the timeline carrying the crash report, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from environments.local.errors import EnvError, NotRunning, UnknownTarget
from environments.local.fault_ledger import FaultLedger
from environments.local.faultfs.errors import FaultFsError
from environments.local.power_loss import NO_LAYER, PowerLoss
from environments.local.spec import ComponentSpec, Group, HealthCheck

REPORT = {"dropped_bytes": 7, "removed_files": [],
          "dropped_files": [{"path": "/op/slot-1/weights.npy", "bytes": 7, "truncated": True}]}


class FakeDisk:
    def __init__(self, calls: list[str], fail: bool = False) -> None:
        self.calls, self.fail = calls, fail

    def state(self) -> dict[str, Any]:
        return {"unsynced_bytes": 7, "unsynced_files": 1}

    def crash(self) -> dict[str, Any]:
        self.calls.append("crash")
        if self.fail:
            raise FaultFsError("refused")
        return REPORT


def _power(tmp_path: Path, calls: list[str], fail: bool = False,
           monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[PowerLoss, FaultLedger]:
    disk = ComponentSpec(name="node-disk-cpu-2", kind="node-disk", group=Group.INFRA, argv=[],
                         health=HealthCheck("http://x"), ports={},
                         labels={"agent": "cpu-2", "mount": str(tmp_path / "m"),
                                 "source": str(tmp_path / "b"), "control_url": "http://x"})
    ledger = FaultLedger(tmp_path / "faults.jsonl", tmp_path / "active.json")
    power = PowerLoss.for_components({disk.name: disk}, ledger,
                                     lambda a: calls.append(f"off {a}") or [11, 12],
                                     lambda a: calls.append(f"on {a}"))
    assert monkeypatch is not None
    monkeypatch.setattr(PowerLoss, "_client", staticmethod(lambda _d: FakeDisk(calls, fail)))
    return power, ledger


def _lines(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (tmp_path / "faults.jsonl").read_text().splitlines()]


def test_processes_go_first_then_the_unsynced_writes_then_power_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    power, ledger = _power(tmp_path, calls, monkeypatch=monkeypatch)
    out = power.cut("cpu-2")
    assert calls == ["off cpu-2", "crash", "on cpu-2"]
    assert out["crash"] == REPORT and out["pids"] == [11, 12]
    start, end = _lines(tmp_path)
    assert (start["event"], start["fault"], start["target"]) == ("fault_start", "power_loss",
                                                                 "cpu-2")
    assert start["details"]["unsynced_bytes"] == 7
    assert end["event"] == "fault_end" and end["details"]["crash"] == REPORT
    assert ledger.active() == {}


def test_a_refused_crash_still_brings_the_power_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    power, ledger = _power(tmp_path, calls, fail=True, monkeypatch=monkeypatch)
    with pytest.raises(EnvError, match="crash refused"):
        power.cut("cpu-2")
    assert calls == ["off cpu-2", "crash", "on cpu-2"]
    assert ledger.active() == {} and "error" in _lines(tmp_path)[-1]["details"]


def test_refusals_name_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    power, _ = _power(tmp_path, calls, monkeypatch=monkeypatch)
    with pytest.raises(UnknownTarget, match="cpu-2"):
        power.cut("cpu-1")
    none = PowerLoss({}, FaultLedger(tmp_path / "t.jsonl", tmp_path / "a.json"),
                     lambda a: [], lambda a: None)
    with pytest.raises(NotRunning, match="--storage-faults"):
        none.cut("cpu-2")
    assert "gameday env up --storage-faults" in NO_LAYER
    assert calls == [] and none.restore_all() == [] and none.close_all("down") == []


def test_restore_all_brings_back_a_host_left_without_power(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    power, ledger = _power(tmp_path, calls, monkeypatch=monkeypatch)
    ledger.begin("power_loss", "cpu-2", {})  # the action died between off and on
    assert power.restore_all() == ["power_loss:cpu-2"]
    assert calls == ["on cpu-2"] and ledger.active() == {}

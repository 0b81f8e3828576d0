"""The fault ledger every fault layer of the local environment shares: timeline + active set."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from environments.local.fault_ledger import FaultLedger


def _ledger(tmp_path: Path) -> FaultLedger:
    return FaultLedger(tmp_path / "faults.jsonl", tmp_path / "faults_active.json")


def test_begin_change_end_are_on_the_timeline_and_in_the_active_set(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    ledger.begin("network_gray", "agents/slow", {"toxic": {"latency": 100}})
    assert ledger.is_active("network_gray", "agents/slow")
    ledger.change("network_gray", "agents/slow", {"toxic": {"latency": 300}})
    assert ledger.active()["network_gray:agents/slow"]["details"]["toxic"] == {"latency": 300}
    assert ledger.end("network_gray", "agents/slow", {}) is not None
    assert ledger.end("network_gray", "agents/slow", {}) is None  # not active: nothing recorded
    lines = ledger.timeline.read()
    assert [x["event"] for x in lines] == ["fault_start", "note", "fault_end"]
    assert lines[1]["details"] == {"changed": True, "toxic": {"latency": 300}}
    assert ledger.active() == {}


def test_a_change_of_a_fault_that_is_not_active_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="not active"):
        _ledger(tmp_path).change("network_gray", "agents/x", {})
    assert not (tmp_path / "faults.jsonl").exists()


def test_concurrent_writers_lose_no_fault(tmp_path: Path) -> None:
    """Experiments and the runner inject from separate processes/threads: the read-modify-write
    of the active set is locked, so no begin overwrites another's."""
    def begin(i: int) -> None:
        _ledger(tmp_path).begin("kill", f"t{i}", {})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(begin, range(64)))
    assert len(json.loads((tmp_path / "faults_active.json").read_text())) == 64
    assert len(_ledger(tmp_path).timeline.read()) == 64

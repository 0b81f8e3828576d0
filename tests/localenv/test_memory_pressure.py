"""Memory pressure on one component (environments/local/memory_pressure.py) on the real kernel: the
limit holds what the processes already use, an allocation beyond it ends in the OOM killer
inside the group only, a limit below what cannot be reclaimed is refused leaving nothing
changed, and undoing it leaves no cgroup behind; each step is on the fault timeline."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.local import procs
from environments.local.errors import EnvError
from environments.local.fault_ledger import FaultLedger
from environments.local.memory_pressure import MemoryPressure, find_memory_root, limit_bytes

ROOT = find_memory_root()
needs_cgroup = pytest.mark.skipif(
    ROOT is None or os.geteuid() != 0,
    reason="needs root and a cgroup hierarchy with the memory controller (not on this machine)")
# holds ~40 MiB of anonymous memory, then grows by 8 MiB per step when told to (a file appears)
HOLDER = """
import os, sys, time
held = [bytearray(40 * 1024 * 1024)]
for b in held: b[::4096] = b"x" * len(b[::4096])
go = sys.argv[1]
while True:
    if os.path.exists(go):
        chunk = bytearray(8 * 1024 * 1024); chunk[::4096] = b"y" * len(chunk[::4096])
        held.append(chunk)
    time.sleep(0.05)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    go = tmp_path / "grow"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(go)], start_new_session=True)
    time.sleep(1.0)  # its 40 MiB touched
    yield proc, go
    procs.signal_group(proc.pid, 9)
    proc.wait()


def _ledger(tmp_path: Path) -> FaultLedger:
    return FaultLedger(tmp_path / "f.jsonl", tmp_path / "a.json")


@pytest.fixture
def cleanup() -> Iterator[list[MemoryPressure]]:
    """Whatever a failing test left limited is undone: no cgroup outlives the test."""
    made: list[MemoryPressure] = []
    yield made
    for squeeze in made:
        squeeze.close_all("test teardown")
        group = squeeze.group("holder")
        if group.exists():
            group.rmdir()


def _charges_move(squeeze: MemoryPressure) -> bool:
    probe = squeeze.root().path / f"gameday-probe-{os.getpid()}"
    probe.mkdir()
    try:
        return squeeze.prepare(probe).get("charges_moved", False)
    except OSError:
        return False
    finally:
        probe.rmdir()


def test_the_limit_is_validated_by_its_name() -> None:
    assert limit_bytes(64) == 64 * 1024 * 1024
    for bad in (0, 4, True, 2 * 1024 * 1024):
        with pytest.raises(EnvError, match="limit_mib: must be between"):
            limit_bytes(bad)


def test_without_a_memory_hierarchy_the_fault_is_refused_with_the_reason(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    squeeze = MemoryPressure(ledger, lambda _: [1], "env", find=lambda: None)
    with pytest.raises(EnvError, match="needs a cgroup hierarchy with the memory controller"):
        squeeze.squeeze("api-1", 64)
    assert ledger.active() == {} and not (tmp_path / "f.jsonl").exists()


@needs_cgroup
def test_a_squeezed_component_keeps_running_until_it_grows_past_the_limit(
        tmp_path: Path, holder: tuple[subprocess.Popen[bytes], Path],
        cleanup: list[MemoryPressure]) -> None:
    proc, go = holder
    ledger = _ledger(tmp_path)
    squeeze = MemoryPressure(ledger, lambda _: [proc.pid], f"test-{tmp_path}")
    cleanup.append(squeeze)
    result = squeeze.squeeze("holder", 96)
    assert result["pids"] == [proc.pid]
    if result["charges_moved"]:  # what it already used moved with it and counts
        assert result["usage_mib"] is not None and result["usage_mib"] >= 35, result
    assert "memory_pressure:holder" in ledger.active()
    time.sleep(0.5)
    assert proc.poll() is None, "killed while under its limit"
    go.touch()  # now it allocates 8 MiB per 50 ms: past 96 MiB within a second
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("a process growing past its memory limit was not stopped")
    assert proc.returncode == -9, f"expected the OOM killer's SIGKILL, got {proc.returncode}"
    restored = squeeze.restore("holder")
    assert restored["moved_back"] == [] and not squeeze.group("holder").exists()
    assert ledger.active() == {}
    events = [line for line in (tmp_path / "f.jsonl").read_text().splitlines() if line]
    assert len(events) == 2  # start and end


@needs_cgroup
def test_a_limit_below_what_cannot_be_reclaimed_is_refused_and_changes_nothing(
        tmp_path: Path, holder: tuple[subprocess.Popen[bytes], Path],
        cleanup: list[MemoryPressure]) -> None:
    proc, _ = holder
    ledger = _ledger(tmp_path)
    squeeze = MemoryPressure(ledger, lambda _: [proc.pid], f"test-{tmp_path}")
    cleanup.append(squeeze)
    if squeeze.root().version != 1 or not _charges_move(squeeze):
        pytest.skip("only cgroup v1 with memory.move_charge_at_immigrate refuses a limit below "
                    "the usage (v2 kills; kernel 6.x, like this machine's, removed the knob)")
    home = Path(f"/proc/{proc.pid}/cgroup").read_text()
    with pytest.raises(EnvError, match="limit_in_bytes=.*choose a limit above its resident"):
        squeeze.squeeze("holder", 16)  # it holds 40 MiB of anonymous memory, no swap
    assert proc.poll() is None
    assert Path(f"/proc/{proc.pid}/cgroup").read_text() == home
    assert not squeeze.group("holder").exists() and ledger.active() == {}
    assert not (tmp_path / "f.jsonl").exists()


def test_validate_names_a_bad_memory_limit() -> None:
    from chaos.gray import argument_problems

    assert argument_problems("squeeze_memory", {"target": "api-1", "limit_mib": 128}) == []
    for bad in (2, "lots", True):
        [(field, reason)] = argument_problems("squeeze_memory", {"target": "api-1",
                                                                 "limit_mib": bad})
        assert field == "limit_mib" and "MiB of memory" in reason

"""CPU starvation of one component (environments/local/cpu_starvation.py) on the real kernel: its
processes, and those they start later, get the share asked for; undoing it gives their CPU
back and leaves no cgroup behind; each step is on the fault timeline."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.local import procs
from environments.local.cpu_starvation import CpuStarvation, find_cpu_root, quota_us
from environments.local.errors import EnvError
from environments.local.fault_ledger import FaultLedger

ROOT = find_cpu_root()
needs_cgroup = pytest.mark.skipif(
    ROOT is None or os.geteuid() != 0,
    reason="needs root and a cgroup hierarchy with the cpu controller (not on this machine)")
BUSY = "import os, time\nif os.fork() == 0:\n    pass\nwhile True: pass\n"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _share(pid: int, seconds: float = 2.0) -> float:
    before = _cpu_seconds(pid)
    time.sleep(seconds)
    return (_cpu_seconds(pid) - before) / seconds


@pytest.fixture
def busy() -> Iterator[subprocess.Popen[bytes]]:
    """A busy loop that also forks a busy child (what a component's tree looks like)."""
    proc = subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
    time.sleep(0.3)
    yield proc
    procs.signal_group(proc.pid, 9)
    proc.wait()


def test_the_share_is_a_quota_per_period_and_is_validated() -> None:
    assert quota_us(0.1) == 10_000 and quota_us(1.0) == 100_000
    for bad in (0.0, 0.001, 1.5):
        with pytest.raises(EnvError, match="share: must be between"):
            quota_us(bad)


def test_without_a_cpu_hierarchy_the_fault_is_refused_with_the_reason(tmp_path: Path) -> None:
    ledger = FaultLedger(tmp_path / "f.jsonl", tmp_path / "a.json")
    starve = CpuStarvation(ledger, lambda _: [1], "env", find=lambda: None)
    with pytest.raises(EnvError, match="needs a cgroup hierarchy with the cpu controller"):
        starve.starve("api-1", 0.1)
    assert ledger.active() == {} and not (tmp_path / "f.jsonl").exists()


@needs_cgroup
def test_a_starved_tree_gets_its_share_and_all_of_it_back(
        tmp_path: Path, busy: subprocess.Popen[bytes]) -> None:
    tree = [busy.pid, *procs.descendants(busy.pid)]
    assert len(tree) == 2
    ledger = FaultLedger(tmp_path / "f.jsonl", tmp_path / "a.json")
    starve = CpuStarvation(ledger, lambda _: tree, f"test-{tmp_path}")
    free = _share(busy.pid, 1.0)
    result = starve.starve("busy", 0.05)
    assert sorted(result["pids"]) == sorted(tree)
    starved = _share(busy.pid) + _share(tree[1], 1.0)
    assert starved < 0.05 * 1.6, f"starved tree used {starved:.2f} of a core (share 0.05)"
    starve.starve("busy", 0.2)  # a change while active: recorded as such
    starve.restore("busy")
    assert not starve.group("busy").exists()
    after = _share(busy.pid, 1.0)
    # the cap is gone: well above what the capped tree could use (0.05 of a core, 0.08 with
    # slack above). Not an absolute 0.2: on a loaded 2-core machine the free tree itself got
    # 0.10 of a core before the fault and 0.19 after it (a CI rehearsal, 2026-12-06)
    assert after > max(0.05 * 3, free / 3), \
        f"{after:.2f} of a core after restore ({free:.2f} before)"
    lines = ledger.timeline.read()
    assert [x["event"] for x in lines] == ["fault_start", "note", "fault_end"]
    assert lines[0]["details"]["share"] == 0.05 and lines[1]["details"]["share"] == 0.2
    assert starve.restore("busy")["time"] is None  # idempotent: nothing more recorded

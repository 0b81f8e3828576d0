"""The agent tests' own servers (moto, registry, API processes started by
tests/agent/agenttest.py) die with the test session, even when pytest is killed hard: a killed
run once left a moto server behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

OWNER = """
import sys, time
from pathlib import Path
from tests.agent.agenttest import ProcessSupervisor
proc = ProcessSupervisor().start("sleeper", ["sleep", "120"], Path(sys.argv[1]))
print(proc.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_server_started_for_agent_tests_dies_when_its_owner_is_killed(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GAMEDAY_OWNER_PID"}  # owner = the caller
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path / "sleeper.log")],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        child = int(owner.stdout.readline())
        assert _alive(child)
        owner.send_signal(signal.SIGKILL)  # no teardown runs
        owner.wait(timeout=10)
        deadline = time.monotonic() + 15
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(child), f"pid {child} outlived its owner"
    finally:
        owner.kill()
        if "child" in locals() and _alive(child):
            os.killpg(child, signal.SIGKILL)

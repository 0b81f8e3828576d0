"""A background load run (hours long, Locust in its own session) ends by itself when the
process that owns it dies, as the local environment's servers do: a test session killed hard
must not leave Locust sending requests for six hours."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadtests.runconfig import OWNER_ENV
from loadtests.runner import start_background


def test_background_run_ends_when_its_owner_is_killed(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        monkeypatch.setenv(OWNER_ENV, str(owner.pid))
        # nothing listens on port 9 of loopback: every request is a refused connection (data)
        handle = start_background("ci", "http://127.0.0.1:9", "token", tmp_path / "run")
        lead = handle.procs[0].popen
        time.sleep(3)
        assert lead.poll() is None, (tmp_path / "run" / "locust.log").read_text()
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()  # reaped, as an init or a shell reaps a killed pytest
        killed = time.monotonic()
        try:
            lead.wait(timeout=60)
        finally:
            summary = handle.stop(timeout=5)
        # it ended within its stop timeout (5 s) and a margin, long before its 6 h bound
        assert time.monotonic() - killed < 30
        assert summary.reason, summary
    finally:
        owner.kill()
        owner.wait()

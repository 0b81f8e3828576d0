"""Running `gameday` for real against a local environment from tests: the CLI as a subprocess,
the run directory, and the check that nothing is left running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from infra.local import procs


def gameday(*args: str, home: Path, extra_env: dict[str, str] | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GAMEDAY_HOME": str(home), **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "gameday.cli", *args], env=env, text=True,
                          capture_output=True, timeout=timeout, check=False)


def only_run(runs: Path) -> Path:
    (run_dir,) = list(runs.iterdir())
    return run_dir


def assert_no_processes(home: Path) -> None:
    state = home / ".gameday" / "envs" / "local"
    deadline = time.monotonic() + 10
    while procs.marked_processes(state) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert procs.marked_processes(state) == []

"""A new user's fresh clone for end-to-end game days: the working directory is a `git clone` of
this repository inside a 0700 directory (like /root), GAMEDAY_HOME unset, HOME an empty
directory. Each test module gets its own clone and local environment (module-scoped fixture),
so modules can run on different pytest-xdist workers; every server dies with the test session
(GAMEDAY_OWNER_PID, tests/conftest.py) and the environment is taken down and checked at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.gameday.localrun import assert_no_processes

REPO = Path(__file__).resolve().parents[2]
GAMEDAY = str(Path(sys.executable).with_name("gameday"))  # what `make run` runs
EVIDENCE = ["run.json", "ledger.jsonl", "requests.jsonl", "load_stats.json", "faults.jsonl",
            "snapshot/operations.jsonl", "snapshot/attempts.jsonl", "snapshot/events.jsonl",
            "snapshot/objects.jsonl", "snapshot/agents.jsonl", "prometheus/alerts.json"]
OUTPUTS = ["verdict.json", "junit.xml", "report.md", "report.html"]


class FreshClone:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / "clone"
        self.home = root / "home"

    def env(self) -> dict[str, str]:
        """The environment of a new user's shell: no GAMEDAY_* settings of ours, HOME empty
        (the test session's owner pid stays: servers must die with this session)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("GAMEDAY_") or k == "GAMEDAY_OWNER_PID"}
        env["HOME"] = str(self.home)
        return env

    def gameday(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run([GAMEDAY, *args], cwd=self.path, env=self.env(), text=True,
                              capture_output=True, timeout=timeout, check=False)


def fresh_clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshClone]:
    """Body of each module's ``clone`` fixture."""
    root = tmp_path_factory.mktemp("newuser")
    root.chmod(0o700)  # like /root: the postgres OS user cannot enter it
    c = FreshClone(root)
    c.home.mkdir()
    subprocess.run(["git", "clone", "-q", str(REPO), str(c.path)], check=True)
    try:
        yield c
    finally:
        down = c.gameday("env", "down", "--purge", timeout=180)
        assert_no_processes(c.path)
        assert down.returncode in (0, 1), down.stdout + down.stderr


def fresh_env(tmp_path_factory: pytest.TempPathFactory, *up_args: str) -> Iterator[FreshClone]:
    """Body of a module's ``clone`` fixture whose environment is up before its first test
    (`gameday env up [up_args] --json`, checked)."""
    for c in fresh_clone(tmp_path_factory):
        up = c.gameday("env", "up", *up_args, "--json", timeout=400)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        yield c


KSERVE_VENV = REPO / ".venv-kserve"


def serving_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshClone]:
    """Body of a serving module's ``clone`` fixture: a fresh clone with model serving up
    (`gameday env up --serving`), this checkout's KServe venv linked in as
    scripts/setup-kserve.sh would leave it (not installed again); skipped without one."""
    if not (KSERVE_VENV / "bin" / "python").exists():
        pytest.skip(f"no KServe venv at {KSERVE_VENV} (scripts/setup-kserve.sh)")
    for c in fresh_clone(tmp_path_factory):
        (c.path / ".venv-kserve").symlink_to(KSERVE_VENV)
        up = c.gameday("env", "up", "--serving", "--json", timeout=400)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        yield c


def verdict_checks(run_dir: Path) -> dict[str, dict]:
    """verdict.json's checks by id."""
    verdict = json.loads((run_dir / "verdict.json").read_text())
    return {c["id"]: c for c in verdict["checks"]}


def assert_selftest_caught(clone: FreshClone, defect: str, check_id: str, runs_name: str) -> None:
    """`gameday selftest --defect DEFECT` in the module's environment (its own runs directory
    under the clone's root): the row is caught, exit 2, with ``check_id`` among the failed
    checks, and the command itself exits 0."""
    runs = clone.root / runs_name
    r = clone.gameday("selftest", "--defect", defect, "--runs-dir", str(runs), timeout=800)
    [selftest] = sorted(runs.glob("selftest-*"))
    [row] = json.loads((selftest / "selftest.json").read_text())
    assert row["defect"] == defect and row["exit_code"] == 2, row
    assert row["caught"], json.dumps(row, indent=1) + r.stdout[-3000:]
    assert check_id in row["failed_checks"], row["failed_checks"]
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def epoch(text: str) -> float:
    t = datetime.fromisoformat(text)  # Chaos Toolkit writes naive UTC
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def journal(run_dir: Path, name: str) -> dict:
    return json.loads((run_dir / "experiments" / name / "journal.json").read_text())

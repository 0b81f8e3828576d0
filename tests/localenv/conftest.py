"""One real local environment per test session (about 12 s to start on 2 cores)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.local import procs
from environments.local.env import LocalEnvironment

ENV_NAME = "pytest"


def _home() -> Path:
    # pytest's tmp_path is 0700: the postgres OS user could not enter it.
    home = Path(tempfile.mkdtemp(prefix="gameday-localenv-"))
    os.chmod(home, 0o755)
    return home


@pytest.fixture(scope="session")
def env_home() -> Iterator[Path]:
    home = _home()
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def local_env(env_home: Path) -> Iterator[LocalEnvironment]:
    env = LocalEnvironment(ENV_NAME, env_home)
    problems = env.preflight()
    if problems:
        pytest.skip("local environment cannot run here: " + "; ".join(problems))
    env.up()
    try:
        yield env
    finally:
        if env.is_running():
            env.down()
        assert procs.marked_processes(env.state_dir) == [], "processes left after down"


@pytest.fixture
def env(local_env: LocalEnvironment) -> Iterator[LocalEnvironment]:
    """The session environment; whatever a test breaks is undone after it. A test that
    brought it down (test_recovery.py's `down` test) leaves it down for the next test in the
    session, which may come from another file (`--dist loadfile` puts several files on one
    worker, in any order), so it is brought up again first."""
    if not local_env.is_running():
        local_env.up()
    yield local_env
    if local_env.is_running():
        local_env.faults.restore_all()

"""environments/local/launch.py ControlPlane without a `logdir`: it makes a temporary one and removes
it when its `with` block ends cleanly (benchmarks left one in /tmp per run), and keeps it after
an error, when its processes' logs are what explains the failure."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from environments.local.launch import ControlPlane


def test_its_own_log_directory_is_removed_after_a_clean_run_and_kept_after_an_error(
        pg_dsn: str) -> None:
    with ControlPlane(dsn=pg_dsn) as cp:
        clean = cp.logdir
        assert (clean / "api-0.log").exists()
    assert not clean.exists()

    with pytest.raises(RuntimeError, match="boom"), ControlPlane(dsn=pg_dsn) as cp:
        failed = cp.logdir
        raise RuntimeError("boom")
    try:
        assert (failed / "api-0.log").exists()
    finally:
        shutil.rmtree(failed, ignore_errors=True)


def test_a_log_directory_given_is_never_removed(pg_dsn: str, tmp_path: Path) -> None:
    with ControlPlane(dsn=pg_dsn, logdir=tmp_path) as cp:
        assert cp.logdir == tmp_path
    assert (tmp_path / "api-0.log").exists()

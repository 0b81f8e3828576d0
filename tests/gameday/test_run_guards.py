"""`gameday run` refuses before touching anything: prod, missing target, freeze windows,
unknown experiments; `--dry-run` prints what would be hit and changes nothing."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from gameday.cli import main
from gameday.run import EXIT_REFUSED
from gameday.suites import SUITES, load_experiment


def _run(*args: str, home: Path) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args), env={"GAMEDAY_HOME": str(home)})
    return r.exit_code, r.output


def test_suites_cover_every_failure_class() -> None:
    classes = {"api-replica-loss", "db-primary-loss", "artifact-store-unavailable",
               "node-pool-exhausted", "registry-failure", "node-interruption-checkpoint",
               "agent-connectivity-loss", "ineligible-fallback-region"}
    # every class, each by the experiment named after it; a class may add rehearsals
    assert {load_experiment(n).gameday["recovery_objective"] for n in SUITES["core"]} == classes
    assert classes <= set(SUITES["core"])
    assert set(SUITES["ci"]) <= classes
    for name in SUITES["core"]:
        g = load_experiment(name).gameday
        assert g["recovery_objective"] in classes and g["runbook"] == g["recovery_objective"]
        assert g["blast_radius"]


def test_prod_needs_target_and_allow_prod(tmp_path: Path) -> None:
    code, out = _run("run", "--env", "prod", home=tmp_path)
    assert code == EXIT_REFUSED and "needs an explicit --target" in out
    target = tmp_path / "outputs.json"
    target.write_text("{}")
    code, out = _run("run", "--env", "prod", "--target", str(target), "--dry-run", home=tmp_path)
    assert code == EXIT_REFUSED and "without --allow-prod" in out


def test_freeze_window_refuses_injection(tmp_path: Path) -> None:
    freeze = tmp_path / "freeze.yaml"
    freeze.write_text('windows:\n  - {name: always, envs: ["*"], start: "2000-01-01T00:00:00Z",'
                      ' end: "2100-01-01T00:00:00Z"}\n')
    code, out = _run("gate", "--freeze-file", str(freeze), home=tmp_path)
    assert code == EXIT_REFUSED and "inside freeze window 'always'" in out


def test_unknown_experiment_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    code, out = _run("run", "--experiment", "nope", home=tmp_path)
    assert code == EXIT_REFUSED and "unknown experiment" in out and "db-primary-loss" in out


def test_dry_run_lists_faults_and_changes_nothing(tmp_path: Path) -> None:
    code, out = _run("run", "--suite", "core", "--dry-run", "--runs-dir",
                     str(tmp_path / "runs"), home=tmp_path)
    assert code == 0, out
    assert "validated 9 experiments" in out
    assert "crash_database_primary" in out and "withdraw_pool(pool=gpu)" in out
    assert "would be brought up" in out and "nothing was changed" in out
    assert not (tmp_path / "runs").exists() and not (tmp_path / ".gameday").exists()


def test_cloud_dry_run_with_target(tmp_path: Path) -> None:
    target = tmp_path / "outputs.json"
    target.write_text("{}")
    code, out = _run("run", "--env", "staging", "--target", str(target), "--dry-run",
                     "--freeze-file", str(tmp_path / "none.yaml"), home=tmp_path)
    assert code == 0, out
    assert "cloud drivers" in out


def _read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory this process cannot write in: mode 0555 for a user, a read-only tmpfs for
    root (who ignores the mode bits)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:
        ro.chmod(0o555)
        yield ro
        ro.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"root cannot mount a read-only tmpfs here: {mounted.stderr.strip()}")
    try:
        yield ro
    finally:
        subprocess.run(["umount", str(ro)], check=True)


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    yield from _read_only_dir(tmp_path)


def _refused_before_anything(code: int, out: str, home: Path, *words: str) -> None:
    assert code == EXIT_REFUSED, out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("refused: "), out  # no traceback
    assert all(w in lines[0] for w in words), out
    assert "bringing up" not in out and not (home / ".gameday").exists()  # nor the lock


def test_a_read_only_runs_dir_is_refused_before_anything_starts(tmp_path: Path,
                                                                read_only_dir: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    code, out = _run("run", "--runs-dir", str(read_only_dir / "runs"), home=home)
    _refused_before_anything(code, out, home, "--runs-dir", "not writable")


def test_a_runs_dir_below_a_file_is_refused_before_anything_starts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "a-file").write_text("")
    code, out = _run("run", "--runs-dir", str(tmp_path / "a-file" / "runs"), home=home)
    _refused_before_anything(code, out, home, "--runs-dir", "not a directory")


def test_a_home_that_is_a_file_is_refused_before_anything_starts(tmp_path: Path) -> None:
    home = tmp_path / "home-file"
    home.write_text("")
    code, out = _run("run", "--runs-dir", str(tmp_path / "runs"), home=home)
    _refused_before_anything(code, out, tmp_path, "GAMEDAY_HOME", "not a directory")
    assert not (tmp_path / "runs").exists()

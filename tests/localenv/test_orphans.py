"""environments/local/orphans.py: a database directory under /var/lib/gameday whose environment's
state directory is gone (a killed run, a deleted clone) is removed by the next `env up`; one
whose state directory exists, one an environment's process still runs on, and one without an
owner record are kept. Against a temporary root, never the machine's /var/lib/gameday."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from environments.local import orphans, procs
from environments.local.env import LocalEnvironment
from environments.local.errors import EnvError
from environments.local.pg_files import OWNER_FILE, prepare_db_root


def _db_root(root: Path, name: str, owner: Path | None) -> Path:
    d = root / name
    (d / "pg-0").mkdir(parents=True)
    if owner is not None:
        (d / OWNER_FILE).write_text(f"{owner}\n")
    return d


def test_only_a_database_whose_state_directory_is_gone_and_unused_is_removed(
        tmp_path: Path) -> None:
    root = tmp_path / "var-lib-gameday"
    alive_state = tmp_path / "state-alive"
    alive_state.mkdir()
    gone, running_gone = tmp_path / "state-gone", tmp_path / "state-gone-running"
    kept = _db_root(root, "local-kept", alive_state)
    orphan = _db_root(root, "local-orphan", gone)
    in_use = _db_root(root, "local-in-use", running_gone)
    unowned = _db_root(root, "local-unowned", None)
    # a process of the environment whose state directory was deleted under it
    sleeper = subprocess.Popen(["sleep", "60"], env={**os.environ,
                                                     procs.MARKER_VAR: str(running_gone)})
    try:
        said: list[str] = []
        removed = orphans.remove_orphans(root, said.append)
        # once failed in a parallel CI-like run without its cause recorded: say what was seen
        assert removed == [orphan], (said, sleeper.poll(),
                                     procs.marked_processes(running_gone), procs.read_stat(
                                         sleeper.pid))
        assert [x.name for x in sorted(root.iterdir())] == [
            "local-in-use", "local-kept", "local-unowned"]
        assert kept.exists() and in_use.exists() and unowned.exists()
        assert said == [(f"removed {orphan}: the database of an environment whose state "
                         f"directory {gone} no longer exists")]
    finally:
        sleeper.kill()
        sleeper.wait()
    assert orphans.remove_orphans(root) == [in_use]  # its last process has gone


def test_a_database_directory_records_its_state_directory(tmp_path: Path) -> None:
    prepare_db_root(tmp_path / "root" / "local-x", tmp_path / "state")
    assert (tmp_path / "root" / "local-x" / OWNER_FILE).read_text() == (
        f"{(tmp_path / 'state').resolve()}\n")


def test_env_up_removes_orphans_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "var-lib-gameday"
    orphan = _db_root(root, "local-orphan", tmp_path / "deleted-clone")
    monkeypatch.setattr(orphans, "SYSTEM_DB_ROOT", root)
    env = LocalEnvironment("orphan-test", tmp_path / "home")
    # stop right after: what up() did before its preflight is what this test is about
    monkeypatch.setattr(env, "preflight", lambda *_a, **_k: ["stopped here by the test"])
    said: list[str] = []
    with pytest.raises(EnvError, match="stopped here by the test"):
        env.up(said.append)
    assert not orphan.exists()
    assert any(str(orphan) in m for m in said), said


def test_a_directory_that_cannot_be_removed_is_said_not_claimed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "var-lib-gameday"
    orphan = _db_root(root, "local-other-users", tmp_path / "gone")
    monkeypatch.setattr(orphans.shutil, "rmtree", lambda *_a, **_k: None)  # as EACCES would
    said: list[str] = []
    assert orphans.remove_orphans(root, said.append) == []
    assert orphan.exists() and said == [
        (f"could not remove {orphan}, the database of an environment whose state directory "
         f"{tmp_path / 'gone'} no longer exists")]


def test_a_database_of_a_state_directory_made_again_is_removed_only_without_env_json(
        tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    other = _db_root(tmp_path / "root", "local-other", tmp_path / "another-state")
    stale = _db_root(tmp_path / "root", "local-stale", state.resolve())
    said: list[str] = []
    assert not orphans.remove_stale(other, state, said.append)  # not this state dir's
    assert not orphans.remove_stale(tmp_path / "root" / "absent", state, said.append)
    sleeper = subprocess.Popen(["sleep", "60"], env={**os.environ, procs.MARKER_VAR: str(state)})
    try:
        with pytest.raises(EnvError, match="processes of it still run"):
            orphans.remove_stale(stale, state, said.append)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert stale.exists() and other.exists() and said == []
    assert orphans.remove_stale(stale, state, said.append)
    assert not stale.exists() and other.exists()
    assert said == [(f"removed {stale}: the database of an earlier environment at {state} "
                     "whose env.json (and so its passwords) is gone")]


@pytest.mark.parametrize("with_env_json", [False, True])
def test_env_up_removes_its_own_stale_database_only_without_env_json(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_env_json: bool) -> None:
    """The killed-run case: same state path, env.json gone, database directory still there."""
    env = LocalEnvironment("stale-test", tmp_path / "home")
    db_root = _db_root(tmp_path / "var-lib-gameday", "stale-test-x", env.state_dir.resolve())
    monkeypatch.setattr(orphans, "SYSTEM_DB_ROOT", tmp_path / "var-lib-gameday")
    monkeypatch.setattr("environments.local.env.db_root_for", lambda *_a: db_root)
    if with_env_json:
        env.state_dir.mkdir(parents=True)
        env.env_file.write_text(json.dumps({"name": "stale-test", "db_root": str(db_root),
                                            "status": "down", "components": {}}))
        env = LocalEnvironment("stale-test", tmp_path / "home")
    monkeypatch.setattr(env, "preflight", lambda *_a, **_k: ["stopped here by the test"])
    said: list[str] = []
    with pytest.raises(EnvError, match="stopped here by the test"):
        env.up(said.append)
    assert db_root.exists() == with_env_json
    assert any(str(db_root) in m for m in said) != with_env_json, said

"""Storage faults on a real local environment started with the storage layer (each Patroni
member's data directory on a faultfs mount): a slow fsync on the leader shows in a commit's
latency, a full disk refuses writes, clearing restores them, the timeline records start and
end, and down --purge leaves no mount and no process."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from environments.local import procs, storage
from environments.local.cli import fault_group
from environments.local.env import LocalEnvironment
from environments.local.errors import UnknownTarget
from environments.local.faultfs.mount import fuse_mounts

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env() -> Iterator[LocalEnvironment]:
    home = Path(tempfile.mkdtemp(prefix="gameday-disk-"))
    os.chmod(home, 0o755)  # the postgres OS user must enter it
    env = LocalEnvironment("pytest-disk", home, storage_faults=True)
    problems = env.preflight() + storage.preflight()
    if problems:
        shutil.rmtree(home, ignore_errors=True)
        pytest.skip("storage layer cannot run here: " + "; ".join(problems))
    env.up()
    try:
        yield env
    finally:
        env.down()
        assert procs.marked_processes(env.state_dir) == [], "processes left after down"
        assert not [m for m in fuse_mounts() if m.startswith(str(home))], "mount left"
        for member in ("pg-0", "pg-1"):  # stopped before its disk: a clean shutdown checkpoint
            log = env.log_file(member).read_text(errors="replace")
            assert "Transport endpoint is not connected" not in log, member
            lines = log.splitlines()
            last = max(i for i, line in enumerate(lines) if "database system is shut down" in line)
            assert "abnormal database system shutdown" not in lines[last - 1], member
        env.down(purge=True)
        shutil.rmtree(home, ignore_errors=True)


def _commit_ms(env: LocalEnvironment, n: int = 5) -> list[float]:
    """Autocommit INSERTs through HAProxy, each timed by the client (a commit flushes WAL)."""
    took = []
    with psycopg.connect(env.db.superuser_dsn(), autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS disk_probe (x int)")
        for _ in range(n):
            started = time.monotonic()
            c.execute("INSERT INTO disk_probe VALUES (1)")
            took.append((time.monotonic() - started) * 1000)
    return took


def _cli(env: LocalEnvironment, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(fault_group, [*args, "--name", env.name,
                                         "--home", str(env.state_dir.parents[2])])
    return r.exit_code, r.output


def test_each_member_runs_on_its_own_mounted_disk(env: LocalEnvironment) -> None:
    assert LocalEnvironment.load(env.name, env.state_dir.parents[2]).storage_faults is True
    mounts = fuse_mounts()
    for i in (0, 1):
        disk, member = env.components[f"disk-{i}"], env.components[f"pg-{i}"]
        assert env.check(disk.name)[0] and mounts.get(disk.labels["mount"]) == "fuse.faultfs"
        assert Path(member.labels["data_dir"], "PG_VERSION").is_file()  # through the mount
        assert Path(disk.labels["source"], "data", "PG_VERSION").is_file()  # the real files
    assert env.applicability("db-slow-disk", ("storage-faults",)) is None


def test_fsync_latency_on_the_leader_shows_in_a_commit_and_clear_restores(
        env: LocalEnvironment) -> None:
    before = len(env.faults.timeline.read())
    leader = env.db.leader()
    assert statistics.median(_commit_ms(env)) < 100
    code, out = _cli(env, "disk-slow", "primary", "--fsync-ms", "200")
    assert code == 0, out
    assert json.loads(out)["target"] == leader
    slow = _commit_ms(env)
    assert min(slow) >= 190, slow  # every commit waits for one WAL flush at least
    assert _cli(env, "disk-clear", "primary")[0] == 0
    assert statistics.median(_commit_ms(env)) < 100
    lines = [x for x in env.faults.timeline.read()[before:] if x["fault"] == "disk"]
    assert [(x["event"], x["target"]) for x in lines] == [("fault_start", leader),
                                                          ("fault_end", leader)]
    start, end = lines[0]["details"], lines[1]["details"]
    assert start["faults"] == {"fsync_delay_ms": 200.0} and start["alias"] == "primary"
    assert start["cluster"]["leader"] == leader and isinstance(start["cluster"]["timeline"], int)
    assert end["injected"]["delays"] >= 5  # the disk's own count of delayed operations
    assert env.db.leader() == leader  # a slow disk is not a dead one


def test_a_full_disk_refuses_writes_and_clear_restores_them(env: LocalEnvironment) -> None:
    # data files only (not the WAL): the statement fails, the server stays up
    fill = "CREATE TABLE disk_full_probe AS SELECT g FROM generate_series(1, 50000) g"
    env.faults.disks.full("primary", glob="base/**")
    try:
        with (psycopg.connect(env.db.superuser_dsn(), autocommit=True) as c,
              pytest.raises(psycopg.Error, match="No space left on device")):
            c.execute(fill)
    finally:
        env.faults.disks.clear()
    assert "disk:" not in " ".join(env.faults.active())
    with psycopg.connect(env.db.superuser_dsn(), autocommit=True) as c:
        c.execute(fill)
        assert c.execute("SELECT count(*) FROM disk_full_probe").fetchone() == (50000,)
        c.execute("DROP TABLE disk_full_probe")


def test_restore_all_clears_a_disk_fault_and_unknown_targets_are_named(
        env: LocalEnvironment) -> None:
    env.faults.disks.errors("standby", fsync=0.5, glob="pg_wal/**")
    assert any(k.startswith("disk:") for k in env.faults.active())
    assert [k for k in env.faults.restore_all() if k.startswith("disk:")]
    assert not any(k.startswith("disk:") for k in env.faults.active())
    with pytest.raises(UnknownTarget, match="not a database member with a disk"):
        env.faults.disks.slow("api-1", fsync_ms=10)
    code, out = _cli(env, "disk-slow", "primary", "--fsync-ms", "-5")
    assert code != 0 and "fsync-ms" in out

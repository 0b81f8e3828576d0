"""The storage layer's pure parts and its refusals, without starting anything: disk fault specs
named by the harness's own parameters, the component layout with and without the layer, the
local environment's answer for experiments that need it, and a machine without FUSE."""

from __future__ import annotations

from pathlib import Path

import pytest

from environments.local import disk_spec, storage
from environments.local.components import build_components
from environments.local.disk_faults import NO_LAYER, DiskFaults, cluster_of, injected
from environments.local.env import LocalEnvironment
from environments.local.errors import EnvError, NotRunning
from environments.local.fault_ledger import FaultLedger
from environments.local.topology import Secrets, port_names
from gameday.suites import experiment_requires


def test_a_disk_spec_maps_the_harness_parameters_onto_faultfs() -> None:
    assert disk_spec.build("slow", {"fsync_ms": 200, "write_ms": 200, "glob": "pg_wal/**"}) == {
        "fsync_delay_ms": 200, "write_delay_ms": 200, "path_glob": "data/pg_wal/**"}
    assert disk_spec.build("slow", {"fsync_ms": 50, "jitter_ms": 10}) == {
        "fsync_delay_ms": 50, "fsync_jitter_ms": 10}
    assert disk_spec.build("full", {"glob": "/base/*"}) == {"enospc": 1.0,
                                                             "path_glob": "data/base/*"}
    assert disk_spec.build("errors", {"write": 0.5}) == {"write_eio": 0.5}


@pytest.mark.parametrize(("mode", "params", "field"), [
    ("slow", {}, "read_ms"),                          # nothing slow: a no-op is refused
    ("slow", {"fsync_ms": -1}, "fsync_ms"),
    ("slow", {"fsync_ms": True}, "fsync_ms"),
    ("slow", {"fsync_ms": 1, "jitter_ms": "x"}, "jitter_ms"),
    ("errors", {"fsync": 1.5}, "fsync"),
    ("full", {"glob": ""}, "glob"),
    ("full", {"fsync_ms": 200}, "fsync_ms"),           # not a parameter of a full disk
    ("sticky", {}, "mode"),
])
def test_a_bad_parameter_is_refused_by_its_own_name(mode: str, params: dict, field: str) -> None:
    [(named, reason)] = disk_spec.problems(mode, params)
    assert named == field and reason


def test_faultfs_metrics_and_patroni_cluster_are_read_purely() -> None:
    text = ('faultfs_ops_total{op="write"} 10\n'
            'faultfs_injected_errors_total{op="write",errno="ENOSPC"} 4\n'
            'faultfs_injected_errors_total{op="create",errno="ENOSPC"} 2\n'
            'faultfs_injected_delays_total{op="fsync"} 7\n')
    assert injected(text) == {"errors": 6.0, "delays": 7.0}
    members = [{"name": "pg-0", "role": "replica", "timeline": 2},
               {"name": "pg-1", "role": "leader", "timeline": 3}, {"name": "x", "role": "replica"}]
    assert cluster_of(members) == {"leader": "pg-1", "timeline": 3, "roles": {
        "pg-0": "replica", "pg-1": "leader", "x": "replica"}}
    assert cluster_of([])["timeline"] is None


def test_without_the_layer_every_disk_fault_says_how_to_get_it(tmp_path: Path) -> None:
    disks = DiskFaults({}, {}, FaultLedger(tmp_path / "t.jsonl", tmp_path / "a.json"),
                       resolve=lambda t: t)
    for call in (lambda: disks.slow("primary", fsync_ms=200), lambda: disks.full("pg-0"),
                 lambda: disks.errors("pg-1", write=1.0), lambda: disks.clear(),
                 lambda: disks.clear("primary")):
        with pytest.raises(NotRunning, match="--storage-faults"):
            call()
    assert "gameday env up --storage-faults" in NO_LAYER
    assert disks.restore_all() == [] and disks.close_all("down") == []


def _components(tmp_path: Path, storage_faults: bool) -> dict:
    names = port_names(()) + storage.port_names(storage_faults)
    ports = {n: 20000 + i for i, n in enumerate(names)}
    return build_components(tmp_path, "t", ports, Secrets(), (), False,
                            storage_faults=storage_faults)


def test_without_the_flag_nothing_changes(tmp_path: Path) -> None:
    specs = _components(tmp_path, False)
    assert not [s for s in specs.values() if s.kind == storage.KIND]
    assert storage.port_names(False) == []
    assert specs["pg-0"].labels["data_dir"] == str(tmp_path / "pg-0" / "data")
    assert not (tmp_path / "pg-0" / "disk").exists()


def test_with_the_flag_each_member_has_its_disk_first_and_its_data_on_the_mount(
        tmp_path: Path) -> None:
    specs = _components(tmp_path, True)
    order = list(specs)
    for i in (0, 1):
        disk, member = specs[f"disk-{i}"], specs[f"pg-{i}"]
        assert disk.kind == "faultfs" and order.index(disk.name) < order.index(member.name)
        home = tmp_path / f"pg-{i}"
        assert disk.labels["mount"] == str(home / "disk")
        assert disk.labels["source"] == str(home / "disk.backing")
        # data one level below the mount point: renaming `data` never touches the mount
        assert member.labels["data_dir"] == str(home / "disk" / "data")
        assert member.labels["home"] == str(home)
        assert "--control-port" in disk.argv and disk.health.body_contains


@pytest.mark.parametrize(("leader", "groups"), [
    ("pg-0", [["pg-1"], ["pg-0"], ["disk-0", "disk-1"]]),
    ("pg-1", [["pg-0"], ["pg-1"], ["disk-0", "disk-1"]]),
    (None, [["pg-0", "pg-1"], ["disk-0", "disk-1"]]),  # no member answered: all at once
])
def test_down_stops_the_replicas_before_the_leader_and_the_disks_last(
        tmp_path: Path, leader: str | None, groups: list[list[str]]) -> None:
    """A leader stopped with its replica hands its key over mid-shutdown; the replica then
    promotes instead of stopping and is killed after the grace (no shutdown checkpoint)."""
    stopped: list[list[str]] = []
    storage.stop_members_then_disks(_components(tmp_path, True),
                                    lambda names, grace: stopped.append(sorted(names)), leader)
    assert stopped == groups


def test_with_the_flag_cpu_2_keeps_its_checkpoints_on_a_node_disk_of_its_own(
        tmp_path: Path) -> None:
    """The node disk is a component of its own (environments/local/node_disk.py), started with the
    infrastructure; only cpu-2 is pointed at it, and only with the flag."""
    from environments.local import node_disk
    from environments.local.topology import DEFAULT_AGENTS

    def build(flag: bool) -> dict:
        agents = tuple(a.name for a in DEFAULT_AGENTS)
        names = (port_names(DEFAULT_AGENTS) + storage.port_names(flag)
                 + node_disk.port_names(flag, agents))
        ports = {n: 20000 + i for i, n in enumerate(names)}
        return build_components(tmp_path, "t", ports, Secrets(), DEFAULT_AGENTS, True,
                                storage_faults=flag)

    assert not [s for s in build(False).values() if s.kind == node_disk.KIND]
    assert node_disk.ENV not in build(False)["cpu-2"].env
    specs = build(True)
    disk = specs["node-disk-cpu-2"]
    home = tmp_path / "agents" / "cpu-2"
    assert (disk.kind, disk.group.value, disk.labels["agent"]) == ("node-disk", "infra", "cpu-2")
    assert disk.labels["mount"] == str(home / "checkpoints")
    assert disk.labels["source"] == str(home / "checkpoints.backing")
    assert specs["cpu-2"].env[node_disk.ENV] == str(home / "checkpoints")
    assert [n for n, s in specs.items() if node_disk.ENV in s.env] == ["cpu-2"]
    assert node_disk.port_names(True, ("cpu-1",)) == []  # no cpu-2, no node disk


def test_the_local_environment_answers_which_experiments_need_the_layer(tmp_path: Path) -> None:
    """The experiments declare what they need (gameday/suites.py reads it); the environment
    says whether it has it."""
    env = LocalEnvironment("t", tmp_path)
    why = "needs the storage fault layer: gameday env up --storage-faults"
    for name in ("db-slow-disk", "db-disk-full", "checkpoint-power-loss"):
        assert experiment_requires(name) == ("storage-faults",)
        assert env.applicability(name, experiment_requires(name)) == why
    assert experiment_requires("db-primary-loss") == ()
    assert env.applicability("db-primary-loss", ()) is None
    assert experiment_requires("no-such-experiment") == ()


def test_a_machine_without_fuse_is_refused_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("environments.local.faultfs.mount.FUSE_DEVICE", str(tmp_path / "no-fuse"))
    env = LocalEnvironment("nofuse", tmp_path, storage_faults=True)
    with pytest.raises(EnvError, match=r"--storage-faults: .*no-fuse does not exist"):
        env.up()
    assert not (env.state_dir / "run" / "supervisor.ready").exists()
    assert not env.env_file.exists()  # nothing recorded, nothing started


def _fuse_or_skip() -> None:
    from environments.local.faultfs import FuseUnavailable
    from environments.local.faultfs.mount import check_fuse

    try:
        check_fuse()
    except FuseUnavailable as exc:
        pytest.skip(f"no FUSE here: {exc}")
    if storage.preflight():
        pytest.skip("; ".join(storage.preflight()))


def test_orphan_cleanup_detaches_a_dead_mount_and_leaves_a_live_one_alone(
        tmp_path: Path) -> None:
    """A database directory of a vanished environment with a disk mount in it: a live mount is
    never deleted through; once its server is killed (and with it the unmount helper, as a
    killed test session leaves it) the dead mount is detached and the directory removed."""
    import os
    import signal

    from environments.local import orphans, procs
    from environments.local.faultfs import FaultFsProcess
    from environments.local.faultfs.mount import is_mounted
    from environments.local.pg_files import OWNER_FILE

    _fuse_or_skip()
    db_root = tmp_path / "root" / "gone-env-1234"
    mount, backing = db_root / "pg-0" / "disk", db_root / "pg-0" / "disk.backing"
    mount.mkdir(parents=True)
    backing.mkdir()
    (db_root / OWNER_FILE).write_text(f"{tmp_path / 'no-such-state-dir'}\n")
    said: list[str] = []
    ffs = FaultFsProcess(backing, mount, log_path=tmp_path / "ffs.log").start()
    try:
        (mount / "f").write_text("x")
        assert orphans.remove_orphans(tmp_path / "root", said.append) == []
        assert "still in use" in said[-1] and db_root.is_dir()
        assert ffs.proc is not None
        helpers = [p for p in procs.descendants(ffs.proc.pid)
                   if (info := procs.read_stat(p)) and info.comm == "fusermount3"]
        procs.signal_pids([*helpers, ffs.proc.pid], signal.SIGKILL)  # no clean unmount
        ffs.proc.wait(5)
        assert is_mounted(str(mount))  # dead: "Transport endpoint is not connected"
        with pytest.raises(OSError):
            os.listdir(mount)
        assert orphans.remove_orphans(tmp_path / "root", said.append) == [db_root]
        assert not is_mounted(str(mount)) and not db_root.exists()
    finally:
        ffs.stop()


def test_validate_refuses_bad_disk_parameters_by_name() -> None:
    from chaos.gray import argument_problems

    good = {"target": "primary", "fsync_ms": 200, "write_ms": 200, "glob": "pg_wal/**"}
    assert argument_problems("slow_disk", good) == []
    assert argument_problems("slow_disk", {**good, "fsync_ms": -1})[0][0] == "fsync_ms"
    assert argument_problems("fill_disk", {"target": 7})[0][0] == "target"
    assert argument_problems("fail_disk", {"target": "pg-0", "write": 2})[0][0] == "write"
    assert argument_problems("fail_disk", {"target": "pg-0"})[0][0] == "read"  # nothing fails
    assert argument_problems("clear_disk", {"settle_seconds": 900})[0][0] == "settle_seconds"
    assert argument_problems("clear_disk", {}) == []

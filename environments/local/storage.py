"""The storage layer of the local environment, opt-in (`gameday env up --storage-faults`): each
Patroni member's data directory on a faultfs mount of its own (docs/faultfs.md), so that the
database's disk can be made slow, full or failing at run time (environments/local/disk_faults.py).

Per member, in its home ``<db_root>/pg-N/``:

* ``disk/`` the mount point; ``disk/data`` the data directory, so that a rename or removal of
  ``data`` (a restore from backup, Patroni's ``remove_data_directory_on_*``) never touches the
  mount point itself;
* ``disk.backing/`` the real files, beside it.

One faultfs process per member is a component of its own (``disk-N``, kind ``faultfs``): started
and healthy (mounted) before its member, stopped after it. Unmounted, the mount point belongs to
root with mode 0755, so a member started by mistake without its disk cannot write its data
directory onto the bare directory (as root; as an ordinary user ``spawn`` checks the mount).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from environments.local.errors import EnvError
from environments.local.faultfs.errors import FaultFsError
from environments.local.faultfs.mount import (
    FUSERMOUNT,
    check_fuse,
    clear_stale,
    fuse_mounts,
    is_mounted,
)
from environments.local.pg_files import chown_for_postgres
from environments.local.spec import ComponentSpec, Group, HealthCheck

Components = Mapping[str, ComponentSpec]

KIND = "faultfs"
HINT = "gameday env up --storage-faults"
# what an experiment that needs this layer declares (x-gameday ``requires``)
REQUIREMENT = "storage-faults"
MEMBERS = ("pg-0", "pg-1")
# Patroni stops postgres with a fast shutdown (a checkpoint through the mount); faultfs then
# writes back what is unsynced and unmounts
MEMBER_STOP_SECONDS = 20.0
DISK_STOP_SECONDS = 15.0
# initdb and the standby's clone write every file through FUSE (about 5x slower than the bare
# disk, docs/faultfs.md): the database stages of `up` wait this many times longer
DB_TIMEOUT_FACTOR = 3.0


def disk_name(member: str) -> str:
    """``pg-0`` -> ``disk-0``."""
    return "disk-" + member.rpartition("-")[2]


def port_names(enabled: bool) -> list[str]:
    return [f"disk{i}_control" for i in range(len(MEMBERS))] if enabled else []


def mount_dir(home: Path) -> Path:
    return home / "disk"


def backing_dir(home: Path) -> Path:
    return home / "disk.backing"


def preflight() -> list[str]:
    """What the storage layer needs from this machine, each missing thing named."""
    problems = []
    try:
        check_fuse()
    except FaultFsError as exc:
        problems.append(f"--storage-faults: {exc}")
    if importlib.util.find_spec("mfusepy") is None:
        problems.append("--storage-faults: the mfusepy binding is not installed "
                        "(pip install -e '.[harness]')")
    return problems


def disk_component(home: Path, index: int, port: int) -> ComponentSpec:
    """The faultfs process of member ``pg-<index>`` (its directories made here)."""
    mount, backing = mount_dir(home), backing_dir(home)
    for d in (mount, backing):
        d.mkdir(exist_ok=True)
    chown_for_postgres(backing)
    backing.chmod(0o700)
    if os.geteuid() == 0:  # unmounted: not writable by the postgres user
        os.chown(mount, 0, 0)
        mount.chmod(0o755)
    url = f"http://127.0.0.1:{port}"
    return ComponentSpec(
        name=f"disk-{index}", kind=KIND, group=Group.INFRA,
        argv=[sys.executable, "-m", "environments.local.faultfs", "--source", str(backing),
              "--mount", str(mount), "--control-port", str(port)],
        # the control API answers only once the mount is up (environments/local/faultfs/mount.py)
        health=HealthCheck(f"{url}/healthz", body_contains='"ok"'),
        ports={"control": port},
        labels={"member": f"pg-{index}", "mount": str(mount), "source": str(backing),
                "control_url": url},
    )


def disks(components: Components) -> list[str]:
    return [n for n, s in components.items() if s.kind == KIND]


def db_timeout(components: Components, timeout: float) -> float:
    """How long `up` waits for the database members: longer on the storage layer."""
    return timeout * DB_TIMEOUT_FACTOR if disks(components) else timeout


def check_mounted(components: Components, member: str) -> None:
    """A member whose data directory is on a disk starts only on the mounted disk."""
    disk = components.get(disk_name(member))
    if disk is None or disk.kind != KIND:
        return
    if not is_mounted(disk.labels["mount"]):
        raise EnvError(f"{member}: its disk {disk.name} is not mounted on {disk.labels['mount']}:"
                       f" start {disk.name} first (gameday fault start {disk.name})")


def stop_members_then_disks(components: Components,
                            stop: Callable[[list[str], float], None],
                            leader: str | None = None) -> list[str]:
    """Patroni members (and their postgres) first, then the disks: a disk that went first would
    leave postgres with ENOTCONN in its shutdown checkpoint; ``stop(names, grace)`` stops
    components (environments/local/processes.py). Returns mounts detached by force.

    The replicas stop before the ``leader``: a leader's Patroni deletes its key once its
    shutdown checkpoint is written, and a replica whose Patroni had not yet acted on its own
    SIGTERM would promote in the middle of its shutdown and outlive the grace (then SIGKILL,
    no clean shutdown checkpoint on its disk)."""
    names = disks(components)
    if not names:
        return []
    members = [m for m in MEMBERS if m in components]
    for group in member_stop_order(members, leader):
        stop(group, MEMBER_STOP_SECONDS)
    stop(names, DISK_STOP_SECONDS)
    detached = []
    for name in names:
        mount = components[name].labels["mount"]
        deadline = time.monotonic() + 2.0  # fusermount3's auto_unmount helper is asynchronous
        while is_mounted(mount) and time.monotonic() < deadline:
            time.sleep(0.05)
        if is_mounted(mount):
            subprocess.run([FUSERMOUNT, "-u", "-z", mount], check=False, capture_output=True)
            detached.append(mount)
    return detached


def member_stop_order(members: list[str], leader: str | None) -> list[list[str]]:
    """Groups of members to stop one after the other: the replicas, then the leader; all at
    once when the leader is unknown (no member answered)."""
    if leader not in members:
        return [members] if members else []
    replicas = [m for m in members if m != leader]
    return [g for g in (replicas, [leader]) if g]


def detach_stale_mounts(root: Path) -> list[str]:
    """Detach every dead FUSE mount under ``root`` (its server was killed) before the tree is
    deleted or used again. A live one is an error naming it: it belongs to a running process,
    and deleting through it would delete that process's data."""
    root_s = str(root.resolve())
    found = sorted(m for m in fuse_mounts() if m == root_s or m.startswith(root_s + os.sep))
    for mount in found:
        try:
            clear_stale(mount)
        except FaultFsError as exc:
            raise EnvError(f"{root} holds a FUSE mount still in use: {exc}") from None
    return found

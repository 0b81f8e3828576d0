"""faultfs: the pure parts (spec validation, the injection decision, the unsynced-write cache),
the filesystem logic and control API without a kernel mount, then real FUSE mounts:
passthrough, slow fsync, EIO, ENOSPC, power loss, shutdown and stale-mount cleanup."""

from __future__ import annotations

import errno
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from environments.local import procs
from environments.local.faultfs import (
    NO_FAULTS,
    ControlUnreachable,
    FaultFsClient,
    FaultFsProcess,
    FaultSpec,
    FuseUnavailable,
    InvalidFaultSpec,
    MountFailed,
    UnsyncedCache,
    decide,
    parse_spec,
)
from environments.local.faultfs import mount as mount_mod
from environments.local.faultfs.cache import FlushPlan
from environments.local.faultfs.control import ControlServer
from environments.local.faultfs.fs import FaultFs
from environments.local.faultfs.stats import Stats

# -- the fault spec ------------------------------------------------------------------------


def test_a_spec_takes_the_fields_given_and_defaults_the_rest_to_no_fault() -> None:
    spec = parse_spec({"fsync_delay_ms": 200, "enospc": 0.5, "path_glob": "/pgdata/pg_wal/*"})
    assert spec == FaultSpec(fsync_delay_ms=200.0, enospc=0.5, path_glob="pgdata/pg_wal/*")
    assert spec.active and not NO_FAULTS.active and parse_spec({}) == NO_FAULTS
    with pytest.raises(AttributeError):
        spec.enospc = 0.0  # type: ignore[misc]


@pytest.mark.parametrize(("body", "field"), [
    ({"fsync_delay_ms": -1}, "fsync_delay_ms"),
    ({"read_delay_ms": 10_000_000}, "read_delay_ms"),
    ({"write_jitter_ms": float("nan")}, "write_jitter_ms"),
    ({"read_eio": 1.5}, "read_eio"),
    ({"enospc": "1"}, "enospc"),
    ({"write_eio": True}, "write_eio"),
    ({"path_glob": ""}, "path_glob"),
    ({"seed": -1}, "seed"),
    ({"fsync_delay": 200}, "fsync_delay"),
    ([1, 2], "body"),
])
def test_a_bad_spec_is_refused_naming_the_field(body: object, field: str) -> None:
    with pytest.raises(InvalidFaultSpec) as info:
        parse_spec(body)
    assert info.value.field == field and field in str(info.value)


def test_the_decision_follows_the_draws() -> None:
    spec = FaultSpec(fsync_delay_ms=200, fsync_jitter_ms=50, write_eio=0.25, enospc=0.5,
                     read_eio=1.0, path_glob="pgdata/pg_wal/*")
    wal = "/pgdata/pg_wal/000000010000000000000001"
    assert decide(spec, "fsync", wal, 0.9, 0.5).delay_s == pytest.approx(0.2)
    assert decide(spec, "fsync", wal, 0.9, 0.0).delay_s == pytest.approx(0.15)
    assert decide(spec, "fsync", wal, 0.9, 1.0).delay_s == pytest.approx(0.25)
    # one draw splits a write between ENOSPC (first half) and EIO (next quarter)
    assert decide(spec, "write", wal, 0.49, 0.5).errno == errno.ENOSPC
    assert decide(spec, "write", wal, 0.6, 0.5).errno == errno.EIO
    assert decide(spec, "write", wal, 0.8, 0.5).errno is None
    assert decide(spec, "create", wal, 0.49, 0.5).errno == errno.ENOSPC
    assert decide(spec, "create", wal, 0.6, 0.5).errno is None  # EIO is for writes only
    assert decide(spec, "read", wal, 0.999, 0.5).errno == errno.EIO
    # other paths are untouched, and so is everything without a spec
    assert decide(spec, "read", "/pgdata/base/5/1259", 0.0, 0.5).errno is None
    assert decide(spec, "fsync", "/pgdata/base/5/1259", 0.0, 0.5).delay_s == 0
    assert decide(NO_FAULTS, "write", wal, 0.0, 0.0) == decide(NO_FAULTS, "fsync", wal, 0.0, 1.0)


# -- the unsynced-write cache --------------------------------------------------------------


def test_the_cache_overlays_writes_and_truncations_until_flushed_and_drops_them_on_crash() -> None:
    c = UnsyncedCache()
    backing = b"A" * 100  # the durable file
    c.write("k", "/f", 90, b"B" * 20, backing_size=100)
    assert c.size("k") == 110 and c.held == 20
    assert c.read("k", 80, 40, backing[80:]) == b"A" * 10 + b"B" * 20
    c.truncate("k", "/f", 50, backing_size=100)
    c.truncate("k", "/f", 60, backing_size=100)  # regrown: the cut-off bytes read as zeros
    assert c.read("k", 40, 40, backing[40:]) == b"A" * 10 + bytes(10)
    c.write("k", "/f", 55, b"C", backing_size=100)
    assert c.plan("k") == FlushPlan(cut=50, writes=((55, bytearray(b"C")),), size=60)
    c.created("n", "/dir/new")
    c.write("n", "/dir/new", 0, b"x" * 7, backing_size=0)
    report = c.drop_all()
    assert report.bytes == 8 and c.held == 0 and c.files == 0
    assert {(f.path, f.bytes, f.truncated) for f in report.files} == {("/f", 1, True),
                                                                      ("/dir/new", 7, False)}
    assert report.removed == (("n", "/dir/new"),)


def test_the_cache_forgets_flushed_files_and_tracks_which_creations_are_durable() -> None:
    c = UnsyncedCache()
    c.write("k", "/a", 0, b"x" * 10, backing_size=0)
    c.flushed("k")
    assert not c.has("k") and c.held == 0
    for key, path in (("1", "/d/one"), ("2", "/d/two"), ("3", "/e/three"), ("4", "/e/four")):
        c.created(key, path)
    c.dir_synced("/d")  # fsync of the directory: its new entries are durable
    c.durable("3")  # fsync of the file (ext4 commits its entry with it)
    c.renamed_dir("/e", "/g")
    assert c.drop_all().removed == (("4", "/g/four"),)


_OPS = st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(0, 300), st.binary(max_size=80)),
    st.tuples(st.just("truncate"), st.integers(0, 400)),
    st.tuples(st.just("extend"), st.integers(0, 400)),
    st.tuples(st.just("fsync"), st.just(0)),
), max_size=25)


def _apply(backing: bytearray, plan: FlushPlan) -> None:
    if plan.cut is not None:
        del backing[plan.cut:]
    for offset, data in plan.writes:
        backing.extend(bytes(max(0, offset - len(backing))))
        backing[offset:offset + len(data)] = data
    del backing[plan.size:]
    backing.extend(bytes(plan.size - len(backing)))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), _OPS)
def test_the_cache_reads_like_a_file_and_a_crash_leaves_the_last_fsync(
        initial: bytes, ops: list[tuple[str, object]]) -> None:
    c, backing, seen = UnsyncedCache(), bytearray(initial), bytearray(initial)
    durable = bytes(initial)
    for op in ops:
        if op[0] == "write":
            _, offset, data = op
            assert isinstance(offset, int) and isinstance(data, bytes)
            c.write("k", "/f", offset, data, len(backing))
            if data:
                seen.extend(bytes(max(0, offset - len(seen))))
                seen[offset:offset + len(data)] = data
        elif op[0] in ("truncate", "extend"):
            length = op[1]
            assert isinstance(length, int)
            if op[0] == "truncate":
                c.truncate("k", "/f", length, len(backing))
                del seen[length:]
            else:
                c.extend("k", "/f", length, len(backing))
            seen.extend(bytes(max(0, length - len(seen))))
        else:
            plan = c.plan("k")
            if plan is not None:
                _apply(backing, plan)
            c.flushed("k")
            durable = bytes(backing)
        size = c.size("k")
        assert (len(backing) if size is None else size) == len(seen)
        for offset in range(0, len(seen) + 40, 37):
            want = bytes(seen[offset:offset + 50])
            assert c.read("k", offset, 50, bytes(backing[offset:offset + 50])) == want
    c.drop_all()
    assert bytes(backing) == durable and c.held == 0


# -- the filesystem logic and the control API, without a kernel mount ----------------------


def _me() -> tuple[int, int, int]:
    return os.getuid(), os.getgid(), os.getpid()


@pytest.fixture
def plainfs(tmp_path: Path) -> FaultFs:
    (tmp_path / "src").mkdir()
    return FaultFs(str(tmp_path / "src"), stats=Stats(), max_unsynced=1 << 20, context=_me)


def test_the_operations_keep_unsynced_data_out_of_the_backing_file(plainfs: FaultFs) -> None:
    src = Path(plainfs.root)
    fh = plainfs.create("/f", 0o640, os.O_RDWR)
    plainfs.write("/f", b"a" * 4096, 0, fh)
    plainfs.fsync("/f", 1, fh)
    plainfs.write("/f", b"b" * 1000, 4096, fh)
    plainfs.truncate("/f", 2000, fh)  # also volatile
    assert plainfs.getattr("/f", fh)["st_size"] == 2000
    assert (src / "f").stat().st_size == 4096
    assert plainfs.read("/f", 10_000, 0, fh) == b"a" * 2000
    plainfs.release("/f", fh)
    fresh = plainfs.create("/new", 0o600, os.O_RDWR)
    plainfs.write("/new", b"n", 0, fresh)
    report = plainfs.crash().to_dict()
    assert report["dropped_bytes"] == 1 and report["removed_files"] == ["/new"]
    assert {f["path"] for f in report["dropped_files"]} == {"/f", "/new"}
    assert (src / "f").read_bytes() == b"a" * 4096 and not (src / "new").exists()
    assert oct((src / "f").stat().st_mode & 0o777) == oct(0o640 & ~_umask())
    plainfs.release("/new", fresh)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_sync_writes_and_memory_pressure_make_data_durable(plainfs: FaultFs) -> None:
    src = Path(plainfs.root)
    fh = plainfs.create("/dsync", 0o600, os.O_RDWR | os.O_DSYNC)
    plainfs.write("/dsync", b"d" * 100, 0, fh)  # O_DSYNC: durable when write returns
    plainfs.max_unsynced = 1000
    big = plainfs.create("/big", 0o600, os.O_RDWR)
    plainfs.write("/big", b"x" * 1500, 0, big)  # over the cap: written back, not fsynced
    assert plainfs.stats.events["writeback_bytes"] == 1500
    other = plainfs.create("/other", 0o600, os.O_RDWR)
    plainfs.write("/other", b"o" * 10, 0, other)
    assert plainfs.sync_all() == (1, 10)  # the POST /sync path
    assert plainfs.crash().bytes == 0
    assert [(src / n).stat().st_size for n in ("dsync", "big", "other")] == [100, 1500, 10]
    for name, h in (("/dsync", fh), ("/big", big), ("/other", other)):
        plainfs.release(name, h)


@pytest.fixture
def control(plainfs: FaultFs) -> Iterator[FaultFsClient]:
    server = ControlServer(0, plainfs, plainfs.root, "/mnt/x")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield FaultFsClient(f"http://127.0.0.1:{server.port}")
    server.shutdown()
    server.server_close()


def test_the_control_api_sets_validates_clears_and_counts(control: FaultFsClient,
                                                          plainfs: FaultFs) -> None:
    r = httpx.put(control.base_url + "/faults", json={"fsync_eio": 2}, timeout=2)
    assert r.status_code == 422 and r.json()["field"] == "fsync_eio"
    with pytest.raises(InvalidFaultSpec, match="read_delay_ms"):
        control.set(read_delay_ms="slow")
    state = control.set(fsync_eio=1.0, path_glob="x/*")
    assert state["faults"]["fsync_eio"] == 1.0 and state["active"]
    assert plainfs.spec == FaultSpec(fsync_eio=1.0, path_glob="x/*")
    assert control.clear()["active"] is False and plainfs.spec == NO_FAULTS
    fh = plainfs.create("/m", 0o600, os.O_RDWR)
    plainfs.write("/m", b"1234", 0, fh)
    assert control.state()["unsynced_bytes"] == 4
    assert control.crash()["dropped_bytes"] == 4
    plainfs.release("/m", fh)
    text = control.metrics()
    for line in ('faultfs_ops_total{op="write"} 1', "faultfs_unsynced_bytes 0",
                 "faultfs_crashes_total 1", "faultfs_dropped_bytes_total 4"):
        assert line in text
    assert httpx.post(control.base_url + "/faults", timeout=2).status_code == 405
    assert httpx.get(control.base_url + "/nope", timeout=2).status_code == 404


def test_an_unreachable_control_api_is_an_error_naming_the_url() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    with pytest.raises(ControlUnreachable, match=f"127.0.0.1:{port}/faults"):
        FaultFsClient(f"http://127.0.0.1:{port}", timeout=0.5).state()


def test_missing_fuse_and_bad_directories_are_clear_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(MountFailed, match="not a directory"):
        FaultFsProcess(tmp_path / "nope", tmp_path).start()
    (tmp_path / "src").mkdir()
    with pytest.raises(MountFailed, match="must not contain each other"):
        FaultFsProcess(tmp_path, tmp_path / "src").start()
    monkeypatch.setattr(mount_mod, "FUSE_DEVICE", str(tmp_path / "fuse"))
    with pytest.raises(FuseUnavailable, match=f"{tmp_path / 'fuse'} does not exist"):
        mount_mod.check_fuse()


# -- real mounts ---------------------------------------------------------------------------


def _fuse_problem() -> str | None:
    if os.geteuid() != 0:
        return "needs root (allow_other for the postgres user, fusermount3 as root)"
    if importlib.util.find_spec("mfusepy") is None:
        return "the mfusepy binding is not installed (pip install -e '.[harness]')"
    try:
        mount_mod.check_fuse()
    except FuseUnavailable as exc:
        return str(exc)
    return None


_PROBLEM = _fuse_problem()
needs_fuse = pytest.mark.skipif(_PROBLEM is not None, reason=f"no FUSE here: {_PROBLEM}")


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    # pytest's tmp_path is 0700: the postgres user could not enter it
    path = Path(tempfile.mkdtemp(prefix="faultfs-test-"))
    path.chmod(0o755)
    yield path
    leftover = [m for m in mount_mod.fuse_mounts() if m.startswith(str(path))]
    for m in leftover:
        subprocess.run([mount_mod.FUSERMOUNT, "-u", "-z", m], check=False)
    shutil.rmtree(path, ignore_errors=True)
    assert leftover == [], "mounts left behind"


def _dirs(base: Path, name: str) -> tuple[Path, Path]:
    src, mnt = base / f"{name}-src", base / f"{name}-mnt"
    src.mkdir(mode=0o777)
    mnt.mkdir()
    src.chmod(0o777)
    return src, mnt


Mounted = tuple[FaultFsProcess, Path, Path]  # the process, the backing dir, the mount point


@pytest.fixture(scope="module")
def mounted(base: Path) -> Iterator[Mounted]:
    src, mnt = _dirs(base, "shared")
    ffs = FaultFsProcess(src, mnt, log_path=base / "shared.log").start()
    yield ffs, src, mnt
    assert ffs.stop() == 0
    assert not mount_mod.is_mounted(str(mnt))


@pytest.fixture
def ffs(mounted: Mounted) -> Iterator[FaultFsProcess]:
    yield mounted[0]
    mounted[0].client.clear()


@needs_fuse
def test_the_mount_passes_everything_through(mounted: Mounted) -> None:
    _, src, mnt = mounted
    (mnt / "d").mkdir()
    (mnt / "d" / "a").write_bytes(b"hello")
    os.rename(mnt / "d" / "a", mnt / "d" / "b")
    os.link(mnt / "d" / "b", mnt / "d" / "hard")
    os.symlink("b", mnt / "d" / "sym")
    os.chmod(mnt / "d" / "b", 0o600)
    os.utime(mnt / "d" / "b", ns=(1_000_000_000, 2_000_000_000))
    with open(mnt / "d" / "b", "r+b") as f:
        f.seek(3)
        f.write(b"LO!")
        f.truncate(5)
        os.fsync(f.fileno())
    with os.scandir(mnt / "d") as seen, os.scandir(src / "d") as real:
        assert {e.name: e.inode() for e in seen} == {e.name: e.inode() for e in real}
    assert sorted(os.listdir(mnt / "d")) == ["b", "hard", "sym"]
    st, back = os.stat(mnt / "d" / "b"), os.stat(src / "d" / "b")
    assert (st.st_ino, st.st_nlink, st.st_mode, st.st_mtime_ns) == (
        back.st_ino, 2, back.st_mode, 2_000_000_000)
    assert (src / "d" / "b").read_bytes() == (mnt / "d" / "hard").read_bytes() == b"helLO"
    assert os.readlink(mnt / "d" / "sym") == "b" and (mnt / "d" / "sym").read_bytes() == b"helLO"
    os.unlink(mnt / "d" / "hard")
    os.unlink(mnt / "d" / "sym")
    os.unlink(mnt / "d" / "b")
    os.rmdir(mnt / "d")
    assert os.listdir(src) == [] and os.statvfs(mnt).f_bsize > 0


@needs_fuse
def test_the_postgres_user_writes_as_itself(mounted: Mounted) -> None:
    _, src, mnt = mounted
    pg = pwd.getpwnam("postgres")
    (mnt / "pg").mkdir(mode=0o700)
    os.chown(mnt / "pg", pg.pw_uid, pg.pw_gid)
    r = subprocess.run(["runuser", "-u", "postgres", "--", "sh", "-c",
                        f"mkdir {mnt}/pg/sub && echo x > {mnt}/pg/sub/f && cat {mnt}/pg/sub/f"],
                       check=False, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == "x\n", r.stderr
    assert (src / "pg" / "sub" / "f").stat().st_uid == pg.pw_uid  # allow_other + ownership
    denied = subprocess.run(["runuser", "-u", "nobody", "--", "ls", f"{mnt}/pg"],
                            check=False, capture_output=True, timeout=30)
    assert denied.returncode != 0  # default_permissions: the kernel checks the modes
    shutil.rmtree(mnt / "pg")


def _fsync_seconds(path: Path, n: int = 3) -> float:
    times = []
    with open(path, "wb") as f:
        for _ in range(n):
            f.write(b"w" * 8192)
            f.flush()
            t = time.perf_counter()
            os.fsync(f.fileno())
            times.append(time.perf_counter() - t)
    return statistics.median(times)


@needs_fuse
def test_fsync_latency_is_injected(ffs: FaultFsProcess, mounted: Mounted) -> None:
    mnt = mounted[2]
    before = _fsync_seconds(mnt / "lat")
    ffs.client.set(fsync_delay_ms=200)
    added = _fsync_seconds(mnt / "lat") - before
    assert 0.17 < added < 1.0, added
    metrics = ffs.client.metrics()
    assert 'faultfs_injected_delays_total{op="fsync"} 3' in metrics


@needs_fuse
def test_eio_on_read_and_enospc_on_write_and_create(ffs: FaultFsProcess, mounted: Mounted) -> None:
    mnt = mounted[2]
    (mnt / "data").write_bytes(b"z" * 100)
    ffs.client.set(read_eio=1.0)
    with pytest.raises(OSError) as info:
        (mnt / "data").read_bytes()
    assert info.value.errno == errno.EIO
    ffs.client.set(enospc=1.0)
    assert (mnt / "data").read_bytes() == b"z" * 100  # reads are fine on a full disk
    with open(mnt / "data", "r+b", buffering=0) as f, pytest.raises(OSError) as info:
        f.write(b"more")
    assert info.value.errno == errno.ENOSPC
    with pytest.raises(OSError) as info:
        (mnt / "fresh").write_bytes(b"")
    assert info.value.errno == errno.ENOSPC and not (mnt / "fresh").exists()
    ffs.client.set(write_eio=1.0, path_glob="wal/*")  # only the matching paths
    (mnt / "wal").mkdir()
    (mnt / "data").write_bytes(b"ok")
    with pytest.raises(OSError) as info:
        (mnt / "wal" / "seg").write_bytes(b"x")
    assert info.value.errno == errno.EIO
    ffs.client.clear()  # everything works again
    (mnt / "wal" / "seg").write_bytes(b"x")
    assert (mnt / "wal" / "seg").read_bytes() == b"x"
    assert 'faultfs_injected_errors_total{op="write",errno="ENOSPC"} 1' in ffs.client.metrics()


@needs_fuse
def test_power_loss_drops_exactly_the_unsynced_writes(ffs: FaultFsProcess,
                                                      mounted: Mounted) -> None:
    src, mnt = mounted[1], mounted[2]
    ffs.client.sync()  # what earlier tests left unsynced is not this test's business
    (mnt / "old").write_bytes(b"o" * 4096)
    with open(mnt / "kept", "wb") as f:
        f.write(b"k" * 10_000)
        f.flush()
        os.fsync(f.fileno())
        f.write(b"u" * 5_000)  # never fsynced
    with open(mnt / "old", "r+b") as f:
        os.fsync(f.fileno())
        f.truncate(100)  # an unsynced truncation
    with open(mnt / "made", "wb") as f:  # created and fsynced: survives
        f.write(b"m")
        f.flush()
        os.fsync(f.fileno())
    (mnt / "volatile").write_bytes(b"v" * 7)  # created, never fsynced: vanishes
    assert os.path.getsize(mnt / "kept") == 15_000 and os.path.getsize(mnt / "old") == 100
    assert ffs.client.state()["unsynced_bytes"] == 5_007
    report = ffs.client.crash()
    assert report["dropped_bytes"] == 5_007
    assert {(f["path"], f["bytes"], f["truncated"]) for f in report["dropped_files"]} == {
        ("/kept", 5_000, False), ("/old", 0, True), ("/volatile", 7, False)}
    assert report["removed_files"] == ["/volatile"]
    # the mount shows the durable state at once (the kernel's cached sizes are invalidated)
    assert [os.stat(mnt / n).st_size for n in ("kept", "old", "made")] == [10_000, 4096, 1]
    for root in (mnt, src):
        assert (root / "kept").read_bytes() == b"k" * 10_000
        assert (root / "old").read_bytes() == b"o" * 4096
        assert (root / "made").read_bytes() == b"m"
        assert not (root / "volatile").exists()
    assert ffs.client.state()["unsynced_bytes"] == 0


def _owned_process(base: Path, name: str) -> tuple[FaultFsProcess, Path, Path]:
    src, mnt = _dirs(base, name)
    return FaultFsProcess(src, mnt, log_path=base / f"{name}.log").start(), src, mnt


@needs_fuse
def test_sigterm_writes_back_and_unmounts_without_waiting_for_delays(base: Path) -> None:
    ffs, src, mnt = _owned_process(base, "term")
    try:
        (mnt / "f").write_bytes(b"t" * 300)
        ffs.client.set(fsync_delay_ms=60_000)
        stuck = open(mnt / "g", "wb")
        waiter = threading.Thread(target=lambda: _swallow(os.fsync, stuck.fileno()), daemon=True)
        waiter.start()  # an fsync sleeping in the filesystem
        time.sleep(0.3)
        assert ffs.proc is not None
        t = time.monotonic()
        ffs.proc.send_signal(signal.SIGTERM)
        assert ffs.proc.wait(10) == 0 and time.monotonic() - t < 8
        waiter.join(5)
        assert not waiter.is_alive() and not mount_mod.is_mounted(str(mnt))
        assert (src / "f").read_bytes() == b"t" * 300  # a clean unmount syncs, like umount
        _swallow(stuck.close)
    finally:
        ffs.stop()


def _swallow(fn: object, *args: object) -> None:
    try:
        fn(*args)  # type: ignore[operator]
    except OSError:
        pass  # the filesystem went away under it: expected


@needs_fuse
def test_a_killed_filesystem_leaves_no_mount_and_a_stale_one_is_cleared(base: Path) -> None:
    ffs, src, mnt = _owned_process(base, "kill")
    try:
        (mnt / "f").write_bytes(b"lost")
        ffs.kill()  # SIGKILL: the unsynced data dies with the process; auto_unmount unmounts
        # (asynchronously: its helper notices the closed FUSE connection; slower on a busy
        # machine, where 5 s was once not enough)
        deadline = time.monotonic() + 15
        while mount_mod.is_mounted(str(mnt)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not mount_mod.is_mounted(str(mnt)) and (src / "f").read_bytes() == b""
        # kill the auto_unmount helper first, then the server: a stale mount stays behind
        again = FaultFsProcess(src, mnt, log_path=base / "kill2.log").start()
        assert again.proc is not None
        helpers = procs.descendants(again.proc.pid)
        procs.signal_pids(helpers, signal.SIGKILL)
        procs.wait_gone(helpers, 5)
        again.kill()
        assert mount_mod.is_mounted(str(mnt))
        with pytest.raises(OSError) as info:
            os.statvfs(mnt)
        assert info.value.errno == errno.ENOTCONN
        third = FaultFsProcess(src, mnt, log_path=base / "kill3.log").start()  # clears it
        assert (mnt / "f").read_bytes() == b""
        assert third.stop() == 0
    finally:
        for p in (ffs, *(locals().get(n) for n in ("again", "third"))):
            if p is not None:
                p.stop()
    assert not mount_mod.is_mounted(str(mnt))


@needs_fuse
def test_a_failed_start_says_why(base: Path) -> None:
    src, mnt = _dirs(base, "busy")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ffs = FaultFsProcess(src, mnt, port=taken.getsockname()[1], log_path=base / "busy.log")
        with pytest.raises(MountFailed, match="Address already in use"):
            ffs.start()
    assert not mount_mod.is_mounted(str(mnt))

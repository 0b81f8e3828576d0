"""The passthrough half of the filesystem: state shared with the data path (fs.py), fault
injection, and the metadata operations, which go straight to the backing directory (not
volatile: a crash keeps them). Written against mfusepy's path-based high-level API."""

from __future__ import annotations

import os
import random
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

from environments.local.faultfs.cache import UnsyncedCache
from environments.local.faultfs.spec import NO_FAULTS, NOTHING, FaultSpec, decide
from environments.local.faultfs.stats import Stats

Key = tuple[int, int]  # (st_dev, st_ino) of the backing file
# mfusepy folds a timespec into tv_sec * 1e9 + tv_nsec, so UTIME_NOW / UTIME_OMIT (tv_nsec
# 2**30 - 1 / 2**30 - 2) arrive as these remainders; a real timestamp hits them 2 in 1e9 times.
_NOW_REM, _OMIT_REM = ((1 << 30) - 1) % 10**9, ((1 << 30) - 2) % 10**9
_UNSET_ID = 0xFFFFFFFF  # chown's "-1" as libfuse passes it (unsigned)


def key_of(st: os.stat_result) -> Key:
    return (st.st_dev, st.st_ino)


class Passthrough:
    use_ns = True  # mfusepy: timestamps in nanoseconds

    def __init__(self, source: str, *, stats: Stats, max_unsynced: int,
                 context: Callable[[], tuple[int, int, int]]) -> None:
        self.root = os.path.realpath(source)
        self.stats = stats
        self.max_unsynced = max_unsynced
        self._context = context  # (uid, gid, pid) of the calling process
        self.cache = UnsyncedCache()
        self.spec: FaultSpec = NO_FAULTS
        self._rng = random.Random()
        self.stopping = threading.Event()  # wakes injected delays at shutdown
        self.on_init: Callable[[], None] | None = None
        # drops the kernel's cached attributes of a path (set once mounted)
        self.invalidate: Callable[[str], None] = lambda path: None
        self._cache_lock = threading.Lock()  # guards self.cache; held only for memory work
        self._guard = threading.Lock()
        self._file_locks: dict[Key, threading.Lock] = {}  # one file's I/O + cache, in order
        self._handles: dict[int, tuple[Key, bool]] = {}  # fh -> (key, opened O_SYNC/O_DSYNC)

    # -- faults ----------------------------------------------------------------------------
    def set_faults(self, spec: FaultSpec) -> None:
        if spec.seed is not None:
            self._rng = random.Random(spec.seed)
        self.spec = spec

    def _inject(self, op: str, path: str | None) -> None:
        spec = self.spec
        if not spec.active:
            return
        d = decide(spec, op, path or "", self._rng.random(), self._rng.random())
        if d is NOTHING:
            return
        self.stats.injected(op, d.delay_s, d.errno)
        if d.delay_s:
            self.stopping.wait(d.delay_s)
        if d.errno is not None:
            raise OSError(d.errno, os.strerror(d.errno))

    # -- helpers ---------------------------------------------------------------------------
    def _p(self, path: str) -> str:
        return self.root + path

    def _lock(self, key: Key) -> threading.Lock:
        with self._guard:
            lock = self._file_locks.get(key)
            if lock is None:
                lock = self._file_locks[key] = threading.Lock()
            return lock

    def _owner(self, path: str) -> tuple[int, int]:
        uid, gid, _ = self._context()
        parent = os.lstat(os.path.dirname(self._p(path)))
        return uid, parent.st_gid if parent.st_mode & stat.S_ISGID else gid

    # -- lifecycle -------------------------------------------------------------------------
    def init(self, path: str) -> None:
        if self.on_init is not None:
            self.on_init()

    # -- metadata --------------------------------------------------------------------------
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        self.stats.op("getattr")
        st = os.fstat(fh) if fh is not None else os.lstat(self._p(path))
        size = st.st_size
        if stat.S_ISREG(st.st_mode) and self.cache.files:
            with self._cache_lock:
                cached = self.cache.size(key_of(st))
            size = size if cached is None else cached
        return {"st_mode": st.st_mode, "st_ino": st.st_ino, "st_nlink": st.st_nlink,
                "st_uid": st.st_uid, "st_gid": st.st_gid, "st_size": size,
                "st_blocks": st.st_blocks, "st_blksize": st.st_blksize, "st_rdev": st.st_rdev,
                "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns,
                "st_ctime": st.st_ctime_ns}

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        self.stats.op("readdir")
        here = os.lstat(self._p(path))
        # st_ino must be set: mfusepy sends 0 for bare names under use_ino, and readdir(3)
        # skips entries with d_ino 0
        out = [(".", {"st_ino": here.st_ino, "st_mode": here.st_mode}, 0),
               ("..", {"st_ino": 1, "st_mode": stat.S_IFDIR}, 0)]
        with os.scandir(self._p(path)) as entries:
            for e in entries:
                if e.is_symlink():
                    mode = stat.S_IFLNK
                elif e.is_dir(follow_symlinks=False):
                    mode = stat.S_IFDIR
                elif e.is_file(follow_symlinks=False):
                    mode = stat.S_IFREG
                else:
                    mode = e.stat(follow_symlinks=False).st_mode
                out.append((e.name, {"st_ino": e.inode(), "st_mode": mode}, 0))
        return out

    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self._p(path))
        return {k: getattr(sv, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree",
                                            "f_bavail", "f_files", "f_ffree", "f_favail",
                                            "f_flag", "f_namemax")}

    def chmod(self, path: str, mode: int) -> None:
        self.stats.op("chmod")
        os.chmod(self._p(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        self.stats.op("chown")
        os.lchown(self._p(path), -1 if uid == _UNSET_ID else uid, -1 if gid == _UNSET_ID else gid)

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> None:
        self.stats.op("utimens")
        p = self._p(path)
        if times is None:
            os.utime(p, follow_symlinks=False)
            return
        st, now = os.lstat(p), time.time_ns()
        current = (st.st_atime_ns, st.st_mtime_ns)
        ns = tuple(now if t % 10**9 == _NOW_REM else cur if t % 10**9 == _OMIT_REM else t
                   for t, cur in zip(times, current, strict=True))
        os.utime(p, ns=ns, follow_symlinks=False)

    def readlink(self, path: str) -> str:
        return os.readlink(self._p(path))

    def symlink(self, target: str, source: str) -> None:
        self.stats.op("symlink")
        uid, gid = self._owner(target)
        os.symlink(source, self._p(target))
        os.lchown(self._p(target), uid, gid)

    def mkdir(self, path: str, mode: int) -> None:
        self.stats.op("mkdir")
        self._inject("create", path)
        uid, gid = self._owner(path)
        os.mkdir(self._p(path), mode)
        os.lchown(self._p(path), uid, gid)

    def rmdir(self, path: str) -> None:
        self.stats.op("rmdir")
        os.rmdir(self._p(path))

    def unlink(self, path: str) -> None:
        self.stats.op("unlink")
        st = os.lstat(self._p(path))
        os.unlink(self._p(path))
        if stat.S_ISREG(st.st_mode) and st.st_nlink <= 1:
            with self._cache_lock:
                self.cache.forget(key_of(st))
            with self._guard:  # the inode number may be reused: start afresh
                self._file_locks.pop(key_of(st), None)

    def rename(self, old: str, new: str) -> None:
        self.stats.op("rename")
        src = os.lstat(self._p(old))
        try:
            dst: os.stat_result | None = os.lstat(self._p(new))
        except FileNotFoundError:
            dst = None
        os.rename(self._p(old), self._p(new))
        with self._cache_lock:
            if stat.S_ISDIR(src.st_mode):
                self.cache.renamed_dir(old, new)
            else:
                self.cache.renamed(key_of(src), new)
            if (dst is not None and stat.S_ISREG(dst.st_mode) and dst.st_nlink <= 1
                    and key_of(dst) != key_of(src)):
                self.cache.forget(key_of(dst))

    def link(self, target: str, source: str) -> None:
        self.stats.op("link")
        os.link(self._p(source), self._p(target))
        with self._cache_lock:
            self.cache.durable(key_of(os.lstat(self._p(target))))

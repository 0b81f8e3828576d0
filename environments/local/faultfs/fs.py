"""The FUSE filesystem: the passthrough (passthrough.py) plus the data path, where file data,
size changes (truncate, fallocate) and the existence of new regular files stay volatile in the
unsynced cache (cache.py) until fsync. mfusepy's path-based high-level API (libfuse3); mfusepy
itself is imported by mount.py only, so this module loads anywhere."""

from __future__ import annotations

import errno
import os
import stat

from environments.local.faultfs.cache import CrashReport, FlushPlan
from environments.local.faultfs.passthrough import Key, Passthrough, key_of

_DROP_FLAGS = (os.O_ACCMODE | os.O_DIRECT | os.O_APPEND | os.O_TRUNC | os.O_CREAT | os.O_EXCL
               | os.O_SYNC | os.O_DSYNC)


def _pwrite_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def apply_plan(fd: int, plan: FlushPlan) -> None:
    if plan.cut is not None:
        os.ftruncate(fd, plan.cut)
    for offset, data in plan.writes:
        _pwrite_all(fd, data, offset)
    if os.fstat(fd).st_size != plan.size:
        os.ftruncate(fd, plan.size)


class FaultFs(Passthrough):
    def _flush(self, key: Key, fd: int, datasync: bool | None) -> int:
        """Write the file's volatile state to the backing file, then fsync unless None.
        Caller holds the file's lock."""
        with self._cache_lock:
            plan = self.cache.plan(key)
        if plan is not None:
            apply_plan(fd, plan)
        if datasync is not None:
            (os.fdatasync if datasync else os.fsync)(fd)
        with self._cache_lock:
            self.cache.flushed(key)
            if datasync is not None:
                self.cache.durable(key)
        return 0 if plan is None else plan.nbytes

    # -- files -----------------------------------------------------------------------------
    def _register(self, fd: int, flags: int) -> Key:
        key = key_of(os.fstat(fd))
        self._handles[fd] = (key, bool(flags & (os.O_SYNC | os.O_DSYNC)))
        return key

    def _open_backing(self, path: str, flags: int, extra: int = 0, mode: int = 0o600) -> int:
        # read-write even for read-only opens: fsync through any handle must be able to write
        # back the cache. O_DIRECT (alignment), O_APPEND (pwrite would ignore offsets) and
        # O_TRUNC (volatile here) are handled above the backing file.
        base = (flags & ~_DROP_FLAGS) | extra
        try:
            return os.open(self._p(path), base | os.O_RDWR, mode)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ETXTBSY):
                raise
            return os.open(self._p(path), base | (flags & os.O_ACCMODE), mode)

    def open(self, path: str, flags: int) -> int:
        self.stats.op("open")
        fd = self._open_backing(path, flags)
        key = self._register(fd, flags)
        if flags & os.O_TRUNC:  # atomic_o_trunc: the truncation comes with the open
            self._truncate(key, path, 0, os.fstat(fd).st_size)
        return fd

    def create(self, path: str, mode: int, flags: int = os.O_RDWR) -> int:
        self.stats.op("create")
        self._inject("create", path)
        uid, gid = self._owner(path)
        try:
            fd = self._open_backing(path, flags, os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            if flags & os.O_EXCL:
                raise
            return self.open(path, flags)
        os.fchown(fd, uid, gid)
        key = self._register(fd, flags)
        with self._cache_lock:
            self.cache.created(key, path)
        return fd

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self.stats.op("read")
        self._inject("read", path)
        key = self._handles[fh][0]
        if not self.cache.has(key):
            return os.pread(fh, size, offset)
        with self._lock(key):
            backing = os.pread(fh, size, offset)
            with self._cache_lock:
                return self.cache.read(key, offset, size, backing)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self.stats.op("write")
        key, sync = self._handles[fh]
        self._inject("write", path)
        if sync:  # O_SYNC/O_DSYNC: each write is also a flush
            self._inject("fsync", path)
        with self._lock(key):
            size = 0 if self.cache.has(key) else os.fstat(fh).st_size
            with self._cache_lock:
                self.cache.write(key, path, offset, data, size)
                over = self.cache.held > self.max_unsynced
            if sync:
                self._flush(key, fh, datasync=True)
            elif over:  # the kernel would write back under memory pressure too
                self.stats.event("writeback_bytes", self._flush(key, fh, datasync=None))
        return len(data)

    def _truncate(self, key: Key, path: str, length: int, backing_size: int) -> None:
        with self._lock(key), self._cache_lock:
            self.cache.truncate(key, path, length, backing_size)

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        self.stats.op("truncate")
        st = os.fstat(fh) if fh is not None else os.lstat(self._p(path))
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        self._truncate(key_of(st), path, length, st.st_size)

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> None:
        self.stats.op("fallocate")
        if mode & ~1:  # only plain and FALLOC_FL_KEEP_SIZE (1)
            raise OSError(errno.EOPNOTSUPP, "fallocate mode not supported")
        self._inject("create", path)
        key = self._handles[fh][0]
        if not mode:
            with self._lock(key):
                backing = os.fstat(fh).st_size
                with self._cache_lock:
                    self.cache.extend(key, path, offset + size, backing)

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        self.stats.op("fsync")
        self._inject("fsync", path)
        key = self._handles[fh][0]
        with self._lock(key):
            self._flush(key, fh, datasync=bool(datasync))

    def fsyncdir(self, path: str, datasync: int, fh: int) -> None:
        self.stats.op("fsyncdir")
        self._inject("fsync", path)
        fd = os.open(self._p(path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        with self._cache_lock:
            self.cache.dir_synced(path)

    def flush(self, path: str, fh: int) -> None:
        return None  # close(2) promises no durability

    def release(self, path: str, fh: int) -> None:
        self._handles.pop(fh, None)
        os.close(fh)

    # -- control ---------------------------------------------------------------------------
    def crash(self) -> CrashReport:
        """Power loss: every volatile write, truncation and creation is gone."""
        with self._cache_lock:
            report = self.cache.drop_all()
        for key, path in report.removed:
            try:
                if key_of(os.lstat(self._p(path))) == key:
                    os.unlink(self._p(path))
            except FileNotFoundError:
                pass
        # the kernel caches sizes (attr_timeout): readers must see the durable ones at once
        for path in {f.path for f in report.files} | {path for _, path in report.removed}:
            self.invalidate(path)
        self.stats.event("crashes")
        self.stats.event("dropped_bytes", report.bytes)
        return report

    def sync_all(self) -> tuple[int, int]:
        """sync(2) (which FUSE never sees): make every file durable. Returns (files, bytes)."""
        files = nbytes = 0
        with self._cache_lock:
            pending = [(key, self.cache.path(key)) for key in self.cache.pending_keys()]
        for key, path in pending:
            with self._lock(key):
                try:
                    fd = os.open(self._p(path), os.O_WRONLY)
                except FileNotFoundError:
                    continue
                try:
                    if key_of(os.fstat(fd)) == key:
                        nbytes += self._flush(key, fd, datasync=False)
                        files += 1
                finally:
                    os.close(fd)
        with self._cache_lock:
            self.cache.dir_synced_all()
        return files, nbytes

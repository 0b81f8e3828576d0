"""The unsynced-write cache (LazyFS's power-loss model) as a pure data structure: no I/O.

Per file (keyed by the backing inode, so renames and hard links keep their state) it holds
what the backing file does not have yet: written extents (coalesced, non-overlapping), the
logical size, and the lowest size the file was truncated to since its last flush (backing
bytes at or past that offset are gone for readers). ``plan`` says what to apply to the backing
file to make it durable, ``drop_all`` forgets everything, as a power loss would. Files created
and not yet made durable (fsync of the file or of its directory, or a rename/link of it) are
listed so that a crash can remove them. The caller serialises access.
"""

from __future__ import annotations

import os
from bisect import bisect_left, bisect_right
from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass
class _File:
    path: str
    size: int
    cut: int | None = None
    starts: list[int] = field(default_factory=list)
    chunks: list[bytearray] = field(default_factory=list)
    held: int = 0  # bytes in chunks


@dataclass(frozen=True)
class FlushPlan:
    """Apply in order: ftruncate(cut) if set, pwrite each extent, then make the size ``size``."""

    cut: int | None
    writes: tuple[tuple[int, bytes | bytearray], ...]
    size: int

    @property
    def nbytes(self) -> int:
        return sum(len(data) for _, data in self.writes)


@dataclass(frozen=True)
class DroppedFile:
    path: str
    bytes: int
    truncated: bool  # an unsynced truncation was undone


@dataclass(frozen=True)
class CrashReport:
    files: tuple[DroppedFile, ...]
    removed: tuple[tuple[Hashable, str], ...]  # (key, path) of creations never made durable

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def to_dict(self) -> dict[str, object]:
        return {"dropped_bytes": self.bytes,
                "dropped_files": [{"path": f.path, "bytes": f.bytes, "truncated": f.truncated}
                                  for f in self.files],
                "removed_files": [path for _, path in self.removed]}


class UnsyncedCache:
    def __init__(self) -> None:
        self._files: dict[Hashable, _File] = {}
        self._created: dict[Hashable, str] = {}
        self.held = 0  # unsynced data bytes over all files

    # -- state ---------------------------------------------------------------------------
    def has(self, key: Hashable) -> bool:
        return key in self._files

    def size(self, key: Hashable) -> int | None:
        f = self._files.get(key)
        return None if f is None else f.size

    @property
    def files(self) -> int:
        return len(self._files)

    def pending_keys(self) -> list[Hashable]:
        return list(self._files)

    def path(self, key: Hashable) -> str:
        return self._files[key].path

    def _file(self, key: Hashable, path: str, backing_size: int) -> _File:
        f = self._files.get(key)
        if f is None:
            f = self._files[key] = _File(path=path, size=backing_size)
        else:
            f.path = path
        return f

    # -- changes -------------------------------------------------------------------------
    def write(self, key: Hashable, path: str, offset: int, data: bytes, backing_size: int) -> None:
        f = self._file(key, path, backing_size)
        if not data:
            return
        end = offset + len(data)
        starts, chunks = f.starts, f.chunks
        lo = bisect_right(starts, offset) - 1
        if lo < 0 or starts[lo] + len(chunks[lo]) < offset:
            lo += 1
        hi = bisect_right(starts, end)  # extents lo..hi-1 overlap or touch [offset, end]
        if lo == hi:
            starts.insert(lo, offset)
            chunks.insert(lo, bytearray(data))
            delta = len(data)
        elif hi - lo == 1 and starts[lo] <= offset:
            # the common case (appends, page rewrites): grow or patch one extent in place
            chunk = chunks[lo]
            old = len(chunk)
            rel = offset - starts[lo]
            chunk[rel:rel + len(data)] = data
            delta = len(chunk) - old
        else:
            new_start = min(starts[lo], offset)
            new_end = max(end, starts[hi - 1] + len(chunks[hi - 1]))
            merged = bytearray(new_end - new_start)
            old = 0
            for s, c in zip(starts[lo:hi], chunks[lo:hi], strict=True):
                merged[s - new_start:s - new_start + len(c)] = c
                old += len(c)
            merged[offset - new_start:end - new_start] = data
            starts[lo:hi] = [new_start]
            chunks[lo:hi] = [merged]
            delta = len(merged) - old
        f.held += delta
        self.held += delta
        f.size = max(f.size, end)

    def truncate(self, key: Hashable, path: str, length: int, backing_size: int) -> None:
        f = self._file(key, path, backing_size)
        if length < f.size:
            i = bisect_left(f.starts, length)
            gone = sum(len(c) for c in f.chunks[i:])
            del f.starts[i:], f.chunks[i:]
            if f.starts and f.starts[-1] + len(f.chunks[-1]) > length:
                last = f.chunks[-1]
                keep = length - f.starts[-1]
                gone += len(last) - keep
                del last[keep:]
            f.held -= gone
            self.held -= gone
            f.cut = length if f.cut is None else min(f.cut, length)
        f.size = length

    def extend(self, key: Hashable, path: str, length: int, backing_size: int) -> None:
        """fallocate without KEEP_SIZE: the size grows, the content reads as zeros."""
        f = self._file(key, path, backing_size)
        f.size = max(f.size, length)

    def read(self, key: Hashable, offset: int, length: int, backing: bytes) -> bytes:
        """What a reader sees at [offset, offset+length), given what the backing file holds
        there (``backing``, possibly short at its end of file)."""
        f = self._files.get(key)
        if f is None:
            return backing[:length]
        end = min(offset + length, f.size)
        if end <= offset:
            return b""
        out = bytearray(end - offset)
        valid = len(backing) if f.cut is None else min(len(backing), f.cut - offset)
        valid = max(0, min(valid, end - offset))
        out[:valid] = backing[:valid]
        i = max(0, bisect_right(f.starts, offset) - 1)
        while i < len(f.starts) and f.starts[i] < end:
            s, c = f.starts[i], f.chunks[i]
            lo, hi = max(s, offset), min(s + len(c), end)
            if hi > lo:
                out[lo - offset:hi - offset] = c[lo - s:hi - s]
            i += 1
        return bytes(out)

    # -- durability ----------------------------------------------------------------------
    def plan(self, key: Hashable) -> FlushPlan | None:
        f = self._files.get(key)
        if f is None:
            return None
        return FlushPlan(cut=f.cut, writes=tuple(zip(f.starts, f.chunks, strict=True)),
                         size=f.size)

    def flushed(self, key: Hashable) -> None:
        """The plan was applied to the backing file: nothing of it is volatile any more."""
        f = self._files.pop(key, None)
        if f is not None:
            self.held -= f.held

    def created(self, key: Hashable, path: str) -> None:
        self._created[key] = path

    def durable(self, key: Hashable) -> None:
        """The file's existence survives a crash (fsync of it, rename, link)."""
        self._created.pop(key, None)

    def renamed(self, key: Hashable, new_path: str) -> None:
        self.durable(key)
        f = self._files.get(key)
        if f is not None:
            f.path = new_path

    def renamed_dir(self, old: str, new: str) -> None:
        """Paths under a renamed directory move with it (reports, crash-time removal)."""
        prefix = old.rstrip("/") + "/"

        def moved(path: str) -> str:
            return new.rstrip("/") + "/" + path[len(prefix):] if path.startswith(prefix) else path

        for key, path in self._created.items():
            self._created[key] = moved(path)
        for f in self._files.values():
            f.path = moved(f.path)

    def dir_synced_all(self) -> None:
        self._created.clear()

    def dir_synced(self, dir_path: str) -> None:
        parent = dir_path.rstrip("/") or "/"
        for key, path in list(self._created.items()):
            if (os.path.dirname(path) or "/") == parent:
                del self._created[key]

    def forget(self, key: Hashable) -> None:
        """The last name of the file is gone: its volatile state with it."""
        self.flushed(key)
        self._created.pop(key, None)

    def drop_all(self) -> CrashReport:
        report = CrashReport(
            files=tuple(DroppedFile(f.path, f.held, f.cut is not None)
                        for f in self._files.values()),
            removed=tuple(self._created.items()))
        self._files.clear()
        self._created.clear()
        self.held = 0
        return report

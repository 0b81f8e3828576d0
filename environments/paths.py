"""Can this process write where it is about to write? Asked before anything starts (`gameday
run`'s ``--runs-dir`` and home, `gameday env up`'s state directory), so a bad path is one line,
not a traceback after the environment came up and the game-day lock was taken."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["unwritable"]


def unwritable(path: Path, what: str) -> str | None:
    """Why ``path`` cannot be, or be made, a directory this process writes in; None when it
    can. Creates nothing (``--dry-run`` changes nothing): the nearest existing ancestor must be
    a directory that is writable, on a file system that is not mounted read-only."""
    probe = path.absolute()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        where = "is" if probe == path.absolute() else f"is below {probe}, which is"
        return f"{what} {path} {where} not a directory"
    # os.access also says no on a read-only mount, even to root, who ignores the mode bits
    if not os.access(probe, os.W_OK | os.X_OK):
        why = ("a read-only file system" if os.statvfs(probe).f_flag & os.ST_RDONLY
               else "no write permission")
        where = "" if probe == path.absolute() else f" (its nearest existing parent {probe})"
        return f"{what} {path} is not writable{where}: {why}"
    return None

"""Database directories of local environments that no longer exist.

As root, an environment whose state directory the postgres user cannot enter (a clone under
root's 0700 home) keeps its two database members in a directory of its own under
/var/lib/gameday (components.db_root_for): 140-250 MB. `gameday env down --purge` deletes it.
A run killed before that, or a state directory deleted by hand (a removed clone, a test's
temporary home), left it behind for good. Each such directory records the state directory it
belongs to (components.OWNER_FILE); `env up` removes the ones whose state directory is gone and
that no process of that environment still runs on. A directory without that record (made
before it existed, or not ours) is left alone.

A state directory deleted and made again at the same path (a test session killed, then run
again with the same ``--basetemp``) maps to the same database directory, whose passwords went
with the deleted ``env.json``: PostgreSQL would refuse the new ones ("password authentication
failed"). ``remove_stale`` removes that one when ``env up`` finds no ``env.json``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from environments.local import procs
from environments.local.errors import EnvError
from environments.local.pg_files import OWNER_FILE, SYSTEM_DB_ROOT


def _owner(db_root: Path) -> Path | None:
    """The state directory a database directory records, None if it records none."""
    try:
        return Path((db_root / OWNER_FILE).read_text().strip())
    except OSError:
        return None  # none there, or not one of ours


def orphans(root: Path = SYSTEM_DB_ROOT) -> list[tuple[Path, Path]]:
    """(database directory, the state directory it belonged to) for each orphan under root."""
    found = []
    for db_root in sorted(root.iterdir()) if root.is_dir() else []:
        owner = _owner(db_root)
        if (owner is None or not owner.is_absolute() or owner.exists()
                or procs.marked_processes(owner)):
            continue
        found.append((db_root, owner))
    return found


def remove_orphans(root: Path = SYSTEM_DB_ROOT,
                   say: Callable[[str], object] = lambda _msg: None) -> list[Path]:
    """Delete every orphan under root, each named through ``say``; the ones deleted."""
    from environments.local.storage import detach_stale_mounts

    removed = []
    for db_root, owner in orphans(root):
        try:  # a killed storage layer's dead mounts (--storage-faults) go first
            detach_stale_mounts(db_root)
        except EnvError as exc:
            say(f"left {db_root} alone: {exc}")
            continue
        shutil.rmtree(db_root, ignore_errors=True)
        if db_root.exists():  # e.g. another user's: said, never claimed
            say(f"could not remove {db_root}, the database of an environment whose state "
                f"directory {owner} no longer exists")
            continue
        say(f"removed {db_root}: the database of an environment whose state directory "
            f"{owner} no longer exists")
        removed.append(db_root)
    return removed


def remove_stale(db_root: Path, state_dir: Path,
                 say: Callable[[str], object] = lambda _msg: None) -> bool:
    """Delete ``db_root`` if it is a database directory of ``state_dir`` (its owner record says
    so) whose ``env.json`` is gone; the caller knows there is none. Refused while a process of
    that environment runs. True if removed."""
    if _owner(db_root) != state_dir.resolve():
        return False
    running = procs.marked_processes(state_dir)
    if running:
        raise EnvError(f"{db_root} holds the database of {state_dir}, whose env.json is gone, "
                       f"and processes of it still run ({sorted(set(running))}): stop them first")
    from environments.local.storage import detach_stale_mounts

    detach_stale_mounts(db_root)
    shutil.rmtree(db_root, ignore_errors=True)
    if db_root.exists():
        raise EnvError(f"could not remove {db_root}: the database of an earlier environment at "
                       f"{state_dir} whose env.json (and so its passwords) is gone")
    say(f"removed {db_root}: the database of an earlier environment at {state_dir} whose "
        "env.json (and so its passwords) is gone")
    return True

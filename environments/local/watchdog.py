"""Tie a process group's life to an owner process: ``python -m environments.local.watchdog --owner PID
--pgid PGID``. When the owner dies (a test session killed by a timeout, say) the group is killed
(SIGTERM, then SIGKILL); the watchdog exits on its own once the group is gone. Standard library
only: it must start fast and depend on nothing that could be half-installed.

``watch(pgid)`` starts one for the calling process (the usual owner) from Python.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from controlplane.procstate import running

OWNER_ENV = "GAMEDAY_OWNER_PID"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch(pgid: int, owner: int | None = None) -> subprocess.Popen[bytes]:
    """Start a watchdog killing process group ``pgid`` when ``owner`` dies (default: the
    process named by $GAMEDAY_OWNER_PID, else the caller)."""
    owner = owner or int(os.environ.get(OWNER_ENV) or os.getpid())
    return subprocess.Popen([sys.executable, "-m", "environments.local.watchdog", "--owner", str(owner),
                             "--pgid", str(pgid)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def run(owner: int, pgid: int, interval: float = 0.5) -> int:
    while _group_alive(pgid):
        if not running(owner):  # a zombie owner counts as dead
            for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 0.0)):
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    return 0
                deadline = time.monotonic() + wait
                while time.monotonic() < deadline and _group_alive(pgid):
                    time.sleep(0.1)
            return 0
        time.sleep(interval)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owner", type=int, required=True)
    parser.add_argument("--pgid", type=int, required=True)
    args = parser.parse_args()
    sys.exit(run(args.owner, args.pgid))


if __name__ == "__main__":
    main()

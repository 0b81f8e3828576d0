"""Whether a process still runs: the owner checks that end servers and load runs together with
whoever started them (environments/local/watchdog.py, loadtests/locustfile.py). Standard library only:
the watchdog must start fast and depend on nothing that could be half-installed."""

from __future__ import annotations

import os


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie. A zombie has ended: only its exit status
    is left for its parent to collect, and a parent that never does (a hung harness, a shell
    killed with it) would otherwise keep it "alive" for as long as the parent lives."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, another user's
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]  # after "(comm)": comm may hold ")"
    except (OSError, IndexError):
        return True  # no /proc to read: existing is all that is known
    return state not in (b"Z", b"X")

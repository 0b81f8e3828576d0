"""Linux process helpers over ``/proc``: identity, process trees, signalling, leak detection.

Every process the local environment starts carries ``GAMEDAY_ENV_STATE=<state dir>`` in its
environment (postgres inherits it through Patroni), so leftovers can be found precisely, by
environment, never by a broad name match.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

MARKER_VAR = "GAMEDAY_ENV_STATE"


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    state: str  # one letter: R, S, T (stopped), Z (zombie) ...
    start_ticks: int
    comm: str


def read_stat(pid: int) -> ProcInfo | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may contain spaces and parentheses: split around the last ')'.
    lpar, rpar = raw.index("("), raw.rindex(")")
    fields = raw[rpar + 2:].split()
    return ProcInfo(pid=pid, ppid=int(fields[1]), pgid=int(fields[2]), state=fields[0],
                    start_ticks=int(fields[19]), comm=raw[lpar + 1:rpar])


def stopped(pid: int) -> bool:
    """True once every thread of ``pid`` is stopped (or it is gone or a zombie). A SIGSTOP
    reaches a busy thread on another core a little after the main one: a multi-threaded
    server may still answer in between."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (FileNotFoundError, ProcessLookupError):
        return True
    for tid in tids:
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # that thread ended
        if raw[raw.rindex(")") + 2:].split()[0] not in ("T", "t", "Z", "X"):
            return False
    return True


def wait_stopped(pids: list[int], timeout: float) -> bool:
    """Wait until every thread of ``pids`` is stopped; False if some still ran at the end."""
    deadline = time.monotonic() + timeout
    while not all(stopped(p) for p in pids):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def is_alive(pid: int, start_ticks: int | None = None) -> bool:
    """True when ``pid`` exists, is not a zombie and (if given) started at ``start_ticks``."""
    info = read_stat(pid)
    if info is None or info.state in ("Z", "X"):
        return False
    return start_ticks is None or info.start_ticks == start_ticks


def children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        info = read_stat(pid)
        if info is not None:
            children.setdefault(info.ppid, []).append(pid)
    return children


def descendants(root: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """All descendants of ``root`` (one /proc scan unless a ``children_map()`` is given)."""
    children = children_map() if children is None else children
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def signal_pids(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` is alive (zombies count as gone); return those still alive."""
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if is_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if is_alive(p)]
    return alive


def stop_groups(pgids: list[int], pids: list[int], grace: float) -> None:
    """Stop process groups the way a supervisor does: SIGCONT (a frozen group cannot die) and
    SIGTERM to each group, then SIGKILL to whatever of ``pids`` (every process of the groups,
    listed before the signals) outlives ``grace``."""
    for pgid in pgids:
        signal_group(pgid, signal.SIGCONT)
        signal_group(pgid, signal.SIGTERM)
    left = wait_gone(pids, grace)
    signal_pids(left, signal.SIGKILL)
    wait_gone(left, 5.0)


def wait_reaped(pids: list[int], timeout: float) -> list[int]:
    """Wait until ``pids`` have disappeared from /proc entirely (zombies reaped)."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if read_stat(p) is not None]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [p for p in left if read_stat(p) is not None]
    return left


def marked_processes(state_dir: Path) -> list[int]:
    """Live processes of one environment: those whose environment carries its marker, plus
    their descendants (postgres backends overwrite their environ area with the ps title)."""
    needle = f"{MARKER_VAR}={state_dir.resolve()}".encode()
    me = os.getpid()
    found: set[int] = set()
    for pid in all_pids():
        if pid == me:
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if needle in env.split(b"\0") and is_alive(pid):
            found.add(pid)
    children = children_map()
    for pid in list(found):
        found.update(descendants(pid, children))
    found.discard(me)
    return sorted(p for p in found if is_alive(p))


def cpu_ticks(pid: int) -> int | None:
    """User + system CPU time of ``pid`` so far, in clock ticks (os.sysconf("SC_CLK_TCK"))."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # utime, stime are fields 14, 15 of stat(5)
    return int(fields[11]) + int(fields[12])


def rss_kib(pids: list[int]) -> int:
    """Sum of VmRSS over ``pids`` in KiB (shared pages are counted once per process)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    break
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def pss_kib(pids: list[int]) -> int:
    """Sum of proportional set size (shared pages split between sharers) in KiB."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total

"""Ports of a local environment: chosen below the kernel's ephemeral range, reserved across processes.

A port is chosen here and bound by its component later, seconds later while the environment
starts. In between, two kinds of process could take it:
- any process binding port 0 (a test's server, a metrics endpoint) or connecting out: the
  kernel picks those ports from its ephemeral range, so ports are chosen below that range;
- another environment starting at the same time (tests on two workers, two users' game days):
  every choice is written to a per-user reservation file, under a lock, and honoured by the
  other allocations until it expires (by then the component holds the port itself).
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import random
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from environments.local.errors import EnvError

# Above the fixed ports developers' own services tend to use (5432, 8080, 9090, ...).
LOWEST = 20000
# Longer than an environment takes to start on a loaded machine (wait_healthy's own timeouts).
RESERVATION_SECONDS = 600.0
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# reserve_port's owners: one per port, so that one process's own calls never share a port
_reservation_ids = itertools.count(1)


class PortsExhausted(EnvError):
    """Every candidate port is bound or reserved."""


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = EPHEMERAL_RANGE_FILE.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def candidate_range() -> range:
    """Ports no kernel-chosen port can be: below the ephemeral range, else above it."""
    low, high = ephemeral_range()
    below, above = range(LOWEST, low), range(high + 1, 65536)
    return below if len(below) >= len(above) else above


def reservation_file() -> Path:
    return Path(tempfile.gettempdir()) / f"gameday-ports-{os.getuid()}.json"


@contextmanager
def _reservations(path: Path) -> Iterator[dict[int, tuple[str, float]]]:
    """The live reservations (port -> owner, expiry), read and written back under a lock."""
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            raw = json.loads(path.read_text())
            now = time.time()
            live = {int(port): (str(owner), float(expiry))
                    for port, (owner, expiry) in raw.items() if float(expiry) > now}
        except (OSError, ValueError, TypeError, AttributeError):
            live = {}  # none yet, or a file cut short by a crash: the bound ports still count
        yield live
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({str(port): list(held) for port, held in sorted(live.items())}))
        os.replace(tmp, path)


def allocate_ports(names: list[str], previous: dict[str, int] | None = None, *, owner: str,
                   candidates: range | None = None, path: Path | None = None) -> dict[str, int]:
    """A free port per name, reserved for ``owner`` (an environment's state directory).

    A previous run's port is kept when it is still free and not reserved by another owner:
    keeping ports stable across `down`/`up` matters for etcd (its data directory remembers its
    peer URL) and for scripts holding an old `env.json`.
    """
    previous = previous or {}
    pool = candidates or candidate_range()
    path = path or reservation_file()
    chosen: dict[str, int] = {}
    with _reservations(path) as reserved:
        def usable(port: int) -> bool:
            held = reserved.get(port)
            return ((held is None or held[0] == owner) and port not in chosen.values()
                    and port_free(port))

        fresh = _probe(pool, avoid=set(previous.values()))
        for name in names:
            port = previous.get(name)
            if not (port and usable(port)):
                port = next((p for p in fresh if usable(p)), None)
                if port is None:
                    others = sum(1 for held in reserved.values() if held[0] != owner)
                    raise PortsExhausted(
                        f"no free port left for {name!r} in {pool.start}-{pool.stop - 1} "
                        f"({others} reserved by other environments in {path})")
            chosen[name] = port
        expiry = time.time() + RESERVATION_SECONDS
        reserved.update({port: (owner, expiry) for port in chosen.values()})
    return chosen


def reserve_port() -> int:
    """One free port for a server started within minutes by this process or its child.

    Binding port 0 and closing the socket hands back a port the kernel may give again at once,
    to another test's server on the other worker or to an outgoing connection: two servers told
    the same port, and a readiness check answered by the other one. A port from here is below
    the ephemeral range and reserved under an owner of its own, so no other caller gets it
    while it waits to be bound.
    """
    owner = f"pid-{os.getpid()}-{next(_reservation_ids)}"
    return allocate_ports(["port"], owner=owner)["port"]


def _probe(pool: range, avoid: set[int]) -> Iterator[int]:
    """Every port of the pool once, from a random start, so that allocations spread out."""
    start = random.randrange(len(pool))
    for i in range(len(pool)):
        port = pool[(start + i) % len(pool)]
        if port not in avoid:
            yield port

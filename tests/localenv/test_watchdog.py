"""Servers die with their owner: a killed test session must not leave a database behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from infra.local import watchdog


def _exited(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    # the server is this test's child: once killed it stays a zombie until polled
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return True
        time.sleep(0.1)
    return False


def test_group_is_killed_when_its_owner_dies() -> None:
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    server = subprocess.Popen(["sleep", "60"], start_new_session=True)
    dog = watchdog.watch(server.pid, owner=owner.pid)
    try:
        time.sleep(1.0)
        assert server.poll() is None, "killed while its owner was alive"
        owner.send_signal(signal.SIGKILL)  # the owner is killed hard, no cleanup runs
        owner.wait()
        assert _exited(server, 10.0), "server outlived its owner"
        dog.wait(5)
    finally:
        for p in (owner, server, dog):
            if p.poll() is None:
                p.kill()


def test_watchdog_exits_with_the_group() -> None:
    server = subprocess.Popen(["sleep", "60"], start_new_session=True)
    dog = watchdog.watch(server.pid, owner=os.getpid())
    server.kill()
    server.wait()
    assert dog.wait(5) == 0

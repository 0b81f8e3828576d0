"""Servers die with their owner: a killed test session must not leave a database behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from environments.local import watchdog


def _exited(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    # the server is this test's child: once killed it stays a zombie until polled
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("reaped", [True, False], ids=["owner-reaped", "owner-left-a-zombie"])
def test_group_is_killed_when_its_owner_dies(reaped: bool) -> None:
    """Killed hard, no cleanup runs. Left unreaped by its parent (a hung harness), the owner
    stays a zombie: its pid answers signal 0, yet nothing of it runs any more, and the servers
    must not wait for a reap that may never come."""
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    server = subprocess.Popen(["sleep", "60"], start_new_session=True)
    dog = watchdog.watch(server.pid, owner=owner.pid)
    try:
        time.sleep(1.0)
        assert server.poll() is None, "killed while its owner was alive"
        owner.send_signal(signal.SIGKILL)
        if reaped:
            owner.wait()
        assert _exited(server, 10.0), "server outlived its owner"
        if not reaped:
            assert owner.poll() is not None  # reaped only now: a zombie all along
        dog.wait(5)
    finally:
        for p in (owner, server, dog):
            if p.poll() is None:
                p.kill()


def test_running_is_false_for_a_zombie_and_for_no_process() -> None:
    from controlplane.procstate import running

    child = subprocess.Popen(["sleep", "60"])
    assert running(child.pid) and running(os.getpid())
    child.kill()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not _is_zombie(child.pid):
        time.sleep(0.02)
    assert _is_zombie(child.pid) and not running(child.pid)
    child.wait()
    assert not running(child.pid)


def _is_zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"


def test_watchdog_exits_with_the_group() -> None:
    server = subprocess.Popen(["sleep", "60"], start_new_session=True)
    dog = watchdog.watch(server.pid, owner=os.getpid())
    server.kill()
    server.wait()
    assert dog.wait(5) == 0

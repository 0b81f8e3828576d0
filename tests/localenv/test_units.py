"""Fast tests of the building blocks: fault proxy, supervisor, timeline, ports (no full environment)."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from environments.local import procs
from environments.local.ports import reserve_port
from environments.local.supervisor import SupervisorClient
from environments.timeline import Timeline


def _wait_http(url: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=0.5)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise AssertionError(f"{url} not up")


@pytest.fixture
def echo_server() -> Iterator[int]:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue

            def echo(c: socket.socket = conn) -> None:
                with c:
                    try:
                        while data := c.recv(4096):
                            c.sendall(data)
                    except OSError:
                        pass  # the proxy reset the connection (refuse mode)

            threading.Thread(target=echo, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    stop.set()
    server.close()


@contextmanager
def _proxy_to(tmp_path: Path, route: str, target_port: int) -> Iterator[tuple[str, int]]:
    """A fault proxy with one route to 127.0.0.1:target_port: (control URL, listen port)."""
    control, listen = reserve_port(), reserve_port()
    config = tmp_path / "proxy.json"
    config.write_text(json.dumps({"control_port": control, "routes": {
        route: {"listen": listen, "target": f"127.0.0.1:{target_port}"}}}))
    proc = subprocess.Popen([sys.executable, "-m", "environments.local.proxy", "--config", str(config)])
    try:
        _wait_http(f"http://127.0.0.1:{control}/healthz")
        yield f"http://127.0.0.1:{control}", listen
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def proxy(tmp_path: Path, echo_server: int) -> Iterator[tuple[str, int]]:
    with _proxy_to(tmp_path, "echo", echo_server) as p:
        yield p


def _roundtrip(port: int, payload: bytes = b"ping", timeout: float = 1.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload)
        return sock.recv(4096)


def test_proxy_pass_refuse_blackhole_and_back(proxy: tuple[str, int]) -> None:
    control, port = proxy
    assert _roundtrip(port) == b"ping"

    # An open connection is held by blackhole and continues after healing.
    held = socket.create_connection(("127.0.0.1", port), timeout=0.5)
    assert httpx.post(f"{control}/routes/echo", params={"mode": "blackhole"}).status_code == 200
    held.sendall(b"during")
    with pytest.raises(socket.timeout):
        held.recv(10)
    with pytest.raises(socket.timeout):
        _roundtrip(port, timeout=0.5)
    httpx.post(f"{control}/routes/echo", params={"mode": "pass"})
    held.settimeout(2)
    assert held.recv(10) == b"during"

    httpx.post(f"{control}/routes/echo", params={"mode": "refuse"})
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        held.sendall(b"x")
        if not held.recv(10):
            raise ConnectionResetError("closed")
    held.close()
    with pytest.raises((ConnectionResetError, ConnectionRefusedError, BrokenPipeError)):
        if not _roundtrip(port):
            raise ConnectionResetError("closed")

    httpx.post(f"{control}/routes/echo", params={"mode": "pass"})
    assert _roundtrip(port) == b"ping"
    routes = httpx.get(f"{control}/routes").json()
    assert routes["echo"]["mode"] == "pass"
    metrics = httpx.get(f"{control}/metrics").text
    assert 'gameday_proxy_upstream_up{route="echo"} 1' in metrics
    assert 'gameday_proxy_route_mode{route="echo",mode="pass"} 1' in metrics


def test_proxy_passes_a_client_reset_on_to_the_server(tmp_path: Path) -> None:
    """A SIGKILLed client's connection is reset: the server behind the proxy must learn it, or
    a database keeps the dead client's transaction (and its locks) open forever."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(5)
    with _proxy_to(tmp_path, "db", server.getsockname()[1]) as (_, listen), server:
        client = socket.create_connection(("127.0.0.1", listen), timeout=2)
        conn, _ = server.accept()
        client.sendall(b"BEGIN")
        conn.settimeout(2)
        assert conn.recv(16) == b"BEGIN"
        conn.sendall(b"unread reply")  # the client dies without reading it: RST, not FIN
        time.sleep(0.2)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        try:
            assert conn.recv(16) == b"", "the server saw no end of the connection"
        except ConnectionResetError:
            pass  # reset: the backend ends and aborts the transaction
        except TimeoutError:
            raise AssertionError("the server never learned that its client is gone") from None
        conn.close()


def test_proxy_rejects_unknown_mode_and_route(proxy: tuple[str, int]) -> None:
    control, _ = proxy
    bad_mode = httpx.post(f"{control}/routes/echo", params={"mode": "drop"})
    assert bad_mode.status_code == 422 and "'drop'" in bad_mode.json()["detail"]
    assert httpx.post(f"{control}/routes/nope", params={"mode": "pass"}).status_code == 404


def test_supervisor_kills_everything_when_its_owner_dies(tmp_path: Path) -> None:
    """A crashed `up` (owner gone before detach) leaves no orphan, not even a double-forked one."""
    state = tmp_path / "env"
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    daemon = subprocess.Popen([sys.executable, "-m", "environments.local.supervisor", "--state", str(state),
                               "--owner-pid", str(owner.pid)], start_new_session=True)
    client = SupervisorClient(state)
    deadline = time.monotonic() + 10
    while not client.alive():
        assert time.monotonic() < deadline, "supervisor did not start"
        time.sleep(0.05)
    child = client.call("spawn", name="sleeper", argv=["sleep", "60"], log=str(state / "s.log"))["pid"]
    # A grandchild that escapes its parent (like Patroni's postmaster) is adopted and killed too.
    escaper = client.call("spawn", name="escaper", log=str(state / "e.log"), argv=[
        "sh", "-c", "setsid sleep 61 & echo $! > " + str(state / "escaped.pid")])["pid"]
    time.sleep(0.5)
    escaped = int((state / "escaped.pid").read_text())
    assert procs.read_stat(escaped).ppid == daemon.pid  # re-parented to the subreaper
    assert procs.read_stat(escaper) is None  # exited and already reaped: no zombie
    owner.kill()
    owner.wait()
    daemon.wait(timeout=10)
    assert not procs.is_alive(child) and not procs.is_alive(escaped)


def test_timeline_lines_follow_the_contract(tmp_path: Path) -> None:
    timeline = Timeline(tmp_path / "faults.jsonl")
    timeline.record("fault_start", "kill", "api-1", {"pids": [1]})
    timeline.record("fault_end", "kill", "api-1", {})
    lines = [json.loads(line) for line in (tmp_path / "faults.jsonl").read_text().splitlines()]
    assert [line["event"] for line in lines] == ["fault_start", "fault_end"]
    for line in lines:
        assert set(line) == {"time", "event", "fault", "target", "details"}
        assert line["time"].endswith("Z") and "T" in line["time"]


def test_run_as_postgres_only_when_root() -> None:
    from environments.local.pg_files import run_as_postgres

    assert run_as_postgres() == ("postgres" if os.geteuid() == 0 else None)


def test_supervisor_does_not_give_a_new_child_the_exit_of_an_earlier_process_with_its_pid(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # pids are reused: the supervisor reaps thousands of workload processes in a game day, and
    # a restarted agent that got a reaped process's pid was reported as "exited with code 1"
    # the moment it started (a pool restore failed, the game day had no verdict)
    from environments.local import supervisor

    class FakePopen:
        def __init__(self, *_a: object, **_k: object) -> None:
            self.pid = os.getpid()  # a live pid, for read_stat

    monkeypatch.setattr(supervisor.subprocess, "Popen", FakePopen)
    daemon = supervisor.Daemon(tmp_path, None)
    daemon.exits[os.getpid()] = 1  # an earlier process with this pid exited 1
    daemon.spawn({"name": "gpu-1", "argv": ["true"], "log": str(tmp_path / "gpu-1.log")})
    assert daemon.ps({})["children"][str(os.getpid())]["returncode"] is None

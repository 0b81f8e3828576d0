"""Ports of a local environment: never a kernel-chosen port nor another starting environment's,
and a foreign server on a component's port never reads as that component."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from environments.local import pgserver, ports
from environments.local.ports import PortsExhausted, allocate_ports


def test_ports_lie_outside_the_kernels_ephemeral_range_and_are_free(tmp_path: Path) -> None:
    low, high = ports.ephemeral_range()
    chosen = allocate_ports([f"p{i}" for i in range(30)], owner="env-a", path=tmp_path / "r.json")
    assert len(set(chosen.values())) == 30
    for port in chosen.values():
        assert not low <= port <= high
        assert ports.port_free(port)
    # what a test's server or a metrics endpoint on port 0 gets comes from the ephemeral range
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        assert low <= sock.getsockname()[1] <= high


def test_two_environments_starting_at_once_never_share_a_port(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the environments' components have not bound anything yet: only the reservations separate them
    monkeypatch.setattr(ports, "port_free", lambda port: True)
    pool, path = range(40000, 40020), tmp_path / "r.json"
    a = allocate_ports([f"p{i}" for i in range(10)], owner="env-a", candidates=pool, path=path)
    b = allocate_ports([f"p{i}" for i in range(10)], owner="env-b", candidates=pool, path=path)
    assert set(a.values()).isdisjoint(b.values())
    assert set(a.values()) | set(b.values()) == set(pool)
    with pytest.raises(PortsExhausted, match=r"'p0' in 40000-40019 \(20 reserved by other"):
        allocate_ports(["p0"], owner="env-c", candidates=pool, path=path)


def test_an_environment_keeps_its_own_reserved_ports_across_down_and_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "port_free", lambda port: True)
    pool, path = range(40000, 40020), tmp_path / "r.json"
    first = allocate_ports(["etcd", "api"], owner="env-a", candidates=pool, path=path)
    again = allocate_ports(["etcd", "api"], first, owner="env-a", candidates=pool, path=path)
    assert again == first
    # another environment holding an old env.json of env-a's ports does not get them
    other = allocate_ports(["etcd", "api"], first, owner="env-b", candidates=pool, path=path)
    assert set(other.values()).isdisjoint(first.values())


def test_reservations_expire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "port_free", lambda port: True)
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"40000": ["env-a", time.time() - 1],
                                "40001": ["env-a", time.time() + 600]}))
    chosen = allocate_ports(["x"], owner="env-b", candidates=range(40000, 40002), path=path)
    assert chosen == {"x": 40000}
    assert set(json.loads(path.read_text())) == {"40000", "40001"}


def test_a_reservation_file_cut_short_is_read_as_empty(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "port_free", lambda port: True)
    path = tmp_path / "r.json"
    path.write_text('{"40000": ["env-a", 9')
    assert allocate_ports(["x"], owner="env-b", candidates=range(40000, 40001), path=path) == {
        "x": 40000}


def test_reserved_single_ports_are_never_handed_out_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """free_port() for tests' and benchmarks' servers: a CI run once had a test's registry told
    the port another worker's registry had just been given, and its readiness check answered by
    that other registry (port 0, closed, given again by the kernel)."""
    # nothing binds the ports: only the reservations keep the calls apart
    monkeypatch.setattr(ports, "port_free", lambda port: True)
    monkeypatch.setattr(ports, "candidate_range", lambda: range(40000, 40003))
    monkeypatch.setattr(ports, "reservation_file", lambda: tmp_path / "r.json")
    got = [ports.reserve_port(), ports.reserve_port(), pgserver.free_port()]
    assert sorted(got) == [40000, 40001, 40002]
    with pytest.raises(PortsExhausted):
        ports.reserve_port()
    with pytest.raises(PortsExhausted, match="3 reserved by other"):
        allocate_ports(["api"], owner="env-a", path=tmp_path / "r.json")


def test_ports_are_kept_when_free_and_replaced_when_taken(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    first = allocate_ports(["a", "b", "c"], owner="env-a", path=path)
    assert len(set(first.values())) == 3
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", first["b"]))
        busy.listen()
        second = allocate_ports(["a", "b", "c"], first, owner="env-a", path=path)
    assert second["a"] == first["a"] and second["c"] == first["c"]
    assert second["b"] != first["b"]


def test_a_metrics_server_on_the_apis_port_is_not_taken_for_the_api(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prometheus_client answers every path with 200: a CI run once saw agents get HTTP 405 in
    its words, most likely from such a server on an API replica's port read as healthy."""
    from prometheus_client import CollectorRegistry, start_http_server

    from environments.local.components import build_components
    from environments.local.env import LocalEnvironment
    from environments.local.topology import DEFAULT_AGENTS, Secrets, port_names

    names = port_names(DEFAULT_AGENTS)
    allocated = allocate_ports(names, owner=str(tmp_path), path=tmp_path / "r.json")
    env = LocalEnvironment("local", tmp_path)
    env.components = build_components(tmp_path, "local", allocated, Secrets(), DEFAULT_AGENTS,
                                      True, db_root=tmp_path / "db")
    monkeypatch.setattr(env.processes, "main_pid", lambda component: 1)
    ports_of = {"api-1": "api1", "reconciler": "reconciler_metrics",
                "cpu-1": "agent_metrics_cpu-1"}
    servers = [start_http_server(allocated[port], addr="127.0.0.1", registry=CollectorRegistry())
               for port in ports_of.values()]
    try:
        for component in ports_of:
            ok, reason = env.check(component)
            assert not ok and "another server on the port?" in reason, (component, reason)
    finally:
        for server, thread in servers:
            server.shutdown()
            thread.join(5)

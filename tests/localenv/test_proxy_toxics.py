"""The fault proxy's toxics (gray network faults): the pure part of environments/local/toxics.py, then a
real proxy process between real loopback clients and servers, measured on the wire."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from environments.local import proxy as proxy_module
from environments.local import watchdog
from environments.local.ports import reserve_port
from environments.local.toxics import (
    Latency,
    ResetPeer,
    Stream,
    Toxic,
    ToxicError,
    ToxicType,
    applies,
    bandwidth_delay,
    latency_delay,
    parse_toxic,
    slice_sizes,
    update_toxic,
)

# timing-sensitive (delays measured in tens of milliseconds): run alone by make test
pytestmark = pytest.mark.serial


# -- parse_toxic, update_toxic ----------------------------------------------------------------
def test_parse_fills_toxiproxy_defaults_and_round_trips() -> None:
    toxic = parse_toxic({"type": "latency", "attributes": {"latency": 100}}, "t")
    assert toxic == Toxic("latency_downstream", Stream.DOWNSTREAM, 1.0, Latency(100.0, 0.0))
    assert toxic.type is ToxicType.LATENCY
    docs = [
        {"name": "a", "type": "latency", "stream": "upstream", "toxicity": 0.5,
         "attributes": {"latency": 100, "jitter": 20.5}},
        {"name": "b", "type": "bandwidth", "attributes": {"rate": 0.5}},
        {"name": "c", "type": "slicer", "attributes": {"average_size": 10, "size_variation": 3,
                                                        "delay": 100}},
        {"name": "d", "type": "limit_data", "attributes": {"bytes": 0}},
        {"name": "e", "type": "reset_peer", "attributes": {"after_bytes": 7}},
        {"name": "f", "type": "reset_peer", "attributes": {"timeout": 5, "after_bytes": 7}},
        {"name": "g", "type": "timeout", "toxicity": 0, "attributes": {"timeout": 0}},
    ]
    for doc in docs:
        toxic = parse_toxic(doc, "t")
        assert parse_toxic(toxic.to_json(), "t") == toxic
        assert json.loads(json.dumps(toxic.to_json())) == toxic.to_json()
    # reset_peer with neither trigger resets at once, as Toxiproxy's does
    assert parse_toxic({"type": "reset_peer"}, "t").attributes == ResetPeer(timeout=0.0)
    # integral floats (YAML, JSON numbers) are fine where an integer is expected
    assert parse_toxic({"type": "limit_data", "attributes": {"bytes": 10.0}}, "t") \
        .attributes.bytes == 10  # type: ignore[union-attr]


def test_the_error_names_the_field_after_the_callers_prefix() -> None:
    with pytest.raises(ToxicError) as err:
        parse_toxic({"type": "latency", "attributes": {"latency": "abc"}},
                     "experiment x.yaml: method[3].arguments")
    assert str(err.value) == ("experiment x.yaml: method[3].arguments.attributes.latency: "
                              "must be a number >= 0, got 'abc'")
    assert isinstance(err.value, ValueError)


LAT = {"type": "latency", "attributes": {"latency": 10}}


@pytest.mark.parametrize(("doc", "path", "reason"), [
    ([], "w", "must be an object"),
    ({**LAT, "colour": 1}, "w.colour", "unknown field; known: name, type"),
    ({"attributes": {}}, "w.type", "required, one of latency, bandwidth"),
    ({"type": "lag"}, "w.type", ("unknown toxic type 'lag'; known: latency, bandwidth, slicer, "
                                 "limit_data, reset_peer, timeout")),
    ({**LAT, "stream": "up"}, "w.stream", "must be 'upstream' or 'downstream', got 'up'"),
    ({**LAT, "toxicity": 1.5}, "w.toxicity", "from 0 to 1, got 1.5"),
    ({**LAT, "toxicity": -0.1}, "w.toxicity", "from 0 to 1"),
    ({**LAT, "toxicity": "1"}, "w.toxicity", "from 0 to 1, got '1'"),
    ({**LAT, "toxicity": True}, "w.toxicity", "from 0 to 1"),
    ({**LAT, "name": "a b"}, "w.name", "1-64 letters, digits, '-' or '_', got 'a b'"),
    ({**LAT, "name": ""}, "w.name", "1-64 letters"),
    ({**LAT, "name": "x" * 65}, "w.name", "1-64 letters"),
    ({**LAT, "name": 5}, "w.name", "1-64 letters"),
    ({"type": "latency", "attributes": [1]}, "w.attributes", "must be an object"),
    ({"type": "latency", "attributes": {"latency": 1, "delay": 2}}, "w.attributes.delay",
     "unknown attribute of a latency toxic; known: latency, jitter"),
    ({"type": "latency"}, "w.attributes.latency", "required for a latency toxic"),
    ({"type": "latency", "attributes": {"latency": -1}}, "w.attributes.latency",
     "must be a number >= 0"),
    ({"type": "latency", "attributes": {"latency": True}}, "w.attributes.latency", "got True"),
    ({"type": "latency", "attributes": {"latency": float("nan")}}, "w.attributes.latency",
     "must be a number"),
    ({"type": "latency", "attributes": {"latency": 1e12}}, "w.attributes.latency",
     "must be <= 86400000 (one day), got 1000000000000.0"),
    ({"type": "latency", "attributes": {"latency": 1, "jitter": -5}}, "w.attributes.jitter",
     ">= 0, got -5"),
    ({"type": "bandwidth", "attributes": {"rate": 0}}, "w.attributes.rate",
     "must be a number > 0, got 0"),
    ({"type": "bandwidth"}, "w.attributes.rate", "required"),
    ({"type": "slicer", "attributes": {"average_size": 0}}, "w.attributes.average_size",
     "must be an integer > 0"),
    ({"type": "slicer", "attributes": {"average_size": 5, "delay": -1}}, "w.attributes.delay",
     ">= 0"),
    ({"type": "limit_data", "attributes": {"bytes": 1.5}}, "w.attributes.bytes",
     "must be an integer >= 0, got 1.5"),
    ({"type": "reset_peer", "attributes": {"after_bytes": -1}}, "w.attributes.after_bytes",
     "integer >= 0"),
    ({"type": "timeout", "attributes": {}}, "w.attributes.timeout", "required"),
])
def test_each_invalid_toxic_names_its_field(doc: Any, path: str, reason: str) -> None:
    with pytest.raises(ToxicError) as err:
        parse_toxic(doc, "w")
    assert str(err.value).startswith(f"{path}: "), str(err.value)
    assert reason in str(err.value)


def test_update_merges_attributes_and_keeps_identity() -> None:
    toxic = parse_toxic({"name": "x", "type": "latency", "attributes": {"latency": 100,
                                                                        "jitter": 10}}, "t")
    assert update_toxic(toxic, {"attributes": {"latency": 50}}, "t").attributes == Latency(50, 10)
    assert update_toxic(toxic, {"toxicity": 0.25}, "t").toxicity == 0.25
    assert update_toxic(toxic, {"attributes": {"jitter": None}}, "t").attributes == Latency(100)
    assert update_toxic(toxic, toxic.to_json(), "t") == toxic  # the whole document again: same
    for doc, path in [({"type": "bandwidth"}, "t.type"), ({"stream": "upstream"}, "t.stream"),
                      ({"name": "y"}, "t.name"), ({"toxicity": 2}, "t.toxicity"),
                      ({"attributes": {"rate": 1}}, "t.attributes.rate"), ("x", "t")]:
        with pytest.raises(ToxicError, match=rf"^{re.escape(path)}: "):
            update_toxic(toxic, doc, "t")
    # a reset_peer goes from "at once" to after_bytes alone by clearing its timeout
    reset = parse_toxic({"type": "reset_peer"}, "t")
    moved = update_toxic(reset, {"attributes": {"after_bytes": 5, "timeout": None}}, "t")
    assert moved.attributes == ResetPeer(timeout=None, after_bytes=5)


def test_toxics_in_the_proxy_config_are_validated_with_their_path() -> None:
    spec = {"listen": 1, "target": "127.0.0.1:2", "toxics": [LAT, {"type": "lag"}]}
    with pytest.raises(ToxicError, match=r"^proxy.json.routes.db.toxics\[1\].type: unknown"):
        proxy_module._route("db", spec, "proxy.json")
    route = proxy_module._route("db", {**spec, "toxics": [LAT]}, "proxy.json")
    assert list(route.toxics) == ["latency_downstream"]


# -- the arithmetic -----------------------------------------------------------------------------
def test_latency_delay_is_latency_plus_minus_jitter_never_negative() -> None:
    rng = random.Random(1)
    draws = [latency_delay(100, 20, rng) for _ in range(2000)]
    assert min(draws) >= 0.080 and max(draws) <= 0.120
    assert min(draws) < 0.082 and max(draws) > 0.118  # the whole range is used
    assert abs(statistics.mean(draws) - 0.100) < 0.002
    assert latency_delay(100, 0, rng) == 0.100
    assert min(latency_delay(5, 50, rng) for _ in range(200)) == 0.0


def test_bandwidth_delay_counts_kb_of_1024_bytes() -> None:
    assert bandwidth_delay(1024, 1) == 1.0
    assert bandwidth_delay(512 * 1024, 256) == 2.0


def test_slice_sizes_cover_the_chunk_in_pieces_around_the_average() -> None:
    rng = random.Random(2)
    sizes = slice_sizes(10_000, 100, 20, rng)
    assert sum(sizes) == 10_000
    assert all(80 <= s <= 120 for s in sizes[:-1]) and 0 < sizes[-1] <= 120
    assert len(set(sizes)) > 10  # varied
    assert slice_sizes(25, 10, 0, rng) == [10, 10, 5]
    assert slice_sizes(5, 3, 10, rng) and all(s >= 1 for s in slice_sizes(50, 3, 10, rng))


def test_toxicity_is_a_fraction_of_draws() -> None:
    assert not applies(0.0, 0.0) and applies(1.0, 0.9999) and applies(0.3, 0.29)
    assert not applies(0.3, 0.3)


# -- a real proxy -------------------------------------------------------------------------------
@dataclass
class Servers:
    echo: int
    source: int
    arrivals: list[float] = field(default_factory=list)  # monotonic time of each echo read


def _serve(handler: Any, stop: threading.Event) -> int:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(256)
    server.settimeout(0.2)

    def accept() -> None:
        with server:
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except OSError:
                    continue
                threading.Thread(target=handler, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return server.getsockname()[1]


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    """An echo server that notes when data arrives, and a source: "N\\n" -> N bytes, close."""
    stop = threading.Event()
    arrivals: list[float] = []

    def echo(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    arrivals.append(time.monotonic())
                    conn.sendall(data)
            except OSError:
                pass  # reset by the proxy: what several tests do on purpose

    def source(conn: socket.socket) -> None:
        with conn:
            try:
                if line := conn.makefile("rb").readline():  # empty: the proxy's TCP probe
                    conn.sendall(b"x" * int(line))
            except OSError:
                pass

    yield Servers(_serve(echo, stop), _serve(source, stop), arrivals)
    stop.set()


@dataclass
class Proxy:
    http: httpx.Client
    echo: int
    source: int

    def add(self, route: str, doc: dict[str, Any]) -> dict[str, Any]:
        response = self.http.post(f"/routes/{route}/toxics", json=doc)
        assert response.status_code == 200, response.text
        return response.json()

    def update(self, route: str, name: str, doc: dict[str, Any]) -> None:
        response = self.http.post(f"/routes/{route}/toxics/{name}", json=doc)
        assert response.status_code == 200, response.text

    def remove(self, route: str, name: str) -> None:
        assert self.http.delete(f"/routes/{route}/toxics/{name}").status_code == 204

    def metric(self, pattern: str) -> float:
        text = self.http.get("/metrics").text
        match = re.search(rf"^{re.escape(pattern)} (\S+)$", text, re.MULTILINE)
        assert match, f"{pattern} not in metrics:\n{text}"
        return float(match.group(1))


@pytest.fixture(scope="module")
def proxy_server(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    control, echo, source = reserve_port(), reserve_port(), reserve_port()
    config = tmp_path_factory.mktemp("toxics") / "proxy.json"
    config.write_text(json.dumps({"control_port": control, "routes": {
        "echo": {"listen": echo, "target": f"127.0.0.1:{servers.echo}"},
        "src": {"listen": source, "target": f"127.0.0.1:{servers.source}"}}}))
    proc = subprocess.Popen([sys.executable, "-m", "environments.local.proxy", "--config", str(config)],
                            start_new_session=True)
    dog = watchdog.watch(proc.pid)  # dies with the test session even if pytest is killed
    http = httpx.Client(base_url=f"http://127.0.0.1:{control}", timeout=5)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                http.get("/healthz")
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and proc.poll() is None, "proxy not up"
                time.sleep(0.05)
        yield Proxy(http, echo, source)
    finally:
        http.close()
        with contextlib.suppress(ProcessLookupError):  # it may have died on its own
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        dog.wait(10)


@pytest.fixture
def proxy(proxy_server: Proxy) -> Iterator[Proxy]:
    yield proxy_server
    for route in ("echo", "src"):
        assert proxy_server.http.delete(f"/routes/{route}/toxics").status_code == 204


def _connect(port: int, timeout: float = 3.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise AssertionError(f"EOF after {len(data)} of {n} bytes")
        data += chunk
    return data


def _rtt(sock: socket.socket, payload: bytes = b"ping") -> float:
    start = time.monotonic()
    sock.sendall(payload)
    assert _recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - start


def _expect_reset(port: int) -> None:
    # connect() itself may report the reset: the proxy can reset a new connection before the
    # client's connect() returns (on a busy machine)
    with pytest.raises(ConnectionResetError), _connect(port) as sock:
        sock.sendall(b"ping")
        sock.recv(10)


def _read_to_end(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_latency_with_jitter_delays_round_trips_until_removed(proxy: Proxy) -> None:
    proxy.add("echo", {"name": "lat", "type": "latency",
                       "attributes": {"latency": 100, "jitter": 20}})
    with _connect(proxy.echo) as sock:
        rtts = [_rtt(sock) for _ in range(30)]
        assert min(rtts) >= 0.079, rtts  # never less than latency - jitter
        assert max(rtts) < 0.300, rtts
        assert min(rtts) < 0.097 and max(rtts) > 0.103, f"no jitter to see: {rtts}"
        proxy.remove("echo", "lat")
        assert statistics.median(_rtt(sock) for _ in range(10)) < 0.020


def test_bandwidth_caps_a_transfer(proxy: Proxy) -> None:
    proxy.add("src", {"type": "bandwidth", "attributes": {"rate": 500}})
    size = 500 * 1024
    with _connect(proxy.source) as sock:
        start = time.monotonic()
        sock.sendall(f"{size}\n".encode())
        assert len(_read_to_end(sock)) == size
        elapsed = time.monotonic() - start
    assert 0.7 <= elapsed <= 1.3, f"500 KiB at 500 KB/s took {elapsed:.2f} s"


def test_slicer_writes_small_pieces(proxy: Proxy) -> None:
    proxy.add("echo", {"type": "slicer", "attributes": {"average_size": 16, "size_variation": 4,
                                                         "delay": 2000}})
    payload = bytes(range(256)) * 4
    with _connect(proxy.echo) as sock:
        sock.sendall(payload)
        reads = []
        while sum(map(len, reads)) < len(payload):
            reads.append(sock.recv(4096))
            assert reads[-1], "EOF"
    assert b"".join(reads) == payload  # in order
    assert len(reads) >= 20 and statistics.median(map(len, reads)) <= 20, [len(r) for r in reads]


def test_limit_data_passes_exactly_n_bytes_then_closes(proxy: Proxy) -> None:
    with _connect(proxy.echo) as sock:  # on an open connection it counts from when it came
        assert _rtt(sock, b"z" * 200) < 1.0
        proxy.add("echo", {"type": "limit_data", "attributes": {"bytes": 100}})
        sock.sendall(b"y" * 150)
        assert _read_to_end(sock) == b"y" * 100
    with _connect(proxy.echo) as sock:
        sock.sendall(b"a" * 60)
        assert _recv_exactly(sock, 60) == b"a" * 60
        sock.sendall(b"b" * 60)  # crosses the limit: 40 of it pass, then FIN (not a reset)
        assert _read_to_end(sock) == b"b" * 40
    with _connect(proxy.echo) as sock:  # counted per connection
        assert _rtt(sock, b"c" * 50) < 1.0
    assert proxy.metric('gameday_proxy_resets_total{route="echo",cause="limit_data"}') >= 1


def test_reset_peer_at_once_and_after_a_timeout(proxy: Proxy) -> None:
    proxy.add("echo", {"name": "rst", "type": "reset_peer", "attributes": {"timeout": 0}})
    _expect_reset(proxy.echo)
    proxy.update("echo", "rst", {"attributes": {"timeout": 300}})
    with _connect(proxy.echo) as sock:
        start = time.monotonic()
        assert _rtt(sock) < 0.2
        with pytest.raises(ConnectionResetError):
            sock.recv(10)
        assert 0.25 <= time.monotonic() - start <= 1.5


def test_reset_peer_toxicity_is_a_fraction_of_connections(proxy: Proxy) -> None:
    proxy.add("echo", {"type": "reset_peer", "toxicity": 0.3, "attributes": {"timeout": 0}})
    resets = 0
    for _ in range(200):
        try:
            with _connect(proxy.echo) as sock:
                sock.sendall(b"ping")
                assert _recv_exactly(sock, 4) == b"ping"
        except ConnectionResetError:
            resets += 1
    # binomial(200, 0.3): mean 60, sd 6.5; 30..90 is beyond 4.5 sd either way
    assert 30 <= resets <= 90, resets


def test_toxicity_is_decided_once_per_connection(proxy: Proxy) -> None:
    """Open connections keep their draw across changes: raising the toxicity adds connections
    to the affected set, an attribute change leaves the set as it is."""

    def delayed(socks: list[socket.socket]) -> set[int]:
        with selectors.DefaultSelector() as sel:
            start = time.monotonic()
            for i, sock in enumerate(socks):
                sock.sendall(b"ping")
                sel.register(sock, selectors.EVENT_READ, i)
            late, pending = set(), len(socks)
            while pending:
                for key, _ in sel.select(timeout=2):
                    assert _recv_exactly(key.fileobj, 4) == b"ping"  # type: ignore[arg-type]
                    sel.unregister(key.fileobj)
                    pending -= 1
                    if time.monotonic() - start >= 0.15:
                        late.add(key.data)
                assert time.monotonic() - start < 5, "echoes missing"
        return late

    socks = [_connect(proxy.echo) for _ in range(30)]
    try:
        delayed(socks)  # warm: the proxy's connection setup must not count as latency
        proxy.add("echo", {"name": "some", "type": "latency", "toxicity": 0.5,
                           "attributes": {"latency": 300}})
        half = delayed(socks)
        assert 0 < len(half) < 30
        proxy.update("echo", "some", {"attributes": {"latency": 250}})
        assert delayed(socks) == half
        proxy.update("echo", "some", {"toxicity": 0.8})
        more = delayed(socks)
        assert more > half or len(half) > 26, (half, more)
    finally:
        for sock in socks:
            sock.close()


def test_reset_peer_after_bytes(proxy: Proxy) -> None:
    proxy.add("echo", {"type": "reset_peer", "stream": "upstream",
                       "attributes": {"after_bytes": 10}})
    with _connect(proxy.echo) as sock:
        assert _rtt(sock, b"123456") < 1.0  # 6 bytes: below the threshold, no reset
        sock.sendall(b"abcdef")  # 4 of these pass, then the reset
        got = b""
        with pytest.raises(ConnectionResetError):
            while chunk := sock.recv(10):
                got += chunk
            raise AssertionError(f"FIN after {got!r} instead of a reset")
        assert got in (b"", b"abcd")


def test_timeout_zero_holds_the_connection_open_and_silent(proxy: Proxy) -> None:
    proxy.add("echo", {"name": "hang", "type": "timeout", "attributes": {"timeout": 0}})
    with _connect(proxy.echo, timeout=0.6) as sock:
        sock.sendall(b"lost")
        with pytest.raises(TimeoutError):
            sock.recv(10)
        time.sleep(0.3)
        proxy.remove("echo", "hang")
        # still open: new data goes through; what the toxic dropped stays dropped (Toxiproxy)
        sock.sendall(b"found")
        assert _recv_exactly(sock, 5) == b"found"


def test_timeout_closes_the_connection_after_n_ms(proxy: Proxy) -> None:
    proxy.add("echo", {"type": "timeout", "attributes": {"timeout": 300}})
    with _connect(proxy.echo) as sock:
        start = time.monotonic()
        sock.sendall(b"ping")
        assert sock.recv(10) == b""  # nothing came back, then the end (FIN)
        assert 0.25 <= time.monotonic() - start <= 1.5
    assert proxy.metric('gameday_proxy_resets_total{route="echo",cause="timeout"}') >= 1


def test_an_update_applies_to_an_open_connection(proxy: Proxy) -> None:
    with _connect(proxy.echo) as sock:
        assert _rtt(sock) < 0.1
        proxy.add("echo", {"name": "lat", "type": "latency", "attributes": {"latency": 300}})
        assert 0.29 <= _rtt(sock) < 0.6
        proxy.update("echo", "lat", {"attributes": {"latency": 50}})
        assert 0.049 <= _rtt(sock) < 0.25
        proxy.update("echo", "lat", {"toxicity": 0})
        assert statistics.median(_rtt(sock) for _ in range(5)) < 0.04


def test_a_change_reaches_data_already_waiting(proxy: Proxy) -> None:
    """A chunk held by a long latency is let go when the latency is removed."""
    proxy.add("echo", {"name": "lat", "type": "latency", "attributes": {"latency": 5000}})
    with _connect(proxy.echo) as sock:
        start = time.monotonic()
        sock.sendall(b"held")
        time.sleep(0.2)
        proxy.remove("echo", "lat")
        assert _recv_exactly(sock, 4) == b"held"
        assert time.monotonic() - start < 1.0


def test_toxics_stack(proxy: Proxy) -> None:
    proxy.add("echo", {"name": "a", "type": "latency", "attributes": {"latency": 80}})
    proxy.add("echo", {"name": "b", "type": "latency", "attributes": {"latency": 80}})
    proxy.add("echo", {"name": "c", "type": "limit_data", "attributes": {"bytes": 12}})
    with _connect(proxy.echo) as sock:
        assert _rtt(sock, b"12345678") >= 0.159
        proxy.remove("echo", "a")
        sock.sendall(b"abcdefgh")
        start = time.monotonic()
        assert _read_to_end(sock) == b"abcd"  # limit_data's 12 bytes, after b's latency
        assert 0.079 <= time.monotonic() - start < 0.159


def test_direction_matters(proxy: Proxy, servers: Servers) -> None:
    """Latency on one direction delays only that leg: the echo server notes when it got the
    data, so each leg of a round trip is measured on its own."""

    def legs() -> tuple[float, float]:
        with _connect(proxy.echo) as sock:
            servers.arrivals.clear()
            sent = time.monotonic()
            sock.sendall(b"ping")
            _recv_exactly(sock, 4)
            back = time.monotonic()
        return servers.arrivals[0] - sent, back - servers.arrivals[0]

    proxy.add("echo", {"name": "up", "type": "latency", "stream": "upstream",
                       "attributes": {"latency": 200}})
    there, back = legs()
    assert there >= 0.199 and back < 0.1, (there, back)
    proxy.remove("echo", "up")
    proxy.add("echo", {"name": "down", "type": "latency", "stream": "downstream",
                       "attributes": {"latency": 200}})
    there, back = legs()
    assert there < 0.1 and back >= 0.199, (there, back)


def test_control_api_validates_and_reports(proxy: Proxy) -> None:
    http = proxy.http
    bad = http.post("/routes/echo/toxics", json={"type": "latency",
                                                 "attributes": {"latency": "abc"}})
    assert bad.status_code == 422
    assert bad.json()["detail"] == "toxic.attributes.latency: must be a number >= 0, got 'abc'"
    bad = http.post("/routes/echo/toxics", json={"type": "lag"})
    assert bad.status_code == 422 and bad.json()["detail"].startswith("toxic.type: ")
    assert http.post("/routes/echo/toxics", content=b"{nope").status_code == 400
    assert http.post("/routes/nope/toxics", json=LAT).status_code == 404
    big = http.post("/routes/echo/toxics", content=b"x" * (70 * 1024))
    assert big.status_code == 413
    created = proxy.add("echo", {"name": "x", "type": "latency", "toxicity": 0,
                                 "attributes": {"latency": 1}})
    assert created == {"name": "x", "type": "latency", "stream": "downstream", "toxicity": 0.0,
                       "attributes": {"latency": 1.0, "jitter": 0.0}}
    assert http.post("/routes/echo/toxics", json=created).status_code == 409
    bad = http.post("/routes/echo/toxics/x", json={"type": "bandwidth"})
    assert bad.status_code == 422 and bad.json()["detail"].startswith("toxic.type: cannot change")
    bad = http.post("/routes/echo/toxics/x", json={"toxicity": 3})
    assert bad.status_code == 422 and bad.json()["detail"].startswith("toxic.toxicity: ")
    assert http.post("/routes/echo/toxics/y", json={"toxicity": 1}).status_code == 404
    assert http.get("/routes/echo/toxics").json() == [created]
    assert http.get("/routes/echo/toxics/x").json() == created
    assert http.get("/routes").json()["echo"]["toxics"] == [created]
    assert http.delete("/routes/echo/toxics/y").status_code == 404
    assert http.put("/routes/echo/toxics").status_code == 405
    assert http.delete("/routes/echo/toxics/x").status_code == 204
    assert http.get("/routes/echo/toxics").json() == []


def test_metrics(proxy: Proxy) -> None:
    before = proxy.metric('gameday_proxy_bytes_total{route="echo",stream="upstream"}')
    resets = proxy.metric('gameday_proxy_resets_total{route="echo",cause="reset_peer"}')
    with _connect(proxy.echo) as sock:
        _rtt(sock, b"x" * 1000)
    proxy.add("echo", {"name": "m", "type": "reset_peer", "attributes": {"timeout": 0}})
    _expect_reset(proxy.echo)
    assert proxy.metric('gameday_proxy_toxic_active{route="echo",toxic="m",type="reset_peer",'
                        'stream="downstream"}') == 1
    assert proxy.metric('gameday_proxy_bytes_total{route="echo",stream="upstream"}') \
        >= before + 1000
    assert proxy.metric('gameday_proxy_bytes_total{route="echo",stream="downstream"}') >= 1000
    # at least: the first connection may still be open in the proxy when the toxic comes
    assert proxy.metric('gameday_proxy_resets_total{route="echo",cause="reset_peer"}') \
        >= resets + 1
    assert proxy.metric('gameday_proxy_resets_total{route="echo",cause="refuse"}') >= 0
    proxy.remove("echo", "m")
    assert "gameday_proxy_toxic_active{" not in proxy.http.get("/metrics").text

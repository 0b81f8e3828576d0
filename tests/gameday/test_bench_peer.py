"""The side-by-side benchmark's pure parts: reading wrk's output, the acknowledgement check and
the ratio (the figures it prints are measured, not tested here). Each check is shown failing."""

from __future__ import annotations

import json
import math
import shutil
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gameday.bench_peer import (
    OURS_ID,
    between_rounds,
    check_acks,
    lua_script,
    median_ratio,
    parse_wrk,
    ratio,
    run_wrk,
)

WRK_STDOUT = """Running 8s test @ http://127.0.0.1:30398/v1/operations
  2 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    40.12ms   10.00ms 105.60ms   70.00%
    Req/Sec   190.00     20.00   250.00     70.00%
  Latency Distribution
     50%   38.80ms
     75%   44.10ms
     90%   52.00ms
     99%  105.60ms
  3037 requests in 8.05s, 2.10MB read
  Non-2xx or 3xx responses: 5
  Socket errors: connect 0, read 1, write 0, timeout 2
Requests/sec:    377.27
Transfer/sec:    267.30KB
"""

SCRIPT_OUT = """ack a1
ack a2
status 201 2
status 503 1
ack a3
status 201 1
latency_us 50 38800
latency_us 90 52000
latency_us 99 105600
requests 4
duration_us 8050000
"""


def test_parse_wrk_reads_the_summary_and_the_script_file() -> None:
    r = parse_wrk(WRK_STDOUT, SCRIPT_OUT)
    assert r.requests == 3037
    assert r.non_2xx == 5
    assert r.socket_errors == {"connect": 0, "read": 1, "write": 0, "timeout": 2}
    assert r.acked == ["a1", "a2", "a3"]
    assert r.statuses == {201: 3, 503: 1}  # summed over the threads
    assert r.ok == 3
    assert r.seconds == pytest.approx(8.05)
    assert r.rate == pytest.approx(3 / 8.05)
    assert r.latency_ms == {50: pytest.approx(38.8), 90: pytest.approx(52.0),
                            99: pytest.approx(105.6)}


def test_parse_wrk_units_of_the_duration() -> None:
    out = "requests 1\n"  # no duration_us: wrk's own line gives the seconds
    assert parse_wrk("  10 requests in 1.50m, 1KB read\n", out).seconds == pytest.approx(90)
    assert parse_wrk("  10 requests in 900.00ms, 1KB read\n", out).seconds == pytest.approx(0.9)


def test_parse_wrk_refuses_an_unfinished_round() -> None:
    with pytest.raises(ValueError, match="no request total"):
        parse_wrk("unable to connect to 127.0.0.1:1 Connection refused\n", SCRIPT_OUT)
    with pytest.raises(ValueError, match="no summary"):
        parse_wrk(WRK_STDOUT, "ack a1\n")  # done() never ran


def test_ack_check_passes_when_every_acknowledged_id_is_stored_once() -> None:
    # an unacknowledged row (a request in flight when wrk stopped) is allowed
    c = check_acks(["a", "b"], {"a": 1, "b": 1, "in-flight": 1})
    assert c.ok
    assert c.text() == "2 of 2 acknowledged ids in the table"


def test_ack_check_fails_when_rows_are_missing() -> None:
    c = check_acks(["a", "b", "c"], {"a": 1})
    assert not c.ok
    assert (c.acknowledged, c.found) == (3, 1)
    assert "1 of 3" in c.text()


def test_ack_check_fails_on_duplicates_and_unreadable_answers() -> None:
    assert not check_acks(["a", "a"], {"a": 1}).ok  # one id acknowledged twice
    assert not check_acks(["a"], {"a": 2}).ok  # stored twice
    unparsed = check_acks(["a", "?"], {"a": 1})  # a 2xx whose body held no id
    assert not unparsed.ok
    assert "without an id" in unparsed.text()


def test_ratio_math() -> None:
    assert ratio(1000.0, 100.0) == pytest.approx(10.0)
    assert math.isnan(ratio(1000.0, 0.0))
    # the median of the per-round ratios, not the ratio of the medians
    assert median_ratio([(1000, 100), (900, 150), (1200, 100)]) == pytest.approx(10.0)
    assert median_ratio([(100, 100), (300, 100)]) == pytest.approx(2.0)


def test_lua_script_carries_the_body_as_a_lua_string() -> None:
    text = lua_script({"name": "x \"q\"", "n": 1})
    first = text.splitlines()[0]
    assert first.startswith("wrk.body = ")
    # a JSON string literal is a Lua string literal for this ASCII body
    assert json.loads(json.loads(first.removeprefix("wrk.body = "))) == {"name": "x \"q\"",
                                                                        "n": 1}


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk not installed (scripts/setup.sh)")
def test_wrk_script_sends_a_fresh_key_per_request_and_keeps_each_id(tmp_path: Path) -> None:
    keys: list[str] = []
    ids: list[str] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            op = str(uuid.uuid4())
            with lock:
                keys.append(self.headers["Idempotency-Key"])
                ids.append(op)
            body = json.dumps({"id": op, "state": "accepted"}, separators=(",", ":")).encode()
            self.send_response(201)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        res, _ = run_wrk(f"http://127.0.0.1:{server.server_port}/v1/operations", {"name": "b"},
                         {}, seconds=1, connections=4, threads=2, key_prefix="t1",
                         id_pattern=OURS_ID, workdir=tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    assert res.ok > 0
    assert len(keys) == len(set(keys))  # fresh per request, across both threads
    assert all(k.startswith("t1-") for k in keys)
    assert set(res.acked) <= set(ids)  # each 201's id, as the server sent it
    assert check_acks(res.acked, dict.fromkeys(ids, 1)).ok


def test_rounds_empty_the_tables_unless_rows_are_kept() -> None:
    emptied: list[int] = []
    between_rounds(lambda: emptied.append(1), keep_rows=False)()
    assert emptied == [1]
    between_rounds(lambda: emptied.append(2), keep_rows=True)()
    assert emptied == [1]


def test_keep_rows_needs_a_peer() -> None:
    from click.testing import CliRunner

    from gameday.bench import bench_controlplane

    res = CliRunner().invoke(bench_controlplane, ["--keep-rows", "--no-runtime", "--no-idle"])
    assert res.exit_code == 2
    assert "--keep-rows applies to the side by side only" in res.output


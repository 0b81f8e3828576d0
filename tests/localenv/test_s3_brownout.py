"""The S3 brownout of the local S3 API server (environments/local/s3_brownout.py): the pure parts on
their own, then a real motoserver process driven through its control path and a real boto3
client with retries off, so every injected answer reaches the test as botocore parses it."""

from __future__ import annotations

import hashlib
import math
import os
import random
import statistics
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from prometheus_client.parser import text_string_to_metric_families

from controlplane import storage
from environments.local import motoserver
from environments.local import s3_brownout as sb
from environments.local import s3_brownout_client as sbc
from environments.local.launch import spawn, wait_http
from environments.local.pgserver import free_port

BUCKET = "brownout-test"

# --- pure parts --------------------------------------------------------------------------------


def test_parse_fills_defaults_and_normalises_methods() -> None:
    assert sb.parse_brownout({}) == sb.HEALTHY and not sb.HEALTHY.active
    state = sb.parse_brownout({"error_rate": 0.25, "methods": ["put", "Get"], "latency_ms": 5})
    assert state.methods == {"PUT", "GET"} and state.error_rate == 0.25 and state.active
    assert sb.parse_brownout(state.to_json()) == state


@pytest.mark.parametrize(("doc", "field"), [
    ({"error_rate": 1.5}, "error_rate"), ({"error_rate": "0.5"}, "error_rate"),
    ({"error_rate": True}, "error_rate"), ({"error_rate": math.nan}, "error_rate"),
    ({"error_code": "Throttled"}, "error_code"), ({"latency_ms": -1}, "latency_ms"),
    ({"jitter_ms": 1e9}, "jitter_ms"), ({"bandwidth_kbps": -5}, "bandwidth_kbps"),
    ({"methods": []}, "methods"), ({"methods": ["PATCH"]}, "methods"),
    ({"methods": "PUT"}, "methods"), ({"retry_after_s": 1.5}, "retry_after_s"),
    ({"errorrate": 0.5}, "errorrate"), ([0.5], "body"),
])
def test_parse_names_the_bad_field(doc: Any, field: str) -> None:
    with pytest.raises(sb.BrownoutInvalid) as info:
        sb.parse_brownout(doc)
    assert info.value.field == field and info.value.reason


def test_decisions_follow_the_draws() -> None:
    state = sb.Brownout(error_rate=0.3, methods=frozenset({"PUT"}), latency_ms=100, jitter_ms=40)
    assert sb.injected_error(state, "PUT", 0.29) == "SlowDown"
    assert sb.injected_error(state, "PUT", 0.3) is None
    assert sb.injected_error(state, "GET", 0.0) is None  # not a method of this brownout
    assert sb.injected_error(sb.Brownout(error_rate=1.0), "GET", 0.999999) == "SlowDown"
    assert sb.injected_error(sb.HEALTHY, "GET", 0.0) is None
    assert sb.delay_seconds(state, 0.0) == pytest.approx(0.06)
    assert sb.delay_seconds(state, 0.5) == pytest.approx(0.1)
    assert sb.delay_seconds(sb.Brownout(latency_ms=10, jitter_ms=50), 0.0) == 0.0


def test_error_response_is_an_s3_error_document() -> None:
    status, headers, body = sb.error_response("SlowDown", "PUT", "ABC", "hid", retry_after_s=7)
    assert status.startswith("503 ")
    root = ET.fromstring(body)
    assert (root.tag, root.findtext("Code"), root.findtext("Message"), root.findtext("RequestId")
            ) == ("Error", "SlowDown", "Please reduce your request rate.", "ABC")
    assert ("Retry-After", "7") in headers and ("Content-Length", str(len(body))) in headers
    assert sb.error_response("InternalError", "GET", "a", "b")[0].startswith("500 ")
    assert sb.error_response("ServiceUnavailable", "HEAD", "a", "b")[2] == b""


def test_pacing() -> None:
    rate = sb.bytes_per_second(8000)
    assert rate == 1_000_000
    assert sb.pace_delay(500_000, 0.2, rate) == pytest.approx(0.3)
    assert sb.pace_delay(500_000, 0.6, rate) == 0.0
    assert sb.chunk_size(rate) == 50_000 and sb.chunk_size(10) == 256


@pytest.mark.parametrize(("path", "host", "control"), [
    ("/_gameday/brownout", "127.0.0.1:9000", True),
    ("/_gameday/brownout/metrics", "localhost:9000", True),
    ("/_gameday/brownout", "[::1]:9000", True),
    ("/_gameday/brownout", "moto:9000", True),
    ("/_gameday/brownout", "bucket.s3.amazonaws.com", False),  # virtual-hosted: a key
    ("/_gameday/brownout", "bucket.localhost:9000", False),
    ("/_gameday/other", "127.0.0.1:9000", False),
    ("/bucket/_gameday/brownout", "127.0.0.1:9000", False),
])
def test_control_only_where_no_s3_request_can_be(path: str, host: str, control: bool) -> None:
    assert sb.is_control(path, host) is control


# --- against a real server ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    proc = spawn("moto", motoserver.command(port), tmp_path_factory.mktemp("moto"))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/moto-api/", proc, 30)
        yield url
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def s3(endpoint: str) -> Any:
    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=2,
                      read_timeout=5, s3={"addressing_style": "path"}))
    client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key="small", Body=b"small")
    return client


@pytest.fixture
def brownout(endpoint: str) -> Iterator[sbc.BrownoutClient]:
    client = sbc.BrownoutClient(endpoint)
    client.clear()
    yield client
    client.clear()


def _code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response = exc.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def test_error_rate_one_fails_every_put_with_slowdown(s3: Any, brownout: sbc.BrownoutClient
                                                      ) -> None:
    before = brownout.state().counters
    brownout.set(error_rate=1.0)
    for i in range(20):
        with pytest.raises(ClientError) as info:
            s3.put_object(Bucket=BUCKET, Key=f"throttled/{i}", Body=b"x")
        assert _code(info) == ("SlowDown", 503)
        assert info.value.response["Error"]["Message"] == "Please reduce your request rate."
    after = brownout.state().counters
    assert after.injected["SlowDown"] - before.injected["SlowDown"] == 20
    assert after.requests - before.requests == 20


@pytest.mark.parametrize(("code", "status"), [("InternalError", 500),
                                              ("ServiceUnavailable", 503)])
def test_other_error_codes(s3: Any, brownout: sbc.BrownoutClient, code: str, status: int) -> None:
    brownout.set(error_rate=1.0, error_code=code)
    with pytest.raises(ClientError) as info:
        s3.get_object(Bucket=BUCKET, Key="small")
    assert _code(info) == (code, status)
    with pytest.raises(ClientError) as info:  # HEAD: no body, botocore names it by status
        s3.head_object(Bucket=BUCKET, Key="small")
    assert _code(info) == (str(status), status)


def test_wire_format_and_retry_after(endpoint: str, brownout: sbc.BrownoutClient) -> None:
    brownout.set(error_rate=1.0)
    answer = httpx.get(f"{endpoint}/{BUCKET}/small")
    assert (answer.status_code, answer.reason_phrase) == (503, "Slow Down")
    assert answer.headers["content-type"] == "application/xml"
    assert "retry-after" not in answer.headers  # AWS S3 sends none
    assert ET.fromstring(answer.content).findtext("RequestId") == answer.headers["x-amz-request-id"]
    brownout.set(error_rate=1.0, retry_after_s=120)
    assert httpx.get(f"{endpoint}/{BUCKET}/small").headers["retry-after"] == "120"


def _binomial_bounds(n: int, p: float, confidence: float) -> tuple[int, int]:
    """[lo, hi] holding a Binomial(n, p) draw with at least ``confidence``."""
    tail = (1 - confidence) / 2
    cdf, lo = 0.0, None
    for k in range(n + 1):
        cdf += math.comb(n, k) * p**k * (1 - p) ** (n - k)
        if lo is None and cdf > tail:
            lo = k
        if cdf >= 1 - tail:
            assert lo is not None
            return lo, k
    raise AssertionError("unreachable")


def test_error_rate_fraction(s3: Any, brownout: sbc.BrownoutClient) -> None:
    n, p = 400, 0.3
    brownout.set(error_rate=p)
    failed = 0
    for _ in range(n):
        try:
            assert s3.get_object(Bucket=BUCKET, Key="small")["Body"].read() == b"small"
        except ClientError as exc:
            assert exc.response["Error"]["Code"] == "SlowDown"
            failed += 1
    lo, hi = _binomial_bounds(n, p, 0.999)
    assert lo <= failed <= hi, (failed, lo, hi)


def _timed_get(s3: Any, key: str = "small") -> float:
    started = time.perf_counter()
    s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    return time.perf_counter() - started


def test_latency_and_jitter(s3: Any, brownout: sbc.BrownoutClient) -> None:
    base = statistics.median(_timed_get(s3) for _ in range(5))
    brownout.set(latency_ms=150)
    fixed = [_timed_get(s3) for _ in range(5)]
    assert all(0.15 <= t <= base + 0.15 + 0.2 for t in fixed), (base, fixed)
    brownout.set(latency_ms=100, jitter_ms=80)
    jittered = [_timed_get(s3) for _ in range(20)]
    assert all(0.02 <= t <= base + 0.18 + 0.2 for t in jittered), jittered
    assert min(jittered) < 0.08 and max(jittered) > 0.12, jittered
    assert brownout.state().counters.delayed >= 25


def test_bandwidth_cap_on_a_1mib_get(s3: Any, brownout: sbc.BrownoutClient) -> None:
    data = os.urandom(1 << 20)
    s3.put_object(Bucket=BUCKET, Key="mib", Body=data)
    assert _timed_get(s3, "mib") < 0.5  # uncapped
    before = brownout.set(bandwidth_kbps=8000).counters.bandwidth_limited  # 1,000,000 bytes/s
    started = time.perf_counter()
    got = s3.get_object(Bucket=BUCKET, Key="mib")["Body"].read()
    elapsed = time.perf_counter() - started
    expected = len(data) / 1_000_000
    assert 0.7 * expected <= elapsed <= 1.3 * expected, (elapsed, expected)
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    assert brownout.state().counters.bandwidth_limited == before + 1


def test_methods_filter(s3: Any, brownout: sbc.BrownoutClient) -> None:
    brownout.set(error_rate=1.0, methods=["PUT"], latency_ms=100)
    assert s3.get_object(Bucket=BUCKET, Key="small")["Body"].read() == b"small"
    s3.head_object(Bucket=BUCKET, Key="small")
    assert _timed_get(s3) < 0.1  # nor delayed
    started = time.perf_counter()
    with pytest.raises(ClientError) as info:
        s3.put_object(Bucket=BUCKET, Key="filtered", Body=b"x")
    assert _code(info) == ("SlowDown", 503) and time.perf_counter() - started >= 0.1


def test_clear_restores(s3: Any, brownout: sbc.BrownoutClient) -> None:
    brownout.set(error_rate=1.0, latency_ms=50, bandwidth_kbps=100)
    with pytest.raises(ClientError):
        s3.put_object(Bucket=BUCKET, Key="after-clear", Body=b"x")
    status = brownout.clear()
    assert status.state == sb.HEALTHY and not status.active
    assert status.counters.injected["SlowDown"] >= 1  # counters are kept: they are counters
    s3.put_object(Bucket=BUCKET, Key="after-clear", Body=b"x")
    assert _timed_get(s3, "after-clear") < 0.05


@pytest.mark.parametrize(("body", "field"), [
    (b'{"error_rate": 1.5}', "error_rate"), (b'{"error_rate": NaN}', "error_rate"),
    (b'{"error_code": "Throttled"}', "error_code"), (b'{"latency_ms": -1}', "latency_ms"),
    (b'{"methods": ["PATCH"]}', "methods"), (b'{"retry_after_s": "soon"}', "retry_after_s"),
    (b'{"error_rate": 0.5, "typo": 1}', "typo"), (b"not json", "body"), (b"[1]", "body"),
    (b"{" + b" " * sb.MAX_CONTROL_BODY + b"}", "body"),
])
def test_bad_bodies_rejected_and_nothing_changed(endpoint: str, brownout: sbc.BrownoutClient,
                                                 body: bytes, field: str) -> None:
    kept = brownout.set(error_rate=0.1, methods=["GET"], latency_ms=1).state
    answer = httpx.put(endpoint + sb.CONTROL_PATH, content=body)
    assert answer.status_code == 422, answer.text
    doc = answer.json()
    assert doc["field"] == field and doc["reason"] and doc["message"].startswith(field)
    assert brownout.state().state == kept


def test_client_errors(endpoint: str, brownout: sbc.BrownoutClient) -> None:
    with pytest.raises(sbc.BrownoutRejected, match="error_rate") as info:
        brownout.set(error_rate=2)
    assert info.value.field == "error_rate" and not brownout.state().active
    assert httpx.post(endpoint + sb.CONTROL_PATH).status_code == 405
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(sbc.BrownoutUnreachable, match=url):
        sbc.BrownoutClient(url).state()
    assert time.monotonic() - started < 3


def test_metrics(endpoint: str, s3: Any, brownout: sbc.BrownoutClient) -> None:
    before = brownout.state().counters
    brownout.set(error_rate=1.0, error_code="InternalError")
    for _ in range(3):
        with pytest.raises(ClientError):
            s3.get_object(Bucket=BUCKET, Key="small")
    answer = httpx.get(endpoint + sb.METRICS_PATH)
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(answer.text)
               for s in family.samples}
    assert samples[("gameday_s3_brownout_error_rate", ())] == 1.0
    assert samples[("gameday_s3_brownout_requests_total", ())] == before.requests + 3
    assert samples[("gameday_s3_brownout_injected_total", (("code", "InternalError"),))] == (
        before.injected["InternalError"] + 3)


def test_moto_api_and_virtual_hosted_keys_pass(endpoint: str, s3: Any,
                                               brownout: sbc.BrownoutClient) -> None:
    """The environment's health check (moto's API) never browns out, and on a virtual-hosted
    host the control path is an ordinary object key, stored by moto."""
    brownout.set(error_rate=1.0)
    assert httpx.get(endpoint + "/moto-api/").status_code == 200
    brownout.clear()
    answer = httpx.put(endpoint + sb.CONTROL_PATH, content=b"an object",
                       headers={"Host": f"{BUCKET}.s3.amazonaws.com"})
    assert answer.status_code == 200, answer.text
    got = s3.get_object(Bucket=BUCKET, Key=sb.CONTROL_PATH.lstrip("/"))["Body"].read()
    assert got == b"an object" and not brownout.state().active


def test_data_intact_before_during_and_after(endpoint: str, s3: Any,
                                             brownout: sbc.BrownoutClient) -> None:
    """The brownout answers instead of moto and never changes what moto holds: what was
    written before and, through retries, during it reads back intact; a write that only got
    an injected error never landed."""
    rng = random.Random(1)
    written = {f"intact/before/{i}": rng.randbytes(2048) for i in range(20)}
    for key, data in written.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=data)
    store = storage.ObjectStore(
        s3, BUCKET, storage.RetryPolicy(initial_backoff=0.005, max_backoff=0.05,
                                        deadline_seconds=20))
    brownout.set(error_rate=1.0)
    with pytest.raises(ClientError):
        s3.put_object(Bucket=BUCKET, Key="intact/never", Body=b"lost")
    brownout.set(error_rate=0.5, latency_ms=2)
    during = {f"intact/during/{i}": rng.randbytes(2048) for i in range(20)}
    for key, data in during.items():
        store.put(key, data)
    assert store.retry_counts[storage.THROTTLED] > 0, "the brownout should have throttled some"
    assert all(store.get(key) == data for key, data in written.items())
    brownout.clear()
    written.update(during)
    for key, data in written.items():
        assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == data, key
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="intact/")
    assert sorted(o["Key"] for o in listed["Contents"]) == sorted(written)


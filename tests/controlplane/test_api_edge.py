"""Bad input at the API's edge, against a real API process and a real PostgreSQL: NUL,
unpaired surrogates and non-finite numbers are a 422 naming the field wherever they are;
bodies above the limit are a 413 (from the API and from the local environment's HAProxy); a
422 quotes a short prefix of the value, never the whole input; image paths cannot climb."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from controlplane.api.edge import MAX_QUOTED_CHARS
from controlplane.models import MAX_BODY_BYTES
from controlplane.registry import ImageRef, InvalidImageReference
from environments.local.configs import haproxy_cfg
from environments.local.launch import ControlPlane
from environments.local.pgserver import PostgresServer

from .helpers import IMAGE, Api, spec

NUL = "\x00"
SURROGATE = "\ud800"  # an unpaired high surrogate: json.dumps escapes it as \ud800


@pytest.fixture(scope="module")
def cp(pg_server: PostgresServer, pg_template: str,
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One API and reconciler for the module: every test here is refused input, which leaves
    nothing behind for the next (cp_stack's fresh database per test costs ~6 s each)."""
    dsn = pg_server.create_database("edge", template=pg_template)
    stack = ControlPlane(dsn=dsn, logdir=tmp_path_factory.mktemp("cp-edge"))
    stack.start(migrate=False)
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def user(cp: ControlPlane) -> Api:
    return Api(cp.api_url, cp.user_token)


@pytest.fixture
def agent(cp: ControlPlane) -> Api:
    return Api(cp.api_url, cp.agent_token)


def _post(api: Api, path: str, body: Any, key: bool = True) -> httpx.Response:
    """``body`` encoded by json.dumps as it is (NaN, Infinity and lone surrogates included)."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Idempotency-Key"] = str(uuid.uuid4())
    return api.c.post(path, content=json.dumps(body), headers=headers)


def _locs(r: httpx.Response) -> list[list[Any]]:
    assert r.status_code == 422, (r.status_code, r.text[:500])
    detail = r.json()["detail"]
    assert isinstance(detail, list), detail  # the schema's HTTPValidationError, every time
    return [e["loc"] for e in detail]


def _with(**workload: Any) -> dict[str, Any]:
    s = spec()
    s["workload"].update(workload)
    return s


# (where, body, the loc the 422 names)
BAD_TEXT = [
    ("label value NUL", {**spec(), "labels": {"team": "a" + NUL}}, ["body", "labels", "team"]),
    ("label value surrogate", {**spec(), "labels": {"team": SURROGATE}},
     ["body", "labels", "team"]),
    ("params value NUL", _with(params={"steps": 10, "note": NUL}),
     ["body", "workload", "params", "note"]),
    ("params key NUL", _with(params={"k" + NUL: 1}),
     ["body", "workload", "params", "k" + NUL]),
    ("params nested surrogate", _with(params={"a": [{"b": "x" + SURROGATE}]}),
     ["body", "workload", "params", "a", 0, "b"]),
]


@pytest.mark.parametrize("where,body,loc", BAD_TEXT, ids=[b[0] for b in BAD_TEXT])
def test_nul_and_surrogates_in_a_submission_are_422_naming_the_field(
        user: Api, where: str, body: dict[str, Any], loc: list[Any]) -> None:
    assert _locs(_post(user, "/v1/operations", body)) == [loc]


def test_nul_and_surrogates_everywhere_else_are_422_naming_the_field(
        user: Api, agent: Api) -> None:
    assert _locs(user.c.get("/v1/operations", params={"queue": NUL})) == [["query", "queue"]]
    assert _locs(user.c.get("/v1/operations/%00")) == [["path", "op_id"]]
    op = user.submit(spec()).json()
    effects = f"/v1/operations/{op['id']}/side-effects"
    assert _locs(_post(user, effects, {"action_id": "a" + NUL, "kind": "register"},
                       key=False)) == [["body", "action_id"]]
    assert _locs(_post(user, effects, {"action_id": "a", "kind": "register",
                                       "payload": {"model": SURROGATE}}, key=False)
                 ) == [["body", "payload", "model"]]
    pipeline = {"name": "p", "labels": {"x": NUL},
                "steps": [{"name": "train", "operation": {"workload": {"image": IMAGE}}}]}
    assert _locs(_post(user, "/v1/pipelines", pipeline)) == [["body", "labels", "x"]]
    aid = agent.register("edge-agent")
    events = {"attempt_id": str(uuid.uuid4()),
              "events": [{"kind": "evidence_dropped", "message": "m" + NUL}]}
    assert _locs(_post(agent, f"/v1/agents/{aid}/events", events, key=False)) == [
        ["body", "events", 0, "message"]]
    # no side effect was recorded for the refused ones: the same action id is still free
    ok = _post(user, effects, {"action_id": "a", "kind": "register"}, key=False)
    assert ok.status_code == 201 and ok.json()["created"] is True


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")],
                         ids=["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_422_not_stored_as_null(user: Api, number: float) -> None:
    r = _post(user, "/v1/operations", _with(params={"steps": 10, "lr": number}))
    assert _locs(r) == [["body", "workload", "params", "lr"]]


def test_an_overflowing_number_is_422(user: Api) -> None:
    text = json.dumps(_with(params={"steps": 10})).replace('"steps": 10', '"steps": 1e999')
    r = user.c.post("/v1/operations", content=text,
                    headers={"Content-Type": "application/json",
                             "Idempotency-Key": str(uuid.uuid4())})
    assert _locs(r) == [["body", "workload", "params", "steps"]]


def test_a_body_above_the_limit_is_413_unread(user: Api) -> None:
    big = _with(params={"blob": "x" * (MAX_BODY_BYTES + 1)})
    r = _post(user, "/v1/operations", big)
    assert r.status_code == 413 and str(MAX_BODY_BYTES) in r.json()["detail"]
    assert len(r.content) < 200

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        yield b'{"name": "x", "workload": {"image": "' + IMAGE.encode() + b'", "params": '
        yield b'{"blob": "' + b"x" * (MAX_BODY_BYTES + 1) + b'"}}}'

    r = user.c.post("/v1/operations", content=chunks(),
                    headers={"Content-Type": "application/json",
                             "Idempotency-Key": str(uuid.uuid4())})
    assert r.status_code == 413
    # below the limit a chunked body is read as always
    r = user.c.post("/v1/operations", content=iter([json.dumps(spec()).encode()]),
                    headers={"Content-Type": "application/json",
                             "Idempotency-Key": str(uuid.uuid4())})
    assert r.status_code == 201, r.text


def test_a_422_quotes_a_short_prefix_never_the_whole_input(user: Api) -> None:
    long_name = "n" * (MAX_BODY_BYTES // 2)
    r = _post(user, "/v1/operations", {**spec(), "name": long_name})
    assert _locs(r) == [["body", "name"]]
    assert len(r.content) < 2_000, len(r.content)
    quoted = r.json()["detail"][0]["input"]
    assert long_name.startswith(quoted[:MAX_QUOTED_CHARS]) and len(quoted) <= MAX_QUOTED_CHARS + 3
    # an unknown field's error quotes the whole body as its input in FastAPI: bounded too
    r = _post(user, "/v1/operations", {**spec(), "bogus": "b" * 100_000})
    assert r.status_code == 422 and len(r.content) < 2_000, len(r.content)


def test_a_404_quotes_a_bounded_id(user: Api, agent: Api) -> None:
    long_id = "a" * 8_000
    for api, path in ((user, f"/v1/operations/{long_id}"),
                      (agent, f"/v1/agents/{long_id}/heartbeat")):
        r = api.c.request("GET" if api is user else "POST", path)
        assert r.status_code == 404 and len(r.content) < 1_000, (path[:30], len(r.content))


def test_booleans_are_not_numbers_and_numbers_are_not_booleans(user: Api, agent: Api) -> None:
    body = {"name": "strict-agent", "pool": "cpu", "zone": "zone-a", "region": "region-1",
            "capabilities": {"cpu_slots": 4, "accelerator_count": False}}
    r = agent.c.post("/v1/agents/register", json=body)
    assert _locs(r) == [["body", "capabilities", "accelerator_count"]]
    r = _post(user, "/v1/operations", {**spec(), "placement": {"interruptible": 0}})
    assert _locs(r) == [["body", "placement", "interruptible"]]
    # an integral float is an integer to JSON Schema, and to the API
    r = _post(user, "/v1/operations", {**spec(), "priority": 5.0})
    assert r.status_code == 201 and r.json()["priority"] == 5, r.text


def test_an_image_path_that_climbs_is_refused_by_the_api_as_by_the_agent(user: Api) -> None:
    image = "127.0.0.1:5000/ml/../trainer:1.0"
    r = _post(user, "/v1/operations", _with(image=image))
    assert _locs(r) == [["body", "workload", "image"]]
    assert "'..'" in r.json()["detail"][0]["msg"]
    with pytest.raises(InvalidImageReference, match=r"'\.\.'"):
        ImageRef.parse(image)  # the agent's check, the same function
    assert _post(user, "/v1/operations", _with(image="127.0.0.1:5000/ml/a..b:1")).status_code \
        == 422


# -- the local environment's HAProxy ---------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def haproxy(cp: ControlPlane, tmp_path: Path) -> Iterator[str]:
    """The environment's generated haproxy.cfg, its API backends pointed at this test's API."""
    api_port = int(cp.api_url.rsplit(":", 1)[1])
    ports: dict[str, int] = {}

    class Ports(dict):  # type: ignore[type-arg]
        def __missing__(self, key: str) -> int:
            ports[key] = api_port if key.startswith("api") else _free_port()
            return ports[key]

    (tmp_path / "run").mkdir()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(haproxy_cfg(tmp_path, Ports()))
    proc = subprocess.Popen(["/usr/sbin/haproxy", "-db", "-f", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{ports['haproxy_api']}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_haproxy_refuses_a_body_above_the_limit_before_the_api(
        haproxy: str, cp: ControlPlane) -> None:
    headers = {"Authorization": f"Bearer {cp.user_token}",
               "Content-Type": "application/json", "Idempotency-Key": str(uuid.uuid4())}
    big = json.dumps(_with(params={"blob": "x" * (MAX_BODY_BYTES + 1)}))
    r = httpx.post(f"{haproxy}/v1/operations", content=big, headers=headers, timeout=10)
    assert r.status_code == 413, r.text[:300]
    assert r.headers["content-type"] == "application/json"
    assert str(MAX_BODY_BYTES) in r.json()["detail"]
    ok = httpx.post(f"{haproxy}/v1/operations", content=json.dumps(spec()), headers=headers,
                    timeout=10)
    assert ok.status_code == 201, ok.text

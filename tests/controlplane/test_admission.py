"""Admission control (controlplane/api/admission.py): the pure policy, the gate and middleware
in process, and a real API process whose database stalls (a held table lock): submissions are
refused at once with 503 + Retry-After, agents and health are still answered, and every 201 was
committed. With admission control off (`--max-in-flight 0`) the same requests queue instead."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner
from prometheus_client import REGISTRY

from controlplane.api.admission import (
    QUEUE_TIMEOUT,
    STANDING_QUEUE,
    AdmissionMiddleware,
    ClassLimit,
    Gate,
    RouteClass,
    classify,
    policy_from,
    wait_allowance,
)
from controlplane.api.app import SETTINGS_ENV, Settings, app_from_env
from controlplane.cli import group
from environments.local.launch import ControlPlane, gameday_cmd, spawn, wait_http
from environments.local.pgserver import free_port

SPEC = {"name": "adm", "workload": {"kind": "train", "image": "127.0.0.1:5000/ml/trainer:1.0"},
        "placement": {"dataset": "nowhere"}}


# --------------------------------------------------------------------------- the pure policy

def test_routes_fall_into_classes() -> None:
    assert {p: classify(p) for p in ("/healthz", "/readyz", "/metrics")} == dict.fromkeys(
        ("/healthz", "/readyz", "/metrics"), RouteClass.HEALTH)
    for p in ("/v1/agents", "/v1/agents/x/heartbeat", "/v1/agents/x/claim",
              "/v1/attempts/a/report", "/v1/attempts/a/events"):
        assert classify(p) is RouteClass.AGENT, p
    for p in ("/v1/operations", "/v1/operations/x", "/v1/pipelines", "/v1/agentsx", "/docs",
              "/metricsx"):
        assert classify(p) is RouteClass.USER, p


def test_a_burst_may_wait_its_deadline_a_standing_queue_only_the_short_wait() -> None:
    limit = ClassLimit(max_in_flight=4, max_wait_s=0.1, standing_wait_s=0.005)
    assert wait_allowance(limit, queued=0, now=10.0, last_empty=0.0) == (0.1, QUEUE_TIMEOUT)
    assert wait_allowance(limit, queued=5, now=10.0, last_empty=9.95) == (0.1, QUEUE_TIMEOUT)
    assert wait_allowance(limit, queued=5, now=10.0, last_empty=9.875) == (0.005, STANDING_QUEUE)


def test_the_defaults_and_bad_limits() -> None:
    policy = policy_from(Settings(dsn="x", lease_seconds=15.0))
    assert policy.user == ClassLimit(128, 0.1, 0.005) and policy.retry_after_s == 1
    # agents: slots of their own, many more, and as long a wait as their call deadline
    assert policy.agent == ClassLimit(1024, 3.0, 3.0)
    assert policy.unbounded().user is None and policy.unbounded().agent is None
    assert policy_from(Settings(dsn="x", max_in_flight=0)).user is None  # off
    for bad, field in (({"max_in_flight": -1}, "max_in_flight"),
                       ({"max_queue_wait_ms": -1}, "max_wait_s"),
                       ({"retry_after_seconds": 0}, "retry_after_s")):
        with pytest.raises(ValueError, match=field):
            policy_from(Settings(dsn="x", **bad))  # type: ignore[arg-type]


def test_the_seeded_defect_admits_every_user_request_and_keeps_agent_slots(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from controlplane import defects

    monkeypatch.setenv(defects.ENV, "admission-unbounded")
    defects.active.cache_clear()
    try:
        policy = policy_from(Settings(dsn="x", lease_seconds=15.0))
        assert policy.user is None  # every user request admitted, however many wait
        assert policy.agent == ClassLimit(1024, 3.0, 3.0)
    finally:
        monkeypatch.delenv(defects.ENV)
        defects.active.cache_clear()
    assert policy_from(Settings(dsn="x")).user == ClassLimit(128, 0.1, 0.005)


def test_the_second_seeded_defect_bounds_the_slots_but_not_the_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from controlplane import defects

    limit = ClassLimit(4, 0.1, 0.005)
    monkeypatch.setenv(defects.ENV, "admission-wait-unbounded")
    defects.active.cache_clear()
    try:
        assert policy_from(Settings(dsn="x")).user == ClassLimit(128, 0.1, 0.005)
        # a standing queue, which the healthy gate lets wait 5 ms: a day
        assert wait_allowance(limit, queued=5, now=10.0, last_empty=0.0) == (
            86_400.0, QUEUE_TIMEOUT)
    finally:
        monkeypatch.delenv(defects.ENV)
        defects.active.cache_clear()
    assert wait_allowance(limit, queued=5, now=10.0, last_empty=0.0) == (0.005, STANDING_QUEUE)


def test_a_freed_slot_goes_to_the_oldest_waiter_in_time_and_late_ones_are_refused() -> None:
    async def go() -> None:
        gate = Gate(ClassLimit(max_in_flight=1, max_wait_s=0.2, standing_wait_s=0.01))
        assert await gate.acquire() == (None, 0.0)
        first = asyncio.ensure_future(gate.acquire())
        second = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0.05)
        gate.release()  # to the oldest waiter
        reason, waited = await first
        assert reason is None and 0.04 < waited < 0.2 and gate.in_flight == 1
        reason, waited = await second  # nobody released again: refused at its deadline
        assert reason == QUEUE_TIMEOUT and waited >= 0.19 and gate.queued == 0
        # a queue that formed after a quiet spell is a burst again ...
        await asyncio.sleep(0.3)
        waiters = [asyncio.ensure_future(gate.acquire())]
        await asyncio.sleep(0.15)
        waiters.append(asyncio.ensure_future(gate.acquire()))
        await asyncio.sleep(0.08)  # ... but one never empty for max_wait_s is standing:
        t0 = time.monotonic()      # a newcomer may wait only 10 ms
        assert (await gate.acquire())[0] == STANDING_QUEUE and time.monotonic() - t0 < 0.1
        assert [(await w)[0] for w in waiters] == [QUEUE_TIMEOUT] * 2
        gate.release()
        assert gate.in_flight == 0 and gate.queued == 0
        assert await gate.acquire() == (None, 0.0)  # the queue is empty again: at once

    asyncio.run(go())


def test_a_cancelled_waiter_passes_on_the_slot_it_was_handed() -> None:
    async def go() -> None:
        gate = Gate(ClassLimit(max_in_flight=1, max_wait_s=1.0, standing_wait_s=1.0))
        await gate.acquire()
        waiter = asyncio.ensure_future(gate.acquire())
        await asyncio.sleep(0.01)
        gate.release()  # handed over ...
        waiter.cancel()  # ... but its request is gone before it ran
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert gate.in_flight == 0 and gate.queued == 0

    asyncio.run(go())


# --------------------------------------------------------------------------- in process

def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Held:
    """An inner app whose /v1 requests are answered only once released."""

    def __init__(self) -> None:
        self.released = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"].startswith("/v1/"):
            await self.released.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def test_the_middleware_refuses_users_beyond_the_bound_never_health_or_agents() -> None:
    settings = Settings(dsn="x", max_in_flight=2, max_queue_wait_ms=50, retry_after_seconds=3,
                        agent_max_in_flight=2)
    shed0 = sample("controlplane_admission_shed_total", **{"class": "user",
                                                           "reason": QUEUE_TIMEOUT})

    async def go() -> None:
        inner = Held()
        mw = AdmissionMiddleware(inner, settings)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw),
                                     base_url="http://api") as c:
            held = [asyncio.ensure_future(c.post("/v1/operations")) for _ in range(2)]
            agents = [asyncio.ensure_future(c.post(f"/v1/attempts/{i}/heartbeat"))
                      for i in range(2)]
            await asyncio.sleep(0.05)
            t0 = time.monotonic()
            refused = await c.post("/v1/operations")
            assert 0.04 < time.monotonic() - t0 < 1.0
            assert refused.status_code == 503 and refused.headers["retry-after"] == "3"
            body = refused.json()
            assert body["retry_after"] == 3 and body["detail"].startswith("overloaded: ")
            assert (await c.get("/readyz")).status_code == 200  # health is never bounded
            assert mw.gates[RouteClass.USER].in_flight == 2
            assert mw.gates[RouteClass.AGENT].in_flight == 2  # held, never refused for users
            inner.released.set()
            assert [r.status_code for r in await asyncio.gather(*held, *agents)] == [200] * 4
            assert (await c.get("/v1/operations")).status_code == 200
            assert mw.gates[RouteClass.USER].in_flight == 0

    asyncio.run(go())
    assert sample("controlplane_admission_shed_total", **{"class": "user",
                                                          "reason": QUEUE_TIMEOUT}) == shed0 + 1


@pytest.fixture
def cli_started(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    import uvicorn

    root = logging.getLogger()  # the command installs the JSON handler: put the old ones back
    handlers, level = root.handlers[:], root.level
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append({"app": app, **kw}))
    monkeypatch.setenv(SETTINGS_ENV, "")
    monkeypatch.setenv("CONTROLPLANE_LOG_LEVEL", "INFO")
    yield calls
    root.handlers[:] = handlers
    root.setLevel(level)


def test_the_options_reach_the_app_and_bad_values_are_refused_naming_them(
        cli_started: list[dict[str, Any]]) -> None:
    base = ["api", "--dsn", "postgresql://127.0.0.1:1/x", "--workers", "2"]
    res = CliRunner().invoke(group, [*base, "--max-in-flight", "7", "--max-queue-wait-ms", "30",
                                     "--agent-max-in-flight", "9", "--retry-after-seconds", "4"])
    assert res.exit_code == 0, res.output
    s = app_from_env().state.settings
    assert (s.max_in_flight, s.max_queue_wait_ms, s.agent_max_in_flight,
            s.retry_after_seconds) == (7, 30.0, 9, 4)
    for option, value in (("--max-in-flight", "-1"), ("--max-queue-wait-ms", "-1"),
                          ("--agent-max-in-flight", "x"), ("--retry-after-seconds", "0")):
        res = CliRunner().invoke(group, [*base, option, value])
        assert res.exit_code == 2 and option in res.output, (option, res.output)
    assert len(cli_started) == 1


# --------------------------------------------------------------------------- a real process

def _start_api(cp: ControlPlane, logdir: Path, max_in_flight: int = 4) -> str:
    port = free_port()
    proc = spawn(f"api-admission{max_in_flight}", gameday_cmd(
        "controlplane", "api", "--port", str(port), "--max-in-flight", str(max_in_flight),
        "--max-queue-wait-ms", "50", "--retry-after-seconds", "2"), logdir,
        {"CONTROLPLANE_DSN": cp.dsn}, port)
    wait_http(f"http://127.0.0.1:{port}/readyz", proc)
    cp.apis.append(proc)  # stopped with the fixture's ControlPlane
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def seeded(pg_dsn: str, tmp_path: Path) -> Iterator[ControlPlane]:
    cp = ControlPlane(dsn=pg_dsn, replicas=0, reconcilers=0, logdir=tmp_path)
    cp.start(migrate=False)  # the seed only: tokens and queues; the test starts its API
    try:
        yield cp
    finally:
        cp.stop()


def metric(text: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus text scrape, whatever the order of its labels."""
    for found in re.finditer(rf"^{re.escape(name)}\{{(.*)\}} (\S+)$", text, re.MULTILINE):
        if dict(re.findall(r'(\w+)="([^"]*)"', found.group(1))) == labels:
            return float(found.group(2))
    return 0.0


async def _submit(c: httpx.AsyncClient, key: str) -> tuple[str, int, float, httpx.Response]:
    t0 = time.monotonic()
    r = await c.post("/v1/operations", json=SPEC, headers={"Idempotency-Key": key})
    return key, r.status_code, time.monotonic() - t0, r


def _committed_keys(dsn: str, keys: list[str]) -> dict[str, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT idempotency_key, id::text FROM operations "
                            "WHERE idempotency_key = ANY(%s)", (keys,)).fetchall()
    return dict(rows)


def test_a_stalled_database_sheds_submissions_at_once_and_keeps_agents_answered(
        seeded: ControlPlane, tmp_path: Path) -> None:
    url = _start_api(seeded, tmp_path)
    user = {"Authorization": f"Bearer {seeded.user_token}"}
    agent = {"Authorization": f"Bearer {seeded.agent_token}", "X-Agent-Name": "adm-agent"}
    keys = [f"adm-{i}-{uuid.uuid4()}" for i in range(40)]

    async def go() -> tuple[list[tuple[str, int, float, httpx.Response]], str, list[float]]:
        async with httpx.AsyncClient(base_url=url, timeout=30,
                                     limits=httpx.Limits(max_connections=100)) as c:
            agent_id = (await c.post("/v1/agents/register", headers=agent, json={
                "name": "adm-agent", "pool": "cpu", "zone": "z", "region": "r",
                "capabilities": {"cpu_slots": 1}})).json()["agent_id"]
            assert (await c.get("/v1/operations", headers=user)).status_code == 200  # token
            with psycopg.connect(seeded.dsn) as lock:
                lock.execute("LOCK TABLE operations IN EXCLUSIVE MODE")  # commits stall
                c.headers.update(user)
                sent = [asyncio.ensure_future(_submit(c, k)) for k in keys]
                beats = []
                for _ in range(5):  # the agent's own calls are still answered meanwhile
                    t0 = time.monotonic()
                    r = await c.post(f"/v1/agents/{agent_id}/heartbeat", json={},
                                     headers=agent)
                    assert r.status_code == 200, r.text
                    beats.append(time.monotonic() - t0)
                    await asyncio.sleep(0.1)
                deadline = time.monotonic() + 10
                while sum(f.done() for f in sent) < 36 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                scraped = (await c.get("/metrics")).text
                assert not any(f.done() and f.result()[1] != 503 for f in sent)
                lock.rollback()  # the stall ends: the admitted four commit
            return await asyncio.gather(*sent), scraped, beats

    answers, scraped, beats = asyncio.run(go())
    shed = [a for a in answers if a[1] == 503]
    acked = {k: r.json()["id"] for k, status, _, r in answers if status == 201}
    assert len(shed) == 36 and len(acked) == 4, [a[1] for a in answers]
    # committed iff acknowledged: every 201 in the table, no refused key in it
    assert _committed_keys(seeded.dsn, keys) == acked
    assert max(a[2] for a in shed) < 2.0 and max(beats) < 1.0  # nobody waited for the lock
    for _, _, _, r in shed:
        assert r.headers["retry-after"] == "2" and r.json()["retry_after"] == 2
        assert r.json()["detail"].startswith("overloaded: ")
    user_shed = sum(metric(scraped, "controlplane_admission_shed_total",
                           **{"class": "user", "reason": r})
                    for r in (QUEUE_TIMEOUT, STANDING_QUEUE))
    assert user_shed == 36
    assert metric(scraped, "controlplane_admission_in_flight", **{"class": "user"}) == 4
    assert metric(scraped, "controlplane_admission_queue_wait_seconds_count",
                  **{"class": "user"}) >= 40
    assert metric(scraped, "controlplane_http_requests_total", route="/v1/operations",
                  method="POST", code="503") == 36  # counted under its route
    assert not any(metric(scraped, "controlplane_admission_shed_total", **{"class": "agent",
                                                                            "reason": r})
                   for r in (QUEUE_TIMEOUT, STANDING_QUEUE))


def test_without_admission_control_the_same_submissions_queue_behind_the_stall(
        seeded: ControlPlane, tmp_path: Path) -> None:
    url = _start_api(seeded, tmp_path, max_in_flight=0)
    keys = [f"adm-{i}-{uuid.uuid4()}" for i in range(40)]

    async def go() -> tuple[list[tuple[str, int, float, httpx.Response]], str]:
        async with httpx.AsyncClient(base_url=url, timeout=30,
                                     headers={"Authorization": f"Bearer {seeded.user_token}"},
                                     limits=httpx.Limits(max_connections=100)) as c:
            assert (await c.get("/v1/operations")).status_code == 200
            with psycopg.connect(seeded.dsn) as lock:
                lock.execute("LOCK TABLE operations IN EXCLUSIVE MODE")
                sent = [asyncio.ensure_future(_submit(c, k)) for k in keys]
                await asyncio.sleep(1.5)
                scraped = (await c.get("/metrics")).text
                assert not any(f.done() for f in sent)  # all of them wait, none refused
                lock.rollback()
            return await asyncio.gather(*sent), scraped

    answers, scraped = asyncio.run(go())
    assert metric(scraped, "controlplane_admission_in_flight", **{"class": "user"}) == 40
    assert [a[1] for a in answers] == [201] * 40 and min(a[2] for a in answers) > 1.4
    assert len(_committed_keys(seeded.dsn, keys)) == 40

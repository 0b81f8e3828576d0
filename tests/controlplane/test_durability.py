"""Commit before acknowledge: SIGKILL of the API in the middle of a burst loses nothing that
was acknowledged, and retries with the same key never create duplicates."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import psycopg

from environments.local.launch import ControlPlane, gameday_cmd, spawn, wait_http

from .helpers import wait_for


def test_api_sigkill_during_burst_loses_no_acknowledged_submission(
        cp_stack: ControlPlane, tmp_path: Path) -> None:
    api = cp_stack.apis[0]
    ledger = tmp_path / "ledger.jsonl"
    ledger.touch()
    client = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("burst_client.py")), cp_stack.api_url,
         cp_stack.user_token, "600", "4", str(ledger)])
    try:
        wait_for(lambda: len(ledger.read_text().splitlines()) >= 100, timeout=60,
                 what="100 acknowledgements")
        api.kill()  # SIGKILL, mid-burst
        api.popen.wait(5)
        acked_at_kill = len(ledger.read_text().splitlines())
        # restart on the same port; the client retries its in-flight keys
        restarted = spawn("api-0-restarted", gameday_cmd(
            "controlplane", "api", "--port", str(api.port), "--lease-seconds", "3"),
            cp_stack.logdir, {"CONTROLPLANE_DSN": cp_stack.dsn}, api.port)
        cp_stack.apis[0] = restarted
        wait_http(f"{cp_stack.api_url}/readyz", restarted)
        assert client.wait(120) == 0
    finally:
        if client.poll() is None:
            client.kill()
    acks = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert acked_at_kill < 600 and len(acks) == 600
    with psycopg.connect(cp_stack.dsn) as conn:
        rows = conn.execute("SELECT idempotency_key, id::text FROM operations"
                            " WHERE name LIKE 'burst-%'").fetchall()
    stored = dict(rows)
    assert len(rows) == len(stored) == 600  # exactly once per key
    missing = [a for a in acks if stored.get(a["key"]) != a["id"]]
    assert missing == []


_SLOW_COMMIT = """
CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN PERFORM pg_sleep(0.05); RETURN NULL; END $$;
CREATE TRIGGER slow_commit AFTER INSERT ON operations
  FOR EACH STATEMENT EXECUTE FUNCTION slow_commit();
"""


def test_api_sigkill_while_a_group_is_in_flight(cp_stack: ControlPlane) -> None:
    """Every 201 is in the table with its id; nothing is in the table that was not sent; no key
    twice. Each group statement is slowed to 50 ms (a trigger), so at the SIGKILL groups are
    committing and requests are waiting on them; the metrics prove requests were grouped."""
    with psycopg.connect(cp_stack.dsn, autocommit=True) as conn:
        conn.execute(_SLOW_COMMIT)
    api = cp_stack.apis[0]
    sent: set[str] = set()
    acked: dict[str, str] = {}

    async def load() -> None:
        import aiohttp

        headers = {"Authorization": f"Bearer {cp_stack.user_token}"}
        async with aiohttp.ClientSession(headers=headers) as s:
            async def worker(w: int) -> None:
                for i in range(10_000):
                    key = f"inflight-{w}-{i}"
                    sent.add(key)
                    try:
                        async with s.post(f"{cp_stack.api_url}/v1/operations",
                                          headers={"Idempotency-Key": key},
                                          json={"name": key, "workload": {"image": "a:1"}}) as r:
                            if r.status == 201:
                                acked[key] = (await r.json())["id"]
                    except aiohttp.ClientError:
                        return  # the API is gone

            async def killer() -> None:
                while len(acked) < 300:
                    await asyncio.sleep(0.01)
                async with s.get(f"{cp_stack.api_url}/metrics") as r:
                    text = await r.text()
                api.kill()  # SIGKILL with groups in flight
                groups = _sample(text, "controlplane_submit_group_size_count")
                grouped = _sample(text, "controlplane_submit_group_size_sum")
                assert grouped / groups > 2, f"requests were not grouped: {grouped}/{groups}"

            await asyncio.gather(killer(), *(worker(w) for w in range(32)))

    asyncio.run(asyncio.wait_for(load(), 120))
    api.popen.wait(5)
    with psycopg.connect(cp_stack.dsn) as conn:
        rows = conn.execute("SELECT idempotency_key, id::text FROM operations").fetchall()
    stored = dict(rows)
    assert len(rows) == len(stored)  # no key twice
    assert set(stored) <= sent  # nothing that was not sent
    assert {k: stored.get(k) for k in acked} == acked  # every 201 committed, same id
    assert len(sent) > len(acked)  # requests were in flight at the kill


def _sample(metrics_text: str, name: str) -> float:
    for line in metrics_text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")

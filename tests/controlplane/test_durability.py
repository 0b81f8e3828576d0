"""Commit before acknowledge: SIGKILL of the API in the middle of a burst loses nothing that
was acknowledged, and retries with the same key never create duplicates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg

from infra.local.launch import ControlPlane, gameday_cmd, spawn, wait_http

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

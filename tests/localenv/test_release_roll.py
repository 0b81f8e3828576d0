"""The local driver's rolling upgrade on the real environment (environments/local/faults.py
roll_release): the schema step runs `controlplane migrate --release N+1` against the
environment's database, a process restarts as N+1 and answers, and restore_all takes the
processes back to N on the expanded schema (docs/upgrades.md). The full game day once failed
on this path with an AttributeError nothing cheaper ran into."""

from __future__ import annotations

import json

import psycopg

from environments.local.env import LocalEnvironment


def _columns(env: LocalEnvironment) -> set[str]:
    with psycopg.connect(env.endpoints["dsn"]) as conn:
        rows = conn.execute("SELECT column_name FROM information_schema.columns"
                            " WHERE table_name = 'operations'").fetchall()
    return {r[0] for r in rows}


def test_roll_one_replica_to_n_plus_1_and_back(env: LocalEnvironment) -> None:
    out = env.faults.roll_release("N+1", ["api-1"], timeout=60.0)
    assert out["steps"] == ["schema", "api-1"] and out["schema"] == "N+1", out
    assert out["releases"]["api-1"] == "N+1" and out["releases"]["api-2"] == "N", out
    assert "wait_reason" in _columns(env) and "pending_reason" in _columns(env)
    env.wait_healthy(["api-1", "api-2"], 30.0)

    env.faults.restore_all()
    assert {c: env.release_of(c) for c in env.release_order()} == dict.fromkeys(
        env.release_order(), "N")
    env.wait_healthy(["api-1"], 30.0)
    lines = [json.loads(x) for x in env.timeline_file.read_text().splitlines() if x]
    spans = [(x["event"], x["target"]) for x in lines if x["fault"] == "roll_release"]
    assert spans[:4] == [("fault_start", "schema"), ("fault_end", "schema"),
                         ("fault_start", "api-1"), ("fault_end", "api-1")], spans

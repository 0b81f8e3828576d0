"""`controlplane migrate --agent-token-env`: how the cloud deploy registers the agent token it
generated in-cluster (provisioning/components/controlplane.py), against a real PostgreSQL."""

from __future__ import annotations

import psycopg
from click.testing import CliRunner

from controlplane.cli import group
from controlplane.store.auth import hash_token


def test_migrate_registers_the_agent_token_from_the_environment_once(pg_dsn: str) -> None:
    token = "t0k3n-from-an-external-secret-48-chars-long-xyz"
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("UPDATE queues SET concurrency = 7 WHERE name = 'default'")
        queues = conn.execute("SELECT name, priority, concurrency FROM queues ORDER BY name").fetchall()
    for _ in range(2):  # a Job retried or re-run with the same image: idempotent
        result = CliRunner().invoke(group, ["migrate", "--dsn", pg_dsn, "--agent-token-env", "TOK"],
                                    env={"TOK": token})
        assert result.exit_code == 0, result.output
        assert "1 agent token(s) registered" in result.output
    assert token not in result.output  # never echoed
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT role FROM tokens WHERE token_hash = %s",
                            (hash_token(token),)).fetchall()
        after = conn.execute("SELECT name, priority, concurrency FROM queues ORDER BY name").fetchall()
    assert rows == [("agent",)]
    assert after == queues  # no queue touched (seed's default queue would reset "default")


def test_migrate_refuses_a_short_token(pg_dsn: str) -> None:
    result = CliRunner().invoke(group, ["migrate", "--dsn", pg_dsn, "--agent-token-env", "TOK"],
                                env={"TOK": "short"})
    assert result.exit_code != 0 and "too short" in result.output

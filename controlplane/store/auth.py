"""Tokens (stored as SHA-256 hashes) and the seed data: projects, queues, tokens."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection, Connection
from psycopg.rows import dict_row


@dataclass(frozen=True)
class Principal:
    role: str  # user | agent | admin
    project_id: str | None = None
    project: str | None = None


def hash_token(token: str) -> str:
    # Tokens are random and long, so a fast hash is enough: nothing to brute-force.
    return hashlib.sha256(token.encode()).hexdigest()


async def lookup(conn: AsyncConnection, token: str) -> Principal | None:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            "SELECT t.role, t.project_id::text AS project_id, p.name AS project FROM tokens t"
            " LEFT JOIN projects p ON p.id = t.project_id WHERE t.token_hash = %s",
            (hash_token(token),),
        )
        row = await cur.fetchone()
    return Principal(**row) if row else None


def seed(conn: Connection, data: dict[str, Any]) -> dict[str, int]:
    """Create projects, queues and tokens (idempotent). ``data`` follows CONTRACTS.md section 2."""
    counts = {"projects": 0, "queues": 0, "tokens": 0}
    with conn.transaction():
        for q in data.get("queues", [{"name": "default"}]):
            conn.execute(
                "INSERT INTO queues (name, priority, concurrency) VALUES (%s, %s, %s)"
                " ON CONFLICT (name) DO UPDATE SET priority = EXCLUDED.priority,"
                " concurrency = EXCLUDED.concurrency",
                (q["name"], int(q.get("priority", 0)), int(q.get("concurrency", 100))),
            )
            counts["queues"] += 1
        for p in data.get("projects", []):
            row = conn.execute(
                "INSERT INTO projects (name) VALUES (%s) ON CONFLICT (name)"
                " DO UPDATE SET name = EXCLUDED.name RETURNING id", (p["name"],),
            ).fetchone()
            counts["projects"] += 1
            for tok in ([p["token"]] if "token" in p else []) + list(p.get("tokens", [])):
                counts["tokens"] += _add_token(conn, tok, "user", row[0])
        for tok in data.get("agent_tokens", []):
            counts["tokens"] += _add_token(conn, tok, "agent", None)
        for tok in data.get("admin_tokens", []):
            counts["tokens"] += _add_token(conn, tok, "admin", None)
    return counts


def _add_token(conn: Connection, token: str, role: str, project_id: Any) -> int:
    if len(token) < 16:
        raise ValueError(f"{role} token too short: tokens need at least 16 characters")
    conn.execute(
        "INSERT INTO tokens (token_hash, role, project_id) VALUES (%s, %s, %s)"
        " ON CONFLICT (token_hash) DO NOTHING", (hash_token(token), role, project_id),
    )
    return 1

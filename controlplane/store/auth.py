"""Tokens (stored as SHA-256 hashes) and the seed data: projects, queues, tokens.

Every token has an expiry (``expires_at``; seeded tokens get the column's default, 90 days)
and may be revoked (``revoked_at``). A refused token is told why: unknown, expired (when) or
revoked (when), so whoever holds it knows whether to fetch the rotated one or ask for a new one.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg import AsyncConnection, Connection
from psycopg.rows import dict_row

from controlplane import defects


@dataclass(frozen=True)
class Principal:
    role: str  # user | agent | admin
    project_id: str | None = None
    project: str | None = None
    expires_at: datetime | None = None  # None only for principals built outside the store


class TokenRefused(Exception):
    """The token is unknown, expired or revoked (the message says which, and since when)."""


def hash_token(token: str) -> str:
    # Tokens are random and long, so a fast hash is enough: nothing to brute-force.
    return hashlib.sha256(token.encode()).hexdigest()


def token_id(token_hash: str) -> str:
    """The public name of a token: the start of its hash (safe to log, print and revoke by)."""
    return token_hash[:12]


def new_token(role: str) -> str:
    return f"{role}-{secrets.token_urlsafe(24)}"


def refusal(row: dict[str, Any] | None, now: datetime) -> str | None:
    """Why a token row may not authenticate at ``now`` (None: it may). Pure."""
    if row is None:
        return "invalid token"
    if row.get("revoked_at") is not None:
        return f"token {token_id(row['token_hash'])} was revoked at {_utc(row['revoked_at'])}"
    if row["expires_at"] <= now:
        return (f"token {token_id(row['token_hash'])} expired at "
                f"{_utc(row['expires_at'])}: use the rotated token or issue a new "
                "one (gameday controlplane token issue)")
    return None


_LOOKUP = ("SELECT t.token_hash, t.role, t.project_id::text AS project_id, p.name AS project,"
           " t.expires_at, t.revoked_at, now() AS now FROM tokens t"
           " LEFT JOIN projects p ON p.id = t.project_id WHERE t.token_hash = %s")


def _utc(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def lookup(conn: AsyncConnection, token: str) -> Principal:
    """The principal of a valid token; TokenRefused (why) for an unknown, expired or revoked
    one. Expiry is judged on the database's clock, the one that wrote ``expires_at``."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(_LOOKUP, (hash_token(token),))
        row = await cur.fetchone()
    if row is not None and row["role"] == "agent" and defects.enabled("agent-revocation-ignored"):
        row = {**row, "revoked_at": None}  # seeded defect: test only
    why = refusal(row, row["now"] if row else datetime.now(UTC))
    if why or row is None:
        raise TokenRefused(why or "invalid token")
    return Principal(row["role"], row["project_id"], row["project"], row["expires_at"])


def issue(conn: Connection, role: str, *, project: str | None = None,
          ttl: timedelta = timedelta(days=30)) -> tuple[str, dict[str, Any]]:
    """A new random token for ``role`` (``project`` for user tokens), valid for ``ttl``.
    Returns the token (shown once, never stored) and its row (id, role, project, expiry)."""
    if role not in ("user", "agent", "admin"):
        raise ValueError(f"role {role!r}: expected user, agent or admin")
    if (role == "user") != (project is not None):
        raise ValueError("a user token needs --project; agent and admin tokens take none")
    if ttl <= timedelta(0):
        raise ValueError(f"ttl {ttl}: must be positive")
    project_id = None
    if project is not None:
        found = conn.execute("SELECT id FROM projects WHERE name = %s", (project,)).fetchone()
        if found is None:
            raise ValueError(f"project {project!r} does not exist (seed it first)")
        project_id = found[0]
    token = new_token(role)
    row = conn.execute(
        "INSERT INTO tokens (token_hash, role, project_id, expires_at)"
        " VALUES (%s, %s, %s, now() + %s) RETURNING expires_at",
        (hash_token(token), role, project_id, ttl)).fetchone()
    conn.commit()
    return token, {"id": token_id(hash_token(token)), "role": role, "project": project,
                   "expires_at": row[0].isoformat() if row else None}


def revoke(conn: Connection, *, token_id_prefix: str | None = None,
           token: str | None = None) -> list[str]:
    """Revoke by id (the hash prefix ``list`` shows, at least 8 characters) or by the token
    itself; returns the ids revoked now (an already revoked token is not revoked again)."""
    if (token_id_prefix is None) == (token is None):
        raise ValueError("give a token id or a token, not both")
    if token is not None:
        where, arg = "token_hash = %s", hash_token(token)
    else:
        prefix = (token_id_prefix or "").lower()
        if len(prefix) < 8 or any(c not in "0123456789abcdef" for c in prefix):
            raise ValueError(f"token id {token_id_prefix!r}: give at least 8 hex characters "
                             "of the id `token list` shows")
        matches = conn.execute("SELECT count(*) FROM tokens WHERE token_hash LIKE %s",
                               (prefix + "%",)).fetchone()
        if matches and matches[0] > 1:
            raise ValueError(f"token id {prefix!r} matches {matches[0]} tokens: give more of it")
        where, arg = "token_hash LIKE %s", prefix + "%"
    rows = conn.execute(f"UPDATE tokens SET revoked_at = now() WHERE {where}"
                        " AND revoked_at IS NULL RETURNING token_hash", (arg,)).fetchall()
    conn.commit()
    return [token_id(r[0]) for r in rows]


def list_tokens(conn: Connection) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT t.token_hash, t.role, p.name AS project, t.created_at, t.expires_at,"
            " t.revoked_at, now() AS now FROM tokens t LEFT JOIN projects p"
            " ON p.id = t.project_id ORDER BY t.created_at, t.token_hash").fetchall()
    out = []
    for r in rows:
        status = ("revoked" if r["revoked_at"] is not None else
                  "expired" if r["expires_at"] <= r["now"] else "valid")
        out.append({"id": token_id(r["token_hash"]), "role": r["role"], "project": r["project"],
                    "created_at": r["created_at"].isoformat(),
                    "expires_at": r["expires_at"].isoformat(),
                    "revoked_at": r["revoked_at"].isoformat() if r["revoked_at"] else None,
                    "status": status})
    return out


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

"""Token expiry, revocation and rotation: `controlplane token issue|revoke|list` against a
real PostgreSQL, the refusal reasons the API gives, the replica's token cache, and the agent's
token file (re-read when rotation replaces it; kept forever under the seeded defect)."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import pytest
from click.testing import CliRunner

from controlplane import defects
from controlplane.agent.api import AgentApi, ApiRejected, TokenFile
from controlplane.api.deps import TokenCache
from controlplane.cli import group
from controlplane.store import auth


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(group, list(args))
    return r.exit_code, r.output


def _lookup(dsn: str, token: str) -> auth.Principal:
    async def go() -> auth.Principal:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            return await auth.lookup(conn, token)
    return asyncio.run(go())


def test_issue_writes_the_token_to_a_private_file_and_prints_only_its_id(
        pg_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_dsn) as conn:
        auth.seed(conn, {"queues": [], "projects": [{"name": "team-b"}]})
    out = tmp_path / "agent-token"
    code, text = _cli("token", "issue", "--dsn", pg_dsn, "--role", "agent", "--ttl", "2h",
                      "--out", str(out))
    assert code == 0, text
    token = out.read_text().strip()
    assert token not in text and os.stat(out).st_mode & 0o777 == 0o600
    row = json.loads(text)
    assert row["id"] == auth.token_id(auth.hash_token(token)) and row["role"] == "agent"
    expires = datetime.fromisoformat(row["expires_at"])
    assert timedelta(minutes=119) < expires - datetime.now(UTC) <= timedelta(hours=2)
    assert _lookup(pg_dsn, token).role == "agent"
    code, text = _cli("token", "issue", "--dsn", pg_dsn, "--role", "user", "--project", "team-b",
                      "--out", str(tmp_path / "p"))
    assert code == 0 and _lookup(pg_dsn, (tmp_path / "p").read_text().strip()).project == "team-b"
    # clear refusals naming what is wrong
    assert "needs --project" in _cli("token", "issue", "--dsn", pg_dsn, "--role", "user",
                                     "--out", str(tmp_path / "x"))[1]
    assert "does not exist" in _cli("token", "issue", "--dsn", pg_dsn, "--role", "user",
                                    "--project", "nope", "--out", str(tmp_path / "x"))[1]
    assert "expected e.g. 90s" in _cli("token", "issue", "--dsn", pg_dsn, "--role", "agent",
                                       "--ttl", "soon", "--out", str(tmp_path / "x"))[1]


def test_a_revoked_token_is_refused_saying_so_and_listed_as_revoked(
        pg_dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "t"
    _cli("token", "issue", "--dsn", pg_dsn, "--role", "agent", "--out", str(out))
    token = out.read_text().strip()
    tid = auth.token_id(auth.hash_token(token))
    code, text = _cli("token", "revoke", "--dsn", pg_dsn, "--id", tid)
    assert code == 0 and json.loads(text) == {"revoked": [tid]}
    with pytest.raises(auth.TokenRefused, match=f"token {tid} was revoked at"):
        _lookup(pg_dsn, token)
    code, text = _cli("token", "revoke", "--dsn", pg_dsn, "--token-file", str(out))
    assert code != 0 and "already revoked" in text
    listed = [json.loads(x) for x in _cli("token", "list", "--dsn", pg_dsn)[1].splitlines()]
    assert [r["status"] for r in listed if r["id"] == tid] == ["revoked"]
    assert token not in json.dumps(listed)
    assert "at least 8 hex" in _cli("token", "revoke", "--dsn", pg_dsn, "--id", "abc")[1]


def test_an_expired_token_is_refused_with_when_and_what_to_do(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        auth.seed(conn, {"queues": [], "agent_tokens": ["agent-seeded-token-0123456789"]})
        seeded = conn.execute("SELECT expires_at - now() FROM tokens").fetchone()[0]
        assert timedelta(days=89) < seeded <= timedelta(days=90)  # seeded tokens expire too
        conn.execute("UPDATE tokens SET expires_at = now() - interval '1 minute'")
    with pytest.raises(auth.TokenRefused, match="expired at .*token issue"):
        _lookup(pg_dsn, "agent-seeded-token-0123456789")
    with pytest.raises(auth.TokenRefused, match="^invalid token$"):
        _lookup(pg_dsn, "never-issued-token-0123456789")


def test_the_replica_cache_never_outlives_a_tokens_expiry() -> None:
    cache = TokenCache(ttl=30.0)
    soon = datetime.now(UTC) + timedelta(seconds=0.2)
    cache.put("a", auth.Principal("agent", expires_at=soon))
    cache.put("b", auth.Principal("agent", expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    cache.put("c", auth.Principal("agent", expires_at=datetime.now(UTC) + timedelta(days=1)))
    assert cache.get("a") and cache.get("b") is None and cache.get("c")
    import time

    time.sleep(0.3)
    assert cache.get("a") is None and cache.get("c")


def _write(path: Path, token: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(token + "\n")
    os.replace(tmp, path)  # as rotation does: a rename


def _api(path: Path, accepted: set[str]) -> tuple[AgentApi, list[str]]:
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        token = request.headers["Authorization"].removeprefix("Bearer ")
        sent.append(token)
        if token in accepted:
            return httpx.Response(200, json={})
        return httpx.Response(401, json={"detail": "token was revoked"})

    return AgentApi("http://cp", TokenFile(path), transport=httpx.MockTransport(handler)), sent


def test_the_agent_uses_a_rotated_token_file_at_the_next_request(tmp_path: Path) -> None:
    path = tmp_path / "agent-token"
    _write(path, "old-token-0123456789")
    api, sent = _api(path, {"old-token-0123456789", "new-token-0123456789"})
    api.heartbeat("a1")
    _write(path, "new-token-0123456789")
    api.heartbeat("a1")
    assert sent == ["old-token-0123456789", "new-token-0123456789"]


def test_a_401_with_a_token_rotated_meanwhile_is_retried_once_with_the_new_one(
        tmp_path: Path) -> None:
    path = tmp_path / "agent-token"
    _write(path, "old-token-0123456789")
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        token = request.headers["Authorization"].removeprefix("Bearer ")
        sent.append(token)
        if token == "old-token-0123456789":  # rotated and revoked while this call was out
            _write(path, "new-token-0123456789")
            return httpx.Response(401, json={"detail": "revoked"})
        return httpx.Response(200, json={})

    AgentApi("http://cp", TokenFile(path), transport=httpx.MockTransport(handler)).heartbeat("a")
    assert sent == ["old-token-0123456789", "new-token-0123456789"]
    # a token that is simply refused is not retried: a config error, said once
    _write(path, "bad-token-0123456789")
    api, sent = _api(path, set())
    with pytest.raises(ApiRejected, match="401"):
        api.heartbeat("a")
    assert sent == ["bad-token-0123456789"]


def test_a_missing_or_empty_token_file_fails_at_start(tmp_path: Path) -> None:
    with pytest.raises(ApiRejected, match="agent token file"):
        TokenFile(tmp_path / "none")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ApiRejected, match="is empty"):
        TokenFile(tmp_path / "empty")


def test_seeded_defect_token_cached_forever_keeps_the_first_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(defects.ENV, "token-cached-forever")
    defects.active.cache_clear()
    try:
        path = tmp_path / "agent-token"
        _write(path, "old-token-0123456789")
        api, sent = _api(path, {"new-token-0123456789"})
        _write(path, "new-token-0123456789")
        with pytest.raises(ApiRejected):
            api.heartbeat("a1")
        assert sent == ["old-token-0123456789"]
    finally:
        monkeypatch.delenv(defects.ENV)
        defects.active.cache_clear()


def test_the_agent_command_needs_a_token_and_checks_its_file_at_start(tmp_path: Path) -> None:
    from controlplane.agent.cli import agent_cmd

    base = ["--api", "http://127.0.0.1:9", "--name", "a", "--pool", "cpu", "--zone", "z",
            "--region", "r", "--cpu-slots", "1"]
    r = CliRunner().invoke(agent_cmd, base, env={"CONTROLPLANE_AGENT_TOKEN": "",
                                                 "CONTROLPLANE_AGENT_TOKEN_FILE": ""})
    assert r.exit_code == 2 and "no agent token" in r.output
    r = CliRunner().invoke(agent_cmd, [*base, "--token-file", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "agent token file" in r.output and "--token-file" in r.output

"""The one-shot admin commands (`gameday controlplane migrate|seed|token ...`) against a
database they cannot reach: one line naming it, exit 1, and never a hang on a server that
accepts the connection and never answers (a stopped PostgreSQL, a blackholed route)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from controlplane import db
from controlplane.cli import group


@pytest.fixture
def refused_dsn() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connection refused
    return f"postgresql://app@127.0.0.1:{port}/controlplane"


@pytest.fixture
def silent_dsn() -> Iterator[str]:
    """A port whose kernel completes the TCP handshake and nobody ever reads or answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    try:
        yield f"postgresql://app@127.0.0.1:{s.getsockname()[1]}/controlplane"
    finally:
        s.close()  # also ends a connection attempt the code under test failed to bound


@pytest.mark.parametrize("args", [["token", "list"], ["migrate"], ["seed", "--file", "SEED"],
                                  ["token", "revoke", "--id", "0123"]])
def test_a_database_that_refuses_is_one_line_not_a_traceback(
        refused_dsn: str, args: list[str], tmp_path: Path) -> None:
    seed = tmp_path / "seed.yaml"
    seed.write_text("projects: []\n")
    args = [str(seed) if a == "SEED" else a for a in args]
    result = CliRunner().invoke(group, [*args, "--dsn", refused_dsn])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # not an uncaught error
    assert "cannot reach the database" in result.output
    assert "Connection refused" in result.output and "--dsn" in result.output
    assert "Traceback" not in result.output


def _invoke_with_guard(args: list[str], guard_seconds: float) -> Result | None:
    """The command's result, or None if it was still waiting after guard_seconds."""
    out: list[Result] = []
    t = threading.Thread(target=lambda: out.append(CliRunner().invoke(group, args)), daemon=True)
    t.start()
    t.join(guard_seconds)
    return out[0] if out else None


def test_a_database_that_never_answers_is_given_up_within_the_bound(
        silent_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    monkeypatch.setattr(db, "ONE_SHOT_CONNECT_TIMEOUT", 2)  # libpq's smallest
    result = _invoke_with_guard(["token", "list", "--dsn", silent_dsn], guard_seconds=60)
    assert result is not None, "token list still waiting on a server that never answers"
    assert result.exit_code == 1
    assert "cannot reach the database" in result.output and "timeout" in result.output


def test_the_users_own_connect_timeout_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(db.psycopg, "connect", lambda dsn, **kw: seen.append(kw))
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    db.connect_once("postgresql://h/d")
    db.connect_once("postgresql://h/d?connect_timeout=30")
    db.connect_once("host=h dbname=d connect_timeout=30")
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "30")
    db.connect_once("postgresql://h/d")
    assert seen == [{"connect_timeout": db.ONE_SHOT_CONNECT_TIMEOUT}, {}, {}, {}]

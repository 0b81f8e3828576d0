"""The local environment's credential files: the control plane's DSN carries no password (libpq
reads it from the password file at each connection, so a rotated password needs no restart),
agents get a token file, and both files are private and replaced atomically."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg

from infra.local.components import (
    agent_token_file,
    app_dsn,
    pgpass_file,
    write_agent_token,
    write_pgpass,
)


def test_the_dsn_names_the_password_file_and_holds_no_password(tmp_path: Path) -> None:
    write_pgpass(tmp_path, "s3cret:with\\odd")
    dsn = app_dsn({"haproxy_pg": 5432}, tmp_path)
    assert "s3cret" not in dsn
    assert psycopg.conninfo.conninfo_to_dict(dsn)["passfile"] == str(pgpass_file(tmp_path))
    # libpq's format, ':' and '\' escaped; any host, port and database
    assert pgpass_file(tmp_path).read_text() == "*:*:*:controlplane:s3cret\\:with\\\\odd\n"
    assert os.stat(pgpass_file(tmp_path)).st_mode & 0o777 == 0o600  # libpq ignores it otherwise


def test_rewriting_a_secret_file_replaces_it_atomically(tmp_path: Path) -> None:
    write_agent_token(tmp_path, "agent-old-0123456789")
    path = agent_token_file(tmp_path)
    before = path.stat().st_ino
    write_agent_token(tmp_path, "agent-new-0123456789")
    # a new inode: a reader holding the old file reads the old token whole, never half of one
    assert path.stat().st_ino != before and path.read_text() == "agent-new-0123456789\n"
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["agent-token"]  # no temp file left

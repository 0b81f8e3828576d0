"""The tracking server's database and role (provisioning/tracking_db.py, the ``tracking-db-init``
Job) against a real PostgreSQL, run as an admin that, like the RDS master user, is no
superuser but has CREATEROLE and CREATEDB."""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
from collections.abc import Iterator

import psycopg
import pytest

from environments.local.pgserver import PostgresServer
from provisioning.tracking_db import ensure_role_and_database, main

_n = itertools.count()


def _dsn(pg: PostgresServer, user: str, db: str = "postgres") -> str:
    return pg.dsn(db).replace("postgres@", f"{user}@", 1)


def _password_is(pg: PostgresServer, role: str, password: str) -> bool:
    """Check the role's SCRAM-SHA-256 verifier against ``password`` (the server trusts every
    local login here, so logging in would prove nothing)."""
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        (stored,) = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s",
                                 (role,)).fetchone()
    method, rest = stored.split("$", 1)
    iterations_salt, keys = rest.split("$")
    iterations, salt = iterations_salt.split(":")
    stored_key = keys.split(":")[0]
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt), int(iterations))
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return method == "SCRAM-SHA-256" and base64.b64encode(hashlib.sha256(client_key).digest()).decode() == stored_key


@pytest.fixture
def admin(pg_server: PostgresServer) -> Iterator[tuple[str, str, str]]:
    """(admin DSN, role, database) with fresh names; an RDS-like admin role."""
    i = next(_n)
    admin, role, db = f"rds_admin{i}", f"mlflow{i}", f"mlflow_db{i}"
    with psycopg.connect(pg_server.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {admin} LOGIN CREATEROLE CREATEDB")
    yield _dsn(pg_server, admin), role, db


def test_creates_the_role_and_its_private_database(pg_server: PostgresServer,
                                                   admin: tuple[str, str, str]) -> None:
    dsn, role, db = admin
    with psycopg.connect(dsn, autocommit=True) as conn:
        done = ensure_role_and_database(conn, role, db, "first-pw")
    assert done == [f"created role {role}", f"created database {db}",
                    f"database {db}: only {role} (and the admin) may connect"]
    assert _password_is(pg_server, role, "first-pw")
    with psycopg.connect(_dsn(pg_server, role, db), autocommit=True) as conn:
        conn.execute("CREATE TABLE runs (id int)")  # the owner: `mlflow db upgrade` can build
        owner = conn.execute("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s",
                             (db,)).fetchone()
        assert owner == (role,)
        attrs = conn.execute("SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles "
                             "WHERE rolname = %s", (role,)).fetchone()
        assert attrs == (False, False, False)
    # another role of the instance (say the control plane's) cannot reach the tracking data
    with psycopg.connect(pg_server.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE other{role} LOGIN")
    with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
        psycopg.connect(_dsn(pg_server, f"other{role}", db)).close()


def test_a_second_run_only_resets_the_password(pg_server: PostgresServer,
                                               admin: tuple[str, str, str]) -> None:
    dsn, role, db = admin
    with psycopg.connect(dsn, autocommit=True) as conn:
        ensure_role_and_database(conn, role, db, "first-pw")
        done = ensure_role_and_database(conn, role, db, "second-pw")
    assert done[0] == f"altered role {role}" and not any("created" in line for line in done)
    assert _password_is(pg_server, role, "second-pw") and not _password_is(pg_server, role, "first-pw")


@pytest.mark.parametrize(("role", "db", "password", "expected"), [
    ("mlflow; DROP", "mlflow", "pw", "role 'mlflow; DROP' is not a plain lower-case identifier"),
    ("mlflow", "Mlflow", "pw", "database 'Mlflow'"),
    ("mlflow", "mlflow", "", "ROLE_PASSWORD is empty"),
])
def test_refuses_unsafe_names_and_empty_passwords(admin: tuple[str, str, str], role: str, db: str,
                                                  password: str, expected: str) -> None:
    with psycopg.connect(admin[0], autocommit=True) as conn, pytest.raises(ValueError, match=expected):
        ensure_role_and_database(conn, role, db, password)


def test_the_job_entry_point(pg_server: PostgresServer, admin: tuple[str, str, str],
                             monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    dsn, role, db = admin
    monkeypatch.delenv("ROLE_PASSWORD", raising=False)
    monkeypatch.setenv("ADMIN_DSN", dsn)
    assert main(["--role", role, "--database", db]) == 2
    assert "ROLE_PASSWORD not set" in capsys.readouterr().err
    monkeypatch.setenv("ROLE_PASSWORD", "job-pw")
    assert main(["--role", role, "--database", db]) == 0
    assert f"tracking-db: created database {db}" in capsys.readouterr().out
    assert _password_is(pg_server, role, "job-pw")

"""The tracking server's own database and role on the platform's PostgreSQL, made idempotently.

Run once per deploy as the ``tracking-db-init`` Job (provisioning/components/tracking.py) in the
control-plane image: ``python -m provisioning.tracking_db --role mlflow --database mlflow``
with ``ADMIN_DSN`` (the RDS master user's DSN, synced by External Secrets) and
``ROLE_PASSWORD`` (generated in the cluster, never in Pulumi state) in its environment.

Creates the role (LOGIN, no other attribute) or resets its password to the generated one,
creates the database owned by it, and takes ``CONNECT``/``TEMP`` on it from ``PUBLIC``: no
other role of the instance (the control plane's included) reaches the tracking data.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

import psycopg
from psycopg import sql

IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def ensure_role_and_database(conn: psycopg.Connection, role: str, database: str,
                             password: str) -> list[str]:
    """What it did, in order (for the Job's log). ``conn`` must be in autocommit mode:
    CREATE DATABASE cannot run inside a transaction."""
    for what, name in (("role", role), ("database", database)):
        if not IDENTIFIER.match(name):
            raise ValueError(f"{what} {name!r} is not a plain lower-case identifier")
    if not password:
        raise ValueError("ROLE_PASSWORD is empty")
    done = []
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
        # Password only: a non-superuser (the RDS master) may not name the SUPERUSER
        # attribute at all, not even to deny it.
        conn.execute(sql.SQL("ALTER ROLE {} WITH LOGIN PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)))
        done.append(f"altered role {role}")
    else:
        conn.execute(sql.SQL("CREATE ROLE {} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
                             "PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))
        done.append(f"created role {role}")
    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone():
        # On RDS the master user is no superuser: it may only create a database owned by a
        # role it is a member of.
        conn.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(sql.Identifier(role)))
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
            sql.Identifier(database), sql.Identifier(role)))
        done.append(f"created database {database}")
    conn.execute(sql.SQL("REVOKE CONNECT, TEMPORARY ON DATABASE {} FROM PUBLIC").format(
        sql.Identifier(database)))
    conn.execute(sql.SQL("GRANT CONNECT, TEMPORARY ON DATABASE {} TO {}").format(
        sql.Identifier(database), sql.Identifier(role)))
    done.append(f"database {database}: only {role} (and the admin) may connect")
    return done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m provisioning.tracking_db")
    parser.add_argument("--role", required=True)
    parser.add_argument("--database", required=True)
    args = parser.parse_args(argv)
    missing = [k for k in ("ADMIN_DSN", "ROLE_PASSWORD") if not os.environ.get(k)]
    if missing:
        print(f"tracking-db: {', '.join(missing)} not set (the Job's Secrets)", file=sys.stderr)
        return 2
    with psycopg.connect(os.environ["ADMIN_DSN"], autocommit=True, connect_timeout=10) as conn:
        for line in ensure_role_and_database(conn, args.role, args.database,
                                             os.environ["ROLE_PASSWORD"]):
            print(f"tracking-db: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

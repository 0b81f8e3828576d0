"""The local environment's database: two Patroni members (leader + synchronous standby) behind
HAProxy's ``pg`` frontend. Everything the environment, its faults and the restore order ask of
the cluster: roles, leader, whether a write commits, the synchronous standby, the app database.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import httpx

from infra.environment_types import poll
from infra.local.errors import ComponentUnhealthy, EnvError
from infra.local.pg_files import APP_DB, APP_USER, superuser_dsn
from infra.local.topology import Secrets

if TYPE_CHECKING:
    from infra.local.env import LocalEnvironment

MEMBERS = ("pg-0", "pg-1")
LEADER_ROLES = ("leader", "master", "primary")


class LocalDatabase:
    def __init__(self, env: LocalEnvironment) -> None:
        self.env = env  # its components (member ports), env.json (ports, secrets), log files

    def secrets(self) -> Secrets:
        return Secrets(**self.env.info["secrets"])

    def superuser_dsn(self) -> str:
        return superuser_dsn(self.env.info["ports"]["haproxy_pg"], self.secrets())

    def cluster(self) -> dict[str, Any]:
        """Patroni's view of the cluster, from the first member that answers."""
        last: Exception | None = None
        for name in MEMBERS:
            try:
                port = self.env.components[name].ports["rest"]
                response = httpx.get(f"http://127.0.0.1:{port}/cluster", timeout=1.0)
                response.raise_for_status()
                return response.json()
            except (httpx.HTTPError, ValueError) as exc:
                last = exc
        raise EnvError(f"no Patroni member answers /cluster: {last}")

    def roles(self) -> dict[str, str]:
        """member name -> role (leader, sync_standby, replica) as Patroni reports it."""
        try:
            members = self.cluster().get("members", [])
        except EnvError:
            return {}
        return {m["name"]: m["role"] for m in members}

    def leader(self) -> str | None:
        return next((n for n, role in self.roles().items() if role in LEADER_ROLES), None)

    def writable(self, timeout: float = 2.0) -> bool:
        """True when a write through the HAProxy `pg` frontend commits."""
        import psycopg

        try:
            with psycopg.connect(self.superuser_dsn(), autocommit=True,
                                 connect_timeout=max(1, int(timeout))) as conn:
                conn.execute(f"SET statement_timeout = {int(timeout * 1000)}")
                conn.execute("CREATE TABLE IF NOT EXISTS gameday_probe (t timestamptz)")
                conn.execute("INSERT INTO gameday_probe VALUES (now())")
            return True
        except psycopg.Error:
            return False

    def wait_writable(self, timeout: float) -> float:
        seconds = poll(self.writable, timeout, 0.1)
        if seconds is not None:
            return seconds
        member = self.leader() or MEMBERS[0]
        raise ComponentUnhealthy(member, f"no write through HAProxy committed within {timeout:.0f} s",
                                 self.env.tail(member))

    def wait_sync_standby(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, role in self.roles().items():
                if role == "sync_standby":
                    return name
            time.sleep(0.2)
        standby = next((n for n in MEMBERS if n != self.leader()), MEMBERS[1])
        raise ComponentUnhealthy(standby, f"no synchronous standby within {timeout:.0f} s "
                                 f"(roles {self.roles()})", self.env.tail(standby))

    def setup_app_database(self) -> None:
        """The control plane's role and database (idempotent; the password from env.json)."""
        import psycopg
        from psycopg import sql

        secrets = self.secrets()
        with psycopg.connect(self.superuser_dsn(), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_USER,)).fetchone()
            verb = "ALTER" if exists else "CREATE"
            conn.execute(sql.SQL(verb + " ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(APP_USER), sql.Literal(secrets.pg_app)))
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (APP_DB,)).fetchone():
                conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(APP_DB), sql.Identifier(APP_USER)))

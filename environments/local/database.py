"""The local environment's database: two Patroni members (leader + synchronous standby) behind
HAProxy's ``pg`` frontend. Everything the environment, its faults and the restore order ask of
the cluster: roles, leader, whether a write commits, the synchronous standby, the app database.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from environments.environment_types import poll
from environments.local.errors import ComponentUnhealthy, EnvError, NotRunning
from environments.local.fault_ledger import FaultLedger
from environments.local.pg_files import APP_DB, APP_USER, superuser_dsn
from environments.local.state import EnvState
from environments.local.topology import Secrets

MEMBERS = ("pg-0", "pg-1")
LEADER_ROLES = ("leader", "master", "primary")


def ensure_role_and_database(admin_dsn: str, user: str, password: str, database: str) -> None:
    """A login role with this password owning its database, on the primary (idempotent): how a
    platform's or service's server (Prefect, MLflow) gets its own database on the cluster."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as conn:
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (user,)).fetchone()
        verb = "ALTER" if exists else "CREATE"
        conn.execute(sql.SQL(verb + " ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(user), sql.Literal(password)))
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                            (database,)).fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database), sql.Identifier(user)))


class LocalDatabase:
    def __init__(self, state: EnvState) -> None:
        self.state = state  # its components (member ports), env.json (ports, secrets), log files

    def secrets(self) -> Secrets:
        return self.state.secrets()

    def superuser_dsn(self) -> str:
        return superuser_dsn(self.state.info["ports"]["haproxy_pg"], self.secrets())

    def cluster(self) -> dict[str, Any]:
        """Patroni's view of the cluster, from the first member that answers."""
        last: Exception | None = None
        for name in MEMBERS:
            try:
                port = self.state.components[name].ports["rest"]
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
                                 self.state.tail(member))

    def wait_sync_standby(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, role in self.roles().items():
                if role == "sync_standby":
                    return name
            time.sleep(0.2)
        standby = next((n for n in MEMBERS if n != self.leader()), MEMBERS[1])
        raise ComponentUnhealthy(standby, f"no synchronous standby within {timeout:.0f} s "
                                 f"(roles {self.roles()})", self.state.tail(standby))

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

    # -- its fault ---------------------------------------------------------------------------
    def failover(self, ledger: FaultLedger, candidate: str | None = None,
                 timeout: float = 30.0) -> dict[str, Any]:
        """Patroni failover to the synchronous standby (a ``failover_db`` fault on the timeline);
        returns once writes commit again."""
        roles = self.roles()
        leader = self.leader()
        if leader is None:
            raise NotRunning(f"no database primary to fail over from (roles {roles})")
        if candidate is None:
            candidate = next((n for n, r in roles.items() if r == "sync_standby"), None)
        if candidate is None or candidate == leader or candidate not in roles:
            raise EnvError(f"no eligible failover candidate (roles {roles}, asked {candidate!r})")
        started = time.monotonic()
        line = ledger.begin("failover_db", "database", {"from": leader, "to": candidate})
        rest = self.state.components[candidate].ports["rest"]
        response = httpx.post(f"http://127.0.0.1:{rest}/failover", json={"candidate": candidate},
                              timeout=timeout)
        if response.status_code != 200:
            ledger.end("failover_db", "database", {"error": response.text.strip()})
            raise EnvError(f"Patroni refused the failover to {candidate}: HTTP {response.status_code} "
                           f"{response.text.strip()}")
        deadline = time.monotonic() + timeout
        while self.leader() != candidate and time.monotonic() < deadline:
            time.sleep(0.05)
        self.wait_writable(max(1.0, deadline - time.monotonic()))
        seconds = round(time.monotonic() - started, 3)
        # The fault ends when redundancy is back: with synchronous_mode only a *synchronous*
        # standby may be promoted, so a primary loss right now would not fail over.
        self.wait_sync_standby(max(1.0, deadline - time.monotonic()))
        redundant = round(time.monotonic() - started, 3)
        details = {"from": leader, "to": candidate, "writable_after_s": seconds,
                   "sync_standby_after_s": redundant}
        ledger.end("failover_db", "database", details)
        return {**details, "time": line["time"]}

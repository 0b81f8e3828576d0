"""Credential rotation in the local environment: the agent token, one project's token and the
database password of the control plane's role, replaced while work runs; then the old ones
revoked, and proof that they no longer work.

How each holder picks up its new credential, with no restart:

* agents read their token from ``secrets/agent-token`` (``--token-file``) and re-read it when
  the file changes; a rotation replaces the file atomically (rename).
* API replicas and the reconciler connect with a DSN that names a libpq password file
  (``secrets/pgpass``, environments/local/components.py ``app_dsn``). libpq reads that file at every
  connection attempt, so after ``ALTER ROLE ... PASSWORD`` and a new file, every new pooled
  connection logs in with the new password. Sessions already open stay logged in (PostgreSQL
  checks a password at login only), so the rotation also terminates the role's sessions: each
  pool then *has* to reconnect with the new password, which is the code path that must work.
  A request on a connection that was just terminated fails once (503), as after a failover;
  clients retry with the same idempotency key, so no acknowledged submission is lost. A rolling
  restart would also pick up a new password, but would prove only that processes start, not
  that the long-running ones reconnect.
* a project's token is a user's: the rotated one is written to ``secrets/project-<name>-token``
  and to env.json's ``tokens``, where the game day's clients read it at start.

The retired credentials are kept in ``secrets/retired.json`` (mode 0600, beside the current
ones, never in a run directory) until they are proven refused.
"""

from __future__ import annotations

import json
import secrets as random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from environments.local.components import TOKEN_CACHE_SECONDS
from environments.local.errors import EnvError
from environments.local.fault_ledger import FaultLedger
from environments.local.pg_files import (
    APP_USER,
    agent_token_file,
    secrets_dir,
    write_pgpass,
    write_private,
)
from environments.local.spec import gameday_argv

if TYPE_CHECKING:
    from environments.local.database import LocalDatabase
    from environments.local.processes import Processes
    from environments.local.state import EnvState

ROTATED_TTL = "30d"


def token_id(token: str) -> str:
    from controlplane.store import auth

    return auth.token_id(auth.hash_token(token))


class LocalCredentials:
    """The credentials themselves: env.json's secrets and tokens (``state``), the secret files,
    the control plane's token commands (run as setup steps by ``processes``) and the role's
    password (through ``db``)."""

    def __init__(self, state: EnvState, processes: Processes, db: LocalDatabase) -> None:
        self.state, self.processes, self.db = state, processes, db

    @property
    def retired_file(self) -> Path:
        return secrets_dir(self.state.dir) / "retired.json"

    def project_token_file(self, project: str) -> Path:
        return secrets_dir(self.state.dir) / f"project-{project}-token"

    def retired(self) -> dict[str, Any]:
        try:
            return json.loads(self.retired_file.read_text())
        except FileNotFoundError:
            return {}

    def _controlplane(self, *args: str) -> None:
        from controlplane.db import DSN_ENV

        # the DSN through the environment (never argv); stdout (ids, never tokens) -> log
        self.processes.run_step("token", gameday_argv("controlplane", "token", *args),
                           env_extra={DSN_ENV: self.state.endpoints["dsn"]})

    def _save_info(self) -> None:
        self.state.info["tokens"] = {"projects": self.state.info["secrets"]["project_tokens"],
                                   "agent": self.state.info["secrets"]["agent_token"],
                                   "admin": self.state.info["secrets"]["admin_token"]}
        self.state.save()

    # -- rotate -----------------------------------------------------------------------------
    def rotate(self, project: str | None = None, ttl: str = ROTATED_TTL) -> dict[str, Any]:
        """Issue a new agent token and a new token for ``project`` (default: the last project
        by name), set a new database password; return the ids (never a secret)."""
        info = self.state.info
        secrets = info["secrets"]
        projects = sorted(secrets["project_tokens"])
        project = project or projects[-1]
        if project not in projects:
            raise EnvError(f"project {project!r}: the environment's projects are {projects}")
        old = {"agent_token": secrets["agent_token"], "pg_app": secrets["pg_app"],
               "project": project, "project_token": secrets["project_tokens"][project],
               "rotated_at": time.time()}
        write_private(self.retired_file, json.dumps(old))
        steps: dict[str, Any] = {}
        t0 = time.monotonic()

        # 1. agent token: issued straight into the file the agents read (atomic rename)
        path = agent_token_file(self.state.dir)
        self._controlplane("issue", "--role", "agent", "--ttl", ttl, "--out", str(path))
        secrets["agent_token"] = path.read_text().strip()
        steps["agent_token"] = {"old": token_id(old["agent_token"]),
                                "new": token_id(secrets["agent_token"])}

        # 2. the project's token
        path = self.project_token_file(project)
        self._controlplane("issue", "--role", "user", "--project", project, "--ttl", ttl,
                           "--out", str(path))
        secrets["project_tokens"][project] = path.read_text().strip()
        steps["project_token"] = {"project": project, "old": token_id(old["project_token"]),
                                  "new": token_id(secrets["project_tokens"][project])}
        self._save_info()

        # 3. the database password: role first, then the file every new connection reads
        password = random.token_urlsafe(18)
        self._alter_password(password)
        write_pgpass(self.state.dir, password)
        secrets["pg_app"] = password
        self._save_info()
        steps["db_password"] = {"role": APP_USER,
                                "sessions_terminated": self._terminate_sessions()}
        steps["seconds"] = round(time.monotonic() - t0, 3)
        return steps

    def _superuser(self) -> Any:
        import psycopg

        return psycopg.connect(self.db.superuser_dsn(), autocommit=True)

    def _alter_password(self, password: str) -> None:
        from psycopg import sql

        with self._superuser() as conn:
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                sql.Identifier(APP_USER), sql.Literal(password)))

    def _terminate_sessions(self) -> int:
        """End every session of the app role on the primary: the pools must log in again."""
        with self._superuser() as conn:
            rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                " WHERE usename = %s AND pid <> pg_backend_pid()",
                                (APP_USER,)).fetchall()
        return len(rows)

    # -- revoke and prove -------------------------------------------------------------------
    def revoke_retired(self) -> dict[str, Any]:
        """Revoke the retired tokens (the old password stopped working at ALTER ROLE)."""
        old = self.retired()
        if not old:
            return {"revoked": [], "note": "nothing was rotated"}
        current = self.state.info["secrets"]
        # a rotation that failed half-way retired nothing yet: never revoke what is in use
        in_use = {current["agent_token"], *current["project_tokens"].values()}
        ids = [token_id(t) for t in (old["agent_token"], old["project_token"])
               if t not in in_use]
        for i in ids:
            try:
                self._controlplane("revoke", "--id", i)
            except EnvError as exc:
                if "already revoked" not in str(exc):
                    raise
        # when (at the latest) they were revoked: every later request with one is judged
        # (slo/outcome_invariants.py retired-credentials-refused)
        write_private(self.retired_file, json.dumps({**old, "revoked_at": time.time()}))
        return {"revoked": ids}

    def refused(self, within: float,
                record: Callable[[dict[str, Any]], object] | None = None) -> dict[str, Any]:
        """Whether every retired credential is refused and every current one accepted,
        asking each API replica directly (each has its own token cache) until ``within``
        seconds have passed. Values are reasons, never secrets. ``record`` gets each request
        made with a retired credential after its revocation (the fault timeline's
        ``retired_credential_request`` notes: the evidence, not this answer, is what the
        retired-credentials-refused invariant judges)."""
        old = self.retired()
        revoked_at = old.get("revoked_at")

        def note(kind: str, credential: str, replica: str | None, status: int,
                 answer: str) -> None:
            if record is None or revoked_at is None:
                return  # before the revocation a retired credential may still work
            record({"kind": kind, "credential": credential, "replica": replica,
                    "revoked_at": revoked_at, "grace_seconds": TOKEN_CACHE_SECONDS
                    if kind != "db_password" else 0.0,
                    "accepted": status not in (0, 401), "status": status,
                    "answer": answer[:160]})

        if not old:
            return {"refused": True, "note": "nothing was rotated"}
        secrets = self.state.info["secrets"]
        project = old["project"]
        checks = {"agent": (old["agent_token"], secrets["agent_token"], "/v1/agents/none/heartbeat"),
                  "project": (old["project_token"], secrets["project_tokens"][project],
                              "/v1/operations?limit=1")}
        result: dict[str, Any] = {}
        deadline = time.monotonic() + within
        for name, (retired, current, route) in checks.items():
            for replica, url in self.state.endpoints["api_replicas"].items():
                while True:
                    got = _status(url, route, retired)
                    note(f"{name}_token", token_id(retired), replica, got[0], got[1])
                    if got[0] == 401 or time.monotonic() > deadline:
                        break
                    time.sleep(0.5)
                now = _status(url, route, current)
                result[f"{name}@{replica}"] = {"retired": f"{got[0]} {got[1]}"[:160],
                                               "current": now[0]}
        result["db_password"] = self._old_password_refused(old["pg_app"])
        note("db_password", APP_USER, None,
             401 if result["db_password"].startswith("refused") else
             200 if result["db_password"].startswith("ACCEPTED") else 0, result["db_password"])
        result["refused"] = all(
            v["retired"].startswith("401") and v["current"] != 401
            for k, v in result.items() if "@" in k) and result["db_password"].startswith("refused")
        return result

    def _old_password_refused(self, password: str) -> str:
        import psycopg

        ports = self.state.info["ports"]
        try:
            with psycopg.connect(host="127.0.0.1", port=ports["haproxy_pg"], user=APP_USER,
                                 password=password, dbname="controlplane", connect_timeout=3):
                return "ACCEPTED: the old database password still logs in"
        except psycopg.OperationalError as exc:
            text = str(exc).replace(password, "***")
            if "password authentication failed" in text:
                return "refused: password authentication failed"
            return f"unknown: {text[:200]}"


class CredentialRotation:
    """The fault: credentials replaced while work runs, on the timeline from the rotation until
    the old ones are revoked (``credential_rotation`` on ``controlplane``)."""

    KINDS = ("credential_rotation",)

    def __init__(self, credentials: LocalCredentials, ledger: FaultLedger) -> None:
        self.credentials, self.ledger = credentials, ledger

    def rotate_credentials(self, project: str | None = None) -> dict[str, Any]:
        """Agent token, a project's token and the database password replaced while work
        runs; on the timeline from now until the old ones are revoked."""
        if self.ledger.is_active("credential_rotation", "controlplane"):
            return {"target": "controlplane", "note": "a rotation is already in progress"}
        self.ledger.begin("credential_rotation", "controlplane", {"project": project})
        steps = self.credentials.rotate(project)
        self.ledger.timeline.record("note", "credentials_rotated", "controlplane", steps)
        return {"target": "controlplane", **steps}

    def revoke_retired_credentials(self) -> dict[str, Any]:
        """Revoke the tokens a rotation retired; ends the rotation on the timeline."""
        out = self.credentials.revoke_retired()
        line = self.ledger.end("credential_rotation", "controlplane", out)
        return {"target": "controlplane", **out, "time": line["time"] if line else None}

    def retired_credentials_refused(self, within: float) -> dict[str, Any]:
        return self.credentials.refused(within, record=lambda details: self.ledger.timeline.record(
            "note", "retired_credential_request", "controlplane", details))

    # -- asked by the fault driver (environments/local/faults.py) ------------------------------------
    def close(self, fault: dict[str, Any]) -> None:
        pass  # nothing to put back: the new credentials stay in place

    def restore(self, fault: dict[str, Any]) -> None:
        # forward only: the new credentials are in place, finish by revoking the old
        self.revoke_retired_credentials()


def _status(base: str, route: str, token: str) -> tuple[int, str]:
    method = "POST" if route.endswith("heartbeat") else "GET"
    try:
        r = httpx.request(method, base + route, headers={"Authorization": f"Bearer {token}"},
                          json={} if method == "POST" else None, timeout=3.0)
    except httpx.HTTPError as exc:
        return 0, type(exc).__name__
    try:
        detail = str(r.json().get("detail", ""))
    except ValueError:
        detail = r.text
    return r.status_code, detail.replace(token, "***")

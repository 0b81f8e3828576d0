"""Base backups of the local environment's database, the loss of both members, and the
restore order of runbooks/db-primary-loss.md (B) as code.

``take()``      pg_basebackup (tar, gzip, WAL streamed) from the current leader
``lose()``      fault ``database_lost``: both Patroni members SIGKILLed, their data directories
                moved aside (kept as ``data.lost-<ts>`` for forensics)
``restore(id)`` steps 1-4: stop intake and every writer (fail closed), put the backup in place
                as the new leader, clone the standby, migrate, advance the fencing sequence
``reopen()``    step 6: reconciler, then agents, then the API replicas

Step 5 (reconciliation with object storage and the client ledgers) is
:mod:`environments.local.restore_reconcile`; it runs between ``restore`` and ``reopen`` against the
database directly, while clients still get 503.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from environments.local.errors import EnvError
from environments.local.pg_files import PG_BIN, PG_USER, app_dsn

if TYPE_CHECKING:
    from environments.local.database import LocalDatabase
    from environments.local.faults import FaultInjector
    from environments.local.processes import Processes
    from environments.local.state import EnvState

Reporter = Callable[[str], None]
FENCING_JUMP = 1_000_000  # > any number of leases granted between a backup and a restore
API_REPLICAS = ("api-1", "api-2")
STOP_GRACE = 2.0  # closing intake is urgent; with the data gone no request can finish anyway


def _utc(t: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if t is None else t, UTC).isoformat()


class BackupError(EnvError):
    """A backup could not be taken, found or restored (message says which and why)."""


class DatabaseBackups:
    """Base backups of the database, losing it (the ``database_lost`` fault) and the restore
    order. Given the environment's record, its processes, its database and its fault driver
    (the restore stops and starts the other components through the driver's faults)."""

    def __init__(self, state: EnvState, processes: Processes, db: LocalDatabase,
                 faults: FaultInjector) -> None:
        self.state, self.processes, self.db, self.faults = state, processes, db, faults
        self.dir = state.dir / "backups"

    # -- backups ----------------------------------------------------------------------------
    def take(self) -> dict[str, Any]:
        """A consistent base backup. Its ``restore_point`` is when it *started*: everything
        committed before then is in it; commits during the backup may or may not be (the copy
        is consistent to the WAL position at its end, which has no exact wall-clock time)."""
        leader = self.db.leader()
        if leader is None:
            raise BackupError("no database leader to back up (Patroni reports none)")
        started = time.time()
        backup_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        partial = self.dir / f".{backup_id}.partial"
        partial.parent.mkdir(parents=True, exist_ok=True)
        argv = [str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1",
                "-p", str(self.state.components[leader].ports["postgres"]), "-U", "replicator",
                "-D", str(partial), "-Ft", "-z", "-X", "stream", "-c", "fast", "--no-password"]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False,
                                env={**os.environ, "PGPASSWORD": self.state.info["secrets"]["pg_replication"]})
        if result.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise BackupError(f"pg_basebackup from {leader} exited {result.returncode}: "
                              f"{result.stderr.strip()[-500:]}")
        finished = time.time()
        meta = {"id": backup_id, "leader": leader, "started_at": _utc(started),
                "finished_at": _utc(finished), "restore_point": _utc(started),
                "seconds": round(finished - started, 3),
                "bytes": sum(p.stat().st_size for p in partial.iterdir())}
        (partial / "backup.json").write_text(json.dumps(meta, indent=2))
        partial.rename(self.dir / backup_id)  # only complete backups carry a plain name
        self.faults.timeline.record("note", "backup", "database", meta)
        return meta

    def list(self) -> list[dict[str, Any]]:
        if not self.dir.is_dir():
            return []
        return [json.loads((d / "backup.json").read_text())
                for d in sorted(self.dir.iterdir()) if (d / "backup.json").is_file()]

    def get(self, backup_id: str = "latest") -> dict[str, Any]:
        backups = self.list()
        if not backups:
            raise BackupError(f"no backups in {self.dir}: take one with `gameday env backup`")
        if backup_id == "latest":
            return backups[-1]
        for b in backups:
            if b["id"] == backup_id:
                return b
        raise BackupError(f"no backup {backup_id!r} in {self.dir}; have: "
                          f"{', '.join(b['id'] for b in backups)}")

    # -- the fault ----------------------------------------------------------------------------
    def lose(self) -> dict[str, Any]:
        """Both members and their data gone (storage loss): only a backup brings the data back."""
        f = self.faults
        if f.is_active("database_lost", "database"):
            return {"target": "database", "already": True}
        ts = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        line = f.begin("database_lost", "database", {"members": ["pg-0", "pg-1"],
                                                      "moved_to": f"data.lost-{ts}"})
        for member in ("pg-0", "pg-1"):
            if self.processes.component_pids(member):
                f.kill(member)
            self._move_aside(member, f"data.lost-{ts}")
        return {"target": "database", "time": line["time"]}

    def _data_dir(self, member: str) -> Path:
        return Path(self.state.components[member].labels["data_dir"])

    def _move_aside(self, member: str, name: str) -> None:
        data = self._data_dir(member)
        if data.exists():
            data.rename(data.with_name(name))

    # -- restore order ----------------------------------------------------------------------
    def restore(self, backup_id: str = "latest", reporter: Reporter | None = None) -> dict[str, Any]:
        """Steps 1-4. Leaves intake closed: run the reconciliation, then :meth:`reopen`."""
        say = reporter or (lambda _msg: None)
        from environments.local.platform import local_platform

        platform = self.state.info.get("platform", "controlplane")
        if not local_platform(platform).CONTROLPLANE:
            raise BackupError(f"the restore order stops and restarts the reference control "
                              f"plane's processes; environment runs {platform!r}")
        backup = self.get(backup_id)
        f, steps, t0 = self.faults, {}, time.monotonic()

        say("1/4 stop intake (API replicas), the reconciler and every agent pool")
        for name in (*API_REPLICAS, "reconciler"):
            if self.processes.component_pids(name):
                f.stop(name, grace=STOP_GRACE)
        for pool in sorted({a.pool for a in self.state.agents}):
            f.withdraw_pool(pool, grace=STOP_GRACE)
        steps["stop_writers_s"] = round(time.monotonic() - t0, 3)

        say(f"2/4 restore backup {backup['id']} (restore point {backup['restore_point']})")
        ts = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        for member in ("pg-0", "pg-1"):
            if self.processes.component_pids(member):
                f.stop(member, grace=STOP_GRACE)
            self._move_aside(member, f"data.replaced-{ts}")
        self._forget_cluster()
        data = self._data_dir("pg-0")
        data.mkdir(mode=0o700)
        (data / "pg_wal").mkdir(mode=0o700)
        source = self.dir / backup["id"]
        for archive, into in (("base.tar.gz", data), ("pg_wal.tar.gz", data / "pg_wal")):
            subprocess.run(["tar", "-xzf", str(source / archive), "-C", str(into)], check=True,
                           capture_output=True)
        if os.geteuid() == 0:  # postgres refuses a data directory it does not own
            subprocess.run(["chown", "-R", f"{PG_USER}:{PG_USER}", str(data)], check=True)
        f.start("pg-0", timeout=90)       # Patroni adopts the restored data directory as leader
        self.db.wait_writable(60)
        steps["database_writable_s"] = round(time.monotonic() - t0, 3)
        f.start("pg-1", timeout=120)      # empty data directory: cloned from pg-0
        self.db.wait_sync_standby(60)
        steps["sync_standby_s"] = round(time.monotonic() - t0, 3)

        say("3/4 migrate the schema to head")
        from controlplane.db import migrate

        # the restored role has the password of the backup's time: set the current one (it
        # may have been rotated since; environments/local/credentials.py)
        self.db.setup_app_database()
        dsn = app_dsn(self.state.info["ports"], self.state.dir)
        head = migrate(dsn)
        say("4/4 advance the fencing sequence past every token issued after the restore point")
        fencing = self._advance_fencing(dsn)
        steps["migrated_fenced_s"] = round(time.monotonic() - t0, 3)
        details = {"backup": backup["id"], "restore_point": backup["restore_point"],
                   "schema_head": head, "fencing_token_floor": fencing, **steps}
        if not f.end("database_lost", "database", details):
            f.timeline.record("note", "database_restored", "database", details)
        return details

    def reopen(self, reporter: Reporter | None = None) -> dict[str, Any]:
        """Step 6: the reconciler first (it expires restored leases and retries), then the
        agents, then intake."""
        say = reporter or (lambda _msg: None)
        f, t0 = self.faults, time.monotonic()
        say("reopen: reconciler, agent pools, API replicas")
        f.start("reconciler")
        for pool in sorted({a.pool for a in self.state.agents}):
            f.restore_pool(pool)
        for name in API_REPLICAS:
            f.start(name)
        return {"reopen_s": round(time.monotonic() - t0, 3)}

    def reconcile(self, restored: dict[str, Any], ledger_files: list[Path]) -> dict[str, Any]:
        """Step 5, intake still closed: quarantine what the restored store does not know and
        list the lost acknowledgements to replay once intake is open (``replay_pending``)."""
        from environments.local.restore_reconcile import reconcile
        from platforms.controlplane import s3_client
        from slo import ledger

        eps, t0 = self.state.endpoints, time.monotonic()
        s3 = s3_client(eps.get("s3_direct") or eps["s3"], eps["bucket"])
        report = reconcile(adapter=self._adapter(), s3=s3, bucket=eps["bucket"],
                           entries=ledger.read(ledger_files, torn_tail_ok=True),
                           restore_point=datetime.fromisoformat(restored["restore_point"]),
                           restore_id=restored["backup"], apply=True)
        report["seconds"] = round(time.monotonic() - t0, 3)
        return report

    def replay(self, pending: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """After the reopen: re-create each lost acknowledged submission under the operation
        id and idempotency key its client holds (admin restore route). ``pending``: the
        reconciliation's ``replay_pending`` (ledger lines, each with its ``restore_id``)."""
        from environments.local.restore_reconcile import from_pending

        if not self.state.tokens.get("admin"):
            raise BackupError("environment has no admin token (env.json: tokens.admin): the "
                              "replay re-creates operations through an admin-only route")
        adapter = self._adapter()
        return [adapter.restore_acknowledged(*from_pending(line)) for line in pending]

    def _adapter(self) -> Any:
        """The platform's adapter: the restore reads the store and replays through it."""
        from platforms import get_adapter

        return get_adapter(self.state.info.get("platform", "controlplane"), self.state.endpoints,
                           self.state.tokens)

    def reopen_and_replay(self, pending: list[dict[str, Any]],
                          reporter: Reporter | None = None) -> dict[str, Any]:
        """Step 6 then the replay: intake must be open before anything is re-created."""
        out = self.reopen(reporter)
        out["replayed"] = self.replay(pending)
        return out

    def restore_order(self, backup_id: str = "latest", ledger_files: tuple[Path, ...] = (),
                      reopen: bool = True, reporter: Reporter | None = None) -> dict[str, Any]:
        """The whole order (1-6) for `gameday env restore-db`; each step's result is kept."""
        say = reporter or (lambda _msg: None)
        out: dict[str, Any] = {"restore": self.restore(backup_id, say)}
        say(f"5 reconcile with object storage and {len(ledger_files)} client ledger(s)")
        out["reconciliation"] = self.reconcile(out["restore"], list(ledger_files))
        if not reopen:
            say("intake left closed (--keep-closed): `gameday fault restore-all` re-opens it")
            return out
        reopened = self.reopen_and_replay(out["reconciliation"].pop("replay_pending", []), say)
        out["replayed"] = reopened.pop("replayed")
        out["reopen"] = reopened
        return out

    def _forget_cluster(self) -> None:
        """Delete the cluster's keys in etcd so Patroni bootstraps from the restored data
        instead of waiting for a leader that is gone (``patronictl remove``, without a prompt)."""
        prefix = f"/gameday/gameday-{self.state.name}/"
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        b64 = lambda s: base64.b64encode(s.encode()).decode()
        try:
            r = httpx.post(f"{self.state.endpoints['etcd']}/v3/kv/deleterange",
                           json={"key": b64(prefix), "range_end": b64(end)}, timeout=5)
            r.raise_for_status()
        except httpx.HTTPError as exc:
            raise BackupError(f"could not remove the Patroni cluster from etcd: {exc}") from exc

    @staticmethod
    def _advance_fencing(dsn: str) -> int:
        import psycopg

        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SELECT setval('fencing_tokens', "
                               "(SELECT last_value FROM fencing_tokens) + %s)", (FENCING_JUMP,)).fetchone()
        return int(row[0])

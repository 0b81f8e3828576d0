"""A private, throwaway PostgreSQL 15 server for tests and benchmarks.

initdb/postgres refuse to run as root, so as root they run as the ``postgres`` OS user. The
harness starts the postmaster itself (and reaps it), which avoids the stale-lock-file trouble
of a killed postmaster lingering as a zombie under another parent.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from environments.local import ports, watchdog

PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))


class PostgresError(RuntimeError):
    pass


def free_port() -> int:
    """A free port, reserved against other callers until its server binds it (ports.py)."""
    return ports.reserve_port()


def _run_as() -> dict[str, object]:
    if os.geteuid() != 0:
        return {}
    try:
        pw = pwd.getpwnam("postgres")
    except KeyError as exc:
        raise PostgresError("running as root needs the 'postgres' OS user (apt-get install "
                            "postgresql-15 creates it)") from exc
    return {"user": pw.pw_uid, "group": pw.pw_gid}


@dataclass
class PostgresServer:
    """``with PostgresServer() as pg: pg.dsn()``; ``fsync`` stays on unless told otherwise."""

    fsync: bool = True
    settings: dict[str, str] = field(default_factory=dict)
    root: Path | None = None
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    _own_root: bool = False

    def start(self) -> PostgresServer:
        if not (PG_BIN / "initdb").exists():
            raise PostgresError(f"PostgreSQL 15 not found in {PG_BIN} (apt-get install "
                                "postgresql-15, or set PG_BIN)")
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="pg-"))
            self._own_root = True
        data = self.root / "data"
        run_as = _run_as()
        if run_as:
            os.chown(self.root, run_as["user"], run_as["group"])  # type: ignore[arg-type]
        log = self.root / "initdb.log"
        with open(log, "wb") as out:
            rc = subprocess.run(
                [str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                 "--no-sync", "-E", "UTF8", "--locale=C"],
                stdout=out, stderr=subprocess.STDOUT, check=False, **run_as).returncode  # type: ignore[call-overload]
        if rc != 0:
            raise PostgresError(f"initdb failed: {log.read_text()[-2000:]}")
        self.port = self.port or free_port()
        opts = {"listen_addresses": "127.0.0.1", "port": str(self.port),
                "unix_socket_directories": str(self.root), "fsync": "on" if self.fsync else "off",
                "max_connections": "200", "shared_buffers": "128MB",
                "log_min_messages": "warning", **self.settings}
        args = [str(PG_BIN / "postgres"), "-D", str(data)]
        for k, v in opts.items():
            args += ["-c", f"{k}={v}"]
        self._log = open(self.root / "postgres.log", "ab")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, **run_as)  # type: ignore[call-overload]
        watchdog.watch(self.proc.pid)  # dies with its owner, even a test session killed hard
        self._wait_ready()
        return self

    def _wait_ready(self, timeout: float = 30.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise PostgresError("postgres exited: "
                                    + (self.root / "postgres.log").read_text()[-2000:])  # type: ignore[operator]
            try:
                psycopg.connect(self.dsn(), connect_timeout=1).close()
                return
            except psycopg.OperationalError:
                time.sleep(0.05)
        raise PostgresError(f"postgres not ready after {timeout}s")

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str, template: str | None = None) -> str:
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            tmpl = f" TEMPLATE {template}" if template else ""
            conn.execute(f'CREATE DATABASE "{name}"{tmpl}')
        return self.dsn(name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # SIGQUIT = immediate shutdown: fine for throwaway data, and never hangs
            os.killpg(self.proc.pid, signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if getattr(self, "_log", None):
            self._log.close()
        if self._own_root and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

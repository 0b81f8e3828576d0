"""PostgreSQL 15 on faultfs, the evidence in docs/faultfs.md: ``python -m
environments.local.faultfs.pgproof [--runs 3] [--only basic,slow,enospc,power]`` (root; about 2
minutes). Prints one JSON document: pgbench on the mount, commit latency with a slow fsync,
what ENOSPC does, and what a power loss costs with synchronous_commit off and on."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from environments.local.faultfs.process import FaultFsProcess
from environments.local.ports import reserve_port

BIN = Path("/usr/lib/postgresql/15/bin")
Result = dict[str, Any]


class Postgres:
    """One postmaster on the mount, started (and reaped) by this process as ``postgres``."""

    def __init__(self, base: Path, port: int) -> None:
        self.data, self.sock, self.log = base / "mnt" / "pgdata", base / "sock", base / "pg.log"
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    def run(self, *cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["runuser", "-u", "postgres", "--", *cmd], capture_output=True,
                              text=True, check=False, timeout=300)

    def initdb(self) -> float:
        t = time.perf_counter()
        r = self.run(str(BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                     "--no-instructions")
        if r.returncode:
            raise RuntimeError(f"initdb failed: {r.stderr}")
        return time.perf_counter() - t

    def start(self, timeout: float = 60.0, **settings: str) -> bool:
        args = [str(BIN / "postgres"), "-D", str(self.data), "-p", str(self.port),
                "-k", str(self.sock), "-c", "listen_addresses="]
        for key, value in settings.items():
            args += ["-c", f"{key}={value}"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(args, user="postgres", group="postgres", stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.alive():
            try:
                with self.connect() as c:
                    c.execute("select 1")
                return True
            except psycopg.OperationalError:
                time.sleep(0.1)
        return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(host=str(self.sock), port=self.port, user="postgres",
                               dbname="postgres", autocommit=True, connect_timeout=5)

    def stop(self) -> None:
        if self.proc is not None and self.alive():
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend (one process group), and wait for them."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        for _ in range(200):
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)

    def pgbench(self, *args: str) -> Result:
        r = self.run(str(BIN / "pgbench"), "-h", str(self.sock), "-p", str(self.port), *args,
                     "postgres")
        if r.returncode:
            raise RuntimeError(f"pgbench {' '.join(args)} failed: {r.stderr}")
        found = {name: re.search(pattern, r.stdout) for name, pattern in (
            ("tps", r"tps = ([\d.]+)"), ("latency_ms", r"latency average = ([\d.]+) ms"),
            ("transactions", r"actually processed: (\d+)"))}
        return {k: float(m.group(1)) for k, m in found.items() if m}

    def log_since(self, offset: int, pattern: str) -> list[str]:
        with open(self.log, errors="replace") as f:
            f.seek(offset)
            return [line for line in f.read().splitlines() if re.search(pattern, line)]


def basic(ffs: FaultFsProcess, pg: Postgres, runs: int) -> Result:
    res: Result = {"initdb_s": round(pg.initdb(), 2)}
    assert pg.start(), "postgres did not start on the mount"
    pg.pgbench("-i", "-s", "4", "-q")
    res["pgbench_c4_j2_T10"] = pg.pgbench("-c", "4", "-j", "2", "-T", "10")
    return res


def _insert_ms(pg: Postgres, n: int = 5) -> list[float]:
    out = []
    with pg.connect() as c:
        c.execute("create table if not exists lat(i int)")
        for i in range(n):
            t = time.perf_counter()
            c.execute("insert into lat values (%s)", (i,))
            out.append(round((time.perf_counter() - t) * 1000, 1))
    return out


def slow_fsync(ffs: FaultFsProcess, pg: Postgres, runs: int) -> Result:
    res: Result = {}
    for label, faults in (("baseline", {}), ("fsync_200ms", {"fsync_delay_ms": 200}),
                          ("fsync_200ms_wal_only", {"fsync_delay_ms": 200,
                                                    "path_glob": "pgdata/pg_wal/*"})):
        ffs.client.set(**faults)
        res[label] = {"pgbench_c1_N_T6": pg.pgbench("-c", "1", "-N", "-T", "6"),
                      "autocommit_insert_ms": _insert_ms(pg)}
    ffs.client.clear()
    return res


def _attempt(pg: Postgres, sql: str) -> str:
    try:
        with pg.connect() as c:
            c.execute(sql)
        return "ok"
    except psycopg.Error as exc:
        return f"{type(exc).__name__}: {str(exc).strip()}"


def enospc(ffs: FaultFsProcess, pg: Postgres, runs: int) -> Result:
    _attempt(pg, "drop table if exists fill; create table fill(i int, pad text)")
    ffs.client.set(enospc=1.0, path_glob="pgdata/base/*")  # only the tables' files are full
    data = {"client": _attempt(pg, "insert into fill select g, repeat('x', 500) "
                                   "from generate_series(1, 50000) g")}
    data["server_answers_after"] = _attempt(pg, "select 1") == "ok"
    ffs.client.set(enospc=1.0)  # WAL too
    offset, t = os.path.getsize(pg.log), time.monotonic()
    every: Result = {"client": _attempt(pg, "insert into fill values (1, 'x')")}
    while time.monotonic() - t < 20 and pg.alive():
        time.sleep(0.2)
    every["postmaster_exited_after_s"] = None if pg.alive() else round(time.monotonic() - t, 1)
    every["log"] = pg.log_since(offset, r"PANIC|FATAL|LOG:  (terminat|all server|database "
                                        r"system|server process|shutting down)")[:12]
    ffs.client.clear()
    pg.kill()
    t = time.monotonic()
    every["restart_after_clear_ok"] = pg.start()
    every["restart_s"] = round(time.monotonic() - t, 2)
    return {"data_files_only": data, "all_writes": every}


def power_loss(ffs: FaultFsProcess, pg: Postgres, runs: int, seconds: float = 2.0) -> Result:
    res: Result = {}
    for mode in ("off", "on"):
        rows = []
        for _ in range(runs):
            pg.stop()
            assert pg.start(synchronous_commit=mode)
            _attempt(pg, "drop table if exists acked; create table acked(i int primary key); "
                         "checkpoint")
            acked = 0
            with pg.connect() as c:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    c.execute("insert into acked values (%s)", (acked + 1,))
                    acked += 1
            pg.kill()  # every process using the disk dies first, then the disk loses its cache
            report = ffs.client.crash()
            t = time.monotonic()
            recovered = pg.start()
            row: Result = {"acked": acked, "recovered": recovered,
                           "ready_after_s": round(time.monotonic() - t, 2),
                           "dropped_bytes": report["dropped_bytes"],
                           "dropped_files": len(report["dropped_files"]),
                           "dropped_wal_bytes": sum(f["bytes"] for f in report["dropped_files"]
                                                    if "/pg_wal/" in f["path"]),
                           "removed_files": report["removed_files"]}
            if recovered:
                with pg.connect() as c:
                    count, top = c.execute("select count(*), coalesce(max(i), 0) "
                                           "from acked").fetchone() or (0, 0)
                row.update(present=count, lost=acked - count, gapless=count == top)
            rows.append(row)
        res[f"synchronous_commit_{mode}"] = rows
    return res


EXPERIMENTS = {"basic": basic, "slow": slow_fsync, "enospc": enospc, "power": power_loss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="power-loss runs per mode")
    parser.add_argument("--only", default=",".join(EXPERIMENTS),
                        help="comma-separated subset of " + ",".join(EXPERIMENTS))
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="faultfs-pgproof-"))
    base.chmod(0o755)
    for name in ("src", "mnt", "sock"):
        (base / name).mkdir()
        (base / name).chmod(0o777)
    results: Result = {}
    try:
        with FaultFsProcess(base / "src", base / "mnt", log_path=base / "faultfs.log") as ffs:
            pg = Postgres(base, reserve_port())
            try:
                for name in ["basic", *[n for n in args.only.split(",") if n != "basic"]]:
                    results[name] = EXPERIMENTS[name](ffs, pg, args.runs)
            finally:
                pg.kill()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

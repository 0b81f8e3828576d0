"""`gameday bench controlplane --peer mlflow`: our submit path and a peer's create call, side by
side, on one PostgreSQL, driven by the same load client (wrk, C, not Python) at the same
concurrency, rounds interleaved (ours, peer, ours, peer, ...) so the ratio is measured within one
run on a noisy machine.

Every acknowledgement is checked against the rows: wrk's Lua script keeps the id of every 2xx
answer (ours: each request with a fresh Idempotency-Key; MLflow: `runs/create`), and after each
round every acknowledged id must be in the database, once. CPU per request per component comes
from /proc (utime + stime of each process tree before and after the round).

The pure parts (the Lua script, parsing wrk's output, the acknowledgement check, the ratio) are
unit-tested (tests/gameday/test_bench_peer.py); the rest needs wrk, PostgreSQL and the peer.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gameday.bench_submit import BODY

REPO = Path(__file__).resolve().parents[1]
MLFLOW_VENV = Path(os.environ.get("GAMEDAY_MLFLOW_VENV") or REPO / ".venv-mlflow")
PEERS = ("mlflow", "prefect")
PREFECT_VENV = Path(os.environ.get("GAMEDAY_PREFECT_VENV") or REPO / ".venv-prefect")

# One Lua state per wrk thread. request(): a fresh Idempotency-Key per request (thread number +
# counter + a per-run prefix); response(): keep the id of every acknowledged (2xx) answer; done():
# write each thread's ids and the latency percentiles to the file named by the first argument.
WRK_LUA = r"""
local threads = {}
local nthreads = 0
function setup(thread)
  nthreads = nthreads + 1
  thread:set("tid", nthreads)  -- a global of the thread's own state
  table.insert(threads, thread)
end

function init(args)
  out_path = args[1]
  key_prefix = args[2] .. "-" .. tid .. "-"
  id_pattern = args[3]
  counter = 0
  acked = {}
  statuses = {}
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  counter = counter + 1
  if key_prefix ~= "" then
    wrk.headers["Idempotency-Key"] = key_prefix .. counter
  end
  return wrk.format()
end

function response(status, headers, body)
  local s = tostring(status)
  statuses[s] = (statuses[s] or 0) + 1
  if status >= 200 and status < 300 then
    local id = string.match(body, id_pattern)
    table.insert(acked, id or "?")
  end
end

function done(summary, latency, requests)
  -- done() runs in the main state, where init() never ran: the path comes from a thread
  local f = io.open(threads[1]:get("out_path"), "w")
  for _, t in ipairs(threads) do
    for _, id in ipairs(t:get("acked")) do f:write("ack ", id, "\n") end
    for s, n in pairs(t:get("statuses")) do f:write("status ", s, " ", n, "\n") end
  end
  for _, q in ipairs({50, 90, 99}) do
    f:write("latency_us ", q, " ", latency:percentile(q), "\n")
  end
  f:write("requests ", summary.requests, "\n")
  f:write("duration_us ", summary.duration, "\n")
  f:close()
end
"""

def lua_script(body: dict[str, Any]) -> str:
    """WRK_LUA with the request body (a JSON document as a Lua string literal)."""
    return f"wrk.body = {json.dumps(json.dumps(body, separators=(',', ':')))}\n" + WRK_LUA


# the id each system puts in a created answer
OURS_ID = '"id":"([^"]+)"'
MLFLOW_ID = '"run_id"%s*:%s*"([^"]+)"'
PREFECT_ID = '^{%s*"id"%s*:%s*"([^"]+)"'  # the flow run's own id comes first


@dataclass
class WrkResult:
    """One wrk round: what wrk printed and what the Lua script kept."""

    requests: int = 0
    seconds: float = 0.0
    non_2xx: int = 0
    socket_errors: dict[str, int] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)
    acked: list[str] = field(default_factory=list)
    latency_ms: dict[int, float] = field(default_factory=dict)

    @property
    def ok(self) -> int:
        return sum(n for s, n in self.statuses.items() if 200 <= s < 300)

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0


_SOCKET = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_TOTAL = re.compile(r"(\d+) requests in ([\d.]+)(us|ms|s|m)\b")
_NON2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def parse_wrk(stdout: str, script_out: str) -> WrkResult:
    """wrk's summary (stdout) and the Lua script's file, as one result. Raises ValueError when
    either lacks what a finished round prints (wrk failed, or the script did not run)."""
    res = WrkResult()
    total = _TOTAL.search(stdout)
    if not total:
        raise ValueError(f"wrk printed no request total: {stdout.strip()[-500:]!r}")
    res.requests = int(total.group(1))
    res.seconds = float(total.group(2)) * _UNIT[total.group(3)]
    if m := _NON2XX.search(stdout):
        res.non_2xx = int(m.group(1))
    if m := _SOCKET.search(stdout):
        res.socket_errors = dict(zip(("connect", "read", "write", "timeout"),
                                     map(int, m.groups()), strict=True))
    seen_requests = False
    for line in script_out.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "ack":
            res.acked.append(parts[1])
        elif parts[0] == "status":
            res.statuses[int(parts[1])] = res.statuses.get(int(parts[1]), 0) + int(parts[2])
        elif parts[0] == "latency_us":
            res.latency_ms[int(parts[1])] = float(parts[2]) / 1000
        elif parts[0] == "duration_us":
            res.seconds = float(parts[1]) / 1e6
        elif parts[0] == "requests":
            seen_requests = True
    if not seen_requests:
        raise ValueError("wrk's Lua script wrote no summary (did done() run?)")
    return res


@dataclass
class AckCheck:
    acknowledged: int
    found: int
    duplicates: int
    unparsed: int

    @property
    def ok(self) -> bool:
        return (self.found == self.acknowledged and self.duplicates == 0
                and self.unparsed == 0)

    def text(self) -> str:
        s = f"{self.found} of {self.acknowledged} acknowledged ids in the table"
        if self.duplicates:
            s += f", {self.duplicates} acknowledged twice or stored twice"
        if self.unparsed:
            s += f", {self.unparsed} acknowledgements without an id"
        return s


def check_acks(acked: list[str], rows: dict[str, int]) -> AckCheck:
    """Every acknowledged id must be in ``rows`` (id -> how many rows carry it) exactly once,
    and no id may be acknowledged twice. Rows nobody acknowledged are allowed: wrk stops with
    requests in flight, which may commit unanswered."""
    unparsed = sum(1 for a in acked if a == "?")
    ids = [a for a in acked if a != "?"]
    twice_acked = len(ids) - len(set(ids))
    stored_twice = sum(1 for i in set(ids) if rows.get(i, 0) > 1)
    found = sum(1 for i in ids if rows.get(i, 0) >= 1)
    return AckCheck(acknowledged=len(acked), found=found,
                    duplicates=twice_acked + stored_twice, unparsed=unparsed)


def ratio(ours: float, peer: float) -> float:
    """How many times the peer's figure ours is (nan when the peer did nothing)."""
    return ours / peer if peer else float("nan")


def median_ratio(pairs: list[tuple[float, float]]) -> float:
    """The median of the per-round ratios (each pair measured back to back), which is what
    a noisy machine allows to compare; not the ratio of the medians."""
    return statistics.median(ratio(a, b) for a, b in pairs)


def cpu_ms_per_request(ticks: dict[str, int], hz: int, n: int) -> dict[str, float]:
    return {k: (t / hz * 1000 / n if n else float("nan")) for k, t in ticks.items()}


def wrk_path() -> str:
    path = shutil.which("wrk")
    if not path:
        raise RuntimeError("wrk not found: install it with `apt-get install -y wrk` "
                           "(scripts/setup.sh does)")
    return path


def prefect_bin() -> Path:
    exe = PREFECT_VENV / "bin" / "prefect"
    if not exe.exists():
        raise RuntimeError(f"Prefect not found at {exe}: install it with "
                           "`bash scripts/setup-prefect.sh` (its own venv .venv-prefect; the "
                           "bench never installs anything)")
    return exe


def mlflow_bin() -> Path:
    exe = MLFLOW_VENV / "bin" / "mlflow"
    if not exe.exists():
        raise RuntimeError(f"MLflow not found at {exe}: install it with "
                           "`bash scripts/setup-mlflow.sh` (its own venv .venv-mlflow; the "
                           "bench never installs anything)")
    return exe


def run_wrk(url: str, body: dict[str, Any], headers: dict[str, str], *, seconds: float,
            connections: int, threads: int, key_prefix: str, id_pattern: str,
            workdir: Path) -> tuple[WrkResult, float]:
    """One wrk round; also returns wrk's own CPU seconds."""
    script = workdir / "bench.lua"
    out = workdir / "wrk.out"
    out.unlink(missing_ok=True)
    args = [wrk_path(), "-t", str(threads), "-c", str(connections), "-d", f"{seconds:g}s",
            "--latency", "--timeout", "10s", "-s", str(script)]
    for k, v in headers.items():
        args += ["-H", f"{k}: {v}"]
    # the body is set at the script's top level, before wrk copies its table to the threads
    script.write_text(lua_script(body))
    args += [url, "--", str(out), key_prefix, id_pattern]
    c0 = os.times()
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    c1 = os.times()
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    if not out.exists():
        raise RuntimeError(f"wrk's script wrote nothing: {proc.stdout.strip()[-500:]}")
    res = parse_wrk(proc.stdout, out.read_text())
    wrk_cpu = (c1.children_user + c1.children_system) - (c0.children_user + c0.children_system)
    return res, wrk_cpu


@dataclass
class Side:
    """One system under load: how to reach it and which processes are its components."""

    name: str
    url: str
    body: dict[str, Any]
    headers: dict[str, str]
    id_pattern: str
    key_prefix: str
    components: Callable[[], dict[str, list[int]]]
    rows: Callable[[list[str]], dict[str, int]]  # acknowledged ids -> rows carrying each
    empty: Callable[[], None]


def measure_round(side: Side, *, seconds: float, connections: int, threads: int,
                  workdir: Path, round_no: int, hz: int) -> dict[str, Any]:
    from gameday.bench_idle import spent, ticks_of

    before = {k: ticks_of(v) for k, v in side.components().items()}
    res, wrk_cpu = run_wrk(side.url, side.body, side.headers, seconds=seconds,
                           connections=connections, threads=threads,
                           key_prefix=f"{side.key_prefix}{round_no}" if side.key_prefix else "",
                           id_pattern=side.id_pattern, workdir=workdir)
    after = {k: ticks_of(v) for k, v in side.components().items()}
    ticks = {k: spent(before[k], after[k]) for k in after}
    check = check_acks(res.acked, side.rows([a for a in res.acked if a != "?"]))
    side.empty()
    cpu = cpu_ms_per_request(ticks, hz, res.ok)
    cpu["wrk"] = wrk_cpu * 1000 / res.ok if res.ok else float("nan")
    return {"rate": res.rate, "ok": res.ok, "requests": res.requests,
            "statuses": {str(k): v for k, v in sorted(res.statuses.items())},
            "socket_errors": res.socket_errors, "p50_ms": res.latency_ms.get(50),
            "p99_ms": res.latency_ms.get(99), "cpu_ms": cpu, "ack": check}


def warm_up(side: Side, *, connections: int, threads: int, workdir: Path, hz: int,
            say: Callable[[str], None], seconds: float = 3.0, limit: int = 30) -> None:
    """3 s rounds until the rate stops rising: two rounds in a row below 1.1 times the best
    so far (MLflow's workers take many seconds of load before they answer at their pace: lazy
    imports and caches), at least 4 rounds, at most ``limit``."""
    best = 0.0
    flat = 0
    for n in range(1, limit + 1):
        r = measure_round(side, seconds=seconds, connections=connections, threads=threads,
                          workdir=workdir, round_no=-n, hz=hz)
        say(f"warm-up {side.name} {n}: {r['rate']:.0f}/s; {r['ack'].text()}")
        if not r["ack"].ok:
            raise RuntimeError(f"{side.name}: acknowledged work is missing or duplicated in "
                               f"the warm-up: {r['ack'].text()}")
        flat = flat + 1 if r["rate"] < best * 1.1 else 0
        best = max(best, r["rate"])
        if n >= 4 and flat >= 2:
            return
    say(f"warm-up {side.name}: still rising after {limit} rounds; measuring anyway")


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    comps = rounds[0]["cpu_ms"].keys()
    server = [k for k in comps if k != "wrk"]
    return {
        "rate": statistics.median(r["rate"] for r in rounds),
        "p50_ms": statistics.median(r["p50_ms"] for r in rounds),
        "p99_ms": statistics.median(r["p99_ms"] for r in rounds),
        "cpu_ms": {k: statistics.median(r["cpu_ms"][k] for r in rounds) for k in comps},
        "cpu_ms_server_total": statistics.median(sum(r["cpu_ms"][k] for k in server)
                                                  for r in rounds),
        "acknowledged": sum(r["ack"].acknowledged for r in rounds),
        "found": sum(r["ack"].found for r in rounds),
        "non_2xx": sum(sum(v for s, v in r["statuses"].items() if not s.startswith("2"))
                       for r in rounds),
    }


def round_line(name: str, i: int, r: dict[str, Any]) -> str:
    return (f"  {name} round {i}: {r['rate']:.0f}/s, p50 {r['p50_ms']:.1f} ms p99 "
            f"{r['p99_ms']:.1f} ms, CPU ms per request "
            + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_ms"].items())
            + f"; {r['ack'].text()}")


def report(ours: dict[str, Any], peer: dict[str, Any], peer_name: str,
           ratios: dict[str, float]) -> str:
    def line(name: str, s: dict[str, Any]) -> str:
        return (f"{name}: {s['rate']:.0f} durable requests/s, p50 {s['p50_ms']:.1f} ms p99 "
                f"{s['p99_ms']:.1f} ms; CPU ms per request "
                + ", ".join(f"{k} {v:.2f}" for k, v in s["cpu_ms"].items())
                + f" (servers {s['cpu_ms_server_total']:.2f}); acknowledged "
                f"{s['acknowledged']}, in the table {s['found']}, non-2xx {s['non_2xx']}")
    return "\n".join([
        line("ours", ours), line(peer_name, peer),
        (f"ratio (median of per-round ratios): throughput {ratios['rate']:.1f}x, server CPU "
         f"per request {ratios['cpu']:.1f}x less"),
    ])


def between_rounds(empty: Callable[[], None], keep_rows: bool) -> Callable[[], None]:
    """What each side does after a round: empty its table (every round starts from the same
    small table), or, with ``keep_rows``, nothing: the tables then grow across the rounds as
    a live system's do, and so does what each submission costs the database
    (docs/performance.md, 2026-12-07)."""
    return (lambda: None) if keep_rows else empty


def run_side_by_side(peer: str, *, seconds: float, rounds: int, connections: int,
                     api_workers: int, say: Callable[[str], None],
                     keep_rows: bool = False) -> dict[str, Any]:
    """Start PostgreSQL, our API + reconciler and the peer; interleave wrk rounds."""
    import psycopg

    from controlplane.db import migrate
    from environments.local import procs
    from environments.local.launch import ControlPlane
    from environments.local.pgserver import PostgresServer

    if peer not in PEERS:
        raise RuntimeError(f"unknown peer {peer!r}; known: {', '.join(PEERS)}")
    wrk_path()
    exe = mlflow_bin() if peer == "mlflow" else prefect_bin()
    load_before = os.getloadavg()[0]
    say(f"load average before: {load_before:.2f}")
    hz = os.sysconf("SC_CLK_TCK")
    threads = min(2, connections)
    work = Path(tempfile.mkdtemp(prefix="bench-peer-"))
    peer_proc: subprocess.Popen[bytes] | None = None
    try:
        with PostgresServer(fsync=True) as pg:
            say(f"PostgreSQL 15 (fsync on) at {pg.dsn()}")
            dsn = pg.create_database("bench")
            migrate(dsn)
            pdsn = pg.create_database(peer)

            def tree(pid: int) -> list[int]:
                return [pid, *procs.descendants(pid, procs.children_map())]

            with ControlPlane(dsn=dsn, replicas=1, reconcilers=1,
                              api_workers=api_workers) as cp:
                say(f"ours: 1 API replica ({api_workers} worker(s)) + 1 reconciler at "
                    f"{cp.api_url}")
                if peer == "mlflow":
                    peer_proc, purl = _start_mlflow(exe, pdsn, work, say)
                else:
                    peer_proc, purl = _start_prefect(exe, pdsn, work, say)

                def ours_rows(ids: list[str]) -> dict[str, int]:
                    with psycopg.connect(dsn) as conn:
                        return dict(conn.execute(
                            "SELECT id::text, count(*) FROM operations WHERE id = ANY(%s::uuid[])"
                            " GROUP BY id", (ids,)).fetchall())

                def ours_empty() -> None:
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        conn.execute("TRUNCATE operations CASCADE")

                # the peer's rows: MLflow's runs, Prefect's flow runs
                table, col = ("runs", "run_uuid") if peer == "mlflow" else ("flow_run", "id")

                def peer_rows(ids: list[str]) -> dict[str, int]:
                    with psycopg.connect(pdsn) as conn:
                        return dict(conn.execute(
                            f"SELECT {col}::text, count(*) FROM {table}"
                            f" WHERE {col}::text = ANY(%s) GROUP BY {col}", (ids,)).fetchall())

                def peer_empty() -> None:
                    with psycopg.connect(pdsn, autocommit=True) as conn:
                        conn.execute(f"TRUNCATE {table} CASCADE")

                ours = Side(
                    "ours", f"{cp.api_url}/v1/operations", BODY,
                    {"Authorization": f"Bearer {cp.user_token}"}, OURS_ID,
                    f"bench-{os.getpid()}-",
                    lambda: {"api": tree(cp.apis[0].popen.pid),
                             "reconciler": tree(cp.recs[0].popen.pid),
                             "postgres": tree(pg.proc.pid)},  # type: ignore[union-attr]
                    ours_rows, between_rounds(ours_empty, keep_rows))
                if peer == "mlflow":
                    url, body, pattern = (f"{purl}/api/2.0/mlflow/runs/create",
                                          {"experiment_id": "0", "run_name": "bench"}, MLFLOW_ID)
                else:
                    url, body, pattern = (f"{purl}/api/flow_runs/",
                                          {"flow_id": _prefect_flow(purl), "name": "bench"},
                                          PREFECT_ID)
                mlf = Side(
                    peer, url, body, {}, pattern, "",
                    lambda: {peer: tree(peer_proc.pid),  # type: ignore[union-attr]
                             "postgres": tree(pg.proc.pid)},  # type: ignore[union-attr]
                    peer_rows, between_rounds(peer_empty, keep_rows))
                for side in (ours, mlf):  # warm-up: connections, caches, plans, imports
                    warm_up(side, connections=connections, threads=threads, workdir=work,
                            hz=hz, say=say)
                results: dict[str, list[dict[str, Any]]] = {"ours": [], peer: []}
                for i in range(1, rounds + 1):
                    for side in (ours, mlf):
                        r = measure_round(side, seconds=seconds, connections=connections,
                                          threads=threads, workdir=work, round_no=i, hz=hz)
                        results[side.name].append(r)
                        say(round_line(side.name, i, r))
                        if not r["ack"].ok:
                            raise RuntimeError(f"{side.name}: acknowledged work is missing or "
                                               f"duplicated: {r['ack'].text()}")
                kept = None
                if keep_rows:  # how big the tables had grown by the last round
                    with psycopg.connect(dsn) as conn:
                        kept = {"ours": conn.execute(
                            "SELECT count(*) FROM operations").fetchone()[0]}  # type: ignore[index]
                    with psycopg.connect(pdsn) as conn:
                        kept[peer] = conn.execute(
                            f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
                    say(f"rows kept across the rounds: {kept['ours']} operations, "
                        f"{kept[peer]} {table}")
    finally:
        if peer_proc is not None:
            _stop(peer_proc)
        shutil.rmtree(work, ignore_errors=True)
    so, sp = summarize(results["ours"]), summarize(results[peer])

    def server_cpu(r: dict[str, Any]) -> float:
        return sum(v for k, v in r["cpu_ms"].items() if k != "wrk")

    ratios = {"rate": median_ratio([(a["rate"], b["rate"]) for a, b in
                                    zip(results["ours"], results[peer], strict=True)]),
              "cpu": median_ratio([(server_cpu(b), server_cpu(a)) for a, b in
                                   zip(results["ours"], results[peer], strict=True)])}
    load_after = os.getloadavg()[0]
    say(report(so, sp, peer, ratios))
    say(f"load average before {load_before:.2f}, after {load_after:.2f} (1 min)")
    for r in (*results["ours"], *results[peer]):
        r["ack"] = r["ack"].text()
    return {"client": f"wrk, {threads} threads, {connections} connections, {seconds:g} s rounds",
            "tables": "kept across rounds" if keep_rows else "emptied after each round",
            "rows_kept": kept,
            "ours": so, peer: sp, "ratio": ratios, "rounds": results,
            "load_average_before": load_before, "load_average_after": load_after}


def _start_mlflow(exe: Path, dsn: str, work: Path, say: Callable[[str], None],
                  workers: int = 2) -> tuple[subprocess.Popen[bytes], str]:

    from environments.local.pgserver import free_port

    port = free_port()
    art = work / "mlflow-artifacts"
    art.mkdir()
    args = [str(exe), "server", "--backend-store-uri", dsn.replace("postgresql://",
                                                                   "postgresql+psycopg2://"),
            "--default-artifact-root", art.as_uri(), "--host", "127.0.0.1", "--port",
            str(port), "--workers", str(workers)]
    say(f"{exe.parent.parent.name}: mlflow server with {workers} workers on the same "
        "PostgreSQL (its own database), job execution off")
    # MLflow 3's job runner (background GenAI jobs: a supervisor and seven huey consumers
    # polling) is no part of runs/create; on, its polling cost more CPU than a round's
    # requests at a few dozen per second, and shared the cores with the workers
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(work / "mlflow.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    return _healthy(proc, "mlflow", f"{url}/health", work / "mlflow.log"), url


def _healthy(proc: subprocess.Popen[bytes], name: str, health: str,
             log: Path) -> subprocess.Popen[bytes]:
    """Wait (180 s) until the peer's server answers 200 on ``health``; stopped and its log's
    tail raised when it exits or never answers."""
    import urllib.request

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} server exited: " + log.read_text()[-2000:])
        try:
            with urllib.request.urlopen(health, timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    _stop(proc)
    raise RuntimeError(f"{name} server not ready after 180 s: " + log.read_text()[-2000:])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def _start_prefect(exe: Path, dsn: str, work: Path, say: Callable[[str], None],
                   ) -> tuple[subprocess.Popen[bytes], str]:
    """Prefect 3's server, API only (--no-services: its schedulers and loop services are no
    part of creating a flow run), one process: more workers need a message broker besides."""

    from environments.local.pgserver import free_port
    from environments.local.prefect import server_env

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, **server_env(work / "prefect-home",
                                      dsn.replace("postgresql://", "postgresql+asyncpg://"),
                                      port)}
    args = [str(exe), "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui",
            "--no-services"]
    say(f"{exe.parent.parent.name}: prefect server (1 process, API only) on the same "
        "PostgreSQL (its own database)")
    with open(work / "prefect.log", "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    return _healthy(proc, "prefect", f"{url}/api/health", work / "prefect.log"), url


def _prefect_flow(url: str) -> str:
    """The flow the bench's flow runs belong to (created once)."""
    import urllib.request

    req = urllib.request.Request(f"{url}/api/flows/", data=b'{"name": "bench"}',
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return str(json.loads(r.read())["id"])

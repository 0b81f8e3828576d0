"""`gameday bench runtime`: what the local runtime costs per attempt, and how fast a backlog of
short operations starts.

One round starts its own PostgreSQL (fsync on), a control plane (1 API replica, 1 reconciler),
moto (S3), a docker-registry holding the trainer image and N real agents on the local runtime,
then submits ``sleep`` operations open-loop at a fixed rate and waits until they end.

Figures:
* queue -> running latency: per operation, from its ``accepted`` event to its first
  ``running`` event (events table, database clock);
* throughput: operations that succeeded / (last terminal event - first accepted event);
* CPU per attempt of the agents' process trees, read from /proc (utime + stime, plus
  cutime + cstime: the CPU of reaped children, so workloads that already exited count). The
  window starts and ends with no workload running. Split into the agents' own CPU (claims,
  heartbeats, events, reports) and the workloads' (everything below an agent: warm parent,
  its forked children, or plain workload processes);
* runtime overhead per attempt = workloads' CPU per attempt - the CPU of the same ``sleep``
  workload run in a warm interpreter (``main()`` in this process, imports done): what is left
  is what starting a workload costs (interpreter start and imports, or fork and copy-on-write).

Everything started here is in a process group with a watchdog (``environments.local.launch.spawn``)
and dies with this process, even if it is killed hard; the warm parents are in their agents'
groups and workloads die with them (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click

TRAINER_REPO, TRAINER_TAG = "ml/trainer", "1.0"
START_ENV = "GAMEDAY_LOCAL_RUNTIME_START"  # as controlplane.runtimes.local reads it


# ---- pure figures ---------------------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (the smallest value with at least q % of values <= it)."""
    if not values:
        return float("nan")
    if not 0 < q <= 100:
        raise ValueError(f"percentile q must be in (0, 100], got {q}")
    xs = sorted(values)
    return xs[max(0, math.ceil(q / 100 * len(xs)) - 1)]


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    return {"n": len(seconds), **{f"p{q}_ms": round(percentile(seconds, q) * 1000, 1)
                                  for q in (50, 95, 99)}}


def cpu_split(stats: Mapping[int, tuple[int, int, int]], agents: Sequence[int]) -> tuple[int, int]:
    """(agents' own ticks, ticks of everything below them) from pid -> (ppid, own, reaped).

    ``own`` is utime + stime of a live process, ``reaped`` its cutime + cstime (children it
    waited for). A live descendant counts own + reaped: its children are in neither figure
    of its parent until it is reaped itself."""
    below: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        below.setdefault(ppid, []).append(pid)
    own = sum(stats[a][1] for a in agents if a in stats)
    rest = sum(stats[a][2] for a in agents if a in stats)
    stack = [c for a in agents for c in below.get(a, [])]
    while stack:
        pid = stack.pop()
        rest += stats[pid][1] + stats[pid][2]
        stack.extend(below.get(pid, []))
    return own, rest


def machine_busy_percent(before: Sequence[int], after: Sequence[int]) -> float:
    """Busy share of all cores between two /proc/stat "cpu" lines (idle + iowait = not busy)."""
    total = sum(after) - sum(before)
    idle = (after[3] + after[4]) - (before[3] + before[4])
    return round(100.0 * (total - idle) / total, 1) if total > 0 else float("nan")


def per_attempt_ms(ticks: int, hz: int, attempts: int) -> float:
    if attempts <= 0 or hz <= 0:
        return float("nan")
    return round(1000.0 * ticks / hz / attempts, 1)


def median_figures(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The median of every numeric figure over the rounds that have it (nested dicts too);
    anything else as in the first round that has it."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for r in rounds for k in r):
        values = [r[key] for r in rounds if key in r]
        if all(isinstance(v, Mapping) for v in values):
            out[key] = median_figures(values)
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = statistics.median(values)
        else:
            out[key] = values[0]
    return out


# ---- /proc ----------------------------------------------------------------------------------

def _proc_stats() -> dict[int, tuple[int, int, int]]:
    out: dict[int, tuple[int, int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        f = raw[raw.rindex(")") + 2:].split()  # stat(5) fields 4 (ppid), 14-17 (times)
        out[int(name)] = (int(f[1]), int(f[11]) + int(f[12]), int(f[13]) + int(f[14]))
    return out


def requests_by_route(metrics_text: str) -> dict[str, float]:
    """"METHOD route" -> requests answered, from the API's /metrics text."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if not line.startswith("controlplane_http_requests_total{"):
            continue
        labels, value = line.rsplit(" ", 1)
        kv = dict(part.split("=", 1) for part in labels[labels.index("{") + 1:-1].split(","))
        key = f"{kv['method'].strip(chr(34))} {kv['route'].strip(chr(34))}"
        out[key] = out.get(key, 0.0) + float(value)
    return out


def _requests_by_route(api_url: str) -> dict[str, float]:
    import httpx

    return requests_by_route(httpx.get(f"{api_url}/metrics", timeout=10).text)


def _cpu_line() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


# ---- the environment ------------------------------------------------------------------------

def _sleep_workload_cpu_ms(endpoint: str, bucket: str, sleep_seconds: float, n: int = 5) -> float:
    """CPU of one ``sleep`` workload run in this (warm) interpreter: the workload's own cost."""
    from controlplane.workload.__main__ import main

    def once() -> float:
        args = ["--kind", "sleep", "--seconds", str(sleep_seconds), "--operation-id",
                f"baseline-{uuid.uuid4()}", "--attempt", "1", "--s3-endpoint", endpoint,
                "--bucket", bucket]
        t0 = time.thread_time()  # this thread only: the bench's other threads are not counted
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(args)
        if code != 0:
            raise click.ClickException(f"the baseline sleep workload exited {code}")
        return (time.thread_time() - t0) * 1000

    once()  # imports and the first S3 client, as the warm parent does before any fork
    return round(statistics.median(once() for _ in range(n)), 1)


def _start_registry(root: Path, logdir: Path) -> tuple[Any, str]:
    from controlplane.registry import push_minimal_image
    from environments.local.launch import spawn, wait_http
    from environments.local.pgserver import free_port

    port = free_port()
    (root / "data").mkdir(parents=True, exist_ok=True)
    config = root / "config.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                      f"    rootdirectory: {root / 'data'}\nhttp:\n  addr: 127.0.0.1:{port}\n")
    binary = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    proc = spawn("registry", [binary, "serve", str(config)], logdir)
    host = f"127.0.0.1:{port}"
    wait_http(f"http://{host}/v2/", proc)
    push_minimal_image(host, TRAINER_REPO, TRAINER_TAG)
    return proc, host


def _wait_terminal(dsn: str, ids: list[str], timeout: float) -> dict[str, int]:
    import psycopg

    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            rows = conn.execute("SELECT state, count(*) FROM operations WHERE id = ANY(%s::uuid[]) "
                                "GROUP BY state", (ids,)).fetchall()
            states = {s: int(n) for s, n in rows}
            done = sum(n for s, n in states.items() if s in ("succeeded", "failed", "canceled"))
            if done >= len(ids) or time.monotonic() > deadline:
                return states
            time.sleep(0.25)


def _latencies(dsn: str, ids: list[str]) -> tuple[list[float], float]:
    """queue -> running seconds per operation, and the span first accepted -> last terminal."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        lat = [float(r[0]) for r in conn.execute(
            """SELECT extract(epoch FROM min(r.time) - min(a.time)) FROM events a
               JOIN events r ON r.operation_id = a.operation_id AND r.to_state = 'running'
               WHERE a.to_state = 'accepted' AND a.operation_id = ANY(%s::uuid[])
               GROUP BY a.operation_id""", (ids,))]
        span = conn.execute(
            """SELECT extract(epoch FROM max(time) FILTER (WHERE to_state IN
                                          ('succeeded', 'failed', 'canceled'))
                                  - min(time) FILTER (WHERE to_state = 'accepted'))
               FROM events WHERE operation_id = ANY(%s::uuid[])""", (ids,)).fetchone()
    return lat, float(span[0] or 0.0) if span else 0.0


def _submit_open_loop(url: str, token: str, body: dict[str, Any], rate: float, seconds: float
                      ) -> list[str]:
    import httpx

    ids: list[str] = []
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {token}"}

    with httpx.Client(base_url=url, timeout=30, headers=headers) as client:
        def one() -> None:
            r = client.post("/v1/operations", json=body,
                            headers={"Idempotency-Key": str(uuid.uuid4())})
            if r.status_code == 201:
                with lock:
                    ids.append(r.json()["id"])

        n = max(1, int(rate * seconds))
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=16) as pool:
            futures = []
            for i in range(n):  # open loop: on schedule, whatever the answers take
                delay = t0 + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                futures.append(pool.submit(one))
            for f in futures:
                f.result()
    return ids


def measure_runtime(rate: float = 20.0, seconds: float = 20.0, sleep_seconds: float = 0.2,
                    agents: int = 2, say: Callable[[str], object] = print, *,
                    start_method: str | None = None, cpu_slots: int = 8,
                    poll_seconds: float = 0.5, drain_timeout: float = 300.0) -> dict[str, Any]:
    """One round (see the module docstring). ``start_method`` None: the runtime's default."""
    from controlplane import storage
    from controlplane.db import migrate
    from environments.local import motoserver
    from environments.local.launch import ControlPlane, spawn, wait_http
    from environments.local.pgserver import PostgresServer, free_port

    work = Path(tempfile.mkdtemp(prefix="bench-runtime-"))
    logdir = work / "logs"
    logdir.mkdir()
    started: list[Any] = []
    hz = os.sysconf("SC_CLK_TCK")
    measured = False
    try:
        with PostgresServer(fsync=True) as pg:
            dsn = pg.create_database("bench_runtime")
            migrate(dsn)
            s3_port = free_port()
            moto = spawn("moto", motoserver.command(s3_port), logdir)
            started.append(moto)
            endpoint = f"http://127.0.0.1:{s3_port}"
            wait_http(endpoint + "/moto-api/", moto)
            bucket = storage.DEFAULT_BUCKET
            storage.ObjectStore.from_config(storage.StorageConfig(endpoint_url=endpoint,
                                                                  bucket=bucket)).ensure_bucket()
            registry, host = _start_registry(work / "registry", logdir)
            started.append(registry)
            baseline_ms = _sleep_workload_cpu_ms(endpoint, bucket, sleep_seconds)
            say(f"sleep workload in a warm interpreter: {baseline_ms} ms CPU")
            with ControlPlane(dsn=dsn, replicas=1, reconcilers=1, logdir=logdir) as cp:
                env = {"CONTROLPLANE_AGENT_TOKEN": cp.agent_token,
                       "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
                if start_method:
                    env[START_ENV] = start_method
                agent_procs = []
                for i in range(agents):
                    metrics = free_port()
                    p = spawn(f"agent-{i}", [
                        sys.executable, "-m", "controlplane.agent", "--api", cp.api_url,
                        "--name", f"bench-rt-{i}", "--pool", "cpu", "--zone", "z",
                        "--region", "r", "--cpu-slots", str(cpu_slots), "--registry", host,
                        "--runtime", "local", "--s3-endpoint", endpoint, "--bucket", bucket,
                        "--poll-seconds", str(poll_seconds), "--metrics-port", str(metrics),
                        "--spool-dir", str(work / f"agent-{i}-spool")], logdir, env)
                    started.append(p)
                    agent_procs.append(p)
                    wait_http(f"http://127.0.0.1:{metrics}/metrics", p)
                body = {"name": "bench-runtime", "max_retries": 0, "workload": {
                    "kind": "sleep", "image": f"{host}/{TRAINER_REPO}:{TRAINER_TAG}",
                    "params": {"seconds": sleep_seconds}}}
                # warm-up: the warm parents start on the first attempts; not measured
                warm = _submit_open_loop(cp.api_url, cp.user_token, body, 4.0, agents * 1.0)
                _wait_terminal(dsn, warm, drain_timeout)
                pids = [p.popen.pid for p in agent_procs]
                assert pg.proc is not None
                roots = {"postgres": [pg.proc.pid], "api": [p.popen.pid for p in cp.apis],
                         "reconciler": [p.popen.pid for p in cp.recs],
                         "moto": [moto.popen.pid], "registry": [registry.popen.pid],
                         "agents": pids}
                stats0, machine0 = _proc_stats(), _cpu_line()
                requests0 = _requests_by_route(cp.api_url)
                before = cpu_split(stats0, pids)
                say(f"submitting {rate:g}/s for {seconds:g} s ({start_method or 'default'} start)")
                ids = _submit_open_loop(cp.api_url, cp.user_token, body, rate, seconds)
                states = _wait_terminal(dsn, ids, drain_timeout)
                stats1, machine1 = _proc_stats(), _cpu_line()
                requests1 = _requests_by_route(cp.api_url)
                after = cpu_split(stats1, pids)
                by_component = {name: sum(cpu_split(stats1, r)) - sum(cpu_split(stats0, r))
                                for name, r in roots.items()}
                lat, span = _latencies(dsn, ids)
                dead = [p.name for p in agent_procs if p.popen.poll() is not None]
                if dead:
                    raise click.ClickException(f"agents died during the round: {dead} "
                                               f"(logs in {logdir})")
                measured = True
    finally:
        for p in reversed(started):
            p.stop()
        # the round's logs, spools and registry: kept only when they may explain a failure
        if measured:
            shutil.rmtree(work, ignore_errors=True)
        else:
            say(f"this round's logs are kept in {logdir}")
    attempts = len(lat)  # max_retries 0: one attempt per operation that ran
    agent_ms = per_attempt_ms(after[0] - before[0], hz, attempts)
    workload_ms = per_attempt_ms(after[1] - before[1], hz, attempts)
    succeeded = states.get("succeeded", 0)
    return {
        "start_method": start_method or "default",
        "rate_per_s": rate, "seconds": seconds, "sleep_seconds": sleep_seconds, "agents": agents,
        "submitted": len(ids), "states": states,
        "queue_to_running": latency_summary(lat),
        "throughput_ops_per_s": round(succeeded / span, 2) if span else 0.0,
        "cpu_ms_per_attempt": {
            "agents": agent_ms, "workloads": workload_ms,
            "total": round(agent_ms + workload_ms, 1),
            "sleep_workload_warm": baseline_ms,
            "runtime_overhead": round(workload_ms - baseline_ms, 1),
        },
        # everything this round started, per operation: where a 2-core machine's CPU goes
        "cpu_ms_per_operation_by_component": {
            **{name: per_attempt_ms(t, hz, attempts) for name, t in by_component.items()},
            "total": per_attempt_ms(sum(by_component.values()), hz, attempts)},
        # what each operation asks of the API (agents' claims, reports, heartbeats, events)
        "api_requests_per_operation": {
            route: round((n - requests0.get(route, 0)) / attempts, 2)
            for route, n in sorted(requests1.items()) if attempts and n > requests0.get(route, 0)},
        "machine_busy_percent": machine_busy_percent(machine0, machine1),
        "load_average_1m": os.getloadavg()[0],
    }


@click.command("runtime")
@click.option("--rate", default=20.0, show_default=True, help="Submissions per second.")
@click.option("--seconds", default=20.0, show_default=True, help="Length of the submission.")
@click.option("--sleep-seconds", default=0.2, show_default=True, help="Each workload's sleep.")
@click.option("--agents", default=2, show_default=True, help="Local agents.")
@click.option("--rounds", default=3, show_default=True, help="Rounds (median shown).")
@click.option("--start-method", type=click.Choice(["forkserver", "subprocess"]), default=None,
              help="Local runtime start path [default: the runtime's, forkserver].")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the figures as JSON here.")
def runtime_cmd(rate: float, seconds: float, sleep_seconds: float, agents: int, rounds: int,
                start_method: str | None, json_out: Path | None) -> None:
    """Local runtime: queue -> running latency, throughput and CPU per attempt under an
    open-loop backlog of short `sleep` operations (a private environment per round)."""
    def say(msg: str) -> None:
        click.echo(msg, err=True)

    figures = runtime_rounds(rate, seconds, sleep_seconds, agents, rounds, say,
                             start_method=start_method)
    click.echo(json.dumps(figures, indent=2))
    if json_out:
        json_out.write_text(json.dumps(figures, indent=2))


def runtime_rounds(rate: float, seconds: float, sleep_seconds: float, agents: int, rounds: int,
                   say: Callable[[str], object], *, start_method: str | None = None,
                   ) -> dict[str, Any]:
    """`rounds` rounds of measure_runtime, each printed; the medians."""
    results = []
    for i in range(rounds):
        r = measure_runtime(rate, seconds, sleep_seconds, agents, say, start_method=start_method)
        q, cpu = r["queue_to_running"], r["cpu_ms_per_attempt"]
        say(f"  round {i + 1}: queue->running p50 {q['p50_ms']} p95 {q['p95_ms']} p99 "
            f"{q['p99_ms']} ms; {r['throughput_ops_per_s']} ops/s; CPU/attempt {cpu['total']} ms "
            f"(runtime overhead {cpu['runtime_overhead']} ms)")
        results.append(r)
    return {**median_figures(results), "rounds": rounds}

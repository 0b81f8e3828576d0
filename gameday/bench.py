"""`gameday bench ...`: benchmarks that print measured figures (never used as pass/fail tests).

The control-plane benchmark starts a private PostgreSQL (fsync on: durable commits), API
replicas and a reconciler, drives them from this process with an asyncio HTTP client, and
prints medians over repeated rounds because this 2-core machine is noisy.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from gameday.bench_disk import disk_cmd
from gameday.bench_idle import idle_cmd, measure_idle
from gameday.bench_peer import PEERS
from gameday.bench_runtime import runtime_cmd, runtime_rounds
from gameday.bench_submit import IMAGE, measure_submit, submit_summary
from gameday.tracking_peer import tracking_peer_cmd


@click.group("bench")
def bench_group() -> None:
    """Benchmarks that print measured figures."""


def _register(c: object, headers: dict[str, str], timeout: float = 60.0) -> str:
    """Register the benchmark's agent, waiting out the backlog the saturation rounds left."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        r = c.post("/v1/agents/register", headers=headers, json={  # type: ignore[attr-defined]
            "name": "bench-agent", "pool": "cpu", "zone": "z", "region": "r",
            "capabilities": {"cpu_slots": 1000}})
        if r.status_code == 200:
            return r.json()["agent_id"]
        last = f"HTTP {r.status_code}: {r.text[:200]}"
        time.sleep(1)
    raise click.ClickException(f"could not register the benchmark agent: {last}")


def _dispatch_and_claims(cp: object, dsn: str, say: object) -> dict[str, object]:
    import httpx
    import psycopg

    out: dict[str, object] = {}
    agent_h = {"Authorization": f"Bearer {cp.agent_token}"}  # type: ignore[attr-defined]
    user_h = {"Authorization": f"Bearer {cp.user_token}"}  # type: ignore[attr-defined]
    with httpx.Client(base_url=cp.api_url, timeout=10) as c:  # type: ignore[attr-defined]
        agent_id = _register(c, agent_h)
        n = 300
        for i in range(n):  # ~40/s: dispatch is measured with free capacity, not a backlog
            c.post("/v1/operations", headers={**user_h, "Idempotency-Key": f"d-{i}"},
                   json={"name": "d", "workload": {"image": IMAGE}})
            time.sleep(0.02)
            if i % 20 == 0:
                c.post(f"/v1/agents/{agent_id}/heartbeat", headers=agent_h)
        time.sleep(2)
        with psycopg.connect(dsn) as conn:
            lat = [r[0] for r in conn.execute(
                """SELECT extract(epoch FROM d.time - a.time) FROM events a
                   JOIN events d ON d.operation_id = a.operation_id
                   WHERE a.to_state = 'accepted' AND d.to_state = 'dispatched'""")]
        if not lat:
            raise click.ClickException("no operation was dispatched: see the reconciler log")
        lat_ms = sorted(float(x) * 1000 for x in lat)
        p50, p95 = lat_ms[len(lat_ms) // 2], lat_ms[int(len(lat_ms) * 0.95)]
        out["dispatch_latency_ms"] = {"n": len(lat_ms), "p50": p50, "p95": p95}
        say(f"queue->dispatched ({len(lat_ms)} ops): p50 {p50:.0f} ms p95 {p95:.0f} ms")  # type: ignore[operator]
        for per_call, share in ((1, n // 2), (8, n - n // 2)):  # half claimed each way
            t0 = time.perf_counter()
            claimed = calls = 0
            while claimed < share:
                items = c.post(f"/v1/agents/{agent_id}/claim", headers=agent_h,
                               json={"max": min(per_call, share - claimed)}).json()["items"]
                calls += 1
                if not items:
                    break
                claimed += len(items)
            dt = time.perf_counter() - t0
            out[f"claims_per_s_max_{per_call}"] = claimed / dt
            say(f"claim throughput (one agent, up to {per_call} per call): "  # type: ignore[operator]
                f"{claimed / dt:.0f} claims/s over {claimed} claims, {calls} calls")
    return out


@bench_group.command("controlplane")
@click.option("--seconds", default=10.0, show_default=True, help="Length of each load round.")
@click.option("--rounds", default=3, show_default=True, help="Rounds per figure (median shown).")
@click.option("--concurrency", default=32, show_default=True, help="Clients at saturation.")
@click.option("--api-workers", default=1, show_default=True,
              help="Worker processes of the API replica.")
@click.option("--runtime/--no-runtime", default=True, show_default=True,
              help="Also measure short workloads through the local runtime (20 ops/s).")
@click.option("--idle/--no-idle", default=True, show_default=True,
              help="Also measure the idle local environment (brought up if it is not up).")
@click.option("--home", type=click.Path(file_okay=False, path_type=Path),
              help="For --idle: directory holding .gameday/ [default: $GAMEDAY_HOME or the "
              "current directory].")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the figures as JSON here.")
@click.option("--peer", type=click.Choice(PEERS),
              help="Instead: our submit path and the peer's create call side by side on one "
              "PostgreSQL, both driven by wrk at --concurrency connections, rounds interleaved "
              "(needs wrk, and the peer from scripts/setup-<peer>.sh).")
@click.option("--keep-rows", is_flag=True,
              help="With --peer: keep every round's rows instead of emptying the tables after "
              "each round, so they grow across the rounds (warm-up included) as a live "
              "system's do.")
def bench_controlplane(seconds: float, rounds: int, concurrency: int, api_workers: int,
                       runtime: bool, idle: bool, home: Path | None,
                       json_out: Path | None, peer: str | None, keep_rows: bool) -> None:
    """Everything the control plane costs, medians of rounds:

    \b
    1. the submit path through one API replica: durable submissions/s and p50/p95/p99 at
       saturation and at half of it, CPU ms per submission of the API, reconciler,
       PostgreSQL and this client, RSS/PSS, every 201 checked against the table;
       queue->dispatched latency and claim throughput;
    2. short `sleep` workloads at 20 operations/s through real agents on the local runtime:
       queue->running p50/p95/p99, throughput, CPU per attempt (as `gameday bench runtime`);
    3. the idle local environment over 30 s windows: % of one core, processes, PSS (as
       `gameday bench idle`).

    With --peer mlflow (or prefect): only the side by side (gameday/bench_peer.py): durable requests/s,
    p50/p99, CPU ms per request of each component (API, reconciler, PostgreSQL, the peer's
    server, wrk) and the ratio, every acknowledgement checked against the rows.
    """

    from controlplane.db import migrate
    from environments.local.launch import ControlPlane
    from environments.local.pgserver import PostgresServer

    figures: dict[str, object] = {}

    def say(msg: str) -> None:
        click.echo(msg, err=True)

    if keep_rows and not peer:
        raise click.UsageError("--keep-rows applies to the side by side only: add --peer")
    if peer:
        from gameday.bench_peer import run_side_by_side

        try:
            figures = run_side_by_side(peer, seconds=seconds, rounds=rounds,
                                       connections=concurrency, api_workers=api_workers, say=say,
                                       keep_rows=keep_rows)
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from exc
        click.echo(json.dumps(figures, indent=2))
        if json_out:
            json_out.write_text(json.dumps(figures, indent=2))
        return

    with PostgresServer(fsync=True) as pg:
        dsn = pg.create_database("bench")
        migrate(dsn)
        with ControlPlane(dsn=dsn, replicas=1, reconcilers=1, api_workers=api_workers) as cp:
            sub = measure_submit(cp, pg, dsn, seconds=seconds, rounds=rounds,
                                 concurrency=concurrency, say=say)
        figures["submit"] = sub
        say(submit_summary(sub))
        if sub["acknowledged_and_committed"] != sub["acknowledged"]:
            raise click.ClickException(
                f"{sub['acknowledged']} submissions were acknowledged (201) but only "
                f"{sub['acknowledged_and_committed']} are in the table: acknowledged work was lost")
        # queue -> dispatched with free capacity, and claim throughput, on a fresh database:
        # the saturation rounds leave thousands of blocked operations behind
        dsn2 = pg.create_database("bench_dispatch")
        migrate(dsn2)
        with ControlPlane(dsn=dsn2, replicas=1, reconcilers=1) as cp:
            figures.update(_dispatch_and_claims(cp, dsn2, say))
    if runtime:
        say("short workloads through the local runtime (20 ops/s of 0.2 s sleeps, 2 agents):")
        figures["runtime"] = runtime_rounds(20.0, 20.0, 0.2, 2, rounds, say)
        q = figures["runtime"]["queue_to_running"]
        say(f"queue->running p50 {q['p50_ms']} ms p95 {q['p95_ms']} ms p99 {q['p99_ms']} ms, "
            f"{figures['runtime']['throughput_ops_per_s']} ops/s, CPU per attempt "
            f"{figures['runtime']['cpu_ms_per_attempt']}")
    if idle:
        figures["idle"] = measure_idle("local", home, seconds=30.0, rounds=rounds, settle=20.0,
                                       say=say)

    click.echo(json.dumps(figures, indent=2))
    if json_out:
        json_out.write_text(json.dumps(figures, indent=2))


bench_group.add_command(disk_cmd)
bench_group.add_command(idle_cmd)
bench_group.add_command(runtime_cmd)
bench_group.add_command(tracking_peer_cmd)

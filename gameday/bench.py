"""`gameday bench ...`: benchmarks that print measured figures (never used as pass/fail tests).

The control-plane benchmark starts a private PostgreSQL (fsync on: durable commits), API
replicas and a reconciler, drives them from this process with an asyncio HTTP client, and
prints medians over repeated rounds because this 2-core machine is noisy.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import click

from gameday.bench_idle import idle_cmd

IMAGE = "127.0.0.1:5000/ml/trainer:1.0"


@click.group("bench")
def bench_group() -> None:
    """Benchmarks that print measured figures."""


@dataclass
class LoadResult:
    ok: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q / 100 * len(xs)))] * 1000


async def _submit_load(urls: list[str], token: str, *, seconds: float, concurrency: int,
                       rate: float | None = None) -> LoadResult:
    """Closed loop (``rate`` None: saturation) or open loop at ``rate`` submissions/s."""
    import aiohttp

    res = LoadResult()
    body = {"name": "bench", "workload": {"image": IMAGE}, "max_retries": 0,
            "placement": {"dataset": "bench-nowhere"}}  # stays blocked: measures the API only
    deadline = time.perf_counter() + seconds
    conn = aiohttp.TCPConnector(limit=concurrency * 2)
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(connector=conn, headers=headers) as s:
        async def one(i: int) -> None:
            t0 = time.perf_counter()
            try:
                async with s.post(f"{urls[i % len(urls)]}/v1/operations", json=body,
                                  headers={"Idempotency-Key": str(uuid.uuid4())}) as r:
                    await r.read()
                    if r.status == 201:
                        res.ok += 1
                        res.latencies.append(time.perf_counter() - t0)
                    else:
                        res.errors += 1
            except aiohttp.ClientError:
                res.errors += 1

        start = time.perf_counter()
        if rate is None:
            counter = iter(range(10**9))

            async def worker() -> None:
                while time.perf_counter() < deadline:
                    await one(next(counter))

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        else:
            tasks = []
            i = 0
            while (now := time.perf_counter()) < deadline:
                due = start + i / rate
                if due > now:
                    await asyncio.sleep(due - now)
                tasks.append(asyncio.create_task(one(i)))
                i += 1
            await asyncio.gather(*tasks)
        res.seconds = time.perf_counter() - start
    return res


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


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _tree_pids(pid: int) -> list[int]:
    import subprocess

    out = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split()] or [pid]


@bench_group.command("controlplane")
@click.option("--seconds", default=8.0, show_default=True, help="Length of each load round.")
@click.option("--rounds", default=3, show_default=True, help="Rounds per figure (median shown).")
@click.option("--concurrency", default=32, show_default=True, help="Clients at saturation.")
@click.option("--api-workers", default=1, show_default=True,
              help="Worker processes per API replica.")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the figures as JSON here.")
def bench_controlplane(seconds: float, rounds: int, concurrency: int, api_workers: int,
                       json_out: Path | None) -> None:
    """Durable submissions/s and latency (1 and 2 replicas), p99 at 200/s, claim throughput,
    queue->dispatched latency, API replica RSS."""

    from controlplane.db import migrate
    from infra.local.launch import ControlPlane
    from infra.local.pgserver import PostgresServer

    figures: dict[str, object] = {}

    def say(msg: str) -> None:
        click.echo(msg, err=True)

    with PostgresServer(fsync=True) as pg:
        dsn = pg.create_database("bench")
        migrate(dsn)
        with ControlPlane(dsn=dsn, replicas=2, reconcilers=1, api_workers=api_workers) as cp:
            urls = [f"http://127.0.0.1:{p.port}" for p in cp.apis]
            warm = asyncio.run(_submit_load(urls, cp.user_token, seconds=2, concurrency=8))
            say(f"warm-up: {warm.ok} submissions")
            for label, targets in (("1 replica", urls[:1]), ("2 replicas", urls)):
                runs = [asyncio.run(_submit_load(targets, cp.user_token, seconds=seconds,
                                                 concurrency=concurrency))
                        for _ in range(rounds)]
                fig = {"submissions_per_s": statistics.median(r.rate for r in runs),
                       "p50_ms": statistics.median(r.pct(50) for r in runs),
                       "p95_ms": statistics.median(r.pct(95) for r in runs),
                       "p99_ms": statistics.median(r.pct(99) for r in runs),
                       "errors": sum(r.errors for r in runs)}
                figures[f"saturation_{label.replace(' ', '_')}"] = fig
                say(f"saturation, {label} ({api_workers} worker(s) each): "
                    f"{fig['submissions_per_s']:.0f}/s p50 "
                    f"{fig['p50_ms']:.1f} ms p95 {fig['p95_ms']:.1f} ms p99 {fig['p99_ms']:.1f} ms")
            runs = [asyncio.run(_submit_load(urls, cp.user_token, seconds=seconds,
                                             concurrency=64, rate=200.0)) for _ in range(rounds)]
            fig = {"achieved_per_s": statistics.median(r.rate for r in runs),
                   "p50_ms": statistics.median(r.pct(50) for r in runs),
                   "p99_ms": statistics.median(r.pct(99) for r in runs),
                   "errors": sum(r.errors for r in runs)}
            figures["at_200_per_s"] = fig
            say(f"at 200/s: achieved {fig['achieved_per_s']:.0f}/s p50 {fig['p50_ms']:.1f} ms "
                f"p99 {fig['p99_ms']:.1f} ms")
            rss = {p.name: sum(_rss_mib(pid) for pid in _tree_pids(p.popen.pid))
                   for p in cp.apis}
            figures["api_rss_mib"] = rss
            say("API replica RSS: " + ", ".join(f"{k} {v:.0f} MiB" for k, v in rss.items()))

        # queue -> dispatched with free capacity, and claim throughput, on a fresh database:
        # the saturation rounds leave thousands of blocked operations behind
        dsn2 = pg.create_database("bench_dispatch")
        migrate(dsn2)
        with ControlPlane(dsn=dsn2, replicas=1, reconcilers=1) as cp:
            figures.update(_dispatch_and_claims(cp, dsn2, say))

    click.echo(json.dumps(figures, indent=2))
    if json_out:
        json_out.write_text(json.dumps(figures, indent=2))


bench_group.add_command(idle_cmd)

from gameday.bench_runtime import runtime_cmd

bench_group.add_command(runtime_cmd)

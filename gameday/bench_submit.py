"""The submit path's figures: durable submissions/s and latency at saturation and at half of it,
CPU ms per submission of each process, memory, and proof that every 201 was committed.

One API replica and one reconciler on a private PostgreSQL with fsync on, driven by an asyncio
HTTP client in this process (fresh Idempotency-Key per request). Figures are medians of rounds.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from environments.local import procs
from gameday.bench_disk import DiskFigures, DiskWatch, stalls_text
from gameday.bench_idle import spent, ticks_of
from gameday.bench_runtime import percentile

IMAGE = "127.0.0.1:5000/ml/trainer:1.0"
# stays blocked (no agent has this dataset): the reconciler routes it once, no agent runs it
BODY = {"name": "bench", "workload": {"image": IMAGE}, "max_retries": 0,
        "placement": {"dataset": "bench-nowhere"}}


@dataclass
class LoadResult:
    ok: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    ids: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        return percentile_ms(self.latencies, q)


def percentile_ms(seconds: list[float], q: float) -> float:
    """The q-th percentile (nearest rank, as `gameday bench runtime`) in milliseconds."""
    return percentile(seconds, q) * 1000


def cpu_ms_per(ticks: int, hz: int, n: int) -> float:
    """CPU milliseconds per unit of work from clock ticks spent over n units."""
    return ticks / hz * 1000 / n if n else float("nan")


async def submit_load(urls: list[str], token: str, *, seconds: float, concurrency: int,
                      rate: float | None = None, body: dict[str, object] | None = None,
                      ) -> LoadResult:
    """Closed loop (``rate`` None: saturation) or open loop at ``rate`` submissions/s."""
    import aiohttp

    res = LoadResult()
    body = body or BODY
    deadline = time.perf_counter() + seconds
    conn = aiohttp.TCPConnector(limit=concurrency * 2)
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(connector=conn, headers=headers) as s:
        async def one(i: int) -> None:
            t0 = time.perf_counter()
            try:
                async with s.post(f"{urls[i % len(urls)]}/v1/operations", json=body,
                                  headers={"Idempotency-Key": str(uuid.uuid4())}) as r:
                    doc = await r.json() if r.status == 201 else None
                    if doc is not None:
                        res.ok += 1
                        res.latencies.append(time.perf_counter() - t0)
                        res.ids.append(doc["id"])
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


def _group_ticks(groups: dict[str, list[int]]) -> dict[str, dict[int, int]]:
    return {name: ticks_of(pids) for name, pids in groups.items()}


def measure_submit(cp: object, pg: object, dsn: str, *, seconds: float, rounds: int,
                   concurrency: int, say: Callable[[str], None]) -> dict[str, object]:
    """Saturation (closed loop) and half of it (open loop) through one API replica."""
    import psycopg

    hz = os.sysconf("SC_CLK_TCK")
    url = cp.api_url  # type: ignore[attr-defined]
    token = cp.user_token  # type: ignore[attr-defined]

    def processes() -> dict[str, list[int]]:
        children = procs.children_map()
        roots = {"api": cp.apis[0].popen.pid, "reconciler": cp.recs[0].popen.pid,  # type: ignore[attr-defined]
                 "postgres": pg.proc.pid}  # type: ignore[attr-defined]
        return {k: [pid, *procs.descendants(pid, children)] for k, pid in roots.items()}

    committed = [0, 0]  # acknowledged, of which found in the table

    def check_and_empty() -> None:
        """Every acknowledged id must be in the table; then start the next round empty (the
        blocked operations a round leaves would make the reconciler's periodic re-check of
        blocked work grow with every round, and that is not the submit path)."""
        with psycopg.connect(dsn, autocommit=True) as conn:
            ids = [i for r in pending for i in r.ids]
            committed[0] += len(ids)
            committed[1] += conn.execute(
                "SELECT count(*) FROM operations WHERE id = ANY(%s::uuid[])", (ids,)).fetchone()[0]
            conn.execute("TRUNCATE operations CASCADE")
        pending.clear()

    pending: list[LoadResult] = []
    warm = asyncio.run(submit_load([url], token, seconds=3, concurrency=8))
    pending.append(warm)
    check_and_empty()
    say(f"warm-up: {warm.ok} submissions")
    sat: list[LoadResult] = []
    cpu: list[dict[str, float]] = []
    sat_disk = []
    for i in range(rounds):
        before = _group_ticks(processes())
        c0 = os.times()
        with DiskWatch(pg.root) as watch:  # type: ignore[attr-defined]
            r = asyncio.run(submit_load([url], token, seconds=seconds, concurrency=concurrency))
        c1 = os.times()
        sat_disk.append(watch.figures())
        after = _group_ticks(processes())
        per = {name: cpu_ms_per(spent(before[name], after[name]), hz, r.ok) for name in after}
        client_s = (c1.user + c1.system) - (c0.user + c0.system) - watch.cpu_seconds
        per["client"] = client_s * 1000 / max(r.ok, 1)
        sat.append(r)
        cpu.append(per)
        pending.append(r)
        check_and_empty()
        say(f"  saturation round {i + 1}: {r.rate:.0f}/s, p99 {r.pct(99):.1f} ms, CPU ms per "
            "submission " + ", ".join(f"{k} {v:.2f}" for k, v in per.items())
            + f"; {sat_disk[-1].line()}")
    rate = statistics.median(r.rate for r in sat)
    half = []
    disk = []
    for i in range(rounds):
        # the disk's own stalls, timed beside the round on the database's filesystem: a
        # durable 201 cannot be faster than the WAL flush it waits for
        with DiskWatch(pg.root) as watch:  # type: ignore[attr-defined]
            r = asyncio.run(submit_load([url], token, seconds=seconds, concurrency=concurrency,
                                        rate=rate / 2))
        half.append(r)
        disk.append(watch.figures())
        pending.append(r)
        check_and_empty()
        say(f"  half-rate round {i + 1}: {r.rate:.0f}/s, p50 {r.pct(50):.1f} ms, "
            f"p99 {r.pct(99):.1f} ms; {disk[-1].line()}")
    pids = processes()
    return {
        "saturation": _latency_figures(sat, sat_disk, concurrency=concurrency),
        "half_saturation": {**_latency_figures(half, disk), "target_per_s": rate / 2},
        "cpu_ms_per_submission": {k: statistics.median(c[k] for c in cpu) for k in cpu[0]},
        "acknowledged": committed[0],
        "acknowledged_and_committed": committed[1],
        "rss_mib": {k: round(sum(rss_kib(p) for p in v) / 1024, 1) for k, v in pids.items()},
        "pss_mib": {k: round(procs.pss_kib(v) / 1024, 1) for k, v in pids.items()},
    }


def rss_kib(pid: int) -> int:
    try:
        for line in open(f"/proc/{pid}/status").read().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def _latency_figures(runs: list[LoadResult], disk: list[DiskFigures],
                     **extra: object) -> dict[str, object]:
    return {"submissions_per_s": statistics.median(r.rate for r in runs),
            "per_round": [{"submissions_per_s": round(r.rate, 1), "p99_ms": round(r.pct(99), 1),
                           "disk": asdict(d)} for r, d in zip(runs, disk, strict=True)],
            "p50_ms": statistics.median(r.pct(50) for r in runs),
            "p95_ms": statistics.median(r.pct(95) for r in runs),
            "p99_ms": statistics.median(r.pct(99) for r in runs),
            "errors": sum(r.errors for r in runs), "rounds": len(runs), **extra}


def submit_summary(sub: dict[str, Any]) -> str:
    """The submit figures as the lines the benchmark prints."""
    sat, half = sub["saturation"], sub["half_saturation"]
    lines = [
        (f"saturation ({sat['rounds']} x closed loop, {sat['concurrency']} clients): "
         f"{sat['submissions_per_s']:.0f} durable submissions/s, p50 {sat['p50_ms']:.1f} ms "
         f"p95 {sat['p95_ms']:.1f} ms p99 {sat['p99_ms']:.1f} ms, errors {sat['errors']}"),
        *_round_lines(sat),
        (f"half of it (open loop at {half['target_per_s']:.0f}/s): achieved "
         f"{half['submissions_per_s']:.0f}/s, p50 {half['p50_ms']:.1f} ms p95 "
         f"{half['p95_ms']:.1f} ms p99 {half['p99_ms']:.1f} ms, errors {half['errors']}"),
        *_round_lines(half),
        "CPU ms per submission (median at saturation): "
        + ", ".join(f"{k} {v:.2f}" for k, v in sub["cpu_ms_per_submission"].items()),
        (f"every 201 committed: {sub['acknowledged_and_committed']} of {sub['acknowledged']} "
         "acknowledged ids are in the table"),
        "RSS MiB: " + ", ".join(f"{k} {v}" for k, v in sub["rss_mib"].items())
        + "; PSS MiB: " + ", ".join(f"{k} {v}" for k, v in sub["pss_mib"].items()),
    ]
    return "\n".join(lines)


def _round_lines(figures: dict[str, Any]) -> list[str]:
    """Each round's rate and p99 beside the disk stalls timed during it."""
    return [f"  round {i}: {r['submissions_per_s']:.0f}/s, p99 {r['p99_ms']:.1f} ms; disk "
            f"fdatasync {stalls_text(r['disk'])}"
            for i, r in enumerate(figures.get("per_round", []), 1)]

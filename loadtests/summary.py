"""Rich rendering of a LoadSummary: per-route stats, thresholds, checks, verdict line."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from loadtests.runner import LoadSummary
from loadtests.thresholds import Status

_STYLE = {Status.PASS: "green", Status.FAIL: "bold red", Status.NO_DATA: "dim"}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def print_summary(summary: LoadSummary, console: Console) -> None:
    if summary.stats is not None:
        table = Table(title=f"load {summary.scenario.name}: requests per route (Locust)")
        table.add_column("method")
        table.add_column("route", overflow="fold")
        for col in ("count", "failures", "p50 ms", "p95 ms", "p99 ms", "req/s"):
            table.add_column(col, justify="right")
        for r in (*summary.stats.routes, summary.stats.total):
            table.add_row(r.method, r.route, str(r.count), str(r.failures), _ms(r.p50_ms),
                          _ms(r.p95_ms), _ms(r.p99_ms), f"{r.rps:.1f}",
                          style="bold" if r.route == "overall" else None)
        console.print(table)
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(summary.outcomes.items())) or "none"
    console.print(f"submissions: {outcomes}; ledger: {summary.acknowledged} acknowledgement(s); "
                  f"requests.jsonl: {summary.requests} line(s)", highlight=False)
    verdict = Table(title="thresholds and checks")
    for col in ("name", "status", "measured", "limit / detail"):
        verdict.add_column(col)
    for t in summary.thresholds:
        measured = "-" if t.measured is None else f"{t.measured:.4g}"
        verdict.add_row(escape(t.name), f"[{_STYLE[t.status]}]{t.status.value}[/]", measured, f"{t.limit:g}")
    for c in summary.checks:
        verdict.add_row(escape(c.name), "[green]pass[/]" if c.ok else "[bold red]fail[/]", "", escape(c.detail))
    console.print(verdict)
    for problem in summary.problems:
        console.print(f"[bold red]evidence[/]: {escape(problem)}", highlight=False)
    colour = "green" if summary.exit_code == 0 else "bold red"
    console.print(f"[{colour}]{summary.exit_code.name}[/] {escape(summary.reason)} "
                  f"(exit {int(summary.exit_code)}); files in {summary.out_dir}", highlight=False)

"""The fault timeline as Prometheus metrics for the duration of a game day."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from environments.timeline import Timeline
from environments.timeline_metrics import (
    DEFAULT_METRICS_PORT,
    FaultMetricsServer,
    FaultTimelineCollector,
)
from gameday.options import Options
from gameday.output import say


def serve_fault_metrics(opts: Options, run_id: str, timeline: Path, since: float,
                        console: Console, targets_file: Path | None = None,
                        ) -> FaultMetricsServer | None:
    """Serve the timeline's metrics (port 0 = off). With ``targets_file`` (a local
    environment's Prometheus reads it) the default port is a free one, listed in that file. A
    port that cannot be bound is said in yellow: the game day goes on without the metrics."""
    port = opts.metrics_port
    if port == 0:
        return None
    if port is None:
        port = 0 if targets_file is not None else DEFAULT_METRICS_PORT
    collector = FaultTimelineCollector(Timeline(timeline), run_id, opts.env, opts.suite, since)
    try:
        server = FaultMetricsServer(collector, port, opts.metrics_addr, targets_file)
    except OSError as exc:
        say(console, f"[yellow]fault timeline metrics not served on "
                     f"{opts.metrics_addr}:{port or 'a free port'}: {exc}[/]")
        return None
    say(console, f"fault timeline metrics: {server.url}")
    return server

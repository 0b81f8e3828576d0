"""`gameday load ...`: run a Locust scenario against the control plane, judge it, exit like
the gate (0 pass, 1 a check failed, 2 a threshold missed, 3 evidence missing/unusable or the run
could not start)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from loadtests.safety import UnsafeTargetError
from loadtests.scenario import ScenarioError, bundled, load_scenario
from slo.durations import parse_duration

EXIT_UNUSABLE = 3


class _Command(click.Command):
    """Usage errors exit 3 ("no evidence"), not click's 2, which here means "threshold missed"."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            exc.exit_code = EXIT_UNUSABLE
            raise


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.group("load")
def load_group() -> None:
    """Run Locust load scenarios (client ack ledger + thresholds)."""


@load_group.command("run", cls=_Command)
@click.option("--scenario", required=True,
              help=f"Bundled name ({', '.join(bundled())}) or a YAML file path.")
@click.option("--host", required=True, help="Control-plane API base URL, e.g. http://127.0.0.1:8080.")
@click.option("--token", envvar="GAMEDAY_TOKEN", required=True,
              help="User bearer token (or GAMEDAY_TOKEN).")
@click.option("--duration", callback=_duration, default=None,
              help="Override the scenario's duration (30s, 5m, 1h30m).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Run directory for ledger.jsonl, requests.jsonl, load_stats.json "
                   "[default: .gameday/load/<scenario>-<UTC time>].")
@click.option("--s3-endpoint", default=None, help="S3 endpoint for artifact downloads (path-style).")
@click.option("--workers", type=click.IntRange(min=0, max=64), default=0,
              help="Locust distributed mode: a master plus N local worker processes.")
@click.option("--allow-remote", is_flag=True, help="Allow a host that is not loopback.")
def run_cmd(scenario: str, host: str, token: str, duration: float | None, out_dir: Path | None,
            s3_endpoint: str | None, workers: int, allow_remote: bool) -> None:
    """Run SCENARIO against HOST in its own Locust process(es) and judge it."""
    from loadtests.runner import start
    from loadtests.summary import print_summary

    console, err = Console(), Console(stderr=True, soft_wrap=True)
    try:
        scn = load_scenario(scenario)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        out = out_dir or Path(".gameday") / "load" / f"{scn.name}-{stamp}"
        handle = start(scn, host, token, out, s3_endpoint=s3_endpoint, workers=workers,
                       duration=duration, allow_remote=allow_remote)
    except (ScenarioError, UnsafeTargetError) as exc:
        err.print(f"[bold red]cannot run[/]: {exc}", highlight=False)
        sys.exit(EXIT_UNUSABLE)
    total = handle.scenario.duration
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        bar = progress.add_task(f"load {handle.scenario.name}", total=total)

        def tick(run: object) -> None:
            progress.update(bar, completed=min(total, handle.elapsed()),
                            description=f"load {handle.scenario.name}: "
                                        f"{handle.acknowledged_so_far()} acknowledged")

        summary = handle.wait(on_tick=tick)
    print_summary(summary, console)
    sys.exit(int(summary.exit_code))


@load_group.command("validate", cls=_Command)
@click.argument("scenarios", nargs=-1)
def validate_cmd(scenarios: tuple[str, ...]) -> None:
    """Validate scenario files (default: every bundled scenario)."""
    bad = 0
    for name in scenarios or tuple(bundled()):
        try:
            scn = load_scenario(name)
        except ScenarioError as exc:
            click.echo(f"invalid: {exc}", err=True)
            bad += 1
        else:
            click.echo(f"ok: {scn.name} ({scn.users.total} users, {scn.duration:g}s)")
    sys.exit(EXIT_UNUSABLE if bad else 0)

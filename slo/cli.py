"""`gameday evaluate RUN_DIR` and `gameday slo ...` (validate specs, generate rules, render)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from slo.evaluate import EXIT_EVIDENCE, evaluate_run
from slo.evidence import EvidenceError
from slo.specs import ENVIRONMENTS, SpecError, load_specs
from slo.verdict import Verdict

_STYLE = {"pass": "green", "warning": "yellow", "skipped": "yellow", "fail": "bold red",
          "error": "bold red",
          "not_measured": "bold magenta", "no_data": "dim", None: "dim"}


def print_verdict(verdict: Verdict, console: Console) -> None:
    """One row per SLI, dropped evidence and per experiment; the reports carry the detail."""
    from slo.report import (
        baseline_rows,
        baseline_summary,
        demonstration_lines,
        dropped_text,
        experiment_status,
        headline,
        status_label,
    )

    table = Table(title=f"gameday verdict {verdict.run_id} ({verdict.env})")
    for col in ("scope", "status", "measured / objective", "missed"):
        table.add_column(col)
    checks = {c.id: c for c in verdict.checks}

    def cell(status: str | None) -> str:
        return f"[{_STYLE.get(status, 'dim')}]{status_label(status)}[/]"

    for s in verdict.slis:
        c = checks.get(f"sli.{s.name}")
        value = "n/a" if s.value is None else f"{s.value:.5g}"
        shown = cell(c.status if c else None)
        if c is not None and c.status == "pass" and c.demonstration is not None \
                and c.demonstration.classification == "consistent":
            shown = "[yellow]pass, not demonstrated[/]"  # too few events: never a bare pass
        table.add_row(
            s.name + (" (key)" if s.key else ""),
            shown,
            f"{value} / {s.target:g}",
            c.message if c and c.status == "fail" else "",
        )
    dropped = checks.get("evidence.dropped")
    if dropped is not None:
        table.add_row("dropped evidence", cell(dropped.status), dropped_text(verdict), "")
    for e in verdict.experiments:
        status = experiment_status(verdict, e.name)
        if not e.measured:
            table.add_row(e.name, cell(status), f"RTO {e.rto_seconds or 0:g}s",
                          f"not measured: {e.not_measured_reason}")
            continue
        rec = "not recovered" if e.recovery_seconds is None else f"{e.recovery_seconds:.0f}s"
        missed = [
            c.id.removeprefix(f"{e.name}.")
            for c in verdict.checks
            if c.experiment == e.name and c.status == "fail"
        ]
        table.add_row(
            e.name,
            cell(status),
            f"recovery {rec} / RTO {e.rto_seconds or 0:g}s",
            ", ".join(missed),
        )
    console.print(table)
    for line in demonstration_lines(verdict):
        console.print(f"[yellow]{escape(line)}[/]", highlight=False)
    summary = baseline_summary(verdict)
    if summary is not None:
        console.print(summary, highlight=False)
        for o, base, cur in baseline_rows(verdict):
            if o.result == "regressed":
                console.print(f"  [yellow]regressed[/] {o.id}: {base} -> {cur} ({o.change})",
                              highlight=False)
    console.print(f"[{_STYLE[verdict.result]}]{headline(verdict)}[/]", highlight=False)


@click.command("evaluate")
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--env",
    type=click.Choice(ENVIRONMENTS),
    default=None,
    help="Objectives to judge against (default: the env in run.json).",
)
@click.option(
    "--baseline-dir",
    "baseline_dirs",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Earlier run directory (with verdict.json) for relative criteria; repeatable.",
)
@click.option(
    "--relative-last",
    type=click.IntRange(min=1),
    default=None,
    help="Compare with the last N passing baseline runs only.",
)
@click.option(
    "--baseline-from",
    "baseline_from",
    default=None,
    metavar="ARCHIVE",
    help="Compare every objective with the last passing run of the same suite and env in "
         "this archive (a directory or s3://bucket/prefix).",
)
@click.option(
    "--spec-dir", type=click.Path(path_type=Path, file_okay=False), default=None, hidden=True
)
def evaluate_cmd(
    run_dir: Path,
    env: str | None,
    baseline_dirs: tuple[Path, ...],
    relative_last: int | None,
    baseline_from: str | None,
    spec_dir: Path | None,
) -> None:
    """Recompute SLIs, recovery objectives and the gate verdict from RUN_DIR's raw evidence.

    Writes verdict.json, junit.xml, report.md and report.html into RUN_DIR. Exit codes:
    0 pass (or warning), 1 an experiment failed or was not measured (steady state broken, no
    fault recorded), 2 a key objective was missed, 3 an expected experiment has no journal or
    the evidence is unusable (or bad specs); 3 wins over 2 over 1. An objective that regressed
    against the --baseline-from run turns a pass into a warning (exit code unchanged).
    """
    from slo.archive import ArchiveError, LocalArchive, open_archive
    from slo.report import write_reports

    console = Console(stderr=False)
    try:
        archive = open_archive(baseline_from) if baseline_from else None
    except ArchiveError as exc:
        raise click.ClickException(str(exc)) from None
    if isinstance(archive, LocalArchive) and not archive.root.is_dir():
        # named on purpose: a typo must not read as "no passing run yet"
        raise click.ClickException(f"--baseline-from {baseline_from}: no such archive directory")
    try:
        verdict = evaluate_run(run_dir, env, baseline_dirs, relative_last, spec_dir, archive)
        specs = load_specs(verdict.env if env is None else env, spec_dir)
    except (EvidenceError, SpecError) as exc:
        Console(stderr=True).print(f"[bold red]evidence unusable[/]: {exc}", highlight=False)
        sys.exit(EXIT_EVIDENCE)
    paths = write_reports(verdict, run_dir, specs)
    print_verdict(verdict, console)
    console.print("wrote " + ", ".join(str(p) for p in paths.values()), highlight=False)
    sys.exit(verdict.exit_code)


@click.group("slo")
def slo_group() -> None:
    """Validate SLO specs, generate Prometheus rules, render reports."""


@slo_group.command("validate")
@click.option(
    "--env", type=click.Choice(ENVIRONMENTS), multiple=True, help="Default: every environment."
)
@click.option("--spec-dir", type=click.Path(path_type=Path, file_okay=False), default=None)
def validate_cmd(env: tuple[str, ...], spec_dir: Path | None) -> None:
    """Load and validate the specs for each environment; print a summary."""
    for name in env or ENVIRONMENTS:
        try:
            specs = load_specs(name, spec_dir)
        except SpecError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(
            f"{name}: {len(specs.slos)} SLOs, {len(specs.recovery_objectives)} recovery objectives, "
            f"{len(specs.alert_names)} alerts: ok"
        )


@slo_group.command("rules")
@click.option("--env", type=click.Choice(ENVIRONMENTS), default="local", show_default=True)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Rule file to write (default: stdout).",
)
@click.option("--spec-dir", type=click.Path(path_type=Path, file_okay=False), default=None)
def rules_cmd(env: str, output: Path | None, spec_dir: Path | None) -> None:
    """Generate Prometheus recording rules and burn-rate alerts for ENV."""
    from slo.rules import dump_rules, generate_rules

    try:
        text = dump_rules(generate_rules(load_specs(env, spec_dir)))
    except SpecError as exc:
        raise click.ClickException(str(exc)) from None
    if output is None:
        click.echo(text, nl=False)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(output)
    click.echo(f"wrote {output}")


@slo_group.command("report")
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False, exists=True))
def report_cmd(run_dir: Path) -> None:
    """Re-render report.md, report.html and junit.xml from RUN_DIR/verdict.json."""
    import json

    from slo.report import write_reports

    try:
        verdict = Verdict.model_validate(
            json.loads((run_dir / "verdict.json").read_text(encoding="utf-8"))
        )
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"{run_dir / 'verdict.json'}: {exc}") from None
    for path in write_reports(verdict, run_dir).values():
        click.echo(f"wrote {path}")


@slo_group.command("fixture")
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--seed", type=int, default=7, show_default=True)
@click.option(
    "--lost-acks",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Acknowledged submissions to drop from the store.",
)
def fixture_cmd(run_dir: Path, seed: int, lost_acks: int) -> None:
    """Write a seeded example run directory (evidence format of docs/EVIDENCE.md)."""
    from slo.fixtures import FixtureSpec, build_run, example_experiments

    build_run(
        run_dir, FixtureSpec(seed=seed, lost_acks=lost_acks, experiments=example_experiments())
    )
    click.echo(f"wrote {run_dir}; try: gameday evaluate {run_dir}")


@slo_group.command("compare")
@click.argument("run_dirs", nargs=-1, required=True,
                type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the comparison here (.html or .md); default: print Markdown.")
def compare_cmd(run_dirs: tuple[Path, ...], output: Path | None) -> None:
    """Compare evaluated runs side by side (e.g. one suite against two platforms)."""
    from slo.compare import CompareError, load_verdicts, render_html, render_markdown

    try:
        verdicts = load_verdicts(list(run_dirs))
    except CompareError as exc:
        raise click.ClickException(str(exc)) from exc
    if output is None:
        click.echo(render_markdown(verdicts))
        return
    output.write_text(render_html(verdicts) if output.suffix == ".html"
                      else render_markdown(verdicts))
    click.echo(f"wrote {output}")


@click.command("history")
@click.option("--archive", "location", default=None, metavar="ARCHIVE",
              help="Archive directory or s3://bucket/prefix [default: $GAMEDAY_ARCHIVE, else "
                   "archive/ next to ./runs].")
@click.option("--suite", default=None, help="Only runs of this suite.")
@click.option("--env", default=None, help="Only runs in this environment.")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True,
              help="Show at most this many runs.")
@click.option("--json", "as_json", is_flag=True, help="Print the index entries as JSON.")
def history_cmd(location: str | None, suite: str | None, env: str | None, limit: int,
                as_json: bool) -> None:
    """List archived game-day runs, newest first: id, time, suite, env, result, score, exit."""
    import json
    from datetime import UTC, datetime

    from slo.archive import ArchiveError, default_location, open_archive
    from slo.baseline import select

    where = location or default_location()
    try:
        entries = select(open_archive(where).entries(), suite, env, limit)
    except ArchiveError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps([e.model_dump(mode="json", by_alias=True) for e in entries],
                              indent=2))
        return
    if not entries:
        click.echo(f"no archived runs in {where}"
                   + (f" (suite {suite})" if suite else "") + (f" (env {env})" if env else ""))
        return
    table = Table(title=f"game-day runs in {where}, newest first")
    for col in ("run", "started (UTC)", "suite", "env", "result", "score", "exit", "baseline"):
        table.add_column(col)
    for e in entries:
        table.add_row(
            e.run_id, datetime.fromtimestamp(e.started_at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S"),
            e.suite, e.env, f"[{_STYLE.get(e.result, 'dim')}]{e.result}[/]",
            "n/a" if e.score is None else f"{e.score:.1f}", str(e.exit_code),
            e.baseline_run or "-")
    Console(width=200).print(table)

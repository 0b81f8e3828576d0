"""`gameday cost report`: cost per completed operation, retry cost, accelerator-hours and idle
capacity per pool, from a game day's store snapshot or a live control plane (read only), at
the declared prices of a price table (slo/cost.py has the formulas, docs/cost.md the page)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
from pydantic import ValidationError

from slo.cost import (
    POOL_HEADER,
    CostInputs,
    CostSummary,
    inputs_from_evidence,
    inputs_from_records,
    pool_rows,
    source_line,
    summarize,
    summary_rows,
)
from slo.evidence import AgentRecord, Attempt, Event, EvidenceError, Operation, load_evidence
from slo.prices import PriceError, load_prices

DSN_ENV = "GAMEDAY_COST_DSN"


@click.group("cost")
def cost_group() -> None:
    """Cost of the control plane's work at declared prices (docs/cost.md)."""


def _utc(value: str) -> datetime:
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 time", param_hint="--since")
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t


def inputs_from_dsn(dsn: str, since: datetime) -> CostInputs:
    """The live store's rows (one READ ONLY transaction) validated as the snapshot's records."""
    import psycopg

    from platforms.controlplane import read_store

    try:
        rows = read_store(dsn, since)
    except psycopg.Error as exc:
        raise click.ClickException(f"control plane database: {exc}".strip()) from None
    parsed = {}
    for name, model in (("operations", Operation), ("attempts", Attempt), ("events", Event),
                        ("agents", AgentRecord)):
        try:
            parsed[name] = [model.model_validate(r) for r in rows[name]]
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            raise click.ClickException(f"control plane {name}: field {field}: {err['msg']}")
    return inputs_from_records(parsed["operations"], parsed["attempts"], parsed["events"],
                               parsed["agents"], since.timestamp(), rows["now"].timestamp())


def render_text(s: CostSummary) -> str:
    """The same rows as the report's Cost section, as aligned plain text."""
    start = datetime.fromtimestamp(s.window_start, UTC).isoformat(timespec="seconds")
    end = datetime.fromtimestamp(s.window_end, UTC).isoformat(timespec="seconds")
    out = [f"cost report, window {start} to {end}", source_line(s), ""]
    width = max(len(k) for k, _ in summary_rows(s))
    out += [f"{k:<{width}}  {v}" for k, v in summary_rows(s)]
    rows = [POOL_HEADER, *pool_rows(s)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(POOL_HEADER))]
    out.append("")
    out += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    out += [f"unpriced: {u}" for u in s.unpriced] + [f"note: {n}" for n in s.notes]
    return "\n".join(out)


@cost_group.command("report")
@click.option("--run-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="A game day's run directory: prices its snapshot/ (run start to snapshot).")
@click.option("--dsn", envvar=DSN_ENV, default=None,
              help=f"A live control plane's PostgreSQL DSN, read only (or ${DSN_ENV}, which "
                   "keeps the password out of the process list).")
@click.option("--since", default=None, metavar="ISO_TIME",
              help="With --dsn: operations created at or after this time [default: 24 h ago]; "
                   "the window ends at the database's now().")
@click.option("--prices", "prices_path", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="Price table YAML [default: the packaged slo/specs/prices.yaml, "
                                 "example figures].")
@click.option("--json", "as_json", is_flag=True, help="Print the cost summary as JSON.")
def report_cmd(run_dir: Path | None, dsn: str | None, since: str | None,
               prices_path: Path | None, as_json: bool) -> None:
    """Cost per completed operation (retried and lost attempts included), retry cost,
    accelerator-hours allocated vs used, and idle capacity per pool, at declared prices.

    Exactly one source: --run-dir or --dsn. Unpriced attempts or pools are listed and no total
    that would include them is claimed; exit code 0 either way (1 on an unusable source or
    price table)."""
    if (run_dir is None) == (dsn is None):
        raise click.UsageError("give exactly one of --run-dir and --dsn")
    if since is not None and dsn is None:
        raise click.UsageError("--since applies to --dsn only (a run directory has its window)")
    try:
        prices = load_prices(prices_path)
    except PriceError as exc:
        raise click.ClickException(str(exc)) from None
    if run_dir is not None:
        try:
            inputs = inputs_from_evidence(load_evidence(run_dir))
        except EvidenceError as exc:
            raise click.ClickException(f"{run_dir}: {exc}") from None
    else:
        assert dsn is not None
        start = _utc(since) if since else datetime.now(UTC) - timedelta(hours=24)
        inputs = inputs_from_dsn(dsn, start)
    summary = summarize(inputs, prices)
    if as_json:
        click.echo(json.dumps(summary.model_dump(mode="json"), indent=2))
    else:
        click.echo(render_text(summary))

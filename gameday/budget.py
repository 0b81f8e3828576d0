"""The error-budget gate of a scheduled game day: read the remaining budget of every SLO the
experiments touch (slo/budget_gate.py judges it), print it, and record a skipped run."""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape

from environments.base import EnvironmentUnavailable, environment_kind
from gameday.options import Options, run_id
from gameday.output import say
from gameday.suites import load_experiment
from slo.archive import ArchiveError, default_location, open_archive
from slo.baseline import skipped_entry
from slo.budget_gate import EXIT_SKIPPED, SKIPPED_FILE, BudgetCheck, SloBudget, judge, touched_slos
from slo.budget_sources import archive_budgets, prometheus_budgets
from slo.specs import load_specs


def budget_check(opts: Options, names: list[str], now: float | None = None) -> BudgetCheck:
    """The remaining error budget of every SLO the experiments touch, judged against the
    env's `gate.minRemainingBudget` (slo/budget_gate.py). Reads only; touches nothing."""
    specs = load_specs(opts.env)
    declared = {}
    for n in names:
        g = load_experiment(n).gameday
        declared[n] = (str(g.get("recovery_objective")), list(g.get("slos") or []))
    touched = touched_slos(specs, declared)
    floor = specs.gate.min_remaining_budget
    at = time.time() if now is None else now
    kind = environment_kind(opts.env)
    source = kind.budget_source if opts.budget_source == "auto" else opts.budget_source
    budgets: list[SloBudget]
    if source == "prometheus":
        try:
            url = kind.prometheus_url(opts.request)
        except EnvironmentUnavailable as exc:
            budgets = [judge(n, exps, None, floor, detail=str(exc)) for n, exps in touched.items()]
            where = "prometheus (unavailable)"
        else:
            budgets = prometheus_budgets(url, specs, touched, floor, at)
            where = f"prometheus {url}"
    else:
        location = opts.archive or default_location(opts.runs_dir)
        try:
            entries = open_archive(location).entries()
        except ArchiveError as exc:
            entries = []
            detail = f"archive unreadable: {exc}"
            budgets = [judge(n, exps, None, floor, detail=detail) for n, exps in touched.items()]
        else:
            budgets = archive_budgets(entries, specs, opts.env, touched, floor, at)
        where = f"archive {location}"
    return BudgetCheck(env=opts.env, suite=opts.suite, source=where, floor=floor,
                       checked_at=at, budgets=budgets, forced=opts.force)


def print_budget(check: BudgetCheck, console: Console) -> None:
    for b in check.budgets:
        left = "" if b.remaining is None else f"{b.remaining:.1%} left; "
        colour = {"ok": "green", "not tracked": "dim"}.get(b.status.value, "bold red")
        say(console, f"  budget {escape(b.slo)}: [{colour}]{b.status.value}[/] ({left}"
                     f"{escape(b.detail)})")


def skip_run(opts: Options, check: BudgetCheck, console: Console) -> int:
    """Nothing was started: write the skip's record (run dir with skipped.json only, no
    verdict) and archive it so `gameday history` lists the run as skipped."""
    base = run_id(opts)
    rid, n = base, 1
    while (opts.runs_dir / rid).exists():  # two skips within one second
        n += 1
        rid = f"{base}.{n}"
    run_dir = (opts.runs_dir / rid).resolve()
    run_dir.mkdir(parents=True)
    (run_dir / SKIPPED_FILE).write_text(
        check.model_dump_json(indent=2, by_alias=True) + "\n", encoding="utf-8")
    say(console, f"[bold yellow]skipped[/] (exit {EXIT_SKIPPED}): {escape(check.reason)}; "
                 "nothing was started, nothing measured; --force runs anyway")
    say(console, f"record: {run_dir / SKIPPED_FILE}")
    if not opts.no_archive:
        try:
            archive = open_archive(opts.archive or default_location(opts.runs_dir))
            entry = archive.put_run(run_dir, rid, lambda loc, files, at: skipped_entry(
                check, rid, opts.platform, loc, files, at))
            say(console, f"archived: {entry.location}")
        except (ArchiveError, OSError, ValueError) as exc:
            say(console, f"[bold red]not archived[/]: {exc}")
    return EXIT_SKIPPED

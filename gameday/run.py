"""`gameday run` and `gameday gate`: a game day from start to verdict.

Open the environment (bring a local one up, or reuse it; a cloud one must exist), take the
game-day lock, start background load, run each experiment with Chaos Toolkit (rollbacks always,
also on Ctrl-C), collect the raw evidence into a new run directory, evaluate it with slo/,
print the verdict and exit with the gate's code.

Where environments differ (how one is opened and locked, what the experiments need to reach
it, what its evidence lacks, whether SIGTERM is a Ctrl-C) the runner asks the environment
(environments/base.py EnvironmentKind and Environment); it never tests the env's name. The
parts: options.py (the CLI's options), preflight.py (guards, dry run), budget.py (the
error-budget gate), experiment.py (one experiment), run_evidence.py (collection),
fault_metrics.py, verdict.py (evaluate and archive).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from environments.base import Environment, EnvironmentRefused, OpenRun, environment_kind
from environments.schedule import ScheduleError
from gameday import collect, durability_stream
from gameday.budget import budget_check, print_budget, skip_run
from gameday.experiment import ExperimentRun, run_experiment, settle, settle_seconds, wait_healthy
from gameday.fault_metrics import serve_fault_metrics
from gameday.options import (
    EXIT_INTERRUPTED,
    EXIT_REFUSED,
    Options,
    build_options,
    resolve_home,
    run_id,
    run_options,
)
from gameday.output import say
from gameday.preflight import dry_run, preflight
from gameday.run_evidence import collect_evidence
from gameday.suites import SuiteError, experiment_requires
from gameday.verdict import evaluate
from platforms import get_adapter
from platforms import registry as platform_registry
from slo.archive import default_location
from slo.budget_gate import BUDGET_CHECK_FILE, BudgetCheck
from slo.specs import SpecError

# what other modules and the tests import from here
__all__ = ["EXIT_INTERRUPTED", "EXIT_REFUSED", "Options", "dry_run", "evaluate", "gate_cmd",
           "preflight", "resolve_home", "run_cmd", "run_experiment", "run_gameday",
           "settle_seconds"]
_serve_fault_metrics = serve_fault_metrics  # its name before the split (tests use it)


def run_gameday(opts: Options, console: Console) -> int:
    try:
        names = preflight(opts)
    except (ScheduleError, SuiteError) as exc:
        # one line however long the paths in it: scripts grep it, people read it
        console.print(f"[bold red]refused[/]: {exc}", highlight=False, soft_wrap=True)
        return EXIT_REFUSED
    check: BudgetCheck | None = None
    if opts.budget_check:
        try:
            check = budget_check(opts, names)
        except SpecError as exc:
            say(console, f"[bold red]refused[/]: budget check: {exc}")
            return EXIT_REFUSED
        say(console, f"error-budget gate (floor {check.floor:.0%}, {escape(check.source)}):")
        print_budget(check, console)
        if opts.dry_run:
            say(console, "a live run would be skipped" if check.skip else
                "a live run would go ahead" + (" (forced)" if check.blocking else ""))
        elif check.skip:
            return skip_run(opts, check, console)
        elif check.blocking:
            say(console, f"[bold yellow]forced[/]: {escape(check.reason)}")
    if opts.dry_run:
        return dry_run(opts, names, console)
    kind = environment_kind(opts.env)

    def new_run() -> tuple[str, Path]:
        rid = run_id(opts)
        return rid, (opts.runs_dir / rid).resolve()

    try:
        with kind.open_for_run(opts.request, new_run, lambda msg: say(console, msg)) as held, \
                _sigterm_as_interrupt(kind.sigterm_is_interrupt):
            return _run_locked(opts, held, names, console, check)
    except EnvironmentRefused as exc:
        say(console, f"[bold red]refused[/]: {exc}")
        return EXIT_REFUSED


@contextmanager
def _sigterm_as_interrupt(wanted: bool) -> Iterator[None]:
    """A pod is stopped with SIGTERM (activeDeadlineSeconds, node drain): where the
    environment says so, treat it like Ctrl-C so rollbacks and evidence still happen."""
    if not wanted or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_locked(opts: Options, held: OpenRun, names: list[str], console: Console,
                check: BudgetCheck | None) -> int:
    env, run_dir = held.env, held.run_dir
    info, started_at = _start_record(opts, held, names, check)
    say(console, f"run {held.run_id}: {len(names)} experiment(s) -> {run_dir}")
    adapter = get_adapter(opts.platform, env.endpoints, env.tokens)
    # a remote environment: the load is aimed at the stack on purpose (allow_remote)
    load = platform_registry.get(opts.platform).resolve("load")(
        env, lambda: get_adapter(opts.platform, env.endpoints, env.tokens), run_dir,
        opts.load_scenario, env.remote)
    records = [ExperimentRun(n) for n in names]
    not_applicable: dict[str, str] = {}
    interrupted = False
    eps = env.endpoints
    targets = eps.get("fault_metrics_targets")  # absent: cloud, or a local env made before
    metrics = serve_fault_metrics(opts, held.run_id, Path(eps["fault_timeline"]),
                                  started_at.timestamp(), console,
                                  Path(targets) if targets else None)
    stream = None
    try:
        if opts.durability_rate:
            stream = durability_stream.start(str(eps["api"]), env.tokens, run_dir,
                                             opts.durability_rate)
            say(console, f"durability stream: {opts.durability_rate:g} submissions/s to the "
                         "held queue")
        _run_experiments(opts, env, adapter, run_dir, records, not_applicable,
                         metrics.collector.begin_experiment if metrics else None, console)
    except KeyboardInterrupt:
        interrupted = True
        say(console, "[yellow]interrupted: rolling back and saving the evidence so far[/]")
    finally:
        if metrics is not None:
            metrics.close()
        rollback = _restore_all(env, console)
        summary = _stop_background(stream, load, adapter, info, console)
        ev = collect_evidence(env, adapter, run_dir, started_at, rollback, held.lock, console)
        info.update(ended_at=ev.ended_at.isoformat(), snapshot_at=collect.utcnow().isoformat(),
                    interrupted=interrupted, not_applicable=not_applicable,
                    ledger_entries=ev.ledger_entries, fault_events=ev.fault_events,
                    prometheus=ev.prometheus, snapshot=ev.snapshot,
                    project=getattr(adapter, "project", opts.platform),
                    experiment_status={r.name: {"status": r.status, "seconds": round(r.seconds, 1),
                                                "detail": r.detail} for r in records},
                    load={"exit_code": int(summary.exit_code), "reason": summary.reason,
                          "acknowledged": summary.acknowledged})
        collect.write_run_json(run_dir, info)
    code = evaluate(run_dir, console, None if opts.no_archive
                    else opts.archive or default_location(opts.runs_dir))
    return EXIT_INTERRUPTED if interrupted else code


def _start_record(opts: Options, held: OpenRun, names: list[str], check: BudgetCheck | None
                  ) -> tuple[dict[str, Any], datetime]:
    """The run directory with its first run.json (and the budget check it went ahead on)."""
    held.run_dir.mkdir(parents=True)
    started_at = collect.utcnow()
    if check is not None:  # read into the verdict (forced or not): slo/evaluate.py
        (held.run_dir / BUDGET_CHECK_FILE).write_text(
            check.model_dump_json(indent=2, by_alias=True) + "\n", encoding="utf-8")
    info: dict[str, Any] = {"run_id": held.run_id, "env": opts.env, "suite": opts.suite,
                            "platform": opts.platform, "started_at": started_at.isoformat(),
                            "ended_at": None, "experiments": names,
                            "environment": held.env.name, "versions": collect.versions(),
                            **held.env.run_info()}
    collect.write_run_json(held.run_dir, info)
    return info, started_at


def _stop_background(stream: Any, load: Any, adapter: Any, info: dict[str, Any],
                     console: Console) -> Any:
    """Stop the durability stream (its counts go into run.json) and the load; the load's
    summary."""
    if stream is not None:
        info["durability_stream"] = c = durability_stream.stop(stream, adapter)
        say(console, f"durability stream: {c['acked']} acknowledged of {c['first_attempts']}"
                     f" submitted ({c['requests']} requests, {c['abandoned']} abandoned)"
                     + (f"; [red]{c['error']}[/]" if "error" in c else ""))
    summary = load.stop()
    say(console, f"load: {summary.acknowledged} acknowledged submissions, "
                 f"{summary.requests} requests ({summary.reason})")
    return summary


def _restore_all(env: Environment, console: Console) -> dict[str, Any]:
    """Every fault undone at the end, also after Ctrl-C; a failure is evidence, not a crash."""
    rollback: dict[str, Any] = {}
    try:
        rollback["restored"] = env.driver.restore_all()
    except Exception as exc:  # noqa: BLE001 - keep collecting evidence regardless
        rollback["error"] = str(exc)
        say(console, f"[red]restore after the run failed: {exc}[/]")
    return rollback


def _run_experiments(opts: Options, env: Environment, adapter: Any, run_dir: Path,
                     records: list[ExperimentRun], not_applicable: dict[str, str],
                     begin: Callable[[str], None] | None, console: Console) -> None:
    # Exactly the home this process resolved, absolute: Chaos Toolkit runs with the experiment
    # directory as its cwd, where a "$GAMEDAY_HOME or cwd" lookup would find no environment.
    env_vars = {"GAMEDAY_ENV": env.name, "GAMEDAY_RUN_DIR": str(run_dir),
                "GAMEDAY_PLATFORM": opts.platform, "GAMEDAY_HOME": str(resolve_home(opts.home)),
                **env.chaos_env()}
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        overall = progress.add_task("game day", total=len(records))
        time.sleep(5)  # let the load reach steady state before the first fault
        for rec in records:
            # the environment knows what it can run (a local one without the storage
            # layer cannot run the disk classes); the experiment says what it needs
            why_not = adapter.applicability(rec.name) or env.applicability(
                rec.name, experiment_requires(rec.name))
            if why_not:
                rec.status = f"not applicable: {why_not}"
                not_applicable[rec.name] = why_not
                progress.add_task(f"{rec.name}: not applicable to {opts.platform}", total=1,
                                  completed=1)
                progress.advance(overall)
                continue
            task = progress.add_task(f"{rec.name}: waiting for a healthy system", total=None)
            healthy, why = wait_healthy(env, adapter, 90.0)
            if not healthy:
                rec.status = f"refused: system unhealthy before injection ({why})"
                progress.update(task, description=f"{rec.name}: {rec.status}")
                progress.remove_task(task)
                continue
            if begin is not None:
                begin(rec.name)
            run_experiment(rec.name, run_dir, env_vars, progress, task, rec)
            # safety net between experiments: every fault undone, whatever the journal says.
            # If that fails the run goes on to its verdict: the next experiment is refused
            # by the health wait above, and the failure is in run.json and the report.
            try:
                env.driver.restore_all()
            except Exception as exc:  # noqa: BLE001 - the evidence and verdict still come
                rec.detail = "; ".join(filter(None, [
                    rec.detail, f"restore after the experiment failed: {exc}"]))
                say(console, f"[red]{rec.name}: restore after the experiment failed: {exc}[/]")
            settle(settle_seconds(opts.env, rec.name), progress, task, rec.name)
            progress.update(task, description=f"{rec.name}: {rec.status} "
                                              f"({rec.seconds:.0f}s)", total=1, completed=1)
            progress.advance(overall)


# -- CLI --------------------------------------------------------------------------------------
@click.command("run")
@click.option("--suite", default="ci", show_default=True, type=click.Choice(["ci", "core", "full"]),
              help="ci: 3 experiments (about 2 min); core: every failure class (9 "
                   "experiments); full: core + db-restore-from-backup.")
@run_options
def run_cmd(suite: str, **kw: Any) -> None:
    """Run a game day: faults under load, evidence, verdict. Exit code = the gate's
    (0 pass, 1 experiment failed/deviated, 2 objective missed, 3 evidence unusable;
    4 refused to start, 5 skipped by the error-budget gate, 130 interrupted)."""
    sys.exit(run_gameday(build_options(suite, **kw), Console()))


@click.command("gate")
@click.option("--suite", default="ci", show_default=True, type=click.Choice(["ci", "core", "full"]))
@run_options
def gate_cmd(suite: str, **kw: Any) -> None:
    """CI SLO gate: a game day whose exit code fails the pipeline when an objective is missed;
    writes junit.xml and prints a short verdict table."""
    sys.exit(run_gameday(build_options(suite, **kw), Console()))

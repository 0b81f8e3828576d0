"""Before a game day touches anything: the guards that refuse it (`preflight`) and the dry run
that prints what it would hit. The environment answers for itself (environments/base.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from rich.console import Console
from rich.markup import escape

from environments.base import EnvironmentRefused, EnvironmentUnavailable, environment_kind
from environments.paths import unwritable
from environments.schedule import ScheduleError, active_freeze, load_freeze_windows
from gameday import durability_stream
from gameday.options import Options, resolve_home
from gameday.output import say
from gameday.suites import SuiteError, experiment_names, load_experiment, validate_names
from platforms import registry as platform_registry


def preflight(opts: Options) -> list[str]:
    """Everything that must hold before anything is touched. Raises ScheduleError/SuiteError."""
    names = experiment_names(opts.suite, opts.experiments)
    # where the run writes: checked before the lock and the environment, never after
    for path, what in ((opts.runs_dir, "--runs-dir"),
                       (resolve_home(opts.home), "the home ($GAMEDAY_HOME or --home)")):
        problem = unwritable(path, what)
        if problem:
            raise SuiteError(problem)
    try:
        kind = environment_kind(opts.env)
    except EnvironmentRefused as exc:
        raise SuiteError(str(exc)) from None
    refusal = kind.refusal(opts.request)
    if refusal:
        raise ScheduleError(refusal)
    window = active_freeze(opts.now or datetime.now(UTC), opts.env,
                           load_freeze_windows(opts.freeze_file))
    if window is not None:
        raise ScheduleError(f"inside freeze window {window.name!r} for {opts.env} "
                            f"({opts.freeze_file}): no injection")
    if opts.durability_rate:
        try:
            durability_stream.check_rate(opts.durability_rate)
        except durability_stream.StreamError as exc:
            raise SuiteError(str(exc)) from exc
        if not (kind.durability_stream and platform_registry.get(opts.platform).held_queue):
            raise SuiteError("--durability-stream: local environments of a platform with a "
                             "held queue only (the reference control plane's; "
                             f"platforms/registry.py), not {opts.env}/{opts.platform}")
    # a wrong func or argument would otherwise surface mid game day, with the load running
    problems = validate_names(names, opts.env)
    if problems:
        raise SuiteError(f"{len(problems)} problem(s) in the experiments, nothing was started:\n"
                         + "\n".join(f"  {escape(p)}" for p in problems))
    return names


def dry_run(opts: Options, names: list[str], console: Console) -> int:
    """Print exactly what would be hit; change nothing."""
    say(console, f"validated {len(names)} experiments")  # preflight did, before this
    say(console, f"[bold]gameday run --dry-run[/]: env {opts.env}, suite {opts.suite}, "
                 f"{len(names)} experiment(s), in this order:")
    for n in names:
        exp = load_experiment(n)
        g = exp.gameday
        say(console, f"- [bold]{n}[/] (objective {g.get('recovery_objective')}, runbook "
                     f"runbooks/{g.get('runbook', n)}.md)")
        say(console, f"    blast radius: {g.get('blast_radius', 'undeclared')}")
        for fault in exp.faults():
            say(console, f"    fault: {fault}")
        say(console, "    rollback: restore_all (always, also on Ctrl-C)")
    try:
        for line in environment_kind(opts.env).dry_run(opts.request):
            say(console, line)
    except EnvironmentUnavailable as exc:
        say(console, f"[yellow]a live run would refuse this target[/]: {exc}")
    say(console, f"background load: loadtests/scenarios/{opts.load_scenario}.yaml; "
                 f"evidence would go to {opts.runs_dir}/<run-id>/")
    if opts.durability_rate:
        say(console, f"durability stream: {opts.durability_rate:g} submissions/s to the held "
                     "queue through the whole run (canceled in bulk at the end)")
    say(console, "dry run: nothing was changed")
    return 0

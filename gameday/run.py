"""`gameday run` and `gameday gate`: a game day from start to verdict.

Bring up (or reuse) the environment, take the game-day lock, start background load, run each
experiment with Chaos Toolkit (rollbacks always, also on Ctrl-C), collect the raw evidence into
a new run directory, evaluate it with slo/, print the verdict and exit with the gate's code.

Cloud envs (dev/staging/prod) take the same path with three differences: the environment must
exist (infra/cloud/env.py, from the explicit ``--target`` file; no up/down), the lock is a
Kubernetes Lease (infra/cloud/lock.py), and faults go through CloudFaults with a fault
timeline (infra/cloud/recorded.py). SIGTERM counts as Ctrl-C there (a pod's deadline).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from chaos.context import ALLOW_PROD_ENV, CLOUD_STATE_ENV, CLOUD_TARGET_ENV
from gameday import collect, durability_stream
from gameday.suites import (
    SuiteError,
    experiment_names,
    experiment_requires,
    load_experiment,
    validate_names,
)
from infra.cloud.env import CloudEnvError, CloudEnvironment, CloudTargetFile
from infra.local.env import LocalEnvironment
from infra.local.errors import EnvError
from infra.paths import unwritable
from infra.schedule import (
    DEFAULT_FREEZE_FILE,
    GameDayLock,
    ScheduleError,
    active_freeze,
    load_freeze_windows,
)
from infra.timeline import Timeline
from infra.timeline_metrics import (
    DEFAULT_METRICS_PORT,
    FaultMetricsServer,
    FaultTimelineCollector,
)
from platforms import get_adapter
from platforms import registry as platform_registry
from slo.archive import Archive, ArchiveError, default_location, open_archive
from slo.baseline import skipped_entry
from slo.budget_gate import (
    BUDGET_CHECK_FILE,
    EXIT_SKIPPED,
    SKIPPED_FILE,
    BudgetCheck,
    SloBudget,
    judge,
    touched_slos,
)
from slo.budget_sources import archive_budgets, prometheus_budgets
from slo.cli import print_verdict
from slo.evaluate import EXIT_EVIDENCE, evaluate_run
from slo.evidence import EvidenceError
from slo.report import write_reports
from slo.run_index import observation_seconds
from slo.specs import SpecError, load_specs
from slo.telemetry import SCRAPES_PROMQL, SCRAPES_QUERY

LOCAL_ENVS = ("local",)
CLOUD_ENVS = ("dev", "staging", "prod")
EXIT_REFUSED = 4  # not started: freeze window, lock held, prod without --allow-prod, bad input
EXIT_INTERRUPTED = 130
EXPERIMENT_TIMEOUT = 420.0
PROM_QUERIES = {
    "alerts": "ALERTS",
    "queue_age": "max by (queue) (controlplane_queue_age_seconds)",
    "pending": "sum by (reason) (controlplane_pending_operations)",
    "api_requests": "sum by (code) (rate(haproxy_backend_http_responses_total[30s]))",
    # agents count every event they had to drop (slo/dropped.py reads the increase per agent)
    "evidence_dropped": "sum by (agent) (controlplane_agent_events_dropped_total)",
    # Prometheus's own liveness: a gap means its evidence of that stretch is lost (slo/telemetry.py)
    SCRAPES_QUERY: SCRAPES_PROMQL,
}
# No HAProxy in front of the API in the cloud (a Service): the API's own request counter, as
# the cloud SLO rules read it (slo/metrics.py API_REQUEST_SOURCES["api"]), by status code.
CLOUD_PROM_QUERIES = {
    **PROM_QUERIES,
    "api_requests": ('sum by (code) (rate(controlplane_http_requests_total'
                     '{route!~"/healthz|/readyz|/metrics"}[30s]))'),
}
# Always true of a cloud run; written to collection-gaps.json so nobody looks for them.
CLOUD_GAPS = {
    "component logs": "pod logs are not copied into the run directory; read them with "
                      "kubectl logs in the control-plane namespace",
}


@dataclass
class Options:
    env: str = "local"
    env_name: str = "local"
    suite: str = "ci"
    experiments: tuple[str, ...] = ()
    platform: str = "controlplane"
    runs_dir: Path = Path("runs")
    target: Path | None = None
    allow_prod: bool = False
    dry_run: bool = False
    keep_env: bool = True
    load_scenario: str = "gameday"
    freeze_file: Path = DEFAULT_FREEZE_FILE
    home: Path | None = None
    now: datetime | None = None
    archive: str | None = None  # None: slo.archive.default_location(runs_dir)
    no_archive: bool = False
    budget_check: bool = False  # read the touched SLOs' remaining budget first (scheduled runs)
    budget_source: str = "auto"  # auto: prometheus for cloud envs, the archive for local
    force: bool = False  # run even when the budget check says skip (recorded as forced)
    # fault timeline metrics: 0 = off; None = a free port announced to the local environment's
    # Prometheus, or DEFAULT_METRICS_PORT where nothing reads an announcement
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    # submissions/s of the durability stream (gameday/durability_stream.py); 0 = off
    durability_rate: float = 0.0


@dataclass
class ExperimentRun:
    name: str
    status: str = "pending"
    seconds: float = 0.0
    detail: str = ""
    log: deque[str] = field(default_factory=lambda: deque(maxlen=200))


def _say(console: Console, msg: str) -> None:
    console.print(msg, highlight=False)


def resolve_home(home: Path | None) -> Path:
    """The one home of this run: ``home``, else ``$GAMEDAY_HOME``, else the current directory,
    made absolute once here and handed to every subprocess as it is."""
    return (home or Path(os.environ.get("GAMEDAY_HOME") or os.getcwd())).resolve()


# -- guards -----------------------------------------------------------------------------------
def preflight(opts: Options) -> list[str]:
    """Everything that must hold before anything is touched. Raises ScheduleError/SuiteError."""
    names = experiment_names(opts.suite, opts.experiments)
    # where the run writes: checked before the lock and the environment, never after
    for path, what in ((opts.runs_dir, "--runs-dir"),
                       (resolve_home(opts.home), "the home ($GAMEDAY_HOME or --home)")):
        problem = unwritable(path, what)
        if problem:
            raise SuiteError(problem)
    if opts.env not in LOCAL_ENVS + CLOUD_ENVS:
        raise SuiteError(f"unknown env {opts.env!r}; envs: {', '.join(LOCAL_ENVS + CLOUD_ENVS)}")
    if opts.env in CLOUD_ENVS:
        if opts.target is None:
            raise ScheduleError(f"env {opts.env} needs an explicit --target (the stack outputs "
                                "JSON of `pulumi stack output --json -s <stack>`)")
        if opts.env == "prod" and not opts.allow_prod:
            raise ScheduleError("refusing to inject faults into prod without --allow-prod")
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
        if opts.env in CLOUD_ENVS or not platform_registry.get(opts.platform).held_queue:
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
    _say(console, f"validated {len(names)} experiments")  # preflight did, before this
    _say(console, f"[bold]gameday run --dry-run[/]: env {opts.env}, suite {opts.suite}, "
                  f"{len(names)} experiment(s), in this order:")
    for n in names:
        exp = load_experiment(n)
        g = exp.gameday
        _say(console, f"- [bold]{n}[/] (objective {g.get('recovery_objective')}, runbook "
                      f"runbooks/{g.get('runbook', n)}.md)")
        _say(console, f"    blast radius: {g.get('blast_radius', 'undeclared')}")
        for fault in exp.faults():
            _say(console, f"    fault: {fault}")
        _say(console, "    rollback: restore_all (always, also on Ctrl-C)")
    if opts.env in LOCAL_ENVS:

        env = LocalEnvironment(opts.env_name, opts.home)
        state = "running (would be reused)" if env.is_running() else "not running (would be brought up)"
        _say(console, f"environment {opts.env_name!r} at {env.state_dir}: {state}")
        if env.is_running():
            eps = env.endpoints
            _say(console, f"targets: API {eps.get('api')}, DB {eps.get('patroni')}, "
                          f"S3 {eps.get('s3')}, registry {eps.get('registry')}")
    else:
        _say(console, f"target: {opts.target} (cloud drivers: Kubernetes + AWS)")
        _dry_run_cloud(opts, console)
    _say(console, f"background load: loadtests/scenarios/{opts.load_scenario}.yaml; "
                  f"evidence would go to {opts.runs_dir}/<run-id>/")
    if opts.durability_rate:
        _say(console, f"durability stream: {opts.durability_rate:g} submissions/s to the held "
                      "queue through the whole run (canceled in bulk at the end)")
    _say(console, "dry run: nothing was changed")
    return 0


def _dry_run_cloud(opts: Options, console: Console) -> None:
    """What a live run would hit, from the target file alone (no credentials, no API call);
    a target a live run would refuse is reported here, without failing the dry run."""
    assert opts.target is not None
    try:
        t = CloudTargetFile.load(opts.target, opts.env)
    except CloudEnvError as exc:
        _say(console, f"[yellow]a live run would refuse this target[/]: {exc}")
        return
    cfg = t.driver_config
    _say(console, f"targets: API {t.api_url}, Prometheus {t.prometheus_url}, cluster "
                  f"{cfg.get('clusterName', '(derived)')} in {cfg['region']}, namespace "
                  f"{cfg.get('controlPlaneNamespace', 'mlp-controlplane')}, bucket(s) "
                  f"{cfg.get('artifactBuckets') or cfg.get('artifactBucket') or 'none'}")
    _say(console, "credentials from env vars " + ", ".join(sorted(t.secret_envs.values()))
         + "; lock: Lease gameday-lock in the control-plane namespace")


# -- the error-budget gate ---------------------------------------------------------------------
def _run_id(opts: Options) -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + f"-{opts.env}-{opts.suite}"


def _budget_prometheus_url(opts: Options) -> tuple[str | None, str]:
    """(URL, why not) of the Prometheus holding the SLO rules of opts.env."""
    if opts.env in CLOUD_ENVS:
        assert opts.target is not None  # preflight refused a cloud env without one
        try:
            return CloudTargetFile.load(opts.target, opts.env).prometheus_url, ""
        except CloudEnvError as exc:
            return None, f"no Prometheus URL: {exc}"
    env = LocalEnvironment(opts.env_name, opts.home)
    if not env.is_running():
        return None, f"local environment {opts.env_name!r} is not running (no Prometheus)"
    return str(env.endpoints["prometheus"]), ""


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
    source = opts.budget_source
    if source == "auto":
        source = "prometheus" if opts.env in CLOUD_ENVS else "archive"
    budgets: list[SloBudget]
    if source == "prometheus":
        url, why = _budget_prometheus_url(opts)
        if url is None:
            budgets = [judge(n, exps, None, floor, detail=why) for n, exps in touched.items()]
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


def _print_budget(check: BudgetCheck, console: Console) -> None:
    for b in check.budgets:
        left = "" if b.remaining is None else f"{b.remaining:.1%} left; "
        colour = {"ok": "green", "not tracked": "dim"}.get(b.status.value, "bold red")
        _say(console, f"  budget {escape(b.slo)}: [{colour}]{b.status.value}[/] ({left}"
                      f"{escape(b.detail)})")


def skip_run(opts: Options, check: BudgetCheck, console: Console) -> int:
    """Nothing was started: write the skip's record (run dir with skipped.json only, no
    verdict) and archive it so `gameday history` lists the run as skipped."""
    base = _run_id(opts)
    run_id, n = base, 1
    while (opts.runs_dir / run_id).exists():  # two skips within one second
        n += 1
        run_id = f"{base}.{n}"
    run_dir = (opts.runs_dir / run_id).resolve()
    run_dir.mkdir(parents=True)
    (run_dir / SKIPPED_FILE).write_text(
        check.model_dump_json(indent=2, by_alias=True) + "\n", encoding="utf-8")
    _say(console, f"[bold yellow]skipped[/] (exit {EXIT_SKIPPED}): {escape(check.reason)}; "
                  "nothing was started, nothing measured; --force runs anyway")
    _say(console, f"record: {run_dir / SKIPPED_FILE}")
    if not opts.no_archive:
        try:
            archive = open_archive(opts.archive or default_location(opts.runs_dir))
            entry = archive.put_run(run_dir, run_id, lambda loc, files, at: skipped_entry(
                check, run_id, opts.platform, loc, files, at))
            _say(console, f"archived: {entry.location}")
        except (ArchiveError, OSError, ValueError) as exc:
            _say(console, f"[bold red]not archived[/]: {exc}")
    return EXIT_SKIPPED


# -- experiments ------------------------------------------------------------------------------
def run_experiment(name: str, run_dir: Path, env_vars: dict[str, str], progress: Progress,
                   task: Any, record: ExperimentRun) -> None:
    exp_dir = run_dir / "experiments" / name
    exp_dir.mkdir(parents=True, exist_ok=True)
    chaos = str(Path(sys.executable).with_name("chaos"))
    argv = [chaos, "run", "--rollback-strategy", "always",
            "--journal-path", str(exp_dir / "journal.json"), str(load_experiment(name).path)]
    started = time.monotonic()
    with open(exp_dir / "chaos.out", "w") as out:
        proc = subprocess.Popen(argv, cwd=exp_dir, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **env_vars}, start_new_session=True)

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                out.flush()
                text = line.strip()
                if "] " in text:
                    text = text.split("] ", 1)[1]
                record.log.append(text)
                progress.update(task, description=f"{name}: {text[:70]}")

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            while proc.poll() is None:
                if time.monotonic() - started > EXPERIMENT_TIMEOUT:
                    record.detail = f"timed out after {EXPERIMENT_TIMEOUT:.0f}s"
                    _interrupt(proc)
                    break
                time.sleep(0.2)
        except KeyboardInterrupt:
            record.detail = "interrupted"
            _interrupt(proc)  # Chaos Toolkit plays its rollbacks on SIGINT
            reader.join(5)
            raise
        finally:
            reader.join(5)
            record.seconds = time.monotonic() - started
    record.status = _journal_status(exp_dir / "journal.json", proc.returncode)


def _interrupt(proc: subprocess.Popen[str], grace: float = 90.0) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def _journal_status(path: Path, rc: int | None) -> str:
    try:
        j = json.loads(path.read_text())
    except (OSError, ValueError):
        return f"no journal (chaos exited {rc})"
    before = ((j.get("steady_states") or {}).get("before") or {}).get("steady_state_met")
    if before is False:
        return "refused: steady state not met before the method"
    if j.get("deviated"):
        return "deviated"
    return j.get("status", "unknown")


# -- the game day ------------------------------------------------------------------------------
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
            _say(console, f"[bold red]refused[/]: budget check: {exc}")
            return EXIT_REFUSED
        _say(console, f"error-budget gate (floor {check.floor:.0%}, {escape(check.source)}):")
        _print_budget(check, console)
        if opts.dry_run:
            _say(console, "a live run would be skipped" if check.skip else
                 "a live run would go ahead" + (" (forced)" if check.blocking else ""))
        elif check.skip:
            return skip_run(opts, check, console)
        elif check.blocking:
            _say(console, f"[bold yellow]forced[/]: {escape(check.reason)}")
    if opts.dry_run:
        return dry_run(opts, names, console)
    if opts.env in CLOUD_ENVS:
        return run_cloud_gameday(opts, names, console, check)


    env = LocalEnvironment(opts.env_name, opts.home)
    started_env = False
    if not env.is_running():
        _say(console, f"bringing up environment {opts.env_name!r} ...")
        try:
            env.up(reporter=lambda msg: _say(console, f"  {msg}"), platform=opts.platform)
        except EnvError as exc:
            _say(console, f"[bold red]refused[/]: the environment did not come up: {exc}")
            return EXIT_REFUSED
        started_env = True
    env = LocalEnvironment.load(opts.env_name, opts.home)
    running = env.info.get("platform", "controlplane")
    if running != opts.platform:
        _say(console, f"[bold red]refused[/]: environment {opts.env_name!r} runs platform "
                      f"{running!r}, not {opts.platform!r}: `gameday env down` it first or use "
                      "another --env-name")
        return EXIT_REFUSED
    run_id = _run_id(opts)
    run_dir = (opts.runs_dir / run_id).resolve()
    lock = GameDayLock(env.state_dir / "gameday.lock")
    try:
        lock.acquire({"run_id": run_id, "run_dir": str(run_dir)})
    except ScheduleError as exc:
        _say(console, f"[bold red]refused[/]: {exc}")
        return EXIT_REFUSED
    try:
        return _run_locked(opts, env, names, run_id, run_dir, console, check=check)
    finally:
        lock.release()
        if started_env and not opts.keep_env:
            env.down()


def run_cloud_gameday(opts: Options, names: list[str], console: Console,
                      check: BudgetCheck | None = None) -> int:
    """dev/staging/prod: the environment must exist already (no up/down); the lock is a Lease
    in the cluster; faults go through CloudFaults, recorded in the environment's timeline."""
    assert opts.target is not None  # preflight refused a cloud env without one
    if not platform_registry.get(opts.platform).cloud:
        _say(console, f"[bold red]refused[/]: cloud game days target what infra/ deploys; "
                      f"platform {opts.platform!r} has no cloud deployment "
                      "(platforms/registry.py)")
        return EXIT_REFUSED
    try:
        env = CloudEnvironment.from_target(opts.target, opts.env, home=opts.home,
                                           allow_prod=opts.allow_prod)
        run_id = _run_id(opts)
        run_dir = (opts.runs_dir / run_id).resolve()
        lock = env.lock(run_id)
        lock.acquire({"run_id": run_id, "run_dir": str(run_dir),
                      "host": os.environ.get("HOSTNAME", "")})
    except CloudEnvError as exc:
        _say(console, f"[bold red]refused[/]: {exc}")
        return EXIT_REFUSED
    except ScheduleError as exc:
        _say(console, f"[bold red]refused[/]: {exc}")
        return EXIT_REFUSED
    except Exception as exc:  # noqa: BLE001 - e.g. no kubeconfig: refuse, nothing was touched
        _say(console, f"[bold red]refused[/]: cannot reach the cluster of {opts.env} "
                      f"({type(exc).__name__}: {exc})")
        return EXIT_REFUSED
    _say(console, f"environment {opts.env}: API {env.target.api_url}, lock Lease "
                  f"{lock.namespace}/{lock.name} held by {run_id}")
    # A pod is stopped with SIGTERM (activeDeadlineSeconds, node drain): treat it like Ctrl-C
    # so rollbacks and evidence still happen, as they do for an interactive run.
    previous = _sigterm_as_interrupt()
    try:
        return _run_locked(opts, env, names, run_id, run_dir, console, lock=lock, check=check)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        lock.release()


def _sigterm_as_interrupt() -> Any:
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    return signal.signal(signal.SIGTERM, handler)


def _run_locked(opts: Options, env: Any, names: list[str], run_id: str, run_dir: Path,
                console: Console, lock: Any = None, check: BudgetCheck | None = None) -> int:

    run_dir.mkdir(parents=True)
    started_at = collect.utcnow()
    if check is not None:  # read into the verdict (forced or not): slo/evaluate.py
        (run_dir / BUDGET_CHECK_FILE).write_text(
            check.model_dump_json(indent=2, by_alias=True) + "\n", encoding="utf-8")
    info: dict[str, Any] = {"run_id": run_id, "env": opts.env, "suite": opts.suite,
                            "platform": opts.platform, "started_at": started_at.isoformat(),
                            "ended_at": None, "experiments": names,
                            "environment": env.name, "versions": collect.versions()}
    collect.write_run_json(run_dir, info)
    _say(console, f"run {run_id}: {len(names)} experiment(s) -> {run_dir}")
    cloud = opts.env in CLOUD_ENVS
    if cloud:
        info["target"] = env.describe()
        collect.write_run_json(run_dir, info)
    adapter = get_adapter(opts.platform, env.endpoints, env.tokens)
    driver = env.driver
    eps = env.endpoints
    project = getattr(adapter, "project", opts.platform)
    # cloud: the load is aimed at the stack on purpose (allow_remote)
    load = platform_registry.get(opts.platform).resolve("load")(
        env, lambda: get_adapter(opts.platform, env.endpoints, env.tokens), run_dir,
        opts.load_scenario, cloud)
    # Exactly the home this process resolved, absolute: Chaos Toolkit runs with the experiment
    # directory as its cwd, where a "$GAMEDAY_HOME or cwd" lookup would find no environment.
    env_vars = {"GAMEDAY_ENV": env.name, "GAMEDAY_RUN_DIR": str(run_dir),
                "GAMEDAY_PLATFORM": opts.platform, "GAMEDAY_HOME": str(resolve_home(opts.home))}
    if cloud:  # chaos.context builds the same CloudEnvironment from these

        env_vars.update({CLOUD_TARGET_ENV: str(env.target.path),
                         CLOUD_STATE_ENV: str(env.state_dir),
                         ALLOW_PROD_ENV: "true" if opts.allow_prod else "false"})
    records = [ExperimentRun(n) for n in names]
    not_applicable: dict[str, str] = {}
    interrupted = False
    targets = eps.get("fault_metrics_targets")  # absent: cloud, or a local env made before
    metrics = _serve_fault_metrics(opts, run_id, Path(eps["fault_timeline"]),
                                   started_at.timestamp(), console,
                                   Path(targets) if targets else None)
    stream = None
    try:
        if opts.durability_rate:
            stream = durability_stream.start(str(eps["api"]), env.tokens, run_dir,
                                             opts.durability_rate)
            _say(console, f"durability stream: {opts.durability_rate:g} submissions/s to the "
                          "held queue")
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                      console=console, transient=False) as progress:
            overall = progress.add_task("game day", total=len(names))
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
                healthy, why = _wait_healthy(env, adapter, 90.0)
                if not healthy:
                    rec.status = f"refused: system unhealthy before injection ({why})"
                    progress.update(task, description=f"{rec.name}: {rec.status}")
                    progress.remove_task(task)
                    continue
                if metrics is not None:
                    metrics.collector.begin_experiment(rec.name)
                run_experiment(rec.name, run_dir, env_vars, progress, task, rec)
                # safety net between experiments: every fault undone, whatever the journal says.
                # If that fails the run goes on to its verdict: the next experiment is refused
                # by the health wait above, and the failure is in run.json and the report.
                try:
                    driver.restore_all()
                except Exception as exc:  # noqa: BLE001 - the evidence and verdict still come
                    rec.detail = "; ".join(filter(None, [rec.detail,
                                                         f"restore after the experiment failed: {exc}"]))
                    _say(console, f"[red]{rec.name}: restore after the experiment failed: {exc}[/]")
                _settle(settle_seconds(opts.env, rec.name), progress, task, rec.name)
                progress.update(task, description=f"{rec.name}: {rec.status} "
                                                  f"({rec.seconds:.0f}s)", total=1, completed=1)
                progress.advance(overall)
    except KeyboardInterrupt:
        interrupted = True
        _say(console, "[yellow]interrupted: rolling back and saving the evidence so far[/]")
    finally:
        if metrics is not None:
            metrics.close()
        rollback: dict[str, Any] = {}
        try:
            rollback["restored"] = driver.restore_all()
        except Exception as exc:  # noqa: BLE001 - keep collecting evidence regardless
            rollback["error"] = str(exc)
            _say(console, f"[red]restore after the run failed: {exc}[/]")
        if stream is not None:
            info["durability_stream"] = durability_stream.stop(stream, adapter)
            c = info["durability_stream"]
            _say(console, f"durability stream: {c['acked']} acknowledged of {c['first_attempts']}"
                          f" submitted ({c['requests']} requests, {c['abandoned']} abandoned)"
                          + (f"; [red]{c['error']}[/]" if "error" in c else ""))
        summary = load.stop()
        _say(console, f"load: {summary.acknowledged} acknowledged submissions, "
                      f"{summary.requests} requests ({summary.reason})")
        ended_at = collect.utcnow()
        acks = collect.merge_ledgers(run_dir)
        faults = collect.copy_faults(Path(eps["fault_timeline"]), run_dir, started_at)
        prom = collect.query_prometheus(eps["prometheus"], run_dir, started_at, ended_at,
                                        CLOUD_PROM_QUERIES if cloud else PROM_QUERIES)
        try:
            counts = collect.snapshot(adapter, run_dir, since=started_at)
        except RuntimeError as exc:
            counts = {"error": str(exc)}
            _say(console, f"[red]{exc}[/]")
        if cloud:
            counts = _collect_cloud(env, run_dir, counts, rollback, lock, console)
        info.update(ended_at=ended_at.isoformat(), snapshot_at=collect.utcnow().isoformat(),
                    interrupted=interrupted, not_applicable=not_applicable,
                    ledger_entries=acks, fault_events=faults,
                    prometheus=prom, snapshot=counts, project=project,
                    experiment_status={r.name: {"status": r.status, "seconds": round(r.seconds, 1),
                                                "detail": r.detail} for r in records},
                    load={"exit_code": int(summary.exit_code), "reason": summary.reason,
                          "acknowledged": summary.acknowledged})
        collect.write_run_json(run_dir, info)
    code = evaluate(run_dir, console, None if opts.no_archive
                    else opts.archive or default_location(opts.runs_dir))
    return EXIT_INTERRUPTED if interrupted else code


def _serve_fault_metrics(opts: Options, run_id: str, timeline: Path, since: float,
                         console: Console, targets_file: Path | None = None,
                         ) -> FaultMetricsServer | None:
    """The fault timeline as Prometheus metrics for the duration of the run (port 0 = off).
    With ``targets_file`` (a local environment's Prometheus reads it) the default port is a
    free one, listed in that file. A port that cannot be bound is said in yellow: the game
    day goes on without the metrics."""
    port = opts.metrics_port
    if port == 0:
        return None
    if port is None:
        port = 0 if targets_file is not None else DEFAULT_METRICS_PORT
    collector = FaultTimelineCollector(Timeline(timeline), run_id, opts.env, opts.suite, since)
    try:
        server = FaultMetricsServer(collector, port, opts.metrics_addr, targets_file)
    except OSError as exc:
        _say(console, f"[yellow]fault timeline metrics not served on "
                      f"{opts.metrics_addr}:{port or 'a free port'}: {exc}[/]")
        return None
    _say(console, f"fault timeline metrics: {server.url}")
    return server


def _collect_cloud(env: Any, run_dir: Path, counts: dict[str, Any], rollback: dict[str, Any],
                   lock: Any, console: Console) -> dict[str, Any]:
    """What differs in the cloud: the object listing comes from AWS S3 (IAM), not an endpoint
    URL; what could not be collected is written down in collection-gaps.json, never faked."""
    gaps: dict[str, str] = dict(CLOUD_GAPS)
    if "error" in counts:
        gaps["snapshot/"] = f"the store snapshot failed (DSN from the target's adminDsnEnv): {counts['error']}"
    else:
        try:
            counts["objects"] = collect.s3_objects(env.bucket, env.region,
                                                   run_dir / "snapshot" / "objects.jsonl",
                                                   operations=_run_operations(run_dir))
        except collect.CollectError as exc:
            (run_dir / "snapshot" / "objects.jsonl").unlink(missing_ok=True)
            gaps["snapshot/objects.jsonl"] = str(exc)
            counts["objects"] = f"error: {exc}"
            _say(console, f"[red]{exc}[/]")
    if "error" in rollback:
        gaps["rollback"] = (f"restore_all failed: {rollback['error']}; the faults still active "
                            f"are in {env.fault_state_file} (docs/chaos-cloud.md)")
    if lock is not None and getattr(lock, "lost", None):
        gaps["lock"] = f"the game-day Lease was lost during the run: {lock.lost}"
    collect.write_gaps(run_dir, gaps)
    counts["rollback"] = rollback
    return counts


def _run_operations(run_dir: Path) -> set[str]:
    path = run_dir / "snapshot" / "operations.jsonl"
    return {json.loads(x)["id"] for x in path.read_text().splitlines() if x.strip()}


def settle_seconds(env: str, experiment: str) -> float:
    """How long after an experiment ends (its work drained, every fault undone) the evaluator
    needs to see its SLIs recover and hold (slo.run_index.observation_seconds)."""
    specs = load_specs(env)
    g = load_experiment(experiment).gameday
    ro = specs.recovery_objectives.get(str(g.get("recovery_objective")))
    own = list(g.get("slos") or [])
    names = [n for n in (ro.judged_slos(own) if ro else dict.fromkeys(own)) if n in specs.slo_names]
    return observation_seconds(specs, names)


def _settle(seconds: float, progress: Progress, task: Any, name: str) -> None:
    """Let the experiment's recovery be observable before the next fault starts (and before
    the evidence is collected, after the last one)."""
    if seconds > 0:
        progress.update(task, description=f"{name}: letting recovery show ({seconds:.0f}s)")
        time.sleep(seconds)


def _wait_healthy(env: Any, adapter: Any, timeout: float) -> tuple[bool, str]:
    deadline = time.monotonic() + timeout
    why = ""
    while time.monotonic() < deadline:
        status = env.status()
        bad = [n for n, c in status["components"].items() if not c["healthy"]]
        ok, detail = adapter.healthy()
        if not bad and ok and not status.get("active_faults"):
            return True, ""
        why = f"unhealthy: {bad}" if bad else (detail if not ok else
                                               f"active faults {list(status['active_faults'])}")
        time.sleep(1.0)
    return False, why


def evaluate(run_dir: Path, console: Console, archive_at: str | None = None) -> int:
    """Evaluate the run; with `archive_at`, compare it with the last passing run of the same
    suite and env there, then archive it (evidence, verdict and reports). A run that cannot be
    archived is said in red; the exit code stays the verdict's (the evidence is in run_dir)."""
    archive: Archive | None = None
    if archive_at is not None:
        try:
            archive = open_archive(archive_at)
        except ArchiveError as exc:
            _say(console, f"[bold red]archive unusable[/]: {exc}: the run is not compared "
                          "with a baseline nor archived")
    try:
        verdict = evaluate_run(run_dir, baseline_archive=archive)
    except (EvidenceError, SpecError) as exc:
        _say(console, f"[bold red]evidence unusable[/]: {exc}")
        return EXIT_EVIDENCE
    paths = write_reports(verdict, run_dir)
    print_verdict(verdict, console)
    _say(console, f"report: {paths['report.html']}\njunit: {paths['junit.xml']}")
    if archive is not None:
        try:
            entry = archive.put(run_dir, verdict)
            _say(console, f"archived: {entry.location}")
        except (ArchiveError, OSError, ValueError) as exc:
            _say(console, f"[bold red]not archived[/]: {exc}")
    return verdict.exit_code


# -- CLI --------------------------------------------------------------------------------------
def _options(f: Any) -> Any:
    opts = [
        click.option("--env", "env", default="local", show_default=True,
                     type=click.Choice(LOCAL_ENVS + CLOUD_ENVS), help="Target environment."),
        click.option("--env-name", default="local", show_default=True,
                     help="Name of the local environment (its state dir under $GAMEDAY_HOME)."),
        click.option("--experiment", "experiments", multiple=True,
                     help="Run only this experiment (repeatable); overrides --suite."),
        click.option("--platform", default="controlplane", show_default=True,
                     help="Platform adapter of the control plane under test."),
        click.option("--runs-dir", type=click.Path(path_type=Path, file_okay=False),
                     default=Path("runs"), show_default=True, help="Where run directories go."),
        click.option("--target", type=click.Path(path_type=Path, dir_okay=False, exists=True),
                     help="Cloud envs (required): target JSON, stack outputs + runner keys "
                          "(docs/chaos-cloud.md, 'Live game days')."),
        click.option("--allow-prod", is_flag=True, help="Allow fault injection into prod."),
        click.option("--dry-run", is_flag=True, help="Print exactly what would be hit; change nothing."),
        click.option("--down-after/--keep-env", "down_after", default=False,
                     help="Take down an environment this run brought up (default: keep it)."),
        click.option("--load-scenario", default="gameday", show_default=True,
                     help="Background load scenario (loadtests/scenarios/NAME.yaml)."),
        click.option("--freeze-file", type=click.Path(path_type=Path, dir_okay=False),
                     default=DEFAULT_FREEZE_FILE, show_default=True,
                     help="Declared freeze windows (no injection inside them)."),
        click.option("--archive", "archive", default=None, metavar="ARCHIVE",
                     help="Run history: directory or s3://bucket/prefix the run is archived to "
                          "and compared with [default: $GAMEDAY_ARCHIVE, else archive/ next to "
                          "--runs-dir]."),
        click.option("--no-archive", is_flag=True,
                     help="Neither archive the run nor compare it with a baseline."),
        click.option("--budget-check/--no-budget-check", "budget_check", default=False,
                     show_default=True,
                     help="First read the remaining error budget of the SLOs the experiments "
                          "touch; skip (exit 5, skipped.json) when one is below the env's "
                          "gate.minRemainingBudget or has no data. Scheduled game days pass it."),
        click.option("--budget-source", type=click.Choice(["auto", "prometheus", "archive"]),
                     default="auto", show_default=True,
                     help="Where the budget check reads: auto = Prometheus for cloud envs "
                          "(the target's prometheusUrl), the archive for local."),
        click.option("--force", is_flag=True,
                     help="Run even when the budget check says skip; the verdict and report "
                          "record that the run was forced."),
        click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
                     show_default=f"a free port for a local environment, {DEFAULT_METRICS_PORT} "
                                  "otherwise",
                     help="Serve the fault timeline as Prometheus metrics on this port during "
                          "the run (0 = off). A local environment's Prometheus is told the "
                          "port whichever it is."),
        click.option("--metrics-addr", default="127.0.0.1", show_default=True,
                     help="Address the fault timeline metrics listen on."),
        click.option("--durability-stream", "durability_rate", type=float, default=0.0,
                     metavar="RATE", show_default=True,
                     help="Also submit RATE cheap operations a second (held queue, no agent) "
                          "through the whole run, so that the durability audit has the events "
                          "to demonstrate its objective: 99.99 % needs 29,956 acknowledged "
                          "with none lost (local, reference control plane; 0 = off)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _build(suite: str, **kw: Any) -> Options:
    return Options(env=kw["env"], env_name=kw["env_name"], suite=suite,
                   experiments=tuple(kw["experiments"]), platform=kw["platform"],
                   runs_dir=kw["runs_dir"], target=kw["target"], allow_prod=kw["allow_prod"],
                   dry_run=kw["dry_run"], keep_env=not kw["down_after"],
                   load_scenario=kw["load_scenario"], freeze_file=kw["freeze_file"],
                   home=resolve_home(None), archive=kw["archive"], no_archive=kw["no_archive"],
                   budget_check=kw["budget_check"], budget_source=kw["budget_source"],
                   force=kw["force"], metrics_port=kw["metrics_port"],
                   metrics_addr=kw["metrics_addr"], durability_rate=kw["durability_rate"])


@click.command("run")
@click.option("--suite", default="ci", show_default=True, type=click.Choice(["ci", "core", "full"]),
              help="ci: 3 experiments (about 2 min); core: every failure class (9 "
                   "experiments); full: core + db-restore-from-backup.")
@_options
def run_cmd(suite: str, **kw: Any) -> None:
    """Run a game day: faults under load, evidence, verdict. Exit code = the gate's
    (0 pass, 1 experiment failed/deviated, 2 objective missed, 3 evidence unusable;
    4 refused to start, 5 skipped by the error-budget gate, 130 interrupted)."""
    sys.exit(run_gameday(_build(suite, **kw), Console()))


@click.command("gate")
@click.option("--suite", default="ci", show_default=True, type=click.Choice(["ci", "core", "full"]))
@_options
def gate_cmd(suite: str, **kw: Any) -> None:
    """CI SLO gate: a game day whose exit code fails the pipeline when an objective is missed;
    writes junit.xml and prints a short verdict table."""
    sys.exit(run_gameday(_build(suite, **kw), Console()))

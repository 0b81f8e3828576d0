"""`gameday env ...` and `gameday fault ...`: the local environment from the command line."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from environments.local.errors import ComponentUnhealthy, EnvError
from environments.local.memory_pressure import MAX_LIMIT_MIB, MIN_LIMIT_MIB
from environments.local.redact import redact, redact_url
from environments.paths import unwritable
from platforms import PLATFORMS

console = Console(stderr=True)

name_option = click.option("--name", "-n", default="local", show_default=True,
                           help="Environment name (one state directory per name).")
home_option = click.option("--home", type=click.Path(file_okay=False, path_type=Path),
                           envvar="GAMEDAY_HOME",
                           help="Directory holding .gameday/envs/<name> [default: $GAMEDAY_HOME or cwd].")


@contextmanager
def domain_errors() -> Iterator[None]:
    """Turn environment errors into one clear CLI error (exit code 1)."""
    try:
        yield
    except ComponentUnhealthy as exc:
        console.print(f"[red]error:[/] component [bold]{exc.component}[/] did not become healthy: "
                      f"{exc.reason}")
        if exc.log_tail:
            console.rule(f"last lines of {exc.component}'s log")
            console.print(exc.log_tail, markup=False, highlight=False)
            console.rule()
        raise SystemExit(1) from exc
    except EnvError as exc:
        raise click.ClickException(str(exc)) from exc


def _load(name: str, home: Path | None) -> Any:
    from environments.local.env import LocalEnvironment

    return LocalEnvironment.load(name, home)


def _components_table(status: dict[str, Any]) -> Table:
    table = Table(title=f"environment {status.get('name')} ({status.get('status')})")
    for column in ("component", "pid", "ports", "health"):
        table.add_column(column)
    for name, comp in status["components"].items():
        health = "[green]healthy[/]" if comp["healthy"] else f"[red]{comp['detail']}[/]"
        if comp.get("role"):
            health += f" [cyan]{comp['role']}[/]"
        if comp.get("model"):  # a model server: its version, and why it is not ready
            model = comp["model"]
            health += f" [cyan]{model.get('version')} {model.get('state')}[/]"
            if model.get("state") != "ready":
                health += f" {model.get('reason')}"
        ports = " ".join(f"{k}={v}" for k, v in comp["ports"].items())
        table.add_row(name, str(comp["pid"] or "-"), ports, health)
    return table


show_secrets_option = click.option(
    "--show-secrets", is_flag=True,
    help="Print tokens and passwords as they are (default: *** in their place).")


def _print_json(status: dict[str, Any], show_secrets: bool) -> None:
    click.echo(json.dumps(status if show_secrets else redact(status), indent=2))


def _print_summary(status: dict[str, Any]) -> None:
    out = Console(width=max(Console().width, 110))
    out.print(_components_table(status))
    endpoints = status.get("endpoints", {})
    for key in ("api", "dsn", "s3", "registry", "image", "prometheus", "haproxy_stats", "fault_timeline"):
        if key in endpoints:
            out.print(f"  [bold]{key:15}[/] {redact_url(str(endpoints[key]))}")
    out.print(f"  [bold]{'processes':15}[/] {status['processes']} (RSS {status['rss_mib']} MiB, "
              f"PSS {status['pss_mib']} MiB)")
    cp = status.get("controlplane", {})
    if not cp.get("included"):
        out.print("  [yellow]control plane not started[/]: missing `gameday controlplane` commands "
                  f"{cp.get('missing_commands')}")
    elif not cp.get("agents"):
        out.print("  [yellow]agents not started[/]: `gameday controlplane agent` is missing")


@click.group("env")
def env_group() -> None:
    """Bring the local environment (real servers on 127.0.0.1) up and down."""


@env_group.command("up")
@name_option
@home_option
@click.option("--infra-only", is_flag=True, help="Start the servers only, not the control plane.")
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait per stage.")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON when up.")
@show_secrets_option
@click.option("--platform", default="controlplane", show_default=True,
              type=click.Choice(list(PLATFORMS)),
              help="Platform under test (platforms/registry.py), e.g. prefect: Prefect 3 "
                   "server + process workers instead of the reference control plane.")
@click.option("--storage-faults/--no-storage-faults", default=None,
              help="Put each database member's data directory on a fault-injecting FUSE "
                   "mount (disk-0, disk-1: docs/faultfs.md) so `gameday fault disk-*` can make "
                   "it slow, full or failing. Default: as the environment was created (off).")
@click.option("--serving/--no-serving", default=None,
              help="Also start model serving: KServe model servers behind HAProxy's serving "
                   "frontend (docs/serving.md). Default: as the environment was created (off).")
@click.option("--tracking/--no-tracking", default=None,
              help="Also start MLflow's tracking server (from scripts/setup-mlflow.sh) on the "
                   "cluster's database and the S3 server; the agents' train workloads log to "
                   "it with `tracking: 1` (the tracking-outage class). Default: as the "
                   "environment was created (off).")
def up_cmd(name: str, home: Path | None, infra_only: bool, timeout: float, as_json: bool,
           show_secrets: bool, platform: str, storage_faults: bool | None,
           serving: bool | None, tracking: bool | None) -> None:
    """Start every component and wait until each is healthy; refuse if already running."""
    from environments.local.env import LocalEnvironment, state_dir_for

    problem = unwritable(state_dir_for(name, home), "the state directory")
    if problem:
        raise click.ClickException(problem)
    env = LocalEnvironment(name, home, storage_faults=storage_faults, serving=serving,
                           tracking=tracking)
    started = time.monotonic()
    with domain_errors(), console.status(f"starting environment {name!r} ...") as spinner:
        def report(message: str) -> None:
            console.print(f"  [green]✓[/] {message} [dim]({time.monotonic() - started:.1f} s)[/]")
            spinner.update(f"starting environment {name!r}: {message}")

        status = env.up(reporter=report, infra_only=infra_only, timeout=timeout,
                        platform=platform)
    console.print(f"[bold green]up[/] in {status['up_seconds']} s; state in {env.state_dir}")
    if as_json:
        _print_json(status, show_secrets)
    else:
        _print_summary(status)


@env_group.command("down")
@name_option
@home_option
@click.option("--purge", is_flag=True, help="Also delete the state directory (data, logs, timeline).")
def down_cmd(name: str, home: Path | None, purge: bool) -> None:
    """Stop every process (restoring active faults first); keep the state unless --purge."""
    from environments.local.env import LocalEnvironment

    env = LocalEnvironment(name, home)
    with domain_errors(), console.status(f"stopping environment {name!r} ..."):
        result = env.down(purge=purge)
    console.print(f"[bold]down[/] in {result['down_seconds']} s; no process left"
                  + ("; state purged" if purge else f"; state kept in {env.state_dir}"))


@env_group.command("status")
@name_option
@home_option
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable endpoints, tokens (redacted) and health.")
@show_secrets_option
def status_cmd(name: str, home: Path | None, as_json: bool, show_secrets: bool) -> None:
    """Re-check the health of every component; exit 1 when something is unhealthy."""
    with domain_errors():
        env = _load(name, home)
        status = env.status()
    if as_json:
        _print_json(status, show_secrets)
    else:
        _print_summary(status)
    if not status["healthy"]:
        sys.exit(1)


@env_group.command("rollout")
@name_option
@home_option
@click.argument("version")
@click.option("--steps", default="10,25,50,100", show_default=True,
              help="The canary's shares of requests, percent, comma-separated, increasing.")
@click.option("--step-seconds", default=5.0, show_default=True, help="How long each step is analysed.")
@click.option("--max-error-ratio", default=0.02, show_default=True)
@click.option("--max-p99-ms", default=250.0, show_default=True)
@click.option("--no-rollback", is_flag=True, help="Hold a failing canary instead of rolling it back.")
def rollout_cmd(name: str, home: Path | None, version: str, steps: str, step_seconds: float,
                max_error_ratio: float, max_p99_ms: float, no_rollback: bool) -> None:
    """Roll model VERSION out to the serving replicas through a canary (docs/serving.md);
    exit 1 when it was rolled back or never passed."""
    from controlplane.serving.catalog import VERSIONS
    from controlplane.serving.rollout import Action, Policy
    from environments.local import serving
    from environments.local.serving_rollout import RolloutController

    try:
        shares = tuple(int(part) for part in steps.split(","))
        policy = Policy(steps=shares, max_error_ratio=max_error_ratio, max_p99_ms=max_p99_ms,
                        rollback=not no_rollback)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--steps / --max-error-ratio") from exc
    if version not in VERSIONS:
        raise click.BadParameter(f"unknown model version {version!r} (published: "
                                 f"{', '.join(VERSIONS)})", param_hint="VERSION")
    with domain_errors():
        env = _load(name, home)
        if not serving.replicas(env.components):
            raise click.ClickException(f"environment {name!r} serves no model: {serving.HINT}")
        result = RolloutController(env.state, env.processes).run(version, policy, step_seconds)
    for step in result.steps:
        console.print(f"  step {step['step']} at {step['share']} %: {step['requests']} requests, "
                      f"{step['errors']} errors, p99 {step['p99_ms'] or 0:.0f} ms, golden wrong "
                      f"{step['golden_wrong']}/{step['golden_total']} -> {step['decision']} "
                      + "; ".join(step["reasons"]))
    console.print(f"[bold]{result.outcome.value}[/] {version}"
                  + (f": {'; '.join(result.reasons)}" if result.reasons else ""))
    if result.outcome is not Action.DONE:
        sys.exit(1)


@env_group.command("scale-serving")
@name_option
@home_option
@click.argument("replicas", type=int)
@click.option("--wait", "wait_seconds", default=0.0, show_default=True,
              help="Seconds to wait for each started replica's model to be ready (0: return "
                   "at once; a store it cannot reach keeps it unready, `env status` says why).")
def scale_serving_cmd(name: str, home: Path | None, replicas: int, wait_seconds: float) -> None:
    """Scale the model-serving replicas to REPLICAS (2 or 3, docs/serving.md): a new one is
    started and gets predictions only once its model is loaded; exit 1 when one started is
    not ready after --wait."""
    from environments.local.serving_scale import ScaleRefused

    with domain_errors():
        faults = _load(name, home).faults
        try:
            out = faults.scale_serving(replicas)
        except ScaleRefused as exc:
            raise click.BadParameter(str(exc), param_hint="REPLICAS") from exc
        console.print(f"serving replicas {', '.join(out['before'])} -> {', '.join(out['after'])}")
        if not wait_seconds:
            return
        seen = [faults.watch_serving_replica(r, ["ready"], wait_seconds) for r in out["started"]]
    for s in seen:
        console.print(f"  {s['replica']}: {s['state']} ({s['reason']})")
    if not all(s["reached"] for s in seen):
        sys.exit(1)


@env_group.command("backup")
@name_option
@home_option
@click.option("--list", "list_only", is_flag=True, help="List the backups instead of taking one.")
def backup_cmd(name: str, home: Path | None, list_only: bool) -> None:
    """Take a base backup of the control-plane database (pg_basebackup from the leader)."""
    with domain_errors():
        backups = _load(name, home).backups
        if list_only:
            click.echo(json.dumps(backups.list(), indent=2))
            return
        with console.status("pg_basebackup ..."):
            meta = backups.take()
    console.print(f"backup [bold]{meta['id']}[/] in {meta['seconds']} s, {meta['bytes']} bytes; "
                  f"restore point {meta['restore_point']}")
    click.echo(json.dumps(meta))


@env_group.command("restore-db")
@name_option
@home_option
@click.argument("backup", default="latest")
@click.option("--ledger", "ledgers", multiple=True, type=click.Path(dir_okay=False,
              path_type=Path), help="Client ack ledger (JSONL, docs/EVIDENCE.md) whose lost "
              "acknowledged submissions are replayed; repeatable.")
@click.option("--keep-closed", is_flag=True, help="Stop after reconciliation, intake still closed.")
def restore_db_cmd(name: str, home: Path | None, backup: str, ledgers: tuple[Path, ...],
                   keep_closed: bool) -> None:
    """Restore the database from BACKUP (default: latest) in the runbook's order: stop intake
    and writers, restore, migrate, advance fencing, reconcile with object storage and the
    ledgers, re-open, replay lost acknowledged submissions. Data after the restore point is
    lost unless a ledger holds it. Prints the report as JSON."""
    missing = [str(p) for p in ledgers if not p.is_file()]
    if missing:  # checked before anything is stopped
        raise click.BadParameter(f"no such ledger file: {', '.join(missing)}", param_hint="--ledger")
    started = time.monotonic()
    with domain_errors():
        backups = _load(name, home).backups
        report = backups.restore_order(backup, ledgers, reopen=not keep_closed,
                                       reporter=lambda m: console.print(f"  {m}"))
    rec = report["reconciliation"]
    failed = [r for r in report.get("replayed", []) if r["error"]]
    console.print(f"[bold]restored[/] in {time.monotonic() - started:.1f} s: "
                  f"{rec['quarantined_objects']} objects quarantined, {rec['lost_acknowledged']} lost "
                  f"acknowledgements, {len(report.get('replayed', []))} replayed, {len(failed)} failed")
    click.echo(json.dumps(report, indent=2, default=str))
    if failed or not rec["consistent"]:
        sys.exit(1)


@env_group.command("logs")
@name_option
@home_option
@click.argument("component", required=False)
@click.option("--lines", "-l", default=40, show_default=True, help="Lines per component.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines (one component).")
def logs_cmd(name: str, home: Path | None, component: str | None, lines: int, follow: bool) -> None:
    """Show the tail of one component's log, or of all of them."""
    from environments.local.state import tail

    with domain_errors():
        env = _load(name, home)
        names = [component] if component else [*env.components, "supervisor"]
        for comp in names:
            path = env.log_file(comp)
            if component is None and not path.exists():
                continue
            if not path.exists():
                raise click.ClickException(f"no log for {comp!r} at {path}")
            click.echo(f"==> {path} <==")
            click.echo(tail(path, lines))
        if follow:
            if component is None:
                raise click.ClickException("--follow needs one COMPONENT")
            with open(env.log_file(component)) as log:
                log.seek(0, os.SEEK_END)
                while True:
                    line = log.readline()
                    if line:
                        click.echo(line, nl=False)
                    else:
                        time.sleep(0.2)


# -- faults -------------------------------------------------------------------------------------
@click.group("fault")
def fault_group() -> None:
    """Inject and revert faults in a running local environment (recorded in faults.jsonl)."""


def _fault_command(name: str, help_text: str, call: Callable[..., dict[str, Any]],
                   argument: str | None = None, mode_default: str | None = None,
                   extra: tuple[click.Parameter, ...] = ()) -> None:
    params: list[click.Parameter] = []
    if argument:
        params.append(click.Argument([argument]))
    params.extend(extra)
    if mode_default:
        params.append(click.Option(["--mode"], type=click.Choice(["refuse", "blackhole"]),
                                   default=mode_default, show_default=True,
                                   help="refuse: connections reset at once; blackhole: they hang."))

    def callback(env_name: str, home: Path | None, **kwargs: Any) -> None:
        with domain_errors():
            env = _load(env_name, home)
            result = call(env.faults, **kwargs)
        click.echo(json.dumps(result))

    params.append(click.Option(["--name", "-n", "env_name"], default="local", show_default=True,
                               help="Environment name."))
    command = click.Command(name, callback=callback, help=help_text, params=params)
    home_option(command)
    fault_group.add_command(command)


_fault_command("kill", "SIGKILL TARGET and all its child processes (aliases: primary, standby; "
               "'primary/postgres' kills only postgres).", lambda f, target: f.kill(target), "target")
_fault_command("hang", "SIGSTOP every process of TARGET.", lambda f, target: f.hang(target), "target")
_fault_command("resume", "SIGCONT a hung TARGET.", lambda f, target: f.resume(target), "target")
_fault_command("stop", "Stop TARGET gracefully (SIGTERM, then SIGKILL).", lambda f, target: f.stop(target),
               "target")
_fault_command("start", "Start a killed/stopped TARGET again and wait until healthy.",
               lambda f, target: f.start(target), "target")
_fault_command("failover-db", "Fail the database over to the synchronous standby (Patroni); "
               "returns when writes commit again.", lambda f: f.failover_db())
_fault_command("artifact-store-unreachable", "Cut the S3 endpoint off (moto keeps its data).",
               lambda f, mode: f.artifact_store_unreachable(mode), mode_default="blackhole")
_fault_command("artifact-store-restore", "Make the S3 endpoint reachable again.",
               lambda f: f.artifact_store_restore())
_fault_command("registry-unreachable", "Cut the image registry off.",
               lambda f, mode: f.registry_unreachable(mode), mode_default="refuse")
_fault_command("registry-restore", "Make the registry reachable again.", lambda f: f.registry_restore())
_fault_command("withdraw-pool", "Stop every agent of POOL (capacity gone).",
               lambda f, pool: f.withdraw_pool(pool), "pool")
_fault_command("restore-pool", "Start the agents of POOL again.", lambda f, pool: f.restore_pool(pool),
               "pool")
_fault_command("partition-agent", "Cut AGENT off from the control plane (its own proxy route).",
               lambda f, agent, mode: f.partition_agent(agent, mode), "agent", mode_default="blackhole")
_fault_command("heal-agent", "Reconnect a partitioned AGENT.", lambda f, agent: f.heal_agent(agent), "agent")
_fault_command("partition-db", "Cut one API REPLICA off from the database (its own proxy route); "
               "the other replica keeps its connection.",
               lambda f, replica, mode: f.partition_database(replica, mode), "replica",
               mode_default="refuse")
_fault_command("heal-db", "Reconnect an API REPLICA to the database.",
               lambda f, replica: f.heal_database(replica), "replica")

_fault_command("skew-clock", "Step the wall clock of TARGET (an agent or the reconciler) SECONDS "
               "away from the true time (negative: backward). Leases do not use it: see "
               "docs/clock.md.", lambda f, target, seconds: f.skew_clock(target, seconds),
               "target", extra=(click.Argument(["seconds"], type=float),))
_fault_command("restore-clock", "Put TARGET's wall clock back on the true time.",
               lambda f, target: f.restore_clock(target), "target")
_fault_command("zone-outage", "Lose everything in ZONE at once (env.json zones): its fault-proxy "
               "routes, API replica, database member and agents.",
               lambda f, zone, mode: f.zone_outage(zone, mode), "zone", mode_default="blackhole")
_fault_command("restore-zone", "Bring ZONE back: heal its routes, start its database member, "
               "API replica and agents.", lambda f, zone: f.restore_zone(zone), "zone")


def _attributes(pairs: tuple[str, ...]) -> dict[str, float]:
    """``--attr latency=200 --attr jitter=50`` -> {"latency": 200.0, "jitter": 50.0}."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            raise click.BadParameter(f"{pair!r}: expected NAME=NUMBER", param_hint="--attr")
        if not sep or not key.strip():
            raise click.BadParameter(f"{pair!r}: expected NAME=NUMBER", param_hint="--attr")
    return out


_ATTR = click.Option(["--attr", "attrs"], multiple=True, metavar="NAME=NUMBER",
                     help="A toxic attribute (repeatable), e.g. latency=200 jitter=50 (ms), "
                          "rate=64 (KB/s), bytes=1024, timeout=0.")
_fault_command("toxic-add", "Add a gray network fault (a toxic) to every route of TARGET (a route, "
               "or the group 'agents' / 'database'): latency, bandwidth, slicer, limit_data, "
               "reset_peer or timeout (environments/local/toxics.py). It stays until toxic-remove.",
               lambda f, target, toxic_type, toxic_name, stream, toxicity, attrs: f.network.add(
                   target, {"name": toxic_name or f"{toxic_type}_{stream}", "type": toxic_type,
                            "stream": stream, "toxicity": toxicity,
                            "attributes": _attributes(attrs)}),
               "target", extra=(
                   click.Option(["--type", "toxic_type"], required=True,
                                type=click.Choice(["latency", "bandwidth", "slicer", "limit_data",
                                                   "reset_peer", "timeout"])),
                   click.Option(["--toxic", "toxic_name"], default=None,
                                help="Name of the toxic (default: TYPE_STREAM)."),
                   click.Option(["--stream"], type=click.Choice(["upstream", "downstream"]),
                                default="downstream", show_default=True,
                                help="upstream: client to server; downstream: server to client."),
                   click.Option(["--toxicity"], type=click.FloatRange(0, 1), default=1.0,
                                show_default=True, help="Fraction of connections it applies to."),
                   _ATTR))
_fault_command("toxic-change", "Change an active toxic NAME on TARGET in place.",
               lambda f, target, toxic, toxicity, attrs: f.network.update(
                   target, toxic, toxicity=toxicity, attributes=_attributes(attrs)),
               "target", extra=(click.Argument(["toxic"]),
                                click.Option(["--toxicity"], type=click.FloatRange(0, 1)),
                                _ATTR))
_fault_command("toxic-remove", "Remove toxic NAME from every route of TARGET.",
               lambda f, target, toxic: f.network.remove(target, toxic), "target",
               extra=(click.Argument(["toxic"]),))
_fault_command("routes", "List the fault proxy's routes with their mode and toxics.",
               lambda f: {r: f.network.routes_detail()[r] for r in f.network.routes()})


def _brownout(error_rate: float, error_code: str, latency_ms: float, jitter_ms: float,
              bandwidth_kbps: float, methods: str | None) -> dict[str, Any]:
    return {"error_rate": error_rate, "error_code": error_code, "latency_ms": latency_ms,
            "jitter_ms": jitter_ms, "bandwidth_kbps": bandwidth_kbps,
            "methods": [m.strip() for m in methods.split(",")] if methods else None}


_fault_command("s3-brownout", "Brown the S3 store out: answer a share of requests with 503 "
               "SlowDown (or another 5xx), delay answers, cap bandwidth (moto keeps its data). "
               "A second call while active changes it; s3-brownout-end ends it.",
               lambda f, baseline_seconds, **kw: f.store.start(
                   _brownout(**kw), baseline_seconds=baseline_seconds),
               extra=(
                   click.Option(["--error-rate"], type=click.FloatRange(0, 1), default=0.0,
                                show_default=True, help="Share of requests answered an error."),
                   click.Option(["--error-code"], default="SlowDown", show_default=True,
                                type=click.Choice(["SlowDown", "InternalError",
                                                   "ServiceUnavailable"])),
                   click.Option(["--latency-ms"], type=click.FloatRange(0), default=0.0),
                   click.Option(["--jitter-ms"], type=click.FloatRange(0), default=0.0),
                   click.Option(["--bandwidth-kbps"], type=click.FloatRange(0), default=0.0,
                                help="Cap of response bodies in kilobits/s (0: none)."),
                   click.Option(["--methods"], default=None, metavar="PUT,GET",
                                help="Only these HTTP methods (default: all)."),
                   click.Option(["--baseline-seconds"], type=click.FloatRange(0, 60),
                                default=0.0, show_default=True,
                                help="Count the store's requests this long first (the rate "
                                     "the retry-amplification check compares with).")))
_fault_command("s3-brownout-end", "End the S3 brownout (the store answers normally again).",
               lambda f: f.store.end())

_GLOB = click.Option(["--glob"], default=None, metavar="PATTERN",
                     help="Only paths under the data directory matching it, e.g. 'pg_wal/**' "
                          "(* also matches /). Default: every file.")
_fault_command("disk-slow", "Make TARGET's disk (pg-0, pg-1; aliases primary, standby) slow: "
               "every fsync, write or read late by its delay. Needs `env up --storage-faults`; "
               "again while active: the new setting applies.",
               lambda f, target, **kw: f.disks.slow(target, **kw), "target", extra=(
                   click.Option(["--fsync-ms"], type=click.FloatRange(0), default=0.0,
                                help="Added to every fsync/fdatasync (a commit waits for one)."),
                   click.Option(["--write-ms"], type=click.FloatRange(0), default=0.0),
                   click.Option(["--read-ms"], type=click.FloatRange(0), default=0.0),
                   click.Option(["--jitter-ms"], type=click.FloatRange(0), default=0.0,
                                help="Uniform +- around each delay."),
                   _GLOB))
_fault_command("disk-full", "Fill TARGET's disk: ENOSPC on every write, new file and "
               "extension (reads still work). Needs `env up --storage-faults`.",
               lambda f, target, glob: f.disks.full(target, glob=glob), "target",
               extra=(_GLOB,))
_fault_command("disk-errors", "Make TARGET's disk fail: EIO with these probabilities.",
               lambda f, target, **kw: f.disks.errors(target, **kw), "target", extra=(
                   *(click.Option([f"--{op}"], type=click.FloatRange(0, 1), default=0.0,
                                  help=f"Probability of EIO per {op}.")
                     for op in ("read", "write", "fsync")),
                   _GLOB))
_fault_command("disk-clear", "Make TARGET's disk healthy again ('all': every faulted disk).",
               lambda f, target: f.disks.clear(None if target == "all" else target), "target")


def _starve(f: Any, target: str, share: float) -> dict[str, Any]:
    component, _ = f.resolve(target)
    return f.cpu.starve(component, share)


_fault_command("cpu-starve", "Limit every process of TARGET (aliases: primary, standby) to "
               "SHARE of one core (a cgroup CPU quota): up, answering, slow. Again while "
               "active: the new share applies.", _starve, "target",
               extra=(click.Option(["--share"], type=click.FloatRange(0.01, 1.0), default=0.1,
                                   show_default=True, help="Fraction of one core."),))
_fault_command("cpu-restore", "Give TARGET its CPU back.",
               lambda f, target: f.cpu.restore(f.resolve(target)[0]), "target")
_fault_command("mem-squeeze", "Limit every process of TARGET (aliases: primary, standby) to "
               "LIMIT MiB of memory in all (a cgroup memory limit): page cache reclaimed, an "
               "allocation past the limit OOM-killed. Again while active: the new limit applies.",
               lambda f, target, limit_mib: f.memory.squeeze(f.resolve(target)[0], limit_mib),
               "target",
               extra=(click.Option(["--limit-mib"], type=click.FloatRange(MIN_LIMIT_MIB,
                                                                          MAX_LIMIT_MIB),
                                   default=256, show_default=True, help="MiB of memory."),))
_fault_command("mem-release", "Lift TARGET's memory limit.",
               lambda f, target: f.memory.restore(f.resolve(target)[0]), "target")


def _lose_db(f: Any) -> dict[str, Any]:
    return f.backups.lose()


_fault_command("lose-db", "Lose both database members and their data (moved aside): only "
               "`gameday env restore-db` brings the store back.", _lose_db)
_fault_command("restore-all", "Undo every active fault (restart, resume, reconnect).",
               lambda f: {"restored": f.restore_all()})


@fault_group.command("list")
@name_option
@home_option
@click.option("--timeline", is_flag=True, help="Print the whole fault timeline (JSONL).")
def list_cmd(name: str, home: Path | None, timeline: bool) -> None:
    """Show the active faults (and optionally the timeline)."""
    with domain_errors():
        env = _load(name, home)
        if timeline:
            for line in env.faults.timeline.read():
                click.echo(json.dumps(line))
            return
        click.echo(json.dumps(env.faults.active(), indent=2))

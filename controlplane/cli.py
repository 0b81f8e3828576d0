"""`gameday controlplane ...`: the control plane's processes and admin commands."""

from __future__ import annotations

import importlib
import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import click
import yaml

from controlplane.db import DSN_ENV, connect_once, resolve_dsn
from controlplane.models import MAX_BODY_BYTES

dsn_option = click.option("--dsn", envvar=DSN_ENV, help=f"PostgreSQL DSN (or ${DSN_ENV}).")


class _Group(click.Group):
    """Mounts `agent` lazily: it lives in controlplane.agent and pulls in boto3/kubernetes."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), "agent"])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name == "agent":
            return importlib.import_module("controlplane.agent.cli").agent_cmd
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            reason = _database_unreachable(exc)
            if reason is None:
                raise
            raise click.ClickException(
                f"cannot reach the database ({reason}): is it running, and is --dsn (or "
                f"${DSN_ENV}) right?") from exc


def _database_unreachable(exc: BaseException) -> str | None:
    """libpq's first line when ``exc`` is a failed connection (psycopg's own, or wrapped by
    SQLAlchemy in `migrate`), else None: a command then fails in one line, not a traceback."""
    import psycopg

    cause = getattr(exc, "orig", None) or exc
    if not isinstance(cause, psycopg.OperationalError) or cause.sqlstate is not None:
        return None  # a server's answer (sqlstate set) is not about reaching it
    return str(cause).strip().splitlines()[0]


@click.group(cls=_Group)
def group() -> None:
    """The reference ML control plane: API, reconciler, agent, migrations.

    CONTROLPLANE_RELEASE=N|N+1 picks the release every subcommand runs as (default N;
    docs/upgrades.md)."""
    from controlplane import release

    try:
        release.current()
    except release.UnknownRelease as exc:
        raise click.ClickException(str(exc)) from exc


@group.command()
@dsn_option
@click.option("--agent-token-env", "token_envs", multiple=True, metavar="NAME",
              help="Also register the agent token held in environment variable NAME "
              "(idempotent; repeatable). From the environment, never argv: argv is visible "
              "to every process on the node.")
@click.option("--release", "release_name", type=click.Choice(["N", "N+1"]), default=None,
              help="Bring the schema to what this release runs on (default: "
              "CONTROLPLANE_RELEASE, else N). N+1 applies the expand migration.")
@click.option("--allow-downgrade", is_flag=True,
              help="Take a schema newer than RELEASE needs back to it (only once no process of "
              "the newer release runs; docs/upgrades.md).")
def migrate(dsn: str | None, token_envs: tuple[str, ...], release_name: str | None,
            allow_downgrade: bool) -> None:
    """Apply the schema migrations (idempotent; replicas may run it at once)."""
    from controlplane.db import migrate as run_migrate
    from controlplane.store.auth import seed as run_seed

    tokens = []
    for name in token_envs:
        value = os.environ.get(name, "")
        if not value:
            raise click.ClickException(f"--agent-token-env {name}: the variable is unset or empty")
        if len(value) < 16:  # checked before migrating: a refused token changes nothing
            raise click.ClickException(f"--agent-token-env {name}: token too short (at least "
                                       "16 characters)")
        tokens.append(value)
    head = run_migrate(resolve_dsn(dsn), release_name, allow_downgrade=allow_downgrade)
    click.echo(f"schema at revision {head}")
    if tokens:
        with connect_once(resolve_dsn(dsn)) as conn:
            try:
                # queues: [] so no queue is touched (seed's default would reset "default").
                run_seed(conn, {"queues": [], "agent_tokens": tokens})
            except ValueError as exc:
                raise click.ClickException(f"--agent-token-env: {exc}") from exc
        click.echo(f"{len(tokens)} agent token(s) registered")


@group.command()
@dsn_option
@click.option("--file", "path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              required=True, help="YAML/JSON with projects, queues, agent/admin tokens.")
def seed(dsn: str | None, path: Path) -> None:
    """Create projects, queues and tokens (idempotent)."""
    from controlplane.store.auth import seed as run_seed

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise click.ClickException(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise click.ClickException(f"{path}: expected a mapping with projects/queues/tokens")
    unknown = set(data) - {"projects", "queues", "agent_tokens", "admin_tokens"}
    if unknown:
        raise click.ClickException(f"{path}: unknown keys {sorted(unknown)}")
    with connect_once(resolve_dsn(dsn)) as conn:
        try:
            counts = run_seed(conn, data)
        except (KeyError, ValueError) as exc:
            raise click.ClickException(f"{path}: {exc}") from exc
    click.echo(json.dumps(counts))


@group.command()
@dsn_option
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--lease-seconds", default=15.0, show_default=True, type=float,
              help="Attempt lease length granted on claim and renewed by heartbeats.")
@click.option("--retry-base", default=1.0, show_default=True, type=float,
              help="Base of the exponential retry backoff, in seconds.")
@click.option("--pool-max", default=10, show_default=True, type=int,
              help="Max database connections of this replica.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 16),
              help="Worker processes of this replica (one event loop each).")
@click.option("--token-cache-seconds", default=30.0, show_default=True,
              type=click.FloatRange(min=0),
              help="How long a replica trusts a token it looked up: a revoked token stops "
                   "working within this bound (an expired one exactly at its expiry).")
@click.option("--submit-gather-ms", default=5.0, show_default=True,
              type=click.FloatRange(0, 100),
              help="While submissions arrive steadily (600/s or more at 5 ms), gather each "
                   "commit group for up to this long: less CPU per submission, a few ms more "
                   "per answer. 0: commit what is waiting at once.")
@click.option("--max-in-flight", default=128, show_default=True,
              type=click.IntRange(0, 100_000),
              help="User requests (everything but agent calls and health) in flight per "
                   "process; more wait for a slot, then get 503 + Retry-After. 0: admission "
                   "control off (every request admitted, however many wait).")
@click.option("--max-queue-wait-ms", default=100.0, show_default=True,
              type=click.FloatRange(0, 60_000),
              help="How long a user request may wait for a slot while a burst lasts; once the "
                   "queue has not been empty this long, new arrivals wait at most 5 ms.")
@click.option("--agent-max-in-flight", default=1024, show_default=True,
              type=click.IntRange(1, 100_000),
              help="Agent calls in flight per process, in slots of their own (user traffic "
                   "never takes them); one waits for a slot up to a fifth of the lease.")
@click.option("--retry-after-seconds", default=1, show_default=True,
              type=click.IntRange(1, 3600),
              help="The Retry-After (whole seconds) of a request refused for overload.")
@click.option("--max-body-bytes", default=MAX_BODY_BYTES, show_default=True,
              type=click.IntRange(1, 1 << 30),
              help="Largest request body read; a larger one is answered 413 unread.")
@click.option("--log-level", default="INFO", show_default=True)
@click.option("--unsafe-ack-before-commit", is_flag=True, hidden=True,
              envvar="CONTROLPLANE_UNSAFE_ACK_BEFORE_COMMIT",
              help="TEST ONLY: acknowledge submissions before committing them.")
def api(dsn: str | None, host: str, port: int, lease_seconds: float, retry_base: float,
        pool_max: int, workers: int, token_cache_seconds: float, submit_gather_ms: float,
        max_in_flight: int, max_queue_wait_ms: float, agent_max_in_flight: int,
        retry_after_seconds: int, max_body_bytes: int, log_level: str,
        unsafe_ack_before_commit: bool) -> None:
    """Run one API replica (uvicorn)."""
    import dataclasses
    import os

    import uvicorn

    from controlplane import logs
    from controlplane.api.app import SETTINGS_ENV, Settings

    logs.setup(log_level)
    settings = Settings(dsn=resolve_dsn(dsn), lease_seconds=lease_seconds,
                        heartbeat_seconds=max(0.5, lease_seconds / 3),
                        retry_base_seconds=retry_base, pool_max=pool_max,
                        token_cache_seconds=token_cache_seconds,
                        submit_gather_ms=submit_gather_ms, max_in_flight=max_in_flight,
                        max_queue_wait_ms=max_queue_wait_ms,
                        agent_max_in_flight=agent_max_in_flight,
                        retry_after_seconds=retry_after_seconds,
                        max_body_bytes=max_body_bytes,
                        unsafe_ack_before_commit=unsafe_ack_before_commit)
    # worker processes rebuild the app from the environment (uvicorn imports a factory)
    os.environ[SETTINGS_ENV] = json.dumps(dataclasses.asdict(settings))
    os.environ["CONTROLPLANE_LOG_LEVEL"] = log_level
    options: dict[str, Any] = {
        "factory": True, "host": host, "port": port, "workers": workers, "log_config": None,
        "access_log": False, "loop": "uvloop", "timeout_graceful_shutdown": 5,
        # httptools, with a small answer's head and body in one write (api/joined_writes.py)
        "http": "controlplane.api.joined_writes:JoinedWritesProtocol"}
    if workers > 1:  # uvicorn's supervisor makes its own servers
        uvicorn.run("controlplane.api.app:app_from_env", **options)
        return
    from controlplane.api.server import QuietServer

    server = QuietServer(uvicorn.Config("controlplane.api.app:app_from_env", **options))
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:
        sys.exit(3)  # uvicorn.run's exit status when the app could not start


@group.command()
@dsn_option
@click.option("--metrics-host", default="127.0.0.1", show_default=True)
@click.option("--metrics-port", default=0, type=int,
              help="Serve /metrics, /healthz and /readyz here (0 = off).")
@click.option("--interval", default=0.5, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds between passes while work is open (NOTIFY wakes a pass sooner).")
@click.option("--idle-interval", default=2.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="Seconds between passes while no work is open and LISTEN is up: new work "
                   "arrives with a NOTIFY, and nothing else is timed then.")
@click.option("--stall-seconds", default=None, type=click.FloatRange(min=0, min_open=True),
              help="/healthz fails when the loop has not iterated this long, and /readyz when "
                   "no database round trip succeeded this long [default: max(10, 20 x interval, 5 x idle-interval)].")
@click.option("--agent-timeout", default=15.0, show_default=True, type=float,
              help="Seconds without heartbeat after which an agent gets no new work.")
@click.option("--lease-seconds", default=15.0, show_default=True, type=float,
              help="Time an agent has to claim a dispatched attempt.")
@click.option("--retry-base", default=1.0, show_default=True, type=float)
@click.option("--progress-stale-seconds", default=60.0, show_default=True, type=float)
@click.option("--log-level", default="INFO", show_default=True)
def reconciler(dsn: str | None, metrics_host: str, metrics_port: int, interval: float,
               idle_interval: float, stall_seconds: float | None, agent_timeout: float, lease_seconds: float,
               retry_base: float, progress_stale_seconds: float, log_level: str) -> None:
    """Run the reconciler (routing, lease expiry, retries, timeouts)."""
    from controlplane import health, logs
    from controlplane.reconciler import ReconcilerSettings, run

    logs.setup(log_level)
    settings = ReconcilerSettings(dsn=resolve_dsn(dsn), interval=interval,
                                  idle_interval=idle_interval,
                                  agent_timeout=agent_timeout, lease_seconds=lease_seconds,
                                  retry_base=retry_base,
                                  progress_stale_seconds=progress_stale_seconds,
                                  stall_seconds=stall_seconds)
    state = health.ReconcilerHealth(settings.stall_bound)
    if metrics_port:
        health.serve(state, metrics_host, metrics_port)
    run(settings, state)


@group.group()
def token() -> None:
    """Issue, list and revoke API tokens (each has an expiry; a revoked one is refused)."""


def _parse_ttl(value: str) -> timedelta:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        seconds = float(value[:-1]) * units[value[-1]] if value[-1:] in units else float(value)
    except (ValueError, IndexError):
        raise click.BadParameter(f"{value!r}: expected e.g. 90s, 12h, 30d",
                                 param_hint="--ttl") from None
    if seconds <= 0:
        raise click.BadParameter(f"{value!r}: must be positive", param_hint="--ttl")
    return timedelta(seconds=seconds)


@token.command("issue")
@dsn_option
@click.option("--role", type=click.Choice(["user", "agent", "admin"]), required=True,
              help="user = a project's token (needs --project).")
@click.option("--project", default=None, help="The project of a user token.")
@click.option("--ttl", default="30d", show_default=True, help="Validity: 90s, 12h, 30d ...")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Write the token here (mode 0600, replaced atomically: a reader sees the "
                   "old token or the new one, never half). It is never printed: stdout ends "
                   "up in logs.")
def token_issue(dsn: str | None, role: str, project: str | None, ttl: str, out: Path) -> None:
    """Issue a new token; print its id and expiry (JSON), write the token to --out."""
    from controlplane.store.auth import issue

    with connect_once(resolve_dsn(dsn)) as conn:
        try:
            value, row = issue(conn, role, project=project, ttl=_parse_ttl(ttl))
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
    write_secret_file(out, value)
    click.echo(json.dumps(row))


@token.command("revoke")
@dsn_option
@click.option("--id", "token_id", default=None, help="The token's id (`token list`).")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Revoke the token held in this file.")
def token_revoke(dsn: str | None, token_id: str | None, token_file: Path | None) -> None:
    """Revoke a token now; every API replica refuses it within its --token-cache-seconds."""
    from controlplane.store.auth import revoke

    held = token_file.read_text().strip() if token_file else None
    with connect_once(resolve_dsn(dsn)) as conn:
        try:
            ids = revoke(conn, token_id_prefix=token_id, token=held)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
    if not ids:
        raise click.ClickException(f"no valid token {'in ' + str(token_file) if token_file else token_id}"
                                   " (unknown or already revoked)")
    click.echo(json.dumps({"revoked": ids}))


@token.command("list")
@dsn_option
def token_list(dsn: str | None) -> None:
    """Every token: id, role, project, created, expires, revoked, status (never the token)."""
    from controlplane.store.auth import list_tokens

    with connect_once(resolve_dsn(dsn)) as conn:
        for row in list_tokens(conn):
            click.echo(json.dumps(row))


def write_secret_file(path: Path, value: str) -> None:
    """Write ``value`` to ``path`` with mode 0600, atomically (rename over the old file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    os.replace(tmp, path)

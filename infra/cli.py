"""`gameday infra`: commands about the Pulumi stacks (drift)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

REPO = Path(__file__).resolve().parents[1]
EXIT_DRIFT = 3  # distinct from click's 1 (error) and 2 (usage)


@click.group("infra")
def infra_group() -> None:
    """Commands about the Pulumi stacks (dev, staging, prod)."""


def _lock(target: Path | None, env: str, lock_file: Path | None) -> Any:
    # The environment is the stack (dev / staging / prod), as in `gameday run --env`.
    """The game-day lock of the environment: held while the preview runs, so a game day's
    injected faults are never reported as drift (and none starts meanwhile)."""
    if target is not None:
        from infra.cloud.env import CloudEnvError, CloudEnvironment

        try:
            return CloudEnvironment.from_target(target, env).lock("gameday-infra-drift")
        except CloudEnvError as exc:
            raise click.ClickException(str(exc)) from exc
    from infra.schedule import GameDayLock

    assert lock_file is not None
    return GameDayLock(lock_file)


@infra_group.command("drift")
@click.option("--stack", required=True, help="Pulumi stack (dev, staging, prod).")
@click.option("--target", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="The environment's cloud target file: its game-day Lease is taken for the "
              "preview (refused while a game day holds it).")
@click.option("--lock-file", type=click.Path(path_type=Path, dir_okay=False),
              help="A game-day lock file instead of the cluster Lease.")
@click.option("--no-lock", is_flag=True,
              help="Do not take the game-day lock (a running game day's faults would show as "
              "drift).")
@click.option("--events", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="Classify a recorded engine event log (`pulumi preview --refresh "
              "--event-log FILE`) instead of running the preview.")
@click.option("--work-dir", type=click.Path(path_type=Path, file_okay=False, exists=True),
              default=REPO, show_default=True, help="Directory holding Pulumi.yaml.")
@click.option("--json-out", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the verdicts as JSON here.")
def drift_cmd(stack: str, target: Path | None, lock_file: Path | None, no_lock: bool,
              events: Path | None, work_dir: Path, json_out: Path | None) -> None:
    """Refresh and preview STACK expecting no changes, and classify each difference as
    restore (`pulumi up` fixes it), import (a same-named resource exists) or investigate
    (data or security at stake). Exit 0 no drift, 3 drift, 1 error."""
    from infra import drift

    if events is not None:
        try:
            recorded = drift.load_event_log(events)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
        _report(drift.summary(drift.classify(recorded)), stack, json_out)
        return
    if not (target or lock_file or no_lock):
        raise click.UsageError("give --target (the cluster's game-day Lease) or --lock-file, "
                               "or --no-lock to preview without the game-day lock")
    lock = None if no_lock else _lock(target, stack, lock_file)
    if lock is not None:
        from infra.schedule import ScheduleError

        try:
            lock.acquire({"purpose": "infra drift", "stack": stack})
        except ScheduleError as exc:
            raise click.ClickException(f"refused: {exc}") from exc
    else:
        click.echo("warning: no game-day lock taken", err=True)
    try:
        click.echo(f"refreshing and previewing stack {stack} (pulumi, Automation API) ...",
                   err=True)
        found = drift.run_preview(stack, work_dir)
    except Exception as exc:  # the CLI or the backend: say what failed and stop
        raise click.ClickException(f"preview of stack {stack} failed: {exc}") from exc
    finally:
        if lock is not None:
            lock.release()
    _report(drift.summary(drift.classify(found)), stack, json_out)


def _report(result: dict[str, Any], stack: str, json_out: Path | None) -> None:
    if json_out is not None:
        json_out.write_text(json.dumps({"stack": stack, **result}, indent=2) + "\n")
    if not result["drifted"]:
        click.echo(f"stack {stack}: no drift")
        return
    for item in result["items"]:
        name = item["urn"].rsplit("::", 1)[-1]
        click.echo(f"{item['verdict']:<12} {item['op']:<8} {item['type']} {name}: {item['reason']}")
    counts = ", ".join(f"{n} {v}" for v, n in result["counts"].items() if n)
    click.echo(f"stack {stack}: drift ({counts}); worst: {result['worst']}")
    sys.exit(EXIT_DRIFT)


@infra_group.command("kube-token")
@click.option("--cluster", required=True, help="EKS cluster name.")
@click.option("--region", required=True, help="AWS region of the cluster.")
def kube_token_cmd(cluster: str, region: str) -> None:
    """Print an ExecCredential with an EKS token signed by your AWS credentials: the
    kubeconfig the application stack builds calls this instead of the `aws` CLI."""
    from infra.cloud.eks_token import TokenError, eks_token, exec_credential

    try:
        click.echo(json.dumps(exec_credential(eks_token(cluster, region))))
    except TokenError as exc:
        raise click.ClickException(str(exc)) from exc

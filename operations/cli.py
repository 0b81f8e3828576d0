"""`gameday infra`: commands about the Pulumi stacks (drift; image build and deploy through
the in-VPC deploy runner)."""

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
    """The Pulumi stacks: platform (dev, staging, prod) and application (<env>-app)."""


def _lock(target: Path | None, env: str, lock_file: Path | None) -> Any:
    # The environment is the stack (dev / staging / prod), as in `gameday run --env`.
    """The game-day lock of the environment: held while the preview runs, so a game day's
    injected faults are never reported as drift (and none starts meanwhile)."""
    if target is not None:
        from environments.cloud.env import CloudEnvError, CloudEnvironment

        try:
            return CloudEnvironment.from_target(target, env).lock("gameday-infra-drift")
        except CloudEnvError as exc:
            raise click.ClickException(str(exc)) from exc
    from environments.schedule import GameDayLock

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
    from operations import drift

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
        from environments.schedule import ScheduleError

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


# --- the in-VPC deploy path (operations/deploy.py, provisioning/components/deploy_runner.py) -------------

def _runner(stack: str, outputs: Path | None, work_dir: Path, need_runner: bool = True) -> Any:
    from operations import deploy

    try:
        if outputs is not None:
            return deploy.Runner.from_outputs(deploy.load_outputs_file(outputs), stack,
                                              str(outputs), need_runner)
        click.echo(f"reading the outputs of stack {stack} (pulumi, Automation API) ...", err=True)
        try:
            found = deploy.automation_outputs(stack, work_dir)
        except Exception as exc:  # the CLI or the backend: say what failed and stop
            raise deploy.DeployError(f"reading the outputs of stack {stack} failed: {exc}; or "
                                     "give --outputs FILE (pulumi stack output --json)") from exc
        return deploy.Runner.from_outputs(found, stack, f"stack {stack} outputs", need_runner)
    except deploy.DeployError as exc:
        raise click.ClickException(str(exc)) from exc


def _session(region: str | None) -> Any:
    import boto3

    return boto3.session.Session(region_name=region)


_STACK = click.option("--stack", required=True,
                      help="Platform stack (dev, staging, prod): where the deploy runner lives.")
_OUTPUTS = click.option(
    "--outputs", type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="The platform stack's outputs as JSON (`pulumi stack output --json -s STACK > FILE`) "
    "instead of reading them through the Automation API.")
_DIRTY = click.option("--allow-dirty", is_flag=True,
                      help="Build uncommitted changes to tracked files too (refused otherwise).")
_POLL = click.option("--poll-seconds", type=click.FloatRange(min=0), default=15.0,
                     show_default=True, help="How often to ask CodeBuild for the build's phase.")
_WORK_DIR = click.option("--work-dir", type=click.Path(path_type=Path, file_okay=False, exists=True),
                         default=REPO, show_default=True,
                         help="The checkout: Pulumi.yaml, the Dockerfile, the stacks' config.")


@infra_group.command("image")
@_STACK
@_OUTPUTS
@click.option("--set-config/--no-set-config", default=True, show_default=True,
              help="Write the digests to the application stack's config "
              "(mlplatform:images.controlplane / .gameday / .serving / .tracking) through the "
              "Automation API.")
@click.option("--local", is_flag=True,
              help="Build and push with the local Docker engine instead of CodeBuild.")
@_DIRTY
@_POLL
@_WORK_DIR
def image_cmd(stack: str, outputs: Path | None, set_config: bool, local: bool, allow_dirty: bool,
              poll_seconds: float, work_dir: Path) -> None:
    """Build the images of this checkout (controlplane; gameday, serving, tracking where the
    stack has their repositories and runs them), push them to the stack's ECR repositories and
    print their digests. By default in the stack's CodeBuild project
    inside the VPC (the checkout is uploaded as a git archive); exit 0 on success, 1 otherwise."""
    from datetime import UTC, datetime

    from operations import deploy

    runner = _runner(stack, outputs, work_dir, need_runner=not local)
    session = _session(runner.region)
    try:
        if local:
            commit, dirty = deploy.check_clean(work_dir, allow_dirty)
            tag = f"{commit}{'-dirty' if dirty else ''}-local-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
            targets = deploy.stack_targets(work_dir, stack)
            digests = deploy.local_build(runner.repositories, tag, work_dir,
                                         deploy.ecr_password(session), click.echo, targets=targets)
        else:
            source = deploy.package_source(work_dir, allow_dirty)
            build = deploy.run_build(session, runner, runner.image_project, stack, source, {},
                                     click.echo, poll_seconds)
            digests = deploy.exported_digests(build)
    except deploy.DeployError as exc:
        raise click.ClickException(str(exc)) from exc
    for name, digest in sorted(digests.items()):
        click.echo(f"{name}: {digest}")
    if set_config:
        click.echo(f"setting {deploy.CONFIG_KEY}.* on stack {runner.app_stack} (Automation API)",
                   err=True)
        try:
            deploy.set_app_images(runner.app_stack, digests, work_dir)
        except Exception as exc:
            raise click.ClickException(
                f"the images are pushed, but setting the config of {runner.app_stack} failed: "
                f"{exc}; set it by hand: " + "; ".join(
                    f"pulumi config set --path '{deploy.CONFIG_KEY}.{n}' {d} -s {runner.app_stack}"
                    for n, d in sorted(digests.items()))) from exc


@infra_group.command("deploy")
@_STACK
@_OUTPUTS
@click.option("--image-digest", "image_digests", multiple=True, metavar="NAME=sha256:...",
              help="Image digest to deploy (controlplane, gameday, serving, tracking); repeatable. "
              "Default: the application stack's config (what `gameday infra image` set).")
@_DIRTY
@_POLL
@_WORK_DIR
def deploy_cmd(stack: str, outputs: Path | None, image_digests: tuple[str, ...], allow_dirty: bool,
               poll_seconds: float, work_dir: Path) -> None:
    """Run `pulumi up` of the application stack (<stack>-app) in the stack's CodeBuild deploy
    project inside the VPC, on an upload of this checkout, with the image digests. Exit 0 when
    the update succeeded, 1 otherwise."""
    from operations import deploy

    runner = _runner(stack, outputs, work_dir)
    try:
        if image_digests:
            pairs = dict(item.partition("=")[::2] for item in image_digests)
            digests = deploy.parse_digests(pairs, "--image-digest")
        else:
            digests = deploy.read_app_images(runner.app_stack, work_dir)
        for name, digest in sorted(digests.items()):
            click.echo(f"{name}: {digest}")
        source = deploy.package_source(work_dir, allow_dirty)
        deploy.run_build(_session(runner.region), runner, runner.deploy_project, stack, source,
                         {deploy.DIGEST_VARIABLES[n]: d for n, d in digests.items()},
                         click.echo, poll_seconds)
    except deploy.DeployError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"stack {runner.app_stack}: deployed")


@infra_group.command("kube-token")
@click.option("--cluster", required=True, help="EKS cluster name.")
@click.option("--region", required=True, help="AWS region of the cluster.")
def kube_token_cmd(cluster: str, region: str) -> None:
    """Print an ExecCredential with an EKS token signed by your AWS credentials: the
    kubeconfig the application stack builds calls this instead of the `aws` CLI."""
    from environments.cloud.eks_token import TokenError, eks_token, exec_credential

    try:
        click.echo(json.dumps(exec_credential(eks_token(cluster, region))))
    except TokenError as exc:
        raise click.ClickException(str(exc)) from exc


@infra_group.command("waste")
@click.option("--stack", help="Look only at resources tagged project=PROJECT, stack=STACK "
              "(dev, staging, prod) and at the stack's VPC.")
@click.option("--all-stacks", is_flag=True, help="Look at every resource of the region.")
@click.option("--project", default="mlplatform", show_default=True, help="The project tag.")
@click.option("--region", help="AWS region (default: the session's, AWS_REGION).")
@click.option("--min-age-days", type=click.FloatRange(min=0), default=7.0, show_default=True,
              help="Unattached volumes, snapshots and stopped instances younger than this are "
              "not waste.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option("--apply", is_flag=True, help="Delete the cleanup list (resources tagged "
              "lifecycle=temporary of a deletable kind); default: dry run.")
@click.option("--allow-prod", is_flag=True, help="Let --apply delete in a prod stack.")
def waste_cmd(stack: str | None, all_stacks: bool, project: str, region: str | None,
              min_age_days: float, as_json: bool, apply: bool, allow_prod: bool) -> None:
    """Find waste (unattached volumes, old snapshots, stopped instances, idle load balancers,
    untagged VPC resources, log groups without retention, alarms without actions, topics
    without subscriptions), each with owner and age. Only resources tagged
    lifecycle=temporary are proposed for deletion; the rest is a review list. Exit 0 no
    waste, 3 waste found, 1 error (docs/waste.md)."""
    from environments.cloud.aws import BOTO_CONFIG
    from operations import waste

    if bool(stack) == all_stacks:
        raise click.UsageError("give exactly one of --stack NAME or --all-stacks")
    if apply and stack and stack.split("-")[0] == "prod" and not allow_prod:
        raise click.ClickException(f"refused: --apply on stack {stack} (prod); give --allow-prod")
    scope = waste.Scope(project, stack, min_age_days)
    session = _session(region)

    def progress(msg: str) -> None:
        click.echo(msg, err=True)

    try:
        found = waste.find_all(session, scope, BOTO_CONFIG, progress=progress)
        deleted = (waste.apply_cleanup(session, found, allow_prod, BOTO_CONFIG, progress)
                   if apply else [])
    except waste.WasteError as exc:
        raise click.ClickException(str(exc)) from exc
    where = f"stack {stack}" if stack else "all stacks"
    if as_json:
        click.echo(json.dumps({"scope": where, "region": session.region_name,
                               "findings": [f.to_json() for f in found],
                               "applied": apply,
                               "deleted": [f.resource for f in deleted]}, indent=2))
    else:
        rows = [(f.kind.value, f.resource, f.owner, f.age, f.reason,
                 "deleted" if f in deleted else f.action.value) for f in found]
        if rows:
            head = ("KIND", "ID", "OWNER", "AGE", "REASON", "ACTION")
            widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
            for row in [head, *rows]:
                click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False))
                           + "  " + row[5])
        cleanup = [f for f in found if f.action is waste.Action.DELETE]
        verb = "deleted" if apply else "would delete (dry run; --apply to delete)"
        click.echo(f"{where} in {session.region_name}: {len(found)} finding(s), "
                   f"{len(found) - len(cleanup)} to review, {len(cleanup)} cleanup; "
                   f"{verb}: {', '.join(f.resource for f in (deleted if apply else cleanup)) or '-'}")
    if found:
        sys.exit(EXIT_DRIFT)


@infra_group.command("inventory")
@click.option("--stack", required=True, help="Platform stack (dev, staging, prod; Pulumi.<stack>.yaml): "
              "both layers of its environment are listed (the application stack <stack>-app too).")
@click.option("--json", "as_json", is_flag=True, help="Print the inventory as JSON.")
@click.option("--live", is_flag=True, help="Also read the account (Resource Groups Tagging API, "
              "EC2/S3/ECR/RDS/EKS describe calls) and report undeclared, missing and untagged "
              "resources.")
@click.option("--endpoint-url", help="AWS endpoint for --live (e.g. a moto server); default: "
              "the SDK's (AWS_ENDPOINT_URL or AWS).")
@click.option("--region", help="AWS region for --live (default: the session's, AWS_REGION).")
def inventory_cmd(stack: str, as_json: bool, live: bool, endpoint_url: str | None,
                  region: str | None) -> None:
    """List every resource the Pulumi program declares for STACK's environment (rendered
    offline, no cloud access) with environment, region, owner, data class, availability
    objective, cost center, provisioning source and retirement condition. With --live,
    compare with the account: exit 0 when it matches, 3 when undeclared, missing or
    untagged resources were found, 1 on error (docs/inventory.md)."""
    from operations import inventory
    from provisioning.config import PROJECT
    from provisioning.render import RenderError, render

    click.echo(f"rendering stack {stack} and its application stack offline (Pulumi mocks) ...",
               err=True)
    try:
        rendered = render(stack)
    except RenderError as exc:
        raise click.ClickException(str(exc)) from exc
    rows = inventory.declared_rows(rendered)
    comparison = None
    if live:
        from environments.cloud.aws import BOTO_CONFIG
        from operations.tagged import TaggedError
        from operations.waste import WasteError

        try:
            comparison = inventory.compare(
                rows, _session(region), PROJECT, [rendered.stack, rendered.app_stack],
                BOTO_CONFIG, endpoint_url, progress=lambda msg: click.echo(msg, err=True))
        except (TaggedError, WasteError) as exc:
            raise click.ClickException(str(exc)) from exc
    if as_json:
        out: dict[str, Any] = {"stack": rendered.stack, "app_stack": rendered.app_stack,
                               "resources": [r.to_json() for r in rows]}
        if comparison is not None:
            out["live"] = comparison.to_json()
        click.echo(json.dumps(out, indent=2))
    else:
        _inventory_table(rendered.stack, rows, comparison)
    if comparison is not None and not comparison.clean:
        sys.exit(EXIT_DRIFT)


def _inventory_table(stack: str, rows: list[Any], comparison: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    from operations.inventory import FIELDS

    console = Console()
    table = Table(title=f"stack {stack}: {len(rows)} declared resources", show_lines=False)
    for name in FIELDS:
        table.add_column(name.replace("_", " ").upper(), overflow="fold")
    for row in rows:
        table.add_row(*[("yes" if getattr(row, f) else "no (stack defaults)")
                        if f == "tagged" else str(getattr(row, f)) or "-" for f in FIELDS])
    console.print(table)
    if comparison is None:
        return
    live = Table(title=f"live, {comparison.region}: {comparison.matched} matched, "
                       f"{comparison.not_checked} declared not checkable here")
    for name in ("FINDING", "KIND", "RESOURCE", "REASON"):
        live.add_column(name, overflow="fold")
    for item in comparison.undeclared:
        live.add_row("undeclared", item.kind, item.arn, item.reason)
    for row in comparison.missing:
        live.add_row("missing", row.type, row.name, f"declared in {row.stack}, not found")
    for item in comparison.untagged:
        live.add_row("untagged", item.kind, item.arn, item.reason)
    for item in comparison.attributed:
        live.add_row("attributed", item.kind, item.arn, item.reason)
    console.print(live)
    click.echo(f"stack {stack} in {comparison.region}: {len(comparison.undeclared)} undeclared, "
               f"{len(comparison.missing)} missing, {len(comparison.untagged)} untagged, "
               f"{len(comparison.attributed)} attributed")


@infra_group.command("decommission")
@click.option("--stack", required=True, help="Platform stack to retire (Pulumi.<stack>.yaml in "
              "--work-dir: its environment, region and tags).")
@click.option("--dry-run", is_flag=True, help="Print what each step would do; change nothing.")
@click.option("--allow-prod", is_flag=True, help="Let it retire a stack whose environment is prod.")
@click.option("--evidence-dir", type=click.Path(path_type=Path, file_okay=False),
              help="Where the evidence, its manifest and the decommission report go (new or "
              "empty). Default: ./decommission-<stack>-<UTC time>.")
@click.option("--endpoint-url", help="AWS endpoint for every call (a moto server, a proxy).")
@click.option("--region", help="AWS region (default: the stack's aws:region).")
@click.option("--yes", is_flag=True, help="Do not ask before changing the account.")
@click.option("--retain-days", type=int, default=365, show_default=True,
              help="Retention set on the stack's log groups and buckets (a CloudWatch Logs "
              "retention value: 1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, ...).")
@click.option("--artifact-bucket", help="The bucket holding gameday-archive/ (default: the one "
              "tagged with the stack and Name=<project>-<stack>-artifacts-bucket).")
@click.option("--verify-only", is_flag=True, help="Only the last step: list what is left (after "
              "`pulumi destroy`).")
@_WORK_DIR
def decommission_cmd(stack: str, dry_run: bool, allow_prod: bool, evidence_dir: Path | None,
                     endpoint_url: str | None, region: str | None, yes: bool, retain_days: int,
                     artifact_bucket: str | None, verify_only: bool, work_dir: Path) -> None:
    """Retire STACK's AWS resources in order: (1) export evidence (gameday-archive/ of the
    artifact bucket, the database's restore points) with a manifest, (2) revoke identities,
    (3) remove network routes, NAT gateways and their addresses, internet gateway
    attachments, VPC endpoints, (4) set retention on what is kept, (5) delete temporary data
    (lifecycle=temporary), (6) verify that nothing billable with the stack's tags is left.
    Exit 0 nothing left, 3 survivors (each listed), 1 error or refused (docs/decommission.md)."""
    from datetime import UTC, datetime

    from environments.cloud.aws import BOTO_CONFIG
    from operations import decommission

    try:
        target = decommission.resolve_stack(stack, work_dir)
    except decommission.DecommissionError as exc:
        raise click.ClickException(str(exc)) from exc
    if target.prod and not allow_prod:
        raise click.ClickException(
            f"refused: stack {stack} is environment prod ({target.source}: "
            "mlplatform:environment); give --allow-prod to retire it")
    if region:
        target = decommission.Target(target.stack, target.environment, target.project, region,
                                     target.source)
    evidence_dir = evidence_dir or Path(f"decommission-{stack}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}")
    if evidence_dir.exists() and any(evidence_dir.iterdir()):
        raise click.ClickException(f"--evidence-dir {evidence_dir} is not empty: give a new "
                                   "directory (each run keeps its own record)")
    if not (dry_run or verify_only or yes):
        click.confirm(f"retire stack {stack} (environment {target.environment}) in "
                      f"{target.region}: revoke its identities, remove its routes, delete its "
                      "temporary data?", abort=True)
    try:
        run = decommission.Decommission(
            _session(target.region), target, evidence_dir, dry_run=dry_run,
            retain_days=retain_days, endpoint_url=endpoint_url, config=BOTO_CONFIG,
            artifact_bucket=artifact_bucket, echo=click.echo)
        survivors = run.run(verify_only=verify_only)
    except decommission.DecommissionError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"report: {run.report_path}")
    if survivors:
        sys.exit(EXIT_DRIFT)

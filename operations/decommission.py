"""Retiring one environment's AWS resources in order, then verifying nothing billable is left.

The order (:data:`STEPS`) is the point: evidence is exported while it can still be read;
identities are revoked before anything else changes, so nothing writes or launches meanwhile;
routes go before the NAT gateways they point at, the NAT gateways before their addresses, the
addresses before the internet gateway is detached; retention is set on what is kept; only
then is temporary data deleted (as :mod:`operations.waste` decides cleanups); and the last step
lists every billable resource still carrying the stack's tags.

Each step first *plans* (describe calls only) a list of :class:`Change` s, then applies them
one by one unless it is a dry run. The decommission report (``decommission-report.json`` in
the evidence directory) is rewritten after every step and when a step fails, so a crash
keeps the record so far. The database, the cluster and the buckets themselves are not
deleted here: that is ``pulumi destroy`` (docs/decommission.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from botocore.exceptions import BotoCoreError, ClientError

from operations.tagged import call, pages
from operations.waste import (
    Action,
    Scope,
    WasteError,
    apply_cleanup,
    find_all,
    log_groups_without_retention,
    stack_vpcs,
    tag_dict,
    tagged_load_balancers,
)
from provisioning.components.common import GAME_DAY_ARCHIVE_PREFIX

__all__ = ["REPORT_NAME", "STEPS", "Change", "Decommission", "DecommissionError", "Survivor",
           "Target", "resolve_stack"]

REPORT_NAME = "decommission-report.json"
MANIFEST_NAME = "manifest.json"
RDS_EVIDENCE_NAME = "rds-restore-points.json"
LIFECYCLE_RULE_ID = "decommission-expire"
# CloudWatch Logs accepts only these retention periods (PutRetentionPolicy).
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096,
                      1827, 2192, 2557, 2922, 3288, 3653)


class DecommissionError(Exception):
    """The decommission was refused or a step failed (names the stack file, field or API
    call)."""


def _pages(client: Any, operation: str, key: str, **kwargs: Any) -> Any:
    return pages(client, operation, key, DecommissionError, **kwargs)


def _call(client: Any, operation: str, **kwargs: Any) -> dict[str, Any]:
    return call(client, operation, DecommissionError, **kwargs)


# --- the stack: Pulumi.<stack>.yaml ---------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """The stack to retire, as its config file declares it."""

    stack: str
    environment: str
    project: str
    region: str
    source: str

    @property
    def prod(self) -> bool:
        return self.environment == "prod"

    @property
    def scope(self) -> Scope:
        return Scope(self.project, self.stack, min_age_days=0.0)

    @property
    def artifact_bucket_name_tag(self) -> str:
        # ArtifactStore(f"{prefix}-artifacts") -> _SecureBucket(f"{name}-bucket") tags Name
        # with its resource name (provisioning/layers/platform.py, provisioning/components/artifacts.py).
        return f"{self.project}-{self.stack}-artifacts-bucket"


def resolve_stack(stack: str, work_dir: Path) -> Target:
    """Read ``Pulumi.<stack>.yaml`` in work_dir: the environment (``mlplatform:environment``),
    the tags every resource carries (``aws:defaultTags.tags``) and the region."""
    path = work_dir / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        known = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in work_dir.glob("Pulumi.*.yaml"))
        raise DecommissionError(f"{path}: no such stack file; stacks here: "
                                f"{', '.join(known) or 'none'}")
    try:
        config = (yaml.safe_load(path.read_text()) or {}).get("config") or {}
    except yaml.YAMLError as exc:
        raise DecommissionError(f"{path}: not YAML: {exc}") from exc
    if config.get("mlplatform:layer") == "application":
        raise DecommissionError(
            f"{path.name}: stack {stack} is an application stack (mlplatform:layer: "
            "application): it owns no AWS resources; retire its platform stack "
            f"{config.get('mlplatform:platformStack')!r} instead")
    tags = ((config.get("aws:defaultTags") or {}).get("tags") or {})
    missing = [k for k in ("project", "stack", "environment") if not tags.get(k)]
    if missing:
        raise DecommissionError(f"{path.name}: aws:defaultTags.tags lacks "
                                f"{', '.join(missing)}: the resources to retire are found by "
                                "their project and stack tags")
    if tags["stack"] != stack:
        raise DecommissionError(f"{path.name}: aws:defaultTags.tags.stack is "
                                f"{tags['stack']!r}, expected {stack!r}")
    environment = str(config.get("mlplatform:environment") or tags["environment"])
    if environment != tags["environment"]:
        raise DecommissionError(f"{path.name}: mlplatform:environment is {environment!r} but "
                                f"aws:defaultTags.tags.environment is {tags['environment']!r}")
    region = config.get("aws:region")
    if not region:
        raise DecommissionError(f"{path.name}: aws:region is not set")
    return Target(stack, environment, str(tags["project"]), str(region), path.name)


# --- plans: changes and survivors -----------------------------------------------------------

@dataclass
class Change:
    """One thing a step does: ``verb resource (detail)``; ``run`` does it. ``removes`` names
    the billable resource it makes go away (a dry run predicts the survivors with it)."""

    verb: str
    resource: str
    detail: str = ""
    run: Callable[[], Any] | None = field(default=None, repr=False, compare=False)
    removes: str | None = None

    def line(self, dry_run: bool) -> str:
        text = f"{'would ' if dry_run else ''}{self.verb} {self.resource}"
        return f"{text} ({self.detail})" if self.detail else text

    def to_json(self) -> dict[str, Any]:
        return {"verb": self.verb, "resource": self.resource, "detail": self.detail}


@dataclass(frozen=True)
class Survivor:
    kind: str
    resource: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "resource": self.resource, "detail": self.detail}


class Status(str, Enum):
    PLANNED = "planned"      # dry run: the changes were printed, none made
    DONE = "done"
    FAILED = "failed"
    NOT_RUN = "not-run"      # an earlier step failed
    SKIPPED = "skipped"      # --verify-only


class _Endpoint:
    """A boto3 session whose clients talk to one endpoint (moto, a VPC endpoint) with one
    config; what :func:`operations.waste.find_all` needs of a session."""

    def __init__(self, session: Any, endpoint_url: str | None, config: Any) -> None:
        self.region_name = session.region_name
        self._session, self._endpoint, self._config = session, endpoint_url, config
        self._clients: dict[tuple[str, str | None], Any] = {}

    def client(self, name: str, config: Any = None, region_name: str | None = None) -> Any:
        key = (name, region_name)
        if key not in self._clients:
            self._clients[key] = self._session.client(
                name, config=config or self._config, endpoint_url=self._endpoint,
                region_name=region_name or self.region_name)
        return self._clients[key]


# --- the run --------------------------------------------------------------------------------

class Decommission:
    """One decommission of ``target``: the steps in order, the report after each."""

    def __init__(self, session: Any, target: Target, evidence_dir: Path, *, dry_run: bool,
                 retain_days: int = 365, endpoint_url: str | None = None, config: Any = None,
                 artifact_bucket: str | None = None, echo: Callable[[str], None] = print,
                 wait_seconds: float = 600.0, poll_seconds: float = 5.0,
                 now: datetime | None = None) -> None:
        if retain_days not in LOG_RETENTION_DAYS:
            raise DecommissionError(f"--retain-days {retain_days}: CloudWatch Logs accepts "
                                    f"only {', '.join(map(str, LOG_RETENTION_DAYS))}")
        self.aws = _Endpoint(session, endpoint_url, config)
        self.target, self.evidence_dir, self.dry_run = target, evidence_dir, dry_run
        self.retain_days, self.artifact_bucket = retain_days, artifact_bucket
        self.echo, self.wait_seconds, self.poll_seconds = echo, wait_seconds, poll_seconds
        self.now = now or datetime.now(UTC)
        self.removed: set[str] = set()
        self.survivors: list[Survivor] = []
        self.report: dict[str, Any] = {
            "stack": target.stack, "environment": target.environment,
            "project": target.project, "region": target.region, "source": target.source,
            "dry_run": dry_run, "started": self.now.isoformat(), "finished": None,
            "result": None, "steps": [
                {"step": i, "name": name, "status": Status.NOT_RUN.value, "changes": [],
                 "error": None} for i, (name, _) in enumerate(STEPS, 1)],
            "survivors": [],
        }

    @property
    def report_path(self) -> Path:
        return self.evidence_dir / REPORT_NAME

    def _save(self) -> None:
        self.evidence_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.report_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.report, indent=2, default=str) + "\n")
        os.replace(tmp, self.report_path)

    def run(self, verify_only: bool = False) -> list[Survivor]:
        """All steps in order (only the last with ``verify_only``: after ``pulumi
        destroy``); returns the survivors (predicted ones on a dry run). A failing step is
        recorded and raised as :class:`DecommissionError`; steps after it are ``not-run``."""
        t = self.target
        self.echo(f"{'dry run: ' if self.dry_run else ''}decommission stack {t.stack} "
                  f"(environment {t.environment}, project {t.project}) in {t.region}; "
                  f"report: {self.report_path}")
        self._save()
        try:
            for number, (name, step) in enumerate(STEPS, 1):
                if verify_only and step is not verify:
                    self.report["steps"][number - 1]["status"] = Status.SKIPPED.value
                    continue
                self._step(number, name, step)
        finally:
            self.report["finished"] = datetime.now(UTC).isoformat()
            self._save()
        return self.survivors

    def _step(self, number: int, name: str, step: Callable[[Decommission], list[Change]]) -> None:
        record = self.report["steps"][number - 1]
        head = f"[{number}/{len(STEPS)}] {name}"
        self.echo(f"{head} ...")
        try:
            changes = step(self)
            for change in changes:
                self.echo(f"  {change.line(self.dry_run)}")
                if not self.dry_run and change.run is not None:
                    change.run()
                if change.removes:
                    self.removed.add(change.removes)
                record["changes"].append(change.to_json())
        except BaseException as exc:  # a crash too: the record so far is kept
            record["status"] = Status.FAILED.value
            record["error"] = f"{type(exc).__name__}: {exc}"
            self.report["result"] = "error"
            self.echo(f"{head}: FAILED: {exc}")
            if isinstance(exc, DecommissionError | WasteError | ClientError | BotoCoreError):
                raise DecommissionError(f"step {number} ({name}) failed: {exc}; the record "
                                        f"so far is in {self.report_path}") from exc
            raise
        if step is verify and self.survivors:
            record["status"] = Status.PLANNED.value if self.dry_run else Status.FAILED.value
            record["error"] = (f"{len(self.survivors)} billable resource(s) "
                               f"{'would be ' if self.dry_run else ''}left")
            self.report["survivors"] = [s.to_json() for s in self.survivors]
            self.report["result"] = "survivors"
            self.echo(f"{head}: {len(self.survivors)} billable resource(s) with the stack's "
                      f"tags {'would be ' if self.dry_run else ''}left:")
            for s in self.survivors:
                self.echo(f"  {s.kind:<28} {s.resource}  {s.detail}")
        else:
            record["status"] = (Status.PLANNED if self.dry_run else Status.DONE).value
            if step is verify:
                self.report["result"] = "planned" if self.dry_run else "retired"
            verb = "would make" if self.dry_run else "made"
            if step is verify:
                self.echo(f"{head}: {record['status']}: no billable resource with the stack's "
                          f"tags {'would be ' if self.dry_run else 'is '}left")
            else:
                self.echo(f"{head}: {record['status']} ({verb} {len(changes)} change(s))")
        self._save()

    # --- helpers the steps share ---

    def client(self, name: str, region: str | None = None) -> Any:
        return self.aws.client(name, region_name=region)

    def vpcs(self) -> list[str]:
        return stack_vpcs(self.client("ec2"), self.target.scope)

    def stack_buckets(self) -> list[tuple[str, dict[str, str]]]:
        """Buckets tagged with the stack (ListBuckets is global; GetBucketTagging per
        bucket, NoSuchTagSet = untagged)."""
        s3 = self.client("s3")
        out = []
        for bucket in _call(s3, "list_buckets").get("Buckets", []):
            name = bucket["Name"]
            try:
                tags = tag_dict(s3.get_bucket_tagging(Bucket=name).get("TagSet"))
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "NoSuchTagSet":
                    continue
                raise DecommissionError(f"s3.get_bucket_tagging {name}: {exc}") from exc
            if self.target.scope.matches(tags):
                out.append((name, tags))
        return out


# --- step 1: evidence -----------------------------------------------------------------------

def _local_path(root: Path, key: str) -> Path:
    parts = PurePosixPath(key).parts
    if not parts or any(p in ("..", ".", "") for p in parts) or key.startswith("/"):
        raise DecommissionError(f"s3 key {key!r} cannot be stored under {root}")
    return root.joinpath(*parts)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _artifact_bucket(d: Decommission) -> str:
    if d.artifact_bucket:
        return d.artifact_bucket
    want = d.target.artifact_bucket_name_tag
    found = [name for name, tags in d.stack_buckets() if tags.get("Name") == want]
    if len(found) != 1:
        raise DecommissionError(
            f"artifact bucket: {len(found)} bucket(s) tagged project={d.target.project}, "
            f"stack={d.target.stack}, Name={want} ({', '.join(found) or 'none'}); give "
            "--artifact-bucket NAME")
    return found[0]


def _rds_evidence(d: Decommission) -> dict[str, Any]:
    """The stack's DB instances with their restore window, and every DB snapshot of them or
    tagged with the stack (automated and manual)."""
    rds = d.client("rds")
    scope = d.target.scope
    instances = [i for i in _pages(rds, "describe_db_instances", "DBInstances")
                 if scope.matches(tag_dict(i.get("TagList")))]
    snapshots: dict[str, dict[str, Any]] = {}
    for inst in instances:
        for snap in _pages(rds, "describe_db_snapshots", "DBSnapshots",
                           DBInstanceIdentifier=inst["DBInstanceIdentifier"]):
            snapshots[snap["DBSnapshotIdentifier"]] = snap
    for snap in _pages(rds, "describe_db_snapshots", "DBSnapshots"):
        if scope.matches(tag_dict(snap.get("TagList"))):
            snapshots[snap["DBSnapshotIdentifier"]] = snap
    keep = ("DBInstanceIdentifier", "Engine", "EngineVersion", "DBInstanceStatus",
            "BackupRetentionPeriod", "LatestRestorableTime", "MultiAZ", "StorageEncrypted",
            "DBInstanceArn")
    snap_keep = ("DBSnapshotIdentifier", "DBInstanceIdentifier", "SnapshotType",
                 "SnapshotCreateTime", "Status", "Encrypted", "AllocatedStorage",
                 "DBSnapshotArn")
    return {"instances": [{k: i.get(k) for k in keep} for i in instances],
            "snapshots": [{k: s.get(k) for k in snap_keep}
                          for _, s in sorted(snapshots.items())]}


def export_evidence(d: Decommission) -> list[Change]:
    """Every object under the artifact bucket's game-day archive prefix (runs, verdicts) and
    the database's restore points, written to the evidence directory with a manifest (path,
    size, sha256, source)."""
    s3 = d.client("s3")
    bucket = _artifact_bucket(d)
    manifest: list[dict[str, Any]] = []
    changes = []
    prefix = f"{GAME_DAY_ARCHIVE_PREFIX}/"
    for obj in _pages(s3, "list_objects_v2", "Contents", Bucket=bucket, Prefix=prefix):
        key, size = obj["Key"], obj["Size"]
        if key.endswith("/") and size == 0:  # a "folder" placeholder
            continue
        path = _local_path(d.evidence_dir, key)

        def download(key: str = key, size: int = size, path: Path = path) -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            body = _call(s3, "get_object", Bucket=bucket, Key=key)["Body"]
            with path.open("wb") as f:
                for chunk in iter(lambda: body.read(1 << 20), b""):
                    f.write(chunk)
            if path.stat().st_size != size:
                raise DecommissionError(f"s3://{bucket}/{key}: {path.stat().st_size} bytes "
                                        f"downloaded, the listing says {size}")
            manifest.append({"path": key, "size": size, "sha256": _sha256(path),
                             "source": f"s3://{bucket}/{key}"})

        changes.append(Change("export", f"s3://{bucket}/{key}", f"{size} bytes -> {key}",
                              download))
    rds = _rds_evidence(d)

    def record_rds() -> None:
        path = d.evidence_dir / RDS_EVIDENCE_NAME
        path.write_text(json.dumps(rds, indent=2, default=str) + "\n")
        manifest.append({"path": RDS_EVIDENCE_NAME, "size": path.stat().st_size,
                         "sha256": _sha256(path), "source": f"rds {d.target.region}"})

    changes.append(Change("record", RDS_EVIDENCE_NAME,
                          f"{len(rds['instances'])} DB instance(s), {len(rds['snapshots'])} "
                          "DB snapshot(s)", record_rds))

    def write_manifest() -> None:
        files = sorted(manifest, key=lambda e: e["path"])
        (d.evidence_dir / MANIFEST_NAME).write_text(json.dumps(
            {"stack": d.target.stack, "bucket": bucket, "prefix": prefix,
             "exported": datetime.now(UTC).isoformat(), "files": files}, indent=2) + "\n")

    changes.append(Change("write", MANIFEST_NAME, f"{len(changes)} file(s) with size and "
                          "sha256", write_manifest))
    return changes


# --- step 2: identities ---------------------------------------------------------------------

def revoke_identities(d: Decommission) -> list[Change]:
    """IAM roles tagged with the stack (their instance profiles, attached and inline
    policies, then the role), instance profiles tagged with the stack, and the access keys
    of users tagged with the stack."""
    iam, scope = d.client("iam"), d.target.scope
    changes: list[Change] = []
    profiles_done: set[str] = set()

    def remove_profile(profile: dict[str, Any]) -> None:
        name = profile["InstanceProfileName"]
        profiles_done.add(name)
        for role in profile.get("Roles", []):
            changes.append(Change("remove-role-from-instance-profile", name, role["RoleName"],
                                  lambda n=name, r=role["RoleName"]: _call(
                                      iam, "remove_role_from_instance_profile",
                                      InstanceProfileName=n, RoleName=r)))
        changes.append(Change("delete-instance-profile", name, "",
                              lambda n=name: _call(iam, "delete_instance_profile",
                                                   InstanceProfileName=n)))

    for role in _pages(iam, "list_roles", "Roles"):
        name = role["RoleName"]
        if role.get("Path", "").startswith("/aws-service-role/"):
            continue  # service-linked roles: AWS's, deleted with their service
        if not scope.matches(tag_dict(_call(iam, "list_role_tags", RoleName=name).get("Tags"))):
            continue
        for profile in _pages(iam, "list_instance_profiles_for_role", "InstanceProfiles",
                              RoleName=name):
            remove_profile(profile)
        for policy in _pages(iam, "list_attached_role_policies", "AttachedPolicies",
                             RoleName=name):
            changes.append(Change("detach-role-policy", name, policy["PolicyArn"],
                                  lambda n=name, a=policy["PolicyArn"]: _call(
                                      iam, "detach_role_policy", RoleName=n, PolicyArn=a)))
        for policy_name in _pages(iam, "list_role_policies", "PolicyNames", RoleName=name):
            changes.append(Change("delete-role-policy", name, policy_name,
                                  lambda n=name, p=policy_name: _call(
                                      iam, "delete_role_policy", RoleName=n, PolicyName=p)))
        changes.append(Change("delete-role", name, role["Arn"],
                              lambda n=name: _call(iam, "delete_role", RoleName=n)))
    for profile in _pages(iam, "list_instance_profiles", "InstanceProfiles"):
        name = profile["InstanceProfileName"]
        if name in profiles_done:
            continue
        # ListInstanceProfiles returns no tags on AWS; GetInstanceProfile does
        tags = _call(iam, "get_instance_profile", InstanceProfileName=name)[
            "InstanceProfile"].get("Tags")
        if scope.matches(tag_dict(tags)):
            remove_profile(profile)
    for user in _pages(iam, "list_users", "Users"):
        name = user["UserName"]
        if not scope.matches(tag_dict(_call(iam, "list_user_tags", UserName=name).get("Tags"))):
            continue
        for key in _pages(iam, "list_access_keys", "AccessKeyMetadata", UserName=name):
            changes.append(Change("delete-access-key", key["AccessKeyId"],
                                  f"user {name}, {key.get('Status', '').lower()}",
                                  lambda n=name, k=key["AccessKeyId"]: _call(
                                      iam, "delete_access_key", UserName=n, AccessKeyId=k)))
    return changes


# --- step 3: network ------------------------------------------------------------------------

_ROUTE_DESTINATIONS = ("DestinationCidrBlock", "DestinationIpv6CidrBlock",
                       "DestinationPrefixListId")


def _wait_nat_deleted(d: Decommission, nat_id: str) -> None:
    """A NAT gateway's address can be released only once it is deleted (minutes on AWS)."""
    ec2 = d.client("ec2")
    deadline = time.monotonic() + d.wait_seconds
    while True:
        gateways = _call(ec2, "describe_nat_gateways", NatGatewayIds=[nat_id])["NatGateways"]
        if all(g.get("State") in ("deleted", "failed") for g in gateways):
            return
        if time.monotonic() > deadline:
            raise DecommissionError(f"NAT gateway {nat_id} not deleted after "
                                    f"{d.wait_seconds:.0f} s")
        time.sleep(d.poll_seconds)


def remove_network_routes(d: Decommission) -> list[Change]:
    """In each VPC tagged with the stack: VPC endpoints, routes other than the local ones,
    NAT gateways and then their elastic IPs, then the internet gateway attachments. Elastic
    IPs tagged with the stack elsewhere are released too."""
    ec2 = d.client("ec2")
    changes: list[Change] = []
    released: set[str] = set()

    def release(allocation: str, detail: str, association: str | None = None) -> None:
        released.add(allocation)
        if association:
            changes.append(Change("disassociate-address", allocation, association,
                                  lambda a=association: _call(ec2, "disassociate_address",
                                                              AssociationId=a)))
        changes.append(Change("release-address", allocation, detail,
                              lambda a=allocation: _call(ec2, "release_address",
                                                         AllocationId=a),
                              removes=allocation))

    for vpc in d.vpcs():
        in_vpc = [{"Name": "vpc-id", "Values": [vpc]}]
        for ep in _pages(ec2, "describe_vpc_endpoints", "VpcEndpoints", Filters=in_vpc):
            if ep.get("State", "").lower() in ("deleted", "deleting"):
                continue
            changes.append(Change("delete-vpc-endpoint", ep["VpcEndpointId"],
                                  f"{ep.get('VpcEndpointType')} {ep.get('ServiceName')} in {vpc}",
                                  lambda e=ep["VpcEndpointId"]: _call(
                                      ec2, "delete_vpc_endpoints", VpcEndpointIds=[e]),
                                  removes=ep["VpcEndpointId"]))
        for table in _pages(ec2, "describe_route_tables", "RouteTables", Filters=in_vpc):
            for route in table.get("Routes", []):
                gateway = route.get("GatewayId", "")
                if gateway == "local" or gateway.startswith("vpce-") or \
                        route.get("Origin") == "CreateRouteTable":
                    continue  # the VPC's own; gateway endpoints' go with the endpoint
                dest = next(k for k in _ROUTE_DESTINATIONS if route.get(k))
                via = (gateway or route.get("NatGatewayId") or route.get("TransitGatewayId")
                       or route.get("VpcPeeringConnectionId") or route.get("NetworkInterfaceId")
                       or route.get("InstanceId") or "?")
                changes.append(Change(
                    "delete-route", f"{table['RouteTableId']} {route[dest]}", f"via {via}",
                    lambda t=table["RouteTableId"], k=dest, v=route[dest]: _call(
                        ec2, "delete_route", RouteTableId=t, **{k: v})))
        for nat in _pages(ec2, "describe_nat_gateways", "NatGateways",
                          Filters=[{"Name": "vpc-id", "Values": [vpc]},
                                   {"Name": "state", "Values": ["pending", "available"]}]):
            if nat.get("VpcId") != vpc or nat.get("State") not in ("pending", "available"):
                continue  # what a filter should have left out (moto's ignore some)
            nat_id = nat["NatGatewayId"]

            def delete_nat(nat_id: str = nat_id) -> None:
                _call(ec2, "delete_nat_gateway", NatGatewayId=nat_id)
                _wait_nat_deleted(d, nat_id)

            changes.append(Change("delete-nat-gateway", nat_id, f"in {vpc}, waits until "
                                  "deleted", delete_nat, removes=nat_id))
            for addr in nat.get("NatGatewayAddresses", []):
                if addr.get("AllocationId"):
                    release(addr["AllocationId"], f"{addr.get('PublicIp')} of {nat_id}")
        for igw in _pages(ec2, "describe_internet_gateways", "InternetGateways",
                          Filters=[{"Name": "attachment.vpc-id", "Values": [vpc]}]):
            changes.append(Change("detach-internet-gateway", igw["InternetGatewayId"],
                                  f"from {vpc}",
                                  lambda i=igw["InternetGatewayId"], v=vpc: _call(
                                      ec2, "detach_internet_gateway", InternetGatewayId=i,
                                      VpcId=v)))
    addresses = _call(ec2, "describe_addresses", Filters=d.target.scope.ec2_filters())
    for addr in addresses.get("Addresses", []):
        if addr.get("AllocationId") and addr["AllocationId"] not in released:
            release(addr["AllocationId"], str(addr.get("PublicIp")), addr.get("AssociationId"))
    # the internet gateway can be detached only once no public address is mapped in the VPC
    order = {"delete-vpc-endpoint": 0, "delete-route": 1, "delete-nat-gateway": 2,
             "disassociate-address": 3, "release-address": 3, "detach-internet-gateway": 4}
    return sorted(changes, key=lambda c: order[c.verb])


# --- step 4: retention ----------------------------------------------------------------------

def apply_retention(d: Decommission) -> list[Change]:
    """Log groups of the stack that keep everything forever get ``retain_days`` of
    retention (the temporary ones are deleted in the next step instead); each bucket of the
    stack gets a lifecycle rule expiring its objects and their old versions after
    ``retain_days`` (existing rules are kept)."""
    logs = d.client("logs")
    changes = []
    for finding in log_groups_without_retention(logs, d.target.scope, d.now, d.target.region):
        if finding.action is Action.DELETE:
            continue
        changes.append(Change("set-log-retention", finding.resource, f"{d.retain_days} days",
                              lambda g=finding.resource: _call(
                                  logs, "put_retention_policy", logGroupName=g,
                                  retentionInDays=d.retain_days),
                              removes=finding.resource))
    s3 = d.client("s3")
    for bucket, _ in d.stack_buckets():
        location = _call(s3, "get_bucket_location", Bucket=bucket).get("LocationConstraint")
        client = d.client("s3", location or "us-east-1")
        try:
            rules = client.get_bucket_lifecycle_configuration(Bucket=bucket).get("Rules", [])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "NoSuchLifecycleConfiguration":
                raise DecommissionError(f"s3.get_bucket_lifecycle_configuration {bucket}: "
                                        f"{exc}") from exc
            rules = []
        rule = {"ID": LIFECYCLE_RULE_ID, "Status": "Enabled", "Filter": {"Prefix": ""},
                "Expiration": {"Days": d.retain_days},
                "NoncurrentVersionExpiration": {"NoncurrentDays": d.retain_days},
                "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}
        kept = [r for r in rules if r.get("ID") != LIFECYCLE_RULE_ID]
        changes.append(Change(
            "set-bucket-expiry", f"s3://{bucket}",
            f"objects and old versions expire after {d.retain_days} days; "
            f"{len(kept)} existing rule(s) kept",
            lambda b=bucket, c=client, r=[*kept, rule]: _call(
                c, "put_bucket_lifecycle_configuration", Bucket=b,
                LifecycleConfiguration={"Rules": r})))
    return changes


# --- step 5: temporary data -----------------------------------------------------------------

def delete_temporary(d: Decommission) -> list[Change]:
    """What :func:`operations.waste.find_all` proposes to delete (tagged lifecycle=temporary, of
    a deletable kind), any age; nothing else."""
    findings = [f for f in find_all(d.aws, d.target.scope, now=d.now)
                if f.action is Action.DELETE]
    return [Change(f"delete-{f.kind.value}", f.resource, f.reason,
                   lambda f=f: apply_cleanup(d.aws, [f], allow_prod=True),
                   removes=f.resource) for f in findings]


# --- step 6: verify -------------------------------------------------------------------------

def billable(d: Decommission) -> list[Survivor]:
    """Every billable resource carrying the stack's tags (NAT gateways: or in its VPC):
    instances, EBS volumes and snapshots, elastic IPs, NAT gateways, load balancers, log
    groups without retention, EKS clusters, RDS instances."""
    ec2, scope = d.client("ec2"), d.target.scope
    tagged = d.target.scope.ec2_filters()
    out: list[Survivor] = []
    for res in _pages(ec2, "describe_instances", "Reservations", Filters=tagged):
        for inst in res.get("Instances", []):
            state = inst.get("State", {}).get("Name")
            if state not in ("terminated", "shutting-down"):
                out.append(Survivor("ec2-instance", inst["InstanceId"],
                                    f"{inst.get('InstanceType')} {state}"))
    for vol in _pages(ec2, "describe_volumes", "Volumes", Filters=tagged):
        out.append(Survivor("ebs-volume", vol["VolumeId"],
                            f"{vol.get('Size')} GiB {vol.get('VolumeType')} {vol.get('State')}"))
    for snap in _pages(ec2, "describe_snapshots", "Snapshots", OwnerIds=["self"], Filters=tagged):
        out.append(Survivor("ebs-snapshot", snap["SnapshotId"],
                            f"of {snap.get('VolumeId')}, {snap.get('VolumeSize')} GiB"))
    for addr in _call(ec2, "describe_addresses", Filters=tagged).get("Addresses", []):
        out.append(Survivor("elastic-ip", addr.get("AllocationId") or addr.get("PublicIp", "?"),
                            str(addr.get("PublicIp"))))
    nats: dict[str, dict[str, Any]] = {}
    states = ["pending", "available", "deleting"]
    vpcs = d.vpcs()
    # moto ignores tag filters on NAT gateways: the tags and states are checked here too
    for nat in _pages(ec2, "describe_nat_gateways", "NatGateways",
                      Filters=[{"Name": "state", "Values": states}]):
        if nat.get("State") in states and (nat.get("VpcId") in vpcs
                                           or scope.matches(tag_dict(nat.get("Tags")))):
            nats[nat["NatGatewayId"]] = nat
    for nat_id, nat in sorted(nats.items()):
        out.append(Survivor("nat-gateway", nat_id, f"{nat.get('State')} in {nat.get('VpcId')}"))
    for lb, _ in tagged_load_balancers(d.client("elbv2"), scope):
        out.append(Survivor("load-balancer", lb["LoadBalancerArn"],
                            f"{lb.get('Type')} {lb.get('State', {}).get('Code', '')}".strip()))
    for finding in log_groups_without_retention(d.client("logs"), scope, d.now, d.target.region):
        out.append(Survivor("log-group-without-retention", finding.resource, finding.reason))
    eks = d.client("eks")
    for name in _pages(eks, "list_clusters", "clusters"):
        cluster = _call(eks, "describe_cluster", name=name)["cluster"]
        if scope.matches(cluster.get("tags") or {}):
            out.append(Survivor("eks-cluster", name, f"{cluster.get('status')}"))
    for inst in _pages(d.client("rds"), "describe_db_instances", "DBInstances"):
        if scope.matches(tag_dict(inst.get("TagList"))):
            out.append(Survivor("rds-instance", inst["DBInstanceIdentifier"],
                                f"{inst.get('DBInstanceClass')} {inst.get('DBInstanceStatus')}"))
    return out


def verify(d: Decommission) -> list[Change]:
    """No change: lists the survivors. On a dry run, those no earlier step would remove;
    otherwise what the account says now (a step that claimed a removal is not believed)."""
    found = billable(d)
    d.survivors = [s for s in found if s.resource not in d.removed] if d.dry_run else found
    return []


STEPS: tuple[tuple[str, Callable[[Decommission], list[Change]]], ...] = (
    ("export evidence", export_evidence),
    ("revoke identities", revoke_identities),
    ("remove network routes", remove_network_routes),
    ("apply retention", apply_retention),
    ("delete temporary data", delete_temporary),
    ("verify nothing billable is left", verify),
)

"""Waste finder: AWS resources that cost money or attention and serve nobody.

Each finder is one small function over boto3 clients that returns :class:`Finding` s, each
with the resource's owner (its ``owner`` tag, or ``untagged``), its stack (``stack`` tag) and
its age, taken only from a creation time the API returns (``CreateTime``, ``StartTime``,
``CreatedTime``, ``creationTime``); where the API gives none the age is ``None`` (shown as
``unknown``), never guessed.

Cleanup is proposed only for resources tagged ``lifecycle=temporary`` (:data:`TEMPORARY_TAG`)
of a kind in :data:`DELETABLE` (unattached volume, old snapshot, log group without
retention, alarm without actions, topic without subscriptions); everything else is a
review item. Instances, load balancers and untagged VPC resources are always review.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from botocore.exceptions import ClientError

from operations.tagged import call, pages
from provisioning.components.common import REQUIRED_TAGS

__all__ = ["DELETABLE", "TEMPORARY_TAG", "Action", "Finding", "Kind", "Scope", "WasteError",
           "apply_cleanup", "find_all"]

TEMPORARY_TAG = ("lifecycle", "temporary")
UNTAGGED = "untagged"


class WasteError(Exception):
    """A waste scan or cleanup could not be done (names the API call that failed)."""


class Kind(str, Enum):
    UNATTACHED_VOLUME = "unattached-volume"
    OLD_SNAPSHOT = "old-snapshot"
    STOPPED_INSTANCE = "stopped-instance"
    IDLE_LOAD_BALANCER = "idle-load-balancer"
    UNTAGGED = "untagged"
    LOG_GROUP_NO_RETENTION = "log-group-no-retention"
    ALARM_NO_ACTIONS = "alarm-no-actions"
    TOPIC_NO_SUBSCRIBERS = "topic-no-subscribers"


class Action(str, Enum):
    DELETE = "delete"
    REVIEW = "review"


DELETABLE = frozenset({Kind.UNATTACHED_VOLUME, Kind.OLD_SNAPSHOT, Kind.LOG_GROUP_NO_RETENTION,
                       Kind.ALARM_NO_ACTIONS, Kind.TOPIC_NO_SUBSCRIBERS})


@dataclass(frozen=True)
class Scope:
    """Which resources are looked at: those tagged project=<project>, stack=<stack>, or all
    (``stack=None``). ``min_age_days`` applies to volumes, snapshots and stopped instances."""

    project: str
    stack: str | None
    min_age_days: float = 7.0

    def matches(self, tags: dict[str, str]) -> bool:
        if self.stack is None:
            return True
        return tags.get("project") == self.project and tags.get("stack") == self.stack

    def old_enough(self, age: float | None) -> bool:
        return age is not None and age >= self.min_age_days

    def ec2_filters(self) -> list[dict[str, Any]]:
        if self.stack is None:
            return []
        return [{"Name": "tag:project", "Values": [self.project]},
                {"Name": "tag:stack", "Values": [self.stack]}]


@dataclass(frozen=True)
class Finding:
    kind: Kind
    resource: str
    owner: str
    stack: str | None
    age_days: float | None
    reason: str
    action: Action
    region: str = ""

    @property
    def age(self) -> str:
        return "unknown" if self.age_days is None else f"{self.age_days:.1f}d"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(kind=self.kind.value, action=self.action.value, age=self.age)
        return data


def age_days(created: datetime | None, now: datetime) -> float | None:
    if created is None:
        return None
    if created.tzinfo is None:
        created = created.replace(tzinfo=UTC)
    return max((now - created).total_seconds() / 86400.0, 0.0)


def tag_dict(tags: Iterable[dict[str, str]] | dict[str, str] | None) -> dict[str, str]:
    """EC2/ELB style [{"Key", "Value"}] or a plain mapping (logs, SNS as converted)."""
    if not tags:
        return {}
    if isinstance(tags, dict):
        return dict(tags)
    return {t["Key"]: t.get("Value", "") for t in tags}


def _finding(kind: Kind, resource: str, tags: dict[str, str], age: float | None, reason: str,
             region: str) -> Finding:
    temporary = tags.get(TEMPORARY_TAG[0]) == TEMPORARY_TAG[1]
    action = Action.DELETE if temporary and kind in DELETABLE else Action.REVIEW
    if temporary and kind in DELETABLE:
        reason += f"; tagged {TEMPORARY_TAG[0]}={TEMPORARY_TAG[1]}"
    return Finding(kind, resource, tags.get("owner") or UNTAGGED, tags.get("stack"), age,
                   reason, action, region)


def _pages(client: Any, operation: str, key: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
    return pages(client, operation, key, WasteError, **kwargs)


def _call(client: Any, operation: str, **kwargs: Any) -> dict[str, Any]:
    return call(client, operation, WasteError, **kwargs)


# --- EC2 ------------------------------------------------------------------------------------

def unattached_volumes(ec2: Any, scope: Scope, now: datetime, region: str) -> list[Finding]:
    """EBS volumes in state ``available`` (attached to nothing) at least min_age_days old."""
    out = []
    filters = [{"Name": "status", "Values": ["available"]}, *scope.ec2_filters()]
    for vol in _pages(ec2, "describe_volumes", "Volumes", Filters=filters):
        age = age_days(vol.get("CreateTime"), now)
        if vol.get("State") != "available" or not scope.old_enough(age):
            continue
        out.append(_finding(Kind.UNATTACHED_VOLUME, vol["VolumeId"], tag_dict(vol.get("Tags")),
                            age, f"unattached {vol.get('Size')} GiB {vol.get('VolumeType')}",
                            region))
    return out


def old_snapshots(ec2: Any, scope: Scope, now: datetime, region: str) -> list[Finding]:
    """Snapshots owned by this account at least min_age_days old that no AMI of the account
    uses (a snapshot behind a registered image is never waste here)."""
    used = {bdm["Ebs"]["SnapshotId"]
            for image in _pages(ec2, "describe_images", "Images", Owners=["self"])
            for bdm in image.get("BlockDeviceMappings", []) if bdm.get("Ebs", {}).get("SnapshotId")}
    out = []
    for snap in _pages(ec2, "describe_snapshots", "Snapshots", OwnerIds=["self"],
                       Filters=scope.ec2_filters()):
        age = age_days(snap.get("StartTime"), now)
        if snap["SnapshotId"] in used or not scope.old_enough(age):
            continue
        out.append(_finding(Kind.OLD_SNAPSHOT, snap["SnapshotId"], tag_dict(snap.get("Tags")),
                            age, f"snapshot of {snap.get('VolumeId')}, used by no AMI", region))
    return out


_STOPPED_AT = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")


def stopped_since(instance: dict[str, Any]) -> datetime | None:
    """When a stopped instance stopped: EC2 only says so inside StateTransitionReason
    ("User initiated (2026-01-01 10:00:00 GMT)"); None when absent (never LaunchTime)."""
    match = _STOPPED_AT.search(instance.get("StateTransitionReason") or "")
    if match is None:
        return None
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)


def stopped_instances(ec2: Any, scope: Scope, now: datetime, region: str) -> list[Finding]:
    """Instances stopped for at least min_age_days (their EBS volumes still bill). A stop
    time the API does not give is ``unknown`` and still reported (for review)."""
    out = []
    filters = [{"Name": "instance-state-name", "Values": ["stopped"]}, *scope.ec2_filters()]
    for res in _pages(ec2, "describe_instances", "Reservations", Filters=filters):
        for inst in res.get("Instances", []):
            age = age_days(stopped_since(inst), now)
            if age is not None and age < scope.min_age_days:
                continue
            out.append(_finding(Kind.STOPPED_INSTANCE, inst["InstanceId"],
                                tag_dict(inst.get("Tags")), age,
                                f"stopped {inst.get('InstanceType')} (age = time stopped)", region))
    return out


def stack_vpcs(ec2: Any, scope: Scope) -> list[str]:
    return [v["VpcId"] for v in _pages(ec2, "describe_vpcs", "Vpcs", Filters=scope.ec2_filters())]


def untagged_in_vpcs(ec2: Any, vpc_ids: list[str], now: datetime, region: str) -> list[Finding]:
    """Instances, their volumes, ENIs and security groups of the given VPCs missing any of
    REQUIRED_TAGS. A VPC's ``default`` security group is created by AWS and cannot carry
    Pulumi's tags unless adopted, so it is left out."""
    if not vpc_ids:
        return []
    vpc = [{"Name": "vpc-id", "Values": vpc_ids}]
    out = []

    def check(resource: str, tags: dict[str, str], created: datetime | None, what: str) -> None:
        missing = [k for k in REQUIRED_TAGS if not tags.get(k)]
        if missing:
            out.append(_finding(Kind.UNTAGGED, resource, tags, age_days(created, now),
                                f"{what} missing tags: {', '.join(missing)}", region))

    volume_ids = []
    for res in _pages(ec2, "describe_instances", "Reservations", Filters=vpc):
        for inst in res.get("Instances", []):
            if inst.get("State", {}).get("Name") == "terminated":
                continue
            check(inst["InstanceId"], tag_dict(inst.get("Tags")), inst.get("LaunchTime"),
                  "instance")
            volume_ids += [b["Ebs"]["VolumeId"] for b in inst.get("BlockDeviceMappings", [])
                           if b.get("Ebs", {}).get("VolumeId")]
    if volume_ids:
        for vol in _pages(ec2, "describe_volumes", "Volumes", VolumeIds=volume_ids):
            check(vol["VolumeId"], tag_dict(vol.get("Tags")), vol.get("CreateTime"), "volume")
    for eni in _pages(ec2, "describe_network_interfaces", "NetworkInterfaces", Filters=vpc):
        # Interfaces AWS creates for a service (NAT gateway, VPC endpoint, load balancer) are
        # requester-managed: not taggable by us, billed through their service. Not tested:
        # moto cannot create one.
        if eni.get("RequesterManaged"):
            continue
        check(eni["NetworkInterfaceId"], tag_dict(eni.get("TagSet")), None,
              f"network interface ({eni.get('InterfaceType', 'interface')})")
    for sg in _pages(ec2, "describe_security_groups", "SecurityGroups", Filters=vpc):
        if sg.get("GroupName") == "default":
            continue
        check(sg["GroupId"], tag_dict(sg.get("Tags")), None, f"security group {sg['GroupName']}")
    return out


# --- ELBv2 ----------------------------------------------------------------------------------

def _target_groups(elbv2: Any, lb_arn: str) -> list[dict[str, Any]]:
    # moto answers TargetGroupNotFound for a load balancer without target groups; AWS an
    # empty list: both mean none.
    try:
        return list(_pages(elbv2, "describe_target_groups", "TargetGroups",
                           LoadBalancerArn=lb_arn))
    except WasteError as exc:
        if isinstance(exc.__cause__, ClientError) and exc.__cause__.response.get(
                "Error", {}).get("Code") == "TargetGroupNotFound":
            return []
        raise


def tagged_load_balancers(elbv2: Any, scope: Scope) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """The load balancers (ELBv2) in scope, each with its tags."""
    lbs = list(_pages(elbv2, "describe_load_balancers", "LoadBalancers"))
    tags: dict[str, dict[str, str]] = {}
    for i in range(0, len(lbs), 20):  # DescribeTags takes at most 20 ARNs
        arns = [lb["LoadBalancerArn"] for lb in lbs[i:i + 20]]
        for desc in _call(elbv2, "describe_tags", ResourceArns=arns)["TagDescriptions"]:
            tags[desc["ResourceArn"]] = tag_dict(desc.get("Tags"))
    return [(lb, tags.get(lb["LoadBalancerArn"], {})) for lb in lbs
            if scope.matches(tags.get(lb["LoadBalancerArn"], {}))]


def idle_load_balancers(elbv2: Any, scope: Scope, now: datetime, region: str) -> list[Finding]:
    """Load balancers with no listener, or with no healthy registered target in any of
    their target groups."""
    out = []
    for lb, lb_tags in tagged_load_balancers(elbv2, scope):
        arn = lb["LoadBalancerArn"]
        listeners = list(_pages(elbv2, "describe_listeners", "Listeners", LoadBalancerArn=arn))
        groups = _target_groups(elbv2, arn)
        healthy = sum(1 for g in groups
                      for t in _call(elbv2, "describe_target_health",
                                     TargetGroupArn=g["TargetGroupArn"])["TargetHealthDescriptions"]
                      if t.get("TargetHealth", {}).get("State") == "healthy")
        if listeners and healthy:
            continue
        reason = ("no listeners" if not listeners
                  else f"no healthy target in {len(groups)} target group(s)")
        out.append(_finding(Kind.IDLE_LOAD_BALANCER, arn, lb_tags,
                            age_days(lb.get("CreatedTime"), now), reason, region))
    return out


# --- CloudWatch Logs, CloudWatch alarms, SNS ----------------------------------------------

def _epoch_ms(value: int | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value / 1000, tz=UTC)


def log_groups_without_retention(logs: Any, scope: Scope, now: datetime,
                                 region: str) -> list[Finding]:
    """Log groups that keep everything forever (no retentionInDays)."""
    out = []
    for group in _pages(logs, "describe_log_groups", "logGroups"):
        if group.get("retentionInDays"):
            continue
        name = group["logGroupName"]
        tags = _call(logs, "list_tags_log_group", logGroupName=name).get("tags", {})
        if not scope.matches(tags):
            continue
        out.append(_finding(Kind.LOG_GROUP_NO_RETENTION, name, tags,
                            age_days(_epoch_ms(group.get("creationTime")), now),
                            f"no retention: {group.get('storedBytes', 0)} bytes kept forever",
                            region))
    return out


def alarms_without_actions(cloudwatch: Any, scope: Scope, now: datetime,
                           region: str) -> list[Finding]:
    """Metric alarms that notify nobody: no alarm/OK/insufficient-data action, or actions
    disabled. The API gives no creation time: age unknown."""
    out = []
    for alarm in _pages(cloudwatch, "describe_alarms", "MetricAlarms"):
        actions = (alarm.get("AlarmActions", []) + alarm.get("OKActions", [])
                   + alarm.get("InsufficientDataActions", []))
        if actions and alarm.get("ActionsEnabled", True):
            continue
        tags = tag_dict(_call(cloudwatch, "list_tags_for_resource",
                              ResourceARN=alarm["AlarmArn"]).get("Tags"))
        if not scope.matches(tags):
            continue
        reason = "actions disabled" if actions else "no actions"
        out.append(_finding(Kind.ALARM_NO_ACTIONS, alarm["AlarmName"], tags, None,
                            f"alarm with {reason} (nobody is told)", region))
    return out


def topics_without_subscribers(sns: Any, scope: Scope, now: datetime,
                               region: str) -> list[Finding]:
    """SNS topics with no subscription (published telemetry nobody receives). The API gives
    no creation time: age unknown."""
    out = []
    for topic in _pages(sns, "list_topics", "Topics"):
        arn = topic["TopicArn"]
        if list(_pages(sns, "list_subscriptions_by_topic", "Subscriptions", TopicArn=arn)):
            continue
        tags = tag_dict(_call(sns, "list_tags_for_resource", ResourceArn=arn).get("Tags"))
        if not scope.matches(tags):
            continue
        out.append(_finding(Kind.TOPIC_NO_SUBSCRIBERS, arn, tags, None,
                            "topic without subscriptions", region))
    return out


# --- all finders, cleanup -------------------------------------------------------------------

def find_all(session: Any, scope: Scope, config: Any = None, now: datetime | None = None,
             progress: Callable[[str], None] = lambda _: None) -> list[Finding]:
    """Every finder against the session's region, in a fixed order."""
    now = now or datetime.now(UTC)
    region = session.region_name
    if not region:
        raise WasteError("no AWS region: give --region or set AWS_REGION / AWS_DEFAULT_REGION")

    def client(name: str) -> Any:
        return session.client(name, config=config)

    ec2 = client("ec2")
    found: list[Finding] = []
    for what, run in (
        ("unattached volumes", lambda: unattached_volumes(ec2, scope, now, region)),
        ("old snapshots", lambda: old_snapshots(ec2, scope, now, region)),
        ("stopped instances", lambda: stopped_instances(ec2, scope, now, region)),
        ("idle load balancers", lambda: idle_load_balancers(client("elbv2"), scope, now, region)),
        ("untagged VPC resources",
         lambda: untagged_in_vpcs(ec2, stack_vpcs(ec2, scope), now, region)),
        ("log groups without retention",
         lambda: log_groups_without_retention(client("logs"), scope, now, region)),
        ("alarms without actions",
         lambda: alarms_without_actions(client("cloudwatch"), scope, now, region)),
        ("topics without subscriptions",
         lambda: topics_without_subscribers(client("sns"), scope, now, region)),
    ):
        progress(f"{region}: {what} ...")
        found += run()
    return found


def is_prod(finding: Finding) -> bool:
    return (finding.stack or "").split("-")[0] == "prod"


def apply_cleanup(session: Any, findings: list[Finding], allow_prod: bool, config: Any = None,
                  progress: Callable[[str], None] = lambda _: None) -> list[Finding]:
    """Delete the findings whose action is delete (and only those); a prod one is refused
    unless allow_prod. Returns what was deleted."""
    deleted = []
    for f in findings:
        if f.action is not Action.DELETE:
            continue
        if f.kind not in DELETABLE:  # _finding never makes one; guard against hand-made ones
            raise WasteError(f"{f.resource}: kind {f.kind.value} is never deleted")
        if is_prod(f) and not allow_prod:
            raise WasteError(f"refused: {f.resource} belongs to stack {f.stack} (prod); "
                             "give --allow-prod")
        progress(f"deleting {f.kind.value} {f.resource}")
        if f.kind is Kind.UNATTACHED_VOLUME:
            _call(session.client("ec2", config=config), "delete_volume", VolumeId=f.resource)
        elif f.kind is Kind.OLD_SNAPSHOT:
            _call(session.client("ec2", config=config), "delete_snapshot", SnapshotId=f.resource)
        elif f.kind is Kind.LOG_GROUP_NO_RETENTION:
            _call(session.client("logs", config=config), "delete_log_group",
                  logGroupName=f.resource)
        elif f.kind is Kind.ALARM_NO_ACTIONS:
            _call(session.client("cloudwatch", config=config), "delete_alarms",
                  AlarmNames=[f.resource])
        elif f.kind is Kind.TOPIC_NO_SUBSCRIBERS:
            _call(session.client("sns", config=config), "delete_topic", TopicArn=f.resource)
        deleted.append(f)
    return deleted

"""`gameday infra inventory`: what a stack declares, and (``--live``) how the account compares.

Declared inventory: the Pulumi program rendered offline (provisioning/render.py, both layers of the
environment), one :class:`Row` per declared resource except the program's own grouping
components and Pulumi's providers and stack references. Each row's owner, cost center, data
class, availability objective, provisioning source and retirement condition are the tags the
resource will carry: its ``tags`` input over its AWS provider's ``defaultTags``. Resources
that take no AWS tags (Kubernetes objects, IAM attachments) show the stack's default tags
and say so (``tagged: false``).

Live comparison (:func:`compare`): the account read through the Resource Groups Tagging API
(resources tagged with the environment's project and stacks) and the EC2 / S3 / ECR / RDS /
EKS describe calls (operations/tagged.py), matched to declared rows by kind and name; plus the
untagged resources in the stack's VPC (operations/waste.py). What pulumi-eks creates inside its
components and what Karpenter and EKS launch is not declared by the program: such resources
are *attributed* to the declared resource that made them, never reported as undeclared.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from operations.tagged import (
    DESCRIBED_KINDS,
    LiveResource,
    TaggedError,
    account_id,
    by_stack_tags,
    described,
)
from provisioning.components.common import TYPE_PREFIX
from provisioning.policies import default_tags, takes_tags
from provisioning.render import Rendered, Resource

__all__ = ["FIELDS", "TYPE_KINDS", "Comparison", "LiveItem", "Row", "compare", "declared_rows"]

# Pulumi type token -> (service, kind) as the resource's ARN spells them. Types not listed
# here cannot be matched to the account (they are listed, never reported missing).
TYPE_KINDS: dict[str, tuple[str, str]] = {
    "aws:ec2/vpc:Vpc": ("ec2", "vpc"),
    "aws:ec2/subnet:Subnet": ("ec2", "subnet"),
    "aws:ec2/securityGroup:SecurityGroup": ("ec2", "security-group"),
    "aws:ec2/internetGateway:InternetGateway": ("ec2", "internet-gateway"),
    "aws:ec2/natGateway:NatGateway": ("ec2", "natgateway"),
    "aws:ec2/routeTable:RouteTable": ("ec2", "route-table"),
    "aws:ec2/vpcEndpoint:VpcEndpoint": ("ec2", "vpc-endpoint"),
    "aws:ec2/eip:Eip": ("ec2", "elastic-ip"),
    "aws:ec2/launchTemplate:LaunchTemplate": ("ec2", "launch-template"),
    "aws:ec2/flowLog:FlowLog": ("ec2", "vpc-flow-log"),
    "aws:s3/bucket:Bucket": ("s3", ""),
    "aws:ecr/repository:Repository": ("ecr", "repository"),
    "aws:rds/instance:Instance": ("rds", "db"),
    "aws:rds/subnetGroup:SubnetGroup": ("rds", "subgrp"),
    "aws:rds/parameterGroup:ParameterGroup": ("rds", "pg"),
    "eks:index:Cluster": ("eks", "cluster"),
    "eks:index:ManagedNodeGroup": ("eks", "nodegroup"),
    "aws:kms/key:Key": ("kms", "key"),
    "aws:cloudwatch/logGroup:LogGroup": ("logs", "log-group"),
    "aws:cloudwatch/metricAlarm:MetricAlarm": ("cloudwatch", "alarm"),
    "aws:cloudwatch/compositeAlarm:CompositeAlarm": ("cloudwatch", "alarm"),
    "aws:cloudwatch/eventRule:EventRule": ("events", "rule"),
    "aws:sns/topic:Topic": ("sns", ""),
    "aws:sqs/queue:Queue": ("sqs", ""),
    "aws:iam/role:Role": ("iam", "role"),
    "aws:iam/instanceProfile:InstanceProfile": ("iam", "instance-profile"),
    "aws:secretsmanager/secret:Secret": ("secretsmanager", "secret"),
    "aws:codebuild/project:Project": ("codebuild", "project"),
}
# Input properties that hold a resource's physical name when the program sets one.
NAME_PROPS = ("name", "bucket", "identifier", "clusterName", "nodeGroupName", "alarmName",
              "repositoryName")
# Tags AWS services put on what they launch for a declared resource (a Karpenter NodePool,
# an EKS cluster or node group): such a resource is attributed, not undeclared.
LAUNCHER_TAGS = ("karpenter.sh/nodepool", "eks:cluster-name", "aws:eks:cluster-name",
                 "eks:eks-cluster-name", "eks:nodegroup-name")
# The inventory's columns, in order (JSON keys are the same, snake_case).
FIELDS = ("type", "name", "stack", "environment", "region", "owner", "data_class",
          "availability_objective", "cost_center", "provisioning_source",
          "retirement_condition", "tagged")


@dataclass(frozen=True)
class Row:
    type: str
    name: str
    stack: str
    environment: str
    region: str
    owner: str
    data_class: str
    availability_objective: str
    cost_center: str
    provisioning_source: str
    retirement_condition: str
    tagged: bool  # False: takes no AWS tags; the values are the stack's default tags
    names: tuple[str, ...] = ()  # what the resource may be called in the account

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["names"] = list(self.names)
        return data

    @property
    def kind(self) -> tuple[str, str] | None:
        return TYPE_KINDS.get(self.type)


def _listed(r: Resource) -> bool:
    return not (r.type.startswith("pulumi:") or r.type.startswith(f"{TYPE_PREFIX}:"))


def _names(r: Resource, tags: Mapping[str, Any]) -> tuple[str, ...]:
    out = [r.name]
    if tags.get("Name"):
        out.append(str(tags["Name"]))
    out += [str(r.props[k]) for k in NAME_PROPS if isinstance(r.props.get(k), str) and r.props[k]]
    return tuple(dict.fromkeys(out))


def declared_rows(rendered: Rendered) -> list[Row]:
    """One row per declared resource of both layers, in declaration order."""
    by_urn = {r.urn: r for r in rendered.resources}
    rows = []
    for r in rendered.resources:
        if not _listed(r):
            continue
        config = rendered.configs.get(r.stack, {})
        stack_tags = default_tags({"defaultTags": config.get("aws:defaultTags")})
        region = str(config.get("aws:region", ""))
        provider = by_urn.get(r.provider)
        if provider is not None and provider.type == "pulumi:providers:aws":
            region = str(provider.props.get("region") or region)
            provider_tags = default_tags(provider.props) or stack_tags
        else:
            provider_tags = stack_tags
        tagged = takes_tags(r.type)
        tags = {**provider_tags, **(r.props.get("tags") or {})} if tagged else stack_tags
        rows.append(Row(
            type=r.type, name=r.name, stack=r.stack,
            environment=str(tags.get("environment", "")), region=region,
            owner=str(tags.get("owner", "")), data_class=str(tags.get("data-class", "")),
            availability_objective=str(tags.get("availability-objective", "")),
            cost_center=str(tags.get("cost-center", "")),
            provisioning_source=str(tags.get("provisioning-source", "")),
            retirement_condition=str(tags.get("retirement-condition", "")),
            tagged=tagged, names=_names(r, tags),
        ))
    return rows


# --- live ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class LiveItem:
    arn: str
    kind: str
    name: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class Comparison:
    """(a) ``undeclared``: tagged with the stack, matching no declared resource; (b)
    ``missing``: declared, of a kind the describe calls enumerate, in this region, not found;
    (c) ``untagged``: resources in the stack's VPC missing required tags. ``attributed``:
    launched by a declared resource (Karpenter, EKS, inside a pulumi-eks component)."""

    region: str
    matched: int = 0
    undeclared: list[LiveItem] = field(default_factory=list)
    missing: list[Row] = field(default_factory=list)
    untagged: list[LiveItem] = field(default_factory=list)
    attributed: list[LiveItem] = field(default_factory=list)
    not_checked: int = 0  # declared rows of kinds no call here enumerates, or other regions

    @property
    def clean(self) -> bool:
        return not (self.undeclared or self.missing or self.untagged)

    def to_json(self) -> dict[str, Any]:
        return {"region": self.region, "matched": self.matched, "clean": self.clean,
                "undeclared": [i.to_json() for i in self.undeclared],
                "missing": [{"type": r.type, "name": r.name, "stack": r.stack} for r in self.missing],
                "untagged": [i.to_json() for i in self.untagged],
                "attributed": [i.to_json() for i in self.attributed],
                "not_checked": self.not_checked}


def _kind_label(live: LiveResource) -> str:
    return f"{live.service}:{live.kind}" if live.kind else live.service


def _matches(row: Row, live: LiveResource) -> bool:
    return row.kind == (live.service, live.kind) and bool(set(row.names) & live.names)


def _attribution(live: LiveResource, rows: list[Row]) -> str | None:
    for key in LAUNCHER_TAGS:
        if live.tags.get(key):
            return f"launched for {key}={live.tags[key]}"
    components = [r for r in rows if r.type in ("eks:index:Cluster", "eks:index:ManagedNodeGroup")]
    for row in components:
        if any(n.startswith(row.name) for n in live.names):
            return f"created inside {row.type} {row.name}"
    return None


def compare(rows: list[Row], session: Any, project: str, stacks: list[str],
            config: Any = None, endpoint_url: str | None = None,
            progress: Callable[[str], None] = lambda _: None,
            now: datetime | None = None) -> Comparison:
    """Compare the declared ``rows`` with the account ``session`` reaches, in its region."""
    from operations import waste

    region = session.region_name
    if not region:
        raise TaggedError("no AWS region: give --region or set AWS_REGION / AWS_DEFAULT_REGION")

    def client(name: str) -> Any:
        return session.client(name, config=config, endpoint_url=endpoint_url)

    progress(f"{region}: resources tagged project={project}, stack in {stacks} (tagging API) ...")
    tagged = by_stack_tags(client("resourcegroupstaggingapi"), project, stacks)
    progress(f"{region}: EC2, S3, ECR, RDS, EKS describe calls ...")
    listed = described(client, region, account_id(client("sts")))
    result = Comparison(region=region)

    # every live resource once, by ARN; the describe calls' tags complete the tagging API's
    live: dict[str, LiveResource] = {x.arn: x for x in tagged}
    for x in listed:
        live.setdefault(x.arn, x)
    ours = {x.arn for x in tagged} | {
        x.arn for x in listed if x.tags.get("project") == project and x.tags.get("stack") in stacks}
    here = [r for r in rows if r.region == region]
    for arn in sorted(ours):
        x = live[arn]
        if any(_matches(r, x) for r in here):
            result.matched += 1
            continue
        item = LiveItem(arn, _kind_label(x), x.tags.get("Name") or x.name, "")
        why = _attribution(x, here)
        if why:
            result.attributed.append(LiveItem(item.arn, item.kind, item.name, why))
        else:
            result.undeclared.append(LiveItem(
                item.arn, item.kind, item.name,
                f"tagged stack={x.tags.get('stack')} but declared by no resource of the program"))
    for row in rows:
        if row.region != region or row.kind not in DESCRIBED_KINDS:
            result.not_checked += 1
        elif not any(_matches(row, x) for x in live.values()):
            result.missing.append(row)

    progress(f"{region}: untagged resources in the stack's VPC ...")
    ec2 = client("ec2")
    vpcs = waste.stack_vpcs(ec2, waste.Scope(project, stacks[0]))
    for finding in waste.untagged_in_vpcs(ec2, vpcs, now or datetime.now(UTC), region):
        what = finding.reason.split(" missing tags")[0]  # "instance", "volume", ...
        result.untagged.append(LiveItem(finding.resource, what, finding.resource, finding.reason))
    return result

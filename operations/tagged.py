"""What the account holds, read with boto3: resources carrying a stack's tags (Resource Groups
Tagging API), and every resource of the kinds the EC2 / S3 / ECR / RDS / EKS describe calls
enumerate, each with its tags.

Shared by ``gameday infra inventory --live`` (operations/inventory.py) and anything else that
needs "the resources of stack X" from the account. Every API failure becomes one
:class:`TaggedError` naming the call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

__all__ = ["DESCRIBED_KINDS", "LiveResource", "TaggedError", "account_id", "by_stack_tags", "call",
           "described", "pages", "parse_arn", "stack_tag_filters"]


class TaggedError(Exception):
    """A read of the account failed (names the service and the API call)."""


@dataclass(frozen=True)
class LiveResource:
    """One resource of the account: its ARN, ``service`` and ``kind`` as the ARN spells them
    (``ec2``/``vpc``, ``s3``/"", ``rds``/``db``), the name part of the ARN, its tags, and
    which call found it."""

    arn: str
    service: str
    kind: str
    name: str
    tags: dict[str, str] = field(default_factory=dict)
    found_by: str = ""

    @property
    def names(self) -> set[str]:
        """What this resource may be called: the ARN's name, each of its ``/`` parts, and
        its ``Name`` tag."""
        out = {self.name, *self.name.split("/")}
        if self.tags.get("Name"):
            out.add(self.tags["Name"])
        return {n for n in out if n}


def parse_arn(arn: str) -> tuple[str, str, str, str]:
    """(service, region, kind, name) of ``arn:<partition>:<service>:<region>:<account>:<rest>``;
    ``rest`` is ``kind/name``, ``kind:name`` or a bare name (S3, SNS, SQS: kind "")."""
    parts = arn.split(":", 5)
    if len(parts) != 6 or parts[0] != "arn":
        raise TaggedError(f"not an ARN: {arn!r}")
    service, region, rest = parts[2], parts[3], parts[5]
    for sep in ("/", ":"):
        kind, found, name = rest.partition(sep)
        if found and service not in ("s3", "sns", "sqs"):
            return service, region, kind, name.removesuffix(":*")
    return service, region, "", rest


def _live(arn: str, tags: Mapping[str, str], found_by: str) -> LiveResource:
    service, _, kind, name = parse_arn(arn)
    return LiveResource(arn, service, kind, name, dict(tags), found_by)


def _tags(items: Any, key: str = "Key", value: str = "Value") -> dict[str, str]:
    if isinstance(items, Mapping):
        return {str(k): str(v) for k, v in items.items()}
    return {t[key]: t.get(value, "") for t in items or []}


def pages(client: Any, operation: str, key: str, error: type[Exception] = TaggedError,
          **kwargs: Any) -> Iterator[Any]:
    """The items under ``key`` of every page of ``operation``; an API failure becomes
    ``error`` naming the service and the call."""
    try:
        for page in client.get_paginator(operation).paginate(**kwargs):
            yield from page.get(key, [])
    except (ClientError, BotoCoreError) as exc:
        raise error(f"{client.meta.service_model.service_name}.{operation}: {exc}") from exc


def call(client: Any, operation: str, error: type[Exception] = TaggedError,
         **kwargs: Any) -> dict[str, Any]:
    """One API call; a failure becomes ``error`` naming the service and the call."""
    try:
        return getattr(client, operation)(**kwargs)
    except (ClientError, BotoCoreError) as exc:
        raise error(f"{client.meta.service_model.service_name}.{operation}: {exc}") from exc



def stack_tag_filters(project: str, stacks: list[str]) -> list[dict[str, Any]]:
    return [{"Key": "project", "Values": [project]}, {"Key": "stack", "Values": list(stacks)}]


def by_stack_tags(tagging: Any, project: str, stacks: list[str]) -> list[LiveResource]:
    """Resources tagged ``project=<project>`` and ``stack`` one of ``stacks``
    (``resourcegroupstaggingapi.get_resources``)."""
    return [_live(item["ResourceARN"], _tags(item.get("Tags")), "tagging-api")
            for item in pages(tagging, "get_resources", "ResourceTagMappingList",
                               TagFilters=stack_tag_filters(project, stacks))]


# (service, kind) -> what enumerates it: a resource of these kinds is either listed by
# :func:`described` or does not exist in the region.
EC2_KINDS: dict[str, tuple[str, str, str, str]] = {
    # kind: (operation, list key, id field, tags field)
    "vpc": ("describe_vpcs", "Vpcs", "VpcId", "Tags"),
    "subnet": ("describe_subnets", "Subnets", "SubnetId", "Tags"),
    "security-group": ("describe_security_groups", "SecurityGroups", "GroupId", "Tags"),
    "internet-gateway": ("describe_internet_gateways", "InternetGateways",
                         "InternetGatewayId", "Tags"),
    "natgateway": ("describe_nat_gateways", "NatGateways", "NatGatewayId", "Tags"),
    "route-table": ("describe_route_tables", "RouteTables", "RouteTableId", "Tags"),
    "vpc-endpoint": ("describe_vpc_endpoints", "VpcEndpoints", "VpcEndpointId", "Tags"),
    "launch-template": ("describe_launch_templates", "LaunchTemplates", "LaunchTemplateId", "Tags"),
}
DESCRIBED_KINDS = frozenset({*(("ec2", k) for k in EC2_KINDS), ("ec2", "instance"),
                             ("ec2", "elastic-ip"), ("s3", ""), ("ecr", "repository"),
                             ("rds", "db"), ("eks", "cluster"), ("eks", "nodegroup")})


def described(client: Callable[[str], Any], region: str, account: str) -> list[LiveResource]:
    """Every resource of :data:`DESCRIBED_KINDS` in the region, with its tags, from the
    EC2 / S3 / ECR / RDS / EKS describe (list) calls."""
    out: list[LiveResource] = []
    ec2 = client("ec2")

    def ec2_arn(kind: str, rid: str) -> str:
        return f"arn:aws:ec2:{region}:{account}:{kind}/{rid}"

    for kind, (operation, key, id_field, tags_field) in EC2_KINDS.items():
        for item in pages(ec2, operation, key):
            if kind == "natgateway" and item.get("State") in ("deleted", "deleting"):
                continue
            out.append(_live(ec2_arn(kind, item[id_field]), _tags(item.get(tags_field)), "ec2"))
    for reservation in pages(ec2, "describe_instances", "Reservations"):
        for inst in reservation.get("Instances", []):
            if inst.get("State", {}).get("Name") != "terminated":
                out.append(_live(ec2_arn("instance", inst["InstanceId"]),
                                 _tags(inst.get("Tags")), "ec2"))
    for address in call(ec2, "describe_addresses").get("Addresses", []):
        out.append(_live(ec2_arn("elastic-ip", address["AllocationId"]),
                         _tags(address.get("Tags")), "ec2"))

    s3 = client("s3")
    for bucket in call(s3, "list_buckets").get("Buckets", []):
        name = bucket["Name"]
        try:
            tag_set = s3.get_bucket_tagging(Bucket=name).get("TagSet", [])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "NoSuchTagSet":
                raise TaggedError(f"s3.get_bucket_tagging({name}): {exc}") from exc
            tag_set = []
        out.append(_live(f"arn:aws:s3:::{name}", _tags(tag_set), "s3"))

    ecr = client("ecr")
    for repo in pages(ecr, "describe_repositories", "repositories"):
        tags = call(ecr, "list_tags_for_resource", resourceArn=repo["repositoryArn"]).get("tags")
        out.append(_live(repo["repositoryArn"], _tags(tags), "ecr"))

    rds = client("rds")
    for db in pages(rds, "describe_db_instances", "DBInstances"):
        out.append(_live(db["DBInstanceArn"], _tags(db.get("TagList")), "rds"))

    eks = client("eks")
    for name in pages(eks, "list_clusters", "clusters"):
        cluster = call(eks, "describe_cluster", name=name)["cluster"]
        out.append(_live(cluster["arn"], _tags(cluster.get("tags")), "eks"))
        for group in pages(eks, "list_nodegroups", "nodegroups", clusterName=name):
            ng = call(eks, "describe_nodegroup", clusterName=name, nodegroupName=group)["nodegroup"]
            out.append(_live(ng["nodegroupArn"], _tags(ng.get("tags")), "eks"))
    return out


def account_id(sts: Any) -> str:
    return str(call(sts, "get_caller_identity")["Account"])

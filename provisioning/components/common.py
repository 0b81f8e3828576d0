"""Naming, tagging and small helpers shared by every component."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import pulumi

TYPE_PREFIX = "mlplatform:infra"


class DataClass(str, Enum):
    """What a resource holds, which decides its availability objective (the recovery
    objectives of the failure classes that data serves: provisioning/objectives.py) and how it may
    be retired (:data:`RETIREMENT`)."""

    PLATFORM = "platform"  # no user data: network, cluster, nodes, identities, queues
    CONTROL_PLANE_STATE = "control-plane-state"  # submissions, attempts, leases (database)
    ARTIFACTS = "artifacts"  # checkpoints, results, game-day archives (buckets)
    IMAGES = "images"  # container images (registry)
    TELEMETRY = "telemetry"  # logs, alarms, notifications
    ENCRYPTION_KEYS = "encryption-keys"  # the key every data store is encrypted with


# When a resource of each data class may go (the `retirement-condition` tag): with the
# stack (`pulumi destroy`), or only after the evidence it holds was exported, the logs'
# retention ran out, or the data it encrypts is gone.
RETIREMENT: dict[DataClass, str] = {
    DataClass.PLATFORM: "with-stack",
    DataClass.CONTROL_PLANE_STATE: "after-evidence-export",
    DataClass.ARTIFACTS: "after-evidence-export",
    DataClass.IMAGES: "with-stack",
    DataClass.TELEMETRY: "after-log-retention",
    DataClass.ENCRYPTION_KEYS: "after-data-deleted",
}
# The inventory's fields, carried as tags by every taggable AWS resource.
INVENTORY_TAGS = ("data-class", "availability-objective", "provisioning-source",
                  "retirement-condition")
REQUIRED_TAGS = ("owner", "environment", "project", "cost-center", "stack", *INVENTORY_TAGS)
POOL_LABEL = "platform.gameday/pool"
# kube-prometheus-stack, installed by Observability as a Helm release with this exact name:
# its Prometheus Service is "<release>-prometheus" in MONITORING_NAMESPACE, port 9090.
PROMETHEUS_RELEASE = "kube-prometheus-stack"
MONITORING_NAMESPACE = "monitoring"
PROMETHEUS_URL = f"http://{PROMETHEUS_RELEASE}-prometheus.{MONITORING_NAMESPACE}.svc:9090"
# Where scheduled game days archive their runs (`gameday gate --archive s3://<artifact
# bucket>/<prefix>`, slo/archive.py: write-once objects), and what their role may write.
GAME_DAY_ARCHIVE_PREFIX = "gameday-archive"
ACCELERATOR_LABEL = "platform.gameday/accelerator"
GPU_RESOURCE = "nvidia.com/gpu"
# Tag Karpenter discovers node subnets and security groups by; its value is the cluster
# name, which is ``Naming.prefix`` (provisioning/components/cluster.py).
DISCOVERY_TAG = "karpenter.sh/discovery"


@dataclass(frozen=True)
class Naming:
    """Names derived from project + stack, and the tags/labels every resource carries.

    ``availability`` maps each data class to its availability objective (derived from the
    recovery objectives, ``provisioning.objectives.availability_objectives``); ``source_stack`` is
    the stack whose `pulumi up` creates the resources (default: ``stack``; the application
    layer names things after its platform stack but is provisioned by ``<env>-app``)."""

    project: str
    stack: str
    environment: str
    owner: str
    cost_center: str
    availability: Mapping[str, str]
    source_stack: str = ""

    @property
    def provisioning_source(self) -> str:
        return f"pulumi:{self.project}/{self.source_stack or self.stack}"

    @property
    def prefix(self) -> str:
        return f"{self.project}-{self.stack}"

    def name(self, *parts: str) -> str:
        return "-".join((self.prefix, *parts))

    def tags(self, name: str | None = None, data: DataClass = DataClass.PLATFORM,
             **extra: str) -> dict[str, str]:
        """The stack's tags (what ``aws:defaultTags`` must say, for ``data`` = platform)
        plus ``Name``; a resource holding another class of data says so with ``data``."""
        tags = {
            "owner": self.owner,
            "environment": self.environment,
            "project": self.project,
            "cost-center": self.cost_center,
            "stack": self.stack,
            "managed-by": "pulumi",
            "data-class": data.value,
            "availability-objective": self.availability[data.value],
            "provisioning-source": self.provisioning_source,
            "retirement-condition": RETIREMENT[data],
        }
        if name:
            tags["Name"] = name
        tags.update(extra)
        return tags

    def labels(self, component: str | None = None) -> dict[str, str]:
        labels = {
            "app.kubernetes.io/part-of": self.project,
            "app.kubernetes.io/managed-by": "pulumi",
            "platform.gameday/environment": self.environment,
            "platform.gameday/owner": self.owner,
            "platform.gameday/cost-center": self.cost_center,
        }
        if component:
            labels["app.kubernetes.io/component"] = component
        return labels


def child(parent: pulumi.Resource, **kwargs: Any) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(parent=parent, **kwargs)


def policy_document(statements: list[dict[str, Any]]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": statements}, sort_keys=True)


def policy_output(statements: pulumi.Input[list[dict[str, Any]]]) -> pulumi.Output[str]:
    """A policy document whose ARNs are Outputs."""
    return pulumi.Output.from_input(statements).apply(policy_document)

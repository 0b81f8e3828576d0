"""Naming, tagging and small helpers shared by every component."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi

TYPE_PREFIX = "mlplatform:infra"
REQUIRED_TAGS = ("owner", "environment", "project", "cost-center")
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
# name, which is ``Naming.prefix`` (infra/components/cluster.py).
DISCOVERY_TAG = "karpenter.sh/discovery"


@dataclass(frozen=True)
class Naming:
    """Names derived from project + stack, and the tags/labels every resource carries."""

    project: str
    stack: str
    environment: str
    owner: str
    cost_center: str

    @property
    def prefix(self) -> str:
        return f"{self.project}-{self.stack}"

    def name(self, *parts: str) -> str:
        return "-".join((self.prefix, *parts))

    def tags(self, name: str | None = None, **extra: str) -> dict[str, str]:
        tags = {
            "owner": self.owner,
            "environment": self.environment,
            "project": self.project,
            "cost-center": self.cost_center,
            "stack": self.stack,
            "managed-by": "pulumi",
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

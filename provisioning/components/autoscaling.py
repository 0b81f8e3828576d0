"""Karpenter: the autoscaler that gives pending pods in the ``cpu`` and ``gpu`` pools a node.

What the Karpenter docs' "Getting started" CloudFormation template and Helm install create,
for this program: the controller's IRSA role (its documented controller policy, scoped by the
cluster tag where the docs scope it), the interruption queue with its EventBridge rules, the
chart (CRDs from its ``crds/``) on the ``system`` managed node group, and per workload pool an
``EC2NodeClass`` + ``NodePool`` whose node labels and taints are the ones the agents and the
game day select on (``pool_labels`` / ``pool_taints``).

Launched nodes use the pool's own node role (``Cluster.node_roles``), through an instance
profile created here, so the controller needs no IAM write permission.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pulumi_kubernetes as k8s

from provisioning.components.common import (
    DISCOVERY_TAG,
    POOL_LABEL,
    TYPE_PREFIX,
    Naming,
    child,
    policy_output,
)
from provisioning.components.identity import WorkloadIdentity
from provisioning.components.instance_types import pool_limits
from provisioning.components.nodepools import pool_labels, pool_taints
from provisioning.config import CapacityType, GpuNodePoolConfig, NodePoolConfig
from provisioning.versions import KARPENTER_CHART_VERSION

CHART = "oci://public.ecr.aws/karpenter/karpenter"
# 1.5 is the first Karpenter release supporting Kubernetes 1.33 (the stacks' version).
# last 1.5 patch (supports Kubernetes 1.29-1.33): checked against the pinned Kubernetes
# version in provisioning/versions.py
CHART_VERSION = KARPENTER_CHART_VERSION
NAMESPACE = "karpenter"
SERVICE_ACCOUNT = "karpenter"

# EventBridge events Karpenter acts on before AWS takes the instance away (docs: interruption).
INTERRUPTION_EVENTS: dict[str, dict[str, Any]] = {
    "scheduled-change": {"source": ["aws.health"], "detail-type": ["AWS Health Event"]},
    "spot-interruption": {"source": ["aws.ec2"],
                          "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "state-change": {"source": ["aws.ec2"],
                     "detail-type": ["EC2 Instance State-change Notification"]},
}

_CAPACITY = {CapacityType.ON_DEMAND: ["on-demand"],
             # Karpenter prefers spot and falls back to on-demand when spot is unavailable.
             CapacityType.SPOT: ["spot", "on-demand"]}


def ami_alias(cfg: NodePoolConfig) -> str:
    """AL2023 for cpu; the GPU pool's AMI family (both aliases pick the NVIDIA variant for
    GPU instance types)."""
    if isinstance(cfg, GpuNodePoolConfig) and cfg.ami_type.startswith("BOTTLEROCKET"):
        return "bottlerocket@latest"
    return "al2023@latest"


def block_devices(cfg: NodePoolConfig, kms_key_arn: pulumi.Input[str]) -> list[dict[str, Any]]:
    """Encrypted gp3 volumes with the data key; Bottlerocket keeps its OS on xvda and
    containers/images on xvdb."""
    def ebs(size: int) -> dict[str, Any]:
        return {"volumeSize": f"{size}Gi", "volumeType": "gp3", "encrypted": True,
                "kmsKeyID": kms_key_arn, "deleteOnTermination": True}
    if ami_alias(cfg).startswith("bottlerocket"):
        return [{"deviceName": "/dev/xvda", "ebs": ebs(4)},
                {"deviceName": "/dev/xvdb", "ebs": ebs(cfg.disk_size_gb)}]
    return [{"deviceName": "/dev/xvda", "ebs": ebs(cfg.disk_size_gb)}]


def k8s_taints(pool: str, cfg: NodePoolConfig) -> list[dict[str, str]]:
    """The managed-node-group taints (``NO_SCHEDULE``) in Kubernetes spelling."""
    effects = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute",
               "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
    return [{**t, "effect": effects[t["effect"]]} for t in pool_taints(pool, cfg)]


def node_pool_spec(pool: str, cfg: NodePoolConfig, node_class: str,
                   zones: list[str]) -> dict[str, Any]:
    gpu = isinstance(cfg, GpuNodePoolConfig)
    return {
        "template": {
            "metadata": {"labels": pool_labels(pool, cfg)},
            "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass",
                                 "name": node_class},
                "taints": k8s_taints(pool, cfg),
                "requirements": [
                    {"key": "node.kubernetes.io/instance-type", "operator": "In",
                     "values": list(cfg.instance_types)},
                    {"key": "karpenter.sh/capacity-type", "operator": "In",
                     "values": _CAPACITY[cfg.capacity_type]},
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": zones},
                    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                ],
                # Nodes are replaced monthly so AMI/security updates land without a human.
                "expireAfter": "720h",
            },
        },
        # GPU nodes only go when empty: consolidating a running training job would cost a
        # checkpoint restore. CPU nodes are also bin-packed.
        "disruption": ({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "5m"} if gpu
                       else {"consolidationPolicy": "WhenEmptyOrUnderutilized",
                             "consolidateAfter": "1m"}),
        # No minimum exists in a NodePool: with no pending pod the pool is at zero nodes.
        "limits": pool_limits(pool, cfg),
    }


def controller_statements(
    region: str, account_id: pulumi.Input[str], cluster_name: str,
    queue_arn: pulumi.Input[str], node_role_arns: list[pulumi.Input[str]],
    instance_profile_arns: list[pulumi.Input[str]], kms_key_arn: pulumi.Input[str],
) -> list[dict[str, Any]]:
    """Karpenter's documented controller policy (the v1.5 getting-started ``cloudformation.yaml``)
    minus the instance-profile write actions (profiles are created here, not by the controller)
    and the ``imagebuilder/*`` SSM read (AMIs are chosen by alias), plus EBS grants on the data
    key."""
    ec2 = pulumi.Output.concat("arn:aws:ec2:", region, ":*:")
    owned = {f"aws:RequestTag/kubernetes.io/cluster/{cluster_name}": "owned",
             "aws:RequestTag/eks:eks-cluster-name": cluster_name}
    launched = ["fleet/*", "instance/*", "volume/*", "network-interface/*", "launch-template/*",
                "spot-instances-request/*"]
    return [
        {"Sid": "AllowScopedEC2InstanceAccessActions", "Effect": "Allow",
         "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
         # AMIs and snapshots carry no account in their ARN.
         "Resource": [f"arn:aws:ec2:{region}::image/*", f"arn:aws:ec2:{region}::snapshot/*",
                      *(pulumi.Output.concat(ec2, r) for r in
                        ("security-group/*", "subnet/*", "capacity-reservation/*"))]},
        {"Sid": "AllowScopedEC2LaunchTemplateAccessActions", "Effect": "Allow",
         "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
         "Resource": [pulumi.Output.concat(ec2, "launch-template/*")],
         "Condition": {
             "StringEquals": {f"aws:ResourceTag/kubernetes.io/cluster/{cluster_name}": "owned"},
             "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"}}},
        {"Sid": "AllowScopedEC2InstanceActionsWithTags", "Effect": "Allow",
         "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"],
         "Resource": [pulumi.Output.concat(ec2, r) for r in (*launched, "capacity-reservation/*")],
         "Condition": {"StringEquals": owned,
                       "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"}}},
        {"Sid": "AllowScopedResourceCreationTagging", "Effect": "Allow",
         "Action": "ec2:CreateTags",
         "Resource": [pulumi.Output.concat(ec2, r) for r in launched],
         "Condition": {
             "StringEquals": {**owned, "ec2:CreateAction": ["RunInstances", "CreateFleet",
                                                            "CreateLaunchTemplate"]},
             "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"}}},
        {"Sid": "AllowScopedResourceTagging", "Effect": "Allow",
         "Action": "ec2:CreateTags",
         "Resource": [pulumi.Output.concat(ec2, "instance/*")],
         "Condition": {
             "StringEquals": {f"aws:ResourceTag/kubernetes.io/cluster/{cluster_name}": "owned"},
             "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
             "StringEqualsIfExists": {"aws:RequestTag/eks:eks-cluster-name": cluster_name},
             "ForAllValues:StringEquals": {
                 "aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim", "Name"]}}},
        {"Sid": "AllowScopedDeletion", "Effect": "Allow",
         "Action": ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
         "Resource": [pulumi.Output.concat(ec2, r) for r in ("instance/*", "launch-template/*")],
         "Condition": {
             "StringEquals": {f"aws:ResourceTag/kubernetes.io/cluster/{cluster_name}": "owned"},
             "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"}}},
        {"Sid": "AllowRegionalReadActions", "Effect": "Allow",
         "Action": ["ec2:DescribeCapacityReservations", "ec2:DescribeImages",
                    "ec2:DescribeInstances", "ec2:DescribeInstanceTypeOfferings",
                    "ec2:DescribeInstanceTypes", "ec2:DescribeLaunchTemplates",
                    "ec2:DescribeSecurityGroups", "ec2:DescribeSpotPriceHistory",
                    "ec2:DescribeSubnets"],
         "Resource": "*",  # Describe* has no resource-level permissions
         "Condition": {"StringEquals": {"aws:RequestedRegion": region}}},
        {"Sid": "AllowSSMReadActions", "Effect": "Allow", "Action": "ssm:GetParameter",
         "Resource": f"arn:aws:ssm:{region}::parameter/aws/service/*"},
        {"Sid": "AllowPricingReadActions", "Effect": "Allow", "Action": "pricing:GetProducts",
         "Resource": "*"},
        {"Sid": "AllowInterruptionQueueActions", "Effect": "Allow",
         "Action": ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"],
         "Resource": [queue_arn]},
        {"Sid": "AllowPassingInstanceRole", "Effect": "Allow", "Action": "iam:PassRole",
         "Resource": node_role_arns,
         "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}},
        {"Sid": "AllowInstanceProfileReadActions", "Effect": "Allow",
         "Action": "iam:GetInstanceProfile", "Resource": instance_profile_arns},
        {"Sid": "AllowAPIServerEndpointDiscovery", "Effect": "Allow",
         "Action": "eks:DescribeCluster",
         "Resource": pulumi.Output.concat("arn:aws:eks:", region, ":", account_id,
                                          ":cluster/", cluster_name)},
        # Root volumes are encrypted with the data key: EC2 creates grants on the caller's
        # behalf when it launches the instance.
        {"Sid": "AllowEncryptedVolumesWithDataKey", "Effect": "Allow",
         "Action": ["kms:CreateGrant", "kms:Decrypt", "kms:DescribeKey",
                    "kms:GenerateDataKeyWithoutPlaintext", "kms:ReEncrypt*"],
         "Resource": [kms_key_arn],
         "Condition": {"StringEquals": {"kms:ViaService": f"ec2.{region}.amazonaws.com"}}},
    ]


class KarpenterAws(pulumi.ComponentResource):
    """Karpenter's AWS side (platform layer): interruption queue and its rules, the workload
    pools' instance profiles and node access entries, the discovery tag on the cluster
    security group, and the controller's IRSA role."""

    queue_name: pulumi.Output[str]
    controller_role_arn: pulumi.Output[str]
    instance_profiles: dict[str, pulumi.Output[str]]

    def __init__(
        self,
        name: str,
        naming: Naming,
        region: str,
        account_id: pulumi.Input[str],
        cluster: eks.Cluster,
        cluster_name: str,
        oidc_provider_arn: pulumi.Input[str],
        oidc_provider_url: pulumi.Input[str],
        cluster_security_group_id: pulumi.Input[str],
        pools: dict[str, NodePoolConfig],
        node_roles: dict[str, aws.iam.Role],
        kms_key_arn: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:KarpenterAws", name, None, opts)
        # -- interruption queue ------------------------------------------------------------
        queue = aws.sqs.Queue(
            f"{name}-interruption",
            name=naming.name("karpenter-interruption"),
            message_retention_seconds=300,  # an interruption warning is stale after 2 min
            # SQS-managed SSE: EventBridge can deliver without a grant on the data key.
            sqs_managed_sse_enabled=True,
            tags=naming.tags(naming.name("karpenter-interruption")),
            opts=child(self),
        )
        aws.sqs.QueuePolicy(
            f"{name}-interruption",
            queue_url=queue.url,
            policy=policy_output([
                {"Sid": "EventBridgeAndSqsWrite", "Effect": "Allow",
                 "Principal": {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]},
                 "Action": "sqs:SendMessage", "Resource": queue.arn},
                {"Sid": "DenyHTTP", "Effect": "Deny", "Principal": "*", "Action": "sqs:*",
                 "Resource": queue.arn,
                 "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
            ]),
            opts=child(self),
        )
        for event, pattern in INTERRUPTION_EVENTS.items():
            rule = aws.cloudwatch.EventRule(
                f"{name}-{event}",
                name=naming.name("karpenter", event),
                event_pattern=pulumi.Output.json_dumps(pattern),
                tags=naming.tags(naming.name("karpenter", event)),
                opts=child(self),
            )
            aws.cloudwatch.EventTarget(f"{name}-{event}", rule=rule.name, arn=queue.arn,
                                       opts=child(self))

        # -- node identity: the pool's node role, allowed to join, behind an instance profile
        workload = [p for p in pools if p != "system"]
        profiles: dict[str, aws.iam.InstanceProfile] = {}
        for pool in workload:
            role = node_roles[pool]
            profiles[pool] = aws.iam.InstanceProfile(
                f"{name}-{pool}", name=naming.name("karpenter", pool), role=role.name,
                tags=naming.tags(naming.name("karpenter", pool)), opts=child(self))
            # API authentication mode: a node role joins only through an EC2_LINUX access
            # entry (managed node groups create theirs; Karpenter nodes need this one).
            # Bottlerocket nodes use the same type.
            aws.eks.AccessEntry(
                f"{name}-{pool}-access", cluster_name=cluster_name,
                principal_arn=role.arn, type="EC2_LINUX",
                tags=naming.tags(naming.name("karpenter", pool)),
                opts=child(self, depends_on=[cluster]))

        # -- subnets are tagged in Network; the EKS-created cluster security group here ----
        aws.ec2.Tag(f"{name}-cluster-sg-discovery", resource_id=cluster_security_group_id,
                    key=DISCOVERY_TAG, value=cluster_name,
                    opts=child(self, depends_on=[cluster]))

        # -- controller identity (the chart that uses it is in the application layer) --------
        identity = WorkloadIdentity(
            f"{name}-controller", naming, NAMESPACE, SERVICE_ACCOUNT, oidc_provider_arn,
            oidc_provider_url,
            controller_statements(region, account_id, cluster_name, queue.arn,
                                  [node_roles[p].arn for p in workload],
                                  [profiles[p].arn for p in workload], kms_key_arn),
            opts=child(self),
        )
        self.queue_name = queue.name
        self.controller_role_arn = identity.role_arn
        self.instance_profiles = {pool: profile.name for pool, profile in profiles.items()}
        self.register_outputs({"queue_name": self.queue_name,
                               "controller_role_arn": self.controller_role_arn,
                               "instance_profiles": self.instance_profiles})


class Karpenter(pulumi.ComponentResource):
    """Karpenter in the cluster (application layer): the controller chart, and one
    EC2NodeClass + NodePool per workload pool. AWS values come from ``KarpenterAws``."""

    node_pools: dict[str, k8s.apiextensions.CustomResource]

    def __init__(
        self,
        name: str,
        naming: Naming,
        cluster_name: str,
        queue_name: pulumi.Input[str],
        controller_role_arn: pulumi.Input[str],
        instance_profiles: Mapping[str, pulumi.Input[str]],
        pools: dict[str, NodePoolConfig],
        zones: list[str],
        kms_key_arn: pulumi.Input[str],
        k8s_provider: k8s.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:Karpenter", name, None, opts)
        workload = {p: c for p, c in pools.items() if p != "system"}
        k8s_opts = child(self, provider=k8s_provider)
        namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata={"name": NAMESPACE, "labels": naming.labels("karpenter")},
            opts=k8s_opts)
        chart = k8s.helm.v4.Chart(
            f"{name}-chart",
            chart=CHART,
            version=CHART_VERSION,
            name="karpenter",
            namespace=NAMESPACE,
            # CRDs (NodePool, NodeClaim, EC2NodeClass) come from the chart's crds/ directory,
            # which helm.v4.Chart installs unless skip_crds is set.
            skip_crds=False,
            values={
                "settings": {"clusterName": cluster_name, "interruptionQueue": queue_name},
                "serviceAccount": {"name": SERVICE_ACCOUNT,
                                   "annotations": {"eks.amazonaws.com/role-arn": controller_role_arn}},
                # On the system managed node group: Karpenter must never run on a node it manages.
                "nodeSelector": {POOL_LABEL: "system"},
                "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists",
                                 "effect": "NoSchedule"}],
                "replicas": 2,
            },
            opts=child(self, provider=k8s_provider, depends_on=[namespace]),
        )

        # -- per pool: EC2NodeClass + NodePool -------------------------------------------------
        self.node_pools = {}
        for pool, cfg in workload.items():
            node_class = k8s.apiextensions.CustomResource(
                f"{name}-{pool}-nodeclass",
                api_version="karpenter.k8s.aws/v1",
                kind="EC2NodeClass",
                metadata={"name": pool, "labels": naming.labels("karpenter")},
                spec={
                    "amiSelectorTerms": [{"alias": ami_alias(cfg)}],
                    "instanceProfile": instance_profiles[pool],
                    "subnetSelectorTerms": [{"tags": {DISCOVERY_TAG: cluster_name}}],
                    "securityGroupSelectorTerms": [{"tags": {DISCOVERY_TAG: cluster_name}}],
                    "metadataOptions": {"httpEndpoint": "enabled", "httpTokens": "required",
                                        "httpPutResponseHopLimit": 1},
                    "blockDeviceMappings": block_devices(cfg, kms_key_arn),
                    "tags": naming.tags(naming.name(pool), **{POOL_LABEL: pool}),
                },
                opts=child(self, provider=k8s_provider, depends_on=[chart]),
            )
            self.node_pools[pool] = k8s.apiextensions.CustomResource(
                f"{name}-{pool}-nodepool",
                api_version="karpenter.sh/v1",
                kind="NodePool",
                metadata={"name": pool, "labels": naming.labels("karpenter")},
                spec=node_pool_spec(pool, cfg, pool, zones),
                opts=child(self, provider=k8s_provider, depends_on=[chart, node_class]),
            )
        self.register_outputs({"node_pools": list(self.node_pools)})

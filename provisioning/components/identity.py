"""IAM roles for Kubernetes service accounts (IRSA), each scoped to named resources."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_aws as aws

from environments.cloud.tags import NODEPOOL_TAG, karpenter_tags
from platforms.controlplane import EVIDENCE_PREFIXES
from provisioning.components.common import (
    GAME_DAY_ARCHIVE_PREFIX,
    TYPE_PREFIX,
    Naming,
    child,
    policy_output,
)


class WorkloadIdentity(pulumi.ComponentResource):
    """One IAM role assumable only by ``system:serviceaccount:<namespace>:<name>``."""

    role_arn: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        naming: Naming,
        namespace: str,
        service_account: str,
        oidc_provider_arn: pulumi.Input[str],
        oidc_provider_url: pulumi.Input[str],
        statements: list[dict[str, Any]],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:WorkloadIdentity", name, None, opts)
        issuer = pulumi.Output.from_input(oidc_provider_url).apply(
            lambda url: url.removeprefix("https://")
        )
        trust = pulumi.Output.all(oidc_provider_arn, issuer).apply(lambda a: [{
            "Effect": "Allow",
            "Principal": {"Federated": a[0]},
            "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {"StringEquals": {
                f"{a[1]}:sub": f"system:serviceaccount:{namespace}:{service_account}",
                f"{a[1]}:aud": "sts.amazonaws.com",
            }},
        }])
        role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=policy_output(trust),
            tags=naming.tags(f"{name}-role", **{"platform.gameday/service-account": f"{namespace}/{service_account}"}),
            opts=child(self),
        )
        if statements:
            aws.iam.RolePolicy(f"{name}-policy", role=role.id, policy=policy_output(statements), opts=child(self))
        self.role_arn = role.arn
        self.register_outputs({"role_arn": self.role_arn})


def game_day_fault_statements(
    region: str,
    account_id: pulumi.Input[str],
    cluster_name: str,
    database_identifier: pulumi.Input[str],
    bucket_names: list[pulumi.Input[str]],
    node_pools: list[str],
    node_groups: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """What the cloud fault drivers (docs/chaos-cloud.md, "AWS IAM") call, each action on
    exactly this stack's resource; no wildcard action.

    ``node_pools`` (Karpenter NodePools) and ``node_groups`` (EKS managed node groups) are the
    pools a game day may lose a node of: the workload pools. The ``system`` pool (control plane
    and the game-day pod itself) is out of reach; without a node group there is no EKS
    permission at all."""
    if not node_pools and not node_groups:
        raise ValueError("game-day node faults need at least one NodePool or node group")
    arn = pulumi.Output.concat
    instances = [arn("arn:aws:ec2:", region, ":", account_id, ":instance/*")]
    node_faults: list[dict[str, Any]] = [
        # DescribeInstances has no resource-level permissions; it exposes no data.
        {"Sid": "FindNodeInstances", "Effect": "Allow",
         "Action": ["ec2:DescribeInstances"], "Resource": "*"},
    ]
    if node_pools:
        # The tags Karpenter itself puts on the instances it launches (environments/cloud/aws.py);
        # a NodePool's own spec.tags cannot set these keys.
        tags: dict[str, Any] = {**karpenter_tags(cluster_name, ""), NODEPOOL_TAG: list(node_pools)}
        node_faults.append(
            {"Sid": "TerminateKarpenterNodeOfThisCluster", "Effect": "Allow",
             "Action": ["ec2:TerminateInstances"], "Resource": instances,
             "Condition": {"StringEquals": {f"aws:ResourceTag/{k}": v for k, v in tags.items()}}})
    if node_groups:
        node_faults += [
            {"Sid": "NodeGroupScaling", "Effect": "Allow",
             "Action": ["eks:DescribeNodegroup", "eks:UpdateNodegroupConfig"],
             "Resource": [arn("arn:aws:eks:", region, ":", account_id, ":nodegroup/",
                              cluster_name, "/", ng, "/*") for ng in node_groups]},
            {"Sid": "TerminateNodeGroupNodeOfThisCluster", "Effect": "Allow",
             "Action": ["ec2:TerminateInstances"], "Resource": instances,
             "Condition": {"StringEquals": {"aws:ResourceTag/eks:cluster-name": cluster_name,
                                            "aws:ResourceTag/eks:nodegroup-name": list(node_groups)}}},
        ]
    return [
        {"Sid": "DatabaseFailover", "Effect": "Allow",
         "Action": ["rds:DescribeDBInstances", "rds:RebootDBInstance"],
         "Resource": [arn("arn:aws:rds:", region, ":", account_id, ":db:", database_identifier)]},
        # The bucket *policy* (artifact_store_unreachable adds/removes a Deny) ...
        {"Sid": "ArtifactStoreUnreachable", "Effect": "Allow",
         "Action": ["s3:GetBucketPolicy", "s3:PutBucketPolicy", "s3:DeleteBucketPolicy"],
         "Resource": [arn("arn:aws:s3:::", b) for b in bucket_names]},
        # ... and read-only evidence: snapshot/objects.jsonl lists the bucket and reads every
        # object of the run's operations under EVIDENCE_PREFIXES (platforms.controlplane
        # write_objects: sha256 of each, manifests parsed). Nothing else; never write/delete.
        {"Sid": "EvidenceReadOnly", "Effect": "Allow",
         "Action": ["s3:ListBucket"],
         "Resource": [arn("arn:aws:s3:::", b) for b in bucket_names]},
        {"Sid": "EvidenceManifestsReadOnly", "Effect": "Allow",
         "Action": ["s3:GetObject"],
         "Resource": [arn("arn:aws:s3:::", b, f"/{prefix}/*")
                      for b in bucket_names for prefix in EVIDENCE_PREFIXES]},
        *node_faults,
    ]


def game_day_identity(
    name: str,
    naming: Naming,
    namespace: str,
    oidc_provider_arn: pulumi.Input[str],
    oidc_provider_url: pulumi.Input[str],
    *,
    region: str,
    account_id: pulumi.Input[str],
    cluster_name: str,
    database_identifier: pulumi.Input[str],
    bucket_names: list[pulumi.Input[str]],
    node_pools: list[str],
    kms_key_arn: pulumi.Input[str],
    node_groups: Sequence[str] = (),
    opts: pulumi.ResourceOptions | None = None,
) -> WorkloadIdentity:
    """IRSA role of the ``gameday`` service account (the scheduled game-day CronJob).

    ``name`` must not start with ``<project>-<stack>-irsa-``: artifact_store_unreachable denies
    object access to every role matching that prefix (``denyPrincipalArns``), and the game-day
    role is the one that must keep the ability to undo it."""
    if name.startswith(naming.name("irsa")):
        raise ValueError(f"game-day role {name!r} would match the artifact fault's deny pattern "
                         f"{naming.name('irsa')}-*")
    return WorkloadIdentity(
        name, naming, namespace, "gameday", oidc_provider_arn, oidc_provider_url,
        [*game_day_fault_statements(region, account_id, cluster_name, database_identifier,
                                    bucket_names, node_pools, node_groups),
         *game_day_archive_statements(bucket_names[0], kms_key_arn)],
        opts=opts,
    )


def game_day_archive_statements(bucket: pulumi.Input[str], kms_key_arn: pulumi.Input[str]
                                ) -> list[dict[str, Any]]:
    """The run archive (``gameday gate --archive s3://<bucket>/<GAME_DAY_ARCHIVE_PREFIX>``):
    read and create objects under that prefix only (the archive never overwrites: conditional
    puts), and the data key the bucket encrypts with (reading the evidence manifests needs
    Decrypt too)."""
    arn = pulumi.Output.concat
    return [
        {"Sid": "RunArchive", "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
         "Resource": [arn("arn:aws:s3:::", bucket, f"/{GAME_DAY_ARCHIVE_PREFIX}/*")]},
        {"Sid": "BucketDataKey", "Effect": "Allow",
         "Action": ["kms:Decrypt", "kms:GenerateDataKey"], "Resource": [kms_key_arn]},
    ]

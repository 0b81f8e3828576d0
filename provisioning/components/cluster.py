"""EKS control plane: no default node group, API authentication, OIDC for IRSA, pinned
version, the DaemonSet add-ons (VPC CNI, kube-proxy), secrets envelope-encrypted with the data
key. CoreDNS needs nodes: ``addons.NodeAddons`` creates it after the system node group."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks

from provisioning.components.common import TYPE_PREFIX, DataClass, Naming, child, policy_output
from provisioning.config import ClusterConfig

NODE_POLICIES = (
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
    "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
)


def control_plane_log_group(cluster_name: str) -> str:
    """The log group EKS writes control-plane logs to (EKS user guide, "Send control plane
    logs to CloudWatch Logs")."""
    return f"/aws/eks/{cluster_name}/cluster"


class Cluster(pulumi.ComponentResource):
    cluster: eks.Cluster
    name: str
    oidc_provider_arn: pulumi.Output[str]
    oidc_provider_url: pulumi.Output[str]
    security_group_id: pulumi.Output[str]
    node_roles: dict[str, aws.iam.Role]

    def __init__(
        self,
        name: str,
        cfg: ClusterConfig,
        naming: Naming,
        vpc_id: pulumi.Input[str],
        public_subnet_ids: list[pulumi.Input[str]],
        private_subnet_ids: list[pulumi.Input[str]],
        kms_key_arn: pulumi.Input[str],
        pools: list[str],
        deletion_protection: bool,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:Cluster", name, None, opts)
        self.name = naming.prefix
        # One node role per pool: control-plane nodes and workload nodes never share
        # credentials (docs/DESIGN.md section 4.9).
        self.node_roles = {}
        for pool in pools:
            role = aws.iam.Role(
                f"{name}-node-{pool}",
                assume_role_policy=policy_output([{
                    "Effect": "Allow",
                    "Principal": {"Service": "ec2.amazonaws.com"},
                    "Action": "sts:AssumeRole",
                }]),
                tags=naming.tags(f"{name}-node-{pool}", **{"platform.gameday/pool": pool}),
                opts=child(self),
            )
            for i, arn in enumerate(NODE_POLICIES):
                aws.iam.RolePolicyAttachment(
                    f"{name}-node-{pool}-{i}", role=role.name, policy_arn=arn, opts=child(self)
                )
            self.node_roles[pool] = role

        # EKS writes control-plane logs to this group and creates it itself (no retention,
        # no KMS, no tags: invisible to the waste finder) unless it exists first; declared
        # after the cluster it would fail as already existing.
        self.log_group = aws.cloudwatch.LogGroup(
            f"{name}-control-plane-logs",
            name=control_plane_log_group(self.name),
            retention_in_days=cfg.log_retention_days,
            kms_key_id=kms_key_arn,
            tags=naming.tags(control_plane_log_group(self.name), DataClass.TELEMETRY),
            opts=child(self),
        )
        addon = {"enabled": True, "resolve_conflicts_on_update": "OVERWRITE"}
        self.cluster = eks.Cluster(
            f"{name}-eks",
            name=self.name,
            version=cfg.kubernetes_version,
            vpc_id=vpc_id,
            public_subnet_ids=public_subnet_ids,
            private_subnet_ids=private_subnet_ids,
            node_associate_public_ip_address=False,
            skip_default_node_group=True,
            # Managed node groups use the EKS-created cluster security group.
            skip_default_security_groups=True,
            authentication_mode=eks.AuthenticationMode.API,
            create_oidc_provider=True,
            endpoint_private_access=True,
            endpoint_public_access=cfg.endpoint_public_access,
            public_access_cidrs=cfg.public_access_cidrs or None,
            encryption_config_key_arn=kms_key_arn,
            enabled_cluster_log_types=["api", "audit", "authenticator", "controllerManager", "scheduler"],
            deletion_protection=deletion_protection,
            # Network policy enforcement in the VPC CNI: without it NetworkPolicies are inert.
            vpc_cni_options=eks.VpcCniOptionsArgs(
                enable_network_policy=True, resolve_conflicts_on_update="OVERWRITE"
            ),
            # Not here: inside the component it is created before any node (addons.py).
            coredns_addon_options=eks.CoreDnsAddonOptionsArgs(enabled=False),
            kube_proxy_addon_options=eks.KubeProxyAddonOptionsArgs(**addon),
            tags=naming.tags(self.name),
            opts=child(self, depends_on=[self.log_group]),
        )
        self.oidc_provider_arn = self.cluster.oidc_provider_arn
        self.oidc_provider_url = self.cluster.oidc_provider_url
        self.security_group_id = self.cluster.cluster_security_group_id
        self.register_outputs({
            "name": self.name,
            "oidc_provider_arn": self.oidc_provider_arn,
            "security_group_id": self.security_group_id,
        })

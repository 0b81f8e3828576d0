"""The ``system`` managed node group, the node labels/taints every pool carries, and the
NVIDIA device plugin where needed.

Only ``system`` is a managed node group (it hosts Karpenter itself); the ``cpu`` and ``gpu``
pools are Karpenter NodePools (``provisioning/components/autoscaling.py``) with the same labels and
taints, so selectors written against ``pool_labels`` work on either."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pulumi_kubernetes as k8s

from provisioning.components.common import (
    ACCELERATOR_LABEL,
    GPU_RESOURCE,
    POOL_LABEL,
    TYPE_PREFIX,
    Naming,
    child,
)
from provisioning.config import GpuNodePoolConfig, NodePoolConfig

# System nodes carry the taint EKS add-ons (CoreDNS) already tolerate, so ordinary
# workload pods cannot land next to the control plane.
SYSTEM_TAINT = {"key": "CriticalAddonsOnly", "value": "true", "effect": "NO_SCHEDULE"}
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NO_SCHEDULE"}
DEVICE_PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.17.2"


def pool_labels(pool: str, cfg: NodePoolConfig) -> dict[str, str]:
    labels = {POOL_LABEL: pool}
    if isinstance(cfg, GpuNodePoolConfig):
        labels[ACCELERATOR_LABEL] = cfg.accelerator_type
        labels["nvidia.com/gpu.present"] = "true"
    return labels


def pool_taints(pool: str, cfg: NodePoolConfig) -> list[dict[str, str]]:
    if isinstance(cfg, GpuNodePoolConfig):
        return [GPU_TAINT]
    if pool == "system":
        return [SYSTEM_TAINT]
    return []


class NodePool(pulumi.ComponentResource):
    labels: dict[str, str]

    def __init__(
        self,
        name: str,
        pool: str,
        cfg: NodePoolConfig,
        naming: Naming,
        cluster: eks.Cluster,
        node_role: aws.iam.Role,
        subnet_ids: list[pulumi.Input[str]],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:NodePool", name, None, opts)
        self.labels = pool_labels(pool, cfg)
        ami_type = cfg.ami_type if isinstance(cfg, GpuNodePoolConfig) else "AL2023_x86_64_STANDARD"
        node_tags = naming.tags(naming.name(pool), **{"platform.gameday/pool": pool})
        # A managed node group's own tags never reach its instances or volumes; a launch
        # template's tag specifications do (owner / cost-center on every node and disk). With
        # a launch template, EKS takes the disk and metadata settings from it, not the group.
        template = aws.ec2.LaunchTemplate(
            f"{name}-lt",
            name=naming.name(f"{pool}-nodes"),
            update_default_version=True,
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled", http_tokens="required",  # IMDSv2 only
                http_put_response_hop_limit=2),
            block_device_mappings=[aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name="/dev/xvda",
                # The account's EBS key: the Auto Scaling service-linked role may use it
                # without a grant in the data key's policy.
                ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                    volume_size=cfg.disk_size_gb, volume_type="gp3", encrypted="true",
                    delete_on_termination="true"),
            )],
            tag_specifications=[aws.ec2.LaunchTemplateTagSpecificationArgs(
                resource_type=kind, tags=node_tags)
                for kind in ("instance", "volume", "network-interface")],
            tags=naming.tags(naming.name(f"{pool}-nodes")),
            opts=child(self),
        )
        eks.ManagedNodeGroup(
            f"{name}-mng",
            cluster=cluster,
            node_group_name=naming.name(pool),
            node_role=node_role,
            subnet_ids=subnet_ids,
            ami_type=ami_type,
            instance_types=cfg.instance_types,
            capacity_type=cfg.capacity_type.value,
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=template.id, version=template.latest_version.apply(str)),
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=cfg.min_size,
                max_size=cfg.max_size,
                desired_size=cfg.desired_size if cfg.desired_size is not None else cfg.min_size,
            ),
            # Nothing autoscales a managed node group here (Karpenter manages only the cpu/gpu
            # NodePools): desired size is min (or desiredSize) at creation and later manual
            # changes are not reverted; resize through minSize/maxSize.
            ignore_scaling_changes=True,
            labels=self.labels,
            taints=[aws.eks.NodeGroupTaintArgs(**t) for t in pool_taints(pool, cfg)],
            tags=node_tags,
            opts=child(self),
        )
        self.register_outputs({"labels": self.labels})


class NvidiaDevicePlugin(pulumi.ComponentResource):
    """Advertises ``nvidia.com/gpu`` on AL2023 NVIDIA nodes (Bottlerocket ships its own).

    A plain DaemonSet rather than the Helm chart so its manifest is schema-validated."""

    def __init__(
        self,
        name: str,
        naming: Naming,
        gpu_labels: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:NvidiaDevicePlugin", name, None, opts)
        labels = {"app.kubernetes.io/name": "nvidia-device-plugin"}
        k8s.apps.v1.DaemonSet(
            f"{name}-ds",
            metadata={"name": "nvidia-device-plugin", "namespace": "kube-system",
                      "labels": {**naming.labels("nvidia-device-plugin"), **labels}},
            spec={
                "selector": {"matchLabels": labels},
                "updateStrategy": {"type": "RollingUpdate"},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": gpu_labels,
                        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                        "priorityClassName": "system-node-critical",
                        "containers": [{
                            "name": "nvidia-device-plugin",
                            "image": DEVICE_PLUGIN_IMAGE,
                            "env": [{"name": "FAIL_ON_INIT_ERROR", "value": "false"}],
                            "securityContext": {"allowPrivilegeEscalation": False,
                                                "capabilities": {"drop": ["ALL"]}},
                            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                                          "limits": {"memory": "128Mi"}},
                            "volumeMounts": [{"name": "device-plugin",
                                              "mountPath": "/var/lib/kubelet/device-plugins"}],
                        }],
                        "volumes": [{"name": "device-plugin",
                                     "hostPath": {"path": "/var/lib/kubelet/device-plugins"}}],
                    },
                },
            },
            opts=child(self),
        )
        self.register_outputs({})

"""EKS add-ons whose pods need nodes (CoreDNS), created after the node group they run on.

Inside pulumi-eks's ``Cluster`` with the default node group skipped, the CoreDNS add-on is
created before any node exists: it stays DEGRADED, the create times out after 20 minutes,
and the node group, which takes the cluster as input, never starts (pulumi-eks #1525,
#1819). Declared here, with the node group as a dependency, it becomes ACTIVE on first try.
DaemonSet add-ons (vpc-cni, kube-proxy) stay in the cluster component: they are ACTIVE with
no node, and nodes need them to become Ready.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from provisioning.components.common import TYPE_PREFIX, Naming, child

# Add-ons whose pods are a Deployment; EKS picks the default version for the cluster's
# Kubernetes version (none is pinned here). Their pods tolerate CriticalAddonsOnly, the
# system pool's taint (nodepools.SYSTEM_TAINT).
NODE_ADDONS = ("coredns",)


class NodeAddons(pulumi.ComponentResource):
    """``aws.eks.Addon`` per name; pass the node group in ``opts.depends_on``."""

    def __init__(self, name: str, naming: Naming, cluster_name: pulumi.Input[str],
                 node_group: pulumi.Resource, addons: tuple[str, ...] = NODE_ADDONS,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{TYPE_PREFIX}:NodeAddons", name, None, opts)
        self.addons = {
            addon: aws.eks.Addon(
                f"{name}-{addon}",
                cluster_name=cluster_name,
                addon_name=addon,
                # EKS bootstraps a self-managed CoreDNS with the cluster: take it over.
                resolve_conflicts_on_create="OVERWRITE",
                resolve_conflicts_on_update="OVERWRITE",
                tags=naming.tags(naming.name(addon)),
                opts=child(self, depends_on=[node_group]),
            )
            for addon in addons
        }
        self.register_outputs({"addons": list(self.addons)})

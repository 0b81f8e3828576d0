"""EC2 tags that identify a workload pool's instances, shared by the fault driver
(environments/cloud/aws.py) and the game day's IAM policy (provisioning/components/identity.py). No
dependencies: the Pulumi program imports it without the harness extras.

Karpenter v1 tags every instance it launches with these keys (``getTags`` in
karpenter-provider-aws ``pkg/cloudprovider/cloudprovider.go``; an EC2NodeClass's
``spec.tags`` may not set them, Karpenter refuses the NodeClass), so a pool's own tags can
never make an instance look like another pool's or another cluster's.
"""

from __future__ import annotations

NODEPOOL_TAG = "karpenter.sh/nodepool"
SYSTEM_POOL = "system"  # the control plane and the game-day pod: never a node-fault target


def karpenter_tags(cluster_name: str, nodepool: str) -> dict[str, str]:
    """The tags Karpenter puts on every instance of ``nodepool`` in ``cluster_name``."""
    return {NODEPOOL_TAG: nodepool, f"kubernetes.io/cluster/{cluster_name}": "owned",
            "eks:eks-cluster-name": cluster_name}

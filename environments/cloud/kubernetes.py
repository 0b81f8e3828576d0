"""Kubernetes fault primitives for the cloud environments (dev / staging / prod on EKS).

Targets are the objects ``provisioning/components/controlplane.py`` declares: Deployments
``controlplane-api``, ``controlplane-reconciler`` and ``controlplane-agent-<pool>`` in the
control-plane namespace, selected by ``app.kubernetes.io/name=controlplane`` +
``app.kubernetes.io/component=<component>``, and nodes labelled
``platform.gameday/pool=<pool>`` (``provisioning/components/nodepools.py``), and the Karpenter
NodePools of the workload pools (``provisioning/components/autoscaling.py``, ``karpenter.sh/v1``).

One fault family per module, each over a shared :class:`~environments.cloud.kube_session.KubeSession`
(clients, targets, the state file): ``kube_workloads`` (kill, stop, start), ``kube_isolation``
(hang, partition, registry), ``kube_nodes`` (pool cordon + drain, zone, node drain),
``kube_nodepools`` (Karpenter NodePools), ``kube_network_chaos`` (Chaos Mesh). This module is
their one face: :class:`KubernetesFaults`, the primitives the cloud driver routes to.

Writes go through chaostoolkit-kubernetes (``chaosk8s``) where one of its actions fits;
reads, pod labels and NetworkPolicy patches use the official client. Gray network faults
(toxics on the agents' route to the API) are Chaos Mesh ``NetworkChaos`` objects in the
control-plane namespace (``chaos-mesh.org/v1alpha1``; the mapping is
``environments/cloud/network_chaos.py``); Chaos Mesh must be installed in the cluster. Every change that has
an inverse is written to the :class:`~environments.cloud.fault_state.FaultState` file *before* it is
made, so ``restore_all`` can undo it after a crash.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from environments.cloud import network_chaos as chaos_mesh
from environments.cloud.kube_isolation import IsolationFaults
from environments.cloud.kube_network_chaos import NetworkChaosFaults
from environments.cloud.kube_nodepools import NodePoolFaults
from environments.cloud.kube_nodes import NodeFaults
from environments.cloud.kube_session import (
    APP_SELECTOR,
    FAULT_LABEL,
    ORIGINAL_LIMITS_ANNOTATION,
    POOL_LABEL,
    TOXIC_ANNOTATION,
    ZONE_LABEL,
    Component,
    KubernetesFaultError,
    KubeSession,
    KubeTarget,
)
from environments.cloud.kube_workloads import WorkloadFaults

if TYPE_CHECKING:
    from environments.cloud.fault_state import FaultState

__all__ = [
    "APP_SELECTOR",
    "FAULT_LABEL",
    "ORIGINAL_LIMITS_ANNOTATION",
    "POOL_LABEL",
    "TOXIC_ANNOTATION",
    "ZONE_LABEL",
    "Component",
    "KubeTarget",
    "KubernetesFaultError",
    "KubernetesFaults",
]


@dataclass
class KubernetesFaults:
    """The Kubernetes primitives of one cluster; each call goes to the family that owns it."""

    target: KubeTarget
    state: FaultState
    kube: KubeSession = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.kube = KubeSession(self.target, self.state)
        self.workloads = WorkloadFaults(self.kube)
        self.isolation = IsolationFaults(self.kube)
        self.nodes = NodeFaults(self.kube)
        self.nodepools = NodePoolFaults(self.kube)
        self.network = NetworkChaosFaults(self.kube)

    def resolve(self, target: str) -> Component:
        return self.kube.resolve(target)

    # kill / stop / start
    def kill(self, target: str) -> dict[str, Any]:
        return self.workloads.kill(target)

    def stop(self, target: str) -> dict[str, Any]:
        return self.workloads.stop(target)

    def start(self, target: str) -> dict[str, Any]:
        return self.workloads.start(target)

    def undo_stop(self, key: str) -> dict[str, Any] | None:
        return self.workloads.undo_stop(key)

    # isolation and the registry
    def hang(self, target: str) -> dict[str, Any]:
        return self.isolation.hang(target)

    def resume(self, target: str) -> dict[str, Any]:
        return self.isolation.resume(target)

    def undo_isolation(self, key: str) -> dict[str, Any] | None:
        return self.isolation.undo_isolation(key)

    def partition_agent(self, agent: str) -> dict[str, Any]:
        return self.isolation.partition_agent(agent)

    def heal_agent(self, agent: str) -> dict[str, Any]:
        return self.isolation.heal_agent(agent)

    def registry_unreachable(self) -> dict[str, Any]:
        return self.isolation.registry_unreachable()

    def registry_restore(self) -> dict[str, Any]:
        return self.isolation.registry_restore()

    # nodes: pools, zones, drains
    def withdraw_pool(self, pool: str, evict: bool = True) -> dict[str, Any]:
        return self.nodes.withdraw_pool(pool, evict)

    def restore_pool(self, pool: str) -> dict[str, Any]:
        return self.nodes.restore_pool(pool)

    def undo_withdraw(self, key: str) -> dict[str, Any] | None:
        return self.nodes.undo_withdraw(key)

    def zone_outage(self, zone: str) -> dict[str, Any]:
        return self.nodes.zone_outage(zone)

    def undo_zone_outage(self, key: str) -> dict[str, Any] | None:
        return self.nodes.undo_zone_outage(key)

    def drain_node(self, node: str, timeout: float | None = None,
                   retry_seconds: float = 5.0) -> dict[str, Any]:
        return self.nodes.drain_node(node, timeout, retry_seconds)

    def undo_drain(self, key: str) -> dict[str, Any] | None:
        return self.nodes.undo_drain(key)

    # Karpenter NodePools
    def withdraw_nodepool(self, pool: str, evict: bool = True) -> dict[str, Any]:
        return self.nodepools.withdraw_nodepool(pool, evict)

    def undo_withdraw_nodepool(self, key: str) -> dict[str, Any] | None:
        return self.nodepools.undo_withdraw_nodepool(key)

    # gray network (Chaos Mesh)
    def check_toxic(self, target: str, toxic: Any, where: str) -> chaos_mesh.Netem:
        return self.network.check_toxic(target, toxic, where)

    def add_network_chaos(self, target: str, toxic: Any) -> dict[str, Any]:
        return self.network.add_network_chaos(target, toxic)

    def remove_network_chaos(self, target: str, name: str) -> dict[str, Any]:
        return self.network.remove_network_chaos(target, name)

    def undo_network_chaos(self, key: str) -> dict[str, Any] | None:
        return self.network.undo_network_chaos(key)

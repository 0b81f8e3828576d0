"""What every Kubernetes fault of the cloud environments shares: where the platform runs
(:class:`KubeTarget`), the names it is found by, the API clients (chaostoolkit-kubernetes for
writes where one of its actions fits, the official client otherwise), the fault state file,
and targets resolved to Deployments and running pods. The fault families
(``kube_workloads``, ``kube_isolation``, ``kube_nodes``, ``kube_nodepools``,
``kube_network_chaos``) each hold one :class:`KubeSession`."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chaosk8s import create_k8s_api_client
from chaoslib.exceptions import ActivityFailed
from kubernetes import client
from kubernetes.client.rest import ApiException

if TYPE_CHECKING:
    from environments.cloud.fault_state import FaultState

# Mirrors provisioning/components/common.py and controlplane.py (a test keeps them in sync; not
# imported because that would pull Pulumi into every chaos run).
POOL_LABEL = "platform.gameday/pool"
ZONE_LABEL = "topology.kubernetes.io/zone"  # well-known label the kubelet sets on every node
APP_SELECTOR = {"app.kubernetes.io/name": "controlplane"}
API_COMPONENT = "api"
FAULT_LABEL = "gameday.platform/fault"  # put on pods a fault isolates; our policies select it
MANAGED_BY = {"app.kubernetes.io/managed-by": "gameday-chaos"}
SYSTEM_POOL = "system"
# Karpenter v1 (provisioning/components/autoscaling.py): NodePools and their NodeClaims are
# cluster-scoped; every NodeClaim carries its NodePool's name in this label.
KARPENTER_GROUP, KARPENTER_VERSION = "karpenter.sh", "v1"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
# The limits a withdrawn NodePool had, kept on the object too: a run whose state file was
# lost must not mistake its own zero limits for the original ones.
ORIGINAL_LIMITS_ANNOTATION = "gameday.platform/original-limits"
# Explicit: some client versions pick json-patch+json for a dict body on custom objects.
MERGE_PATCH = "application/merge-patch+json"
# The toxic a NetworkChaos of ours was made from (JSON), so a later run can tell its own.
TOXIC_ANNOTATION = "gameday.platform/toxic"


class KubernetesFaultError(ActivityFailed):
    """A Kubernetes fault could not be applied or undone (Chaos Toolkit records it as data)."""


@dataclass(frozen=True)
class KubeTarget:
    """Where the platform runs in one cluster (defaults match provisioning/config.py)."""

    namespace: str = "mlp-controlplane"
    workload_namespaces: tuple[str, ...] = ("mlp-workloads",)
    agent_pools: tuple[str, ...] = ("cpu", "gpu")
    agent_name_prefix: str = ""  # agents are named "<project>-<stack>-<pool>" in the cloud
    context: str | None = None
    kubeconfig: str | None = None  # a path; None = $KUBECONFIG / ~/.kube/config / in-pod
    registry_cidrs: tuple[str, ...] = ()  # e.g. the ECR interface-endpoint ENI IPs (/32)
    registry_port: int = 443
    partition_allow_cidrs: tuple[str, ...] = ()  # egress a partitioned agent keeps (K8s API ...)
    drain_timeout: int = 300
    node_pools: dict[str, str] = field(default_factory=dict)  # pool -> Karpenter NodePool name
    # Chaos Mesh NetworkChaos (gray network faults): the object's own end (``duration``), so a
    # run that crashed cannot leave it in effect, and how long to wait for Chaos Mesh to
    # report it injected / to finish recovering when it is deleted.
    network_chaos_duration: int = 900
    network_chaos_wait: float = 60.0
    api_service: str = "controlplane-api"  # the Service agents reach the API through
    cluster_domain: str = "cluster.local"


@dataclass(frozen=True)
class Component:
    deployment: str
    component: str
    index: int | None = None  # "api-2" -> the 2nd running pod (by name); None = all / any

    @property
    def selector(self) -> dict[str, str]:
        return {**APP_SELECTOR, "app.kubernetes.io/component": self.component}

    @property
    def label_selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.selector.items())


def dns_label(text: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", text.lower()).strip("-")[:50]


@dataclass
class KubeSession:
    target: KubeTarget
    state: FaultState
    _serializer: client.ApiClient = field(default_factory=client.ApiClient, repr=False)

    @property
    def secrets(self) -> dict[str, str]:
        return {"KUBERNETES_CONTEXT": self.target.context} if self.target.context else {}

    @contextmanager
    def kubeconfig(self) -> Iterator[None]:
        # chaosk8s reads the kubeconfig path from $KUBECONFIG only; point it at ours for
        # the duration of one call.
        if not self.target.kubeconfig:
            yield
            return
        before = os.environ.get("KUBECONFIG")
        os.environ["KUBECONFIG"] = self.target.kubeconfig
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("KUBECONFIG", None)
            else:
                os.environ["KUBECONFIG"] = before

    def api(self) -> client.ApiClient:
        with self.kubeconfig():
            return create_k8s_api_client(self.secrets)

    def chaosk8s(self, fn: Any, **kwargs: Any) -> Any:
        with self.kubeconfig():
            try:
                return fn(secrets=self.secrets, **kwargs)
            except ApiException as exc:
                raise KubernetesFaultError(f"{fn.__name__}({kwargs}): HTTP {exc.status} "
                                           f"{exc.reason}") from exc

    def to_dict(self, obj: Any) -> dict[str, Any]:
        return self._serializer.sanitize_for_serialization(obj)

    def resolve(self, target: str) -> Component:
        """``api``/``api-N``, ``reconciler[-N]``, ``agent:<pool>|<pool>-N|<agent name>``."""
        kind, _, rest = target.partition(":")
        if kind == "agent" and rest:
            return self.agent_component(rest)
        base, _, idx = target.rpartition("-")
        name, index = (base, int(idx)) if idx.isdigit() and base else (target, None)
        if name in ("api", "reconciler"):
            return Component(f"controlplane-{name}", name, index)
        if name.startswith("agent-") or name in self.target.agent_pools:
            return self.agent_component(target)
        raise KubernetesFaultError(
            f"unknown target {target!r}; use api, api-<n>, reconciler, agent:<pool> "
            f"(pools: {', '.join(self.target.agent_pools)})")

    def agent_component(self, agent: str) -> Component:
        name = agent.removeprefix("agent-")
        if self.target.agent_name_prefix:
            name = name.removeprefix(f"{self.target.agent_name_prefix}-")
        base, _, idx = name.rpartition("-")
        pool, index = (base, int(idx)) if idx.isdigit() and base else (name, None)
        if pool not in self.target.agent_pools:
            raise KubernetesFaultError(f"unknown agent {agent!r}; agent pools: "
                                       f"{', '.join(self.target.agent_pools)}")
        return Component(f"controlplane-agent-{pool}", f"agent-{pool}", index)

    def running_pods(self, comp: Component) -> list[client.V1Pod]:
        pods = client.CoreV1Api(self.api()).list_namespaced_pod(
            self.target.namespace, label_selector=comp.label_selector).items
        alive = [p for p in pods if p.status and p.status.phase == "Running"
                 and not p.metadata.deletion_timestamp]
        return sorted(alive, key=lambda p: p.metadata.name)

    def pick(self, comp: Component) -> list[client.V1Pod]:
        pods = self.running_pods(comp)
        if not pods:
            raise KubernetesFaultError(f"no running pod of {comp.deployment} in "
                                       f"{self.target.namespace}")
        if comp.index is None:
            return pods
        return [pods[(comp.index - 1) % len(pods)]]

    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api())

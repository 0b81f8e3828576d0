"""Kubernetes fault primitives for the cloud environments (dev / staging / prod on EKS).

Targets are the objects ``provisioning/components/controlplane.py`` declares: Deployments
``controlplane-api``, ``controlplane-reconciler`` and ``controlplane-agent-<pool>`` in the
control-plane namespace, selected by ``app.kubernetes.io/name=controlplane`` +
``app.kubernetes.io/component=<component>``, and nodes labelled
``platform.gameday/pool=<pool>`` (``provisioning/components/nodepools.py``), and the Karpenter
NodePools of the workload pools (``provisioning/components/autoscaling.py``, ``karpenter.sh/v1``).

Writes go through chaostoolkit-kubernetes (``chaosk8s``) where one of its actions fits;
reads, pod labels and NetworkPolicy patches use the official client. Gray network faults
(toxics on the agents' route to the API) are Chaos Mesh ``NetworkChaos`` objects in the
control-plane namespace (``chaos-mesh.org/v1alpha1``; the mapping is
``environments/cloud/network_chaos.py``); Chaos Mesh must be installed in the cluster. Every change that has
an inverse is written to the :class:`~environments.cloud.fault_state.FaultState` file *before* it is
made, so ``restore_all`` can undo it after a crash.

NetworkPolicies only ever *allow* (the allowed traffic of a pod is the union of every
policy selecting it), so a "deny" policy of our own cannot cancel an existing allow rule.
Where the platform already has allow rules (ingress to the API, workload egress on 443),
the driver narrows them for the fault and puts back the exact original spec afterwards.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chaosk8s import create_k8s_api_client
from chaosk8s.deployment.actions import scale_deployment
from chaosk8s.networking.actions import create_network_policy, remove_network_policy
from chaosk8s.node.actions import cordon_node, drain_nodes, uncordon_node
from chaosk8s.pod.actions import terminate_pods
from chaoslib.exceptions import ActivityFailed
from kubernetes import client
from kubernetes.client.rest import ApiException

from environments.cloud import network_chaos as chaos_mesh
from environments.local.toxics import ToxicError, parse_toxic

if TYPE_CHECKING:
    from environments.cloud.fault_state import FaultState

__all__ = [
    "FAULT_LABEL",
    "POOL_LABEL",
    "ZONE_LABEL",
    "Component",
    "KubeTarget",
    "KubernetesFaultError",
    "KubernetesFaults",
]

logger = logging.getLogger("chaostoolkit")

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


def _dns_label(text: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", text.lower()).strip("-")[:50]


@dataclass
class KubernetesFaults:
    target: KubeTarget
    state: FaultState
    _serializer: client.ApiClient = field(default_factory=client.ApiClient, repr=False)

    # -- clients ----------------------------------------------------------------------------
    @property
    def _secrets(self) -> dict[str, str]:
        return {"KUBERNETES_CONTEXT": self.target.context} if self.target.context else {}

    @contextmanager
    def _kubeconfig(self) -> Iterator[None]:
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

    def _api(self) -> client.ApiClient:
        with self._kubeconfig():
            return create_k8s_api_client(self._secrets)

    def _chaosk8s(self, fn: Any, **kwargs: Any) -> Any:
        with self._kubeconfig():
            try:
                return fn(secrets=self._secrets, **kwargs)
            except ApiException as exc:
                raise KubernetesFaultError(f"{fn.__name__}({kwargs}): HTTP {exc.status} "
                                           f"{exc.reason}") from exc

    def _to_dict(self, obj: Any) -> dict[str, Any]:
        return self._serializer.sanitize_for_serialization(obj)

    # -- targets ----------------------------------------------------------------------------
    def resolve(self, target: str) -> Component:
        """``api``/``api-N``, ``reconciler[-N]``, ``agent:<pool>|<pool>-N|<agent name>``."""
        kind, _, rest = target.partition(":")
        if kind == "agent" and rest:
            return self._agent_component(rest)
        base, _, idx = target.rpartition("-")
        name, index = (base, int(idx)) if idx.isdigit() and base else (target, None)
        if name in ("api", "reconciler"):
            return Component(f"controlplane-{name}", name, index)
        if name.startswith("agent-") or name in self.target.agent_pools:
            return self._agent_component(target)
        raise KubernetesFaultError(
            f"unknown target {target!r}; use api, api-<n>, reconciler, agent:<pool> "
            f"(pools: {', '.join(self.target.agent_pools)})")

    def _agent_component(self, agent: str) -> Component:
        name = agent.removeprefix("agent-")
        if self.target.agent_name_prefix:
            name = name.removeprefix(f"{self.target.agent_name_prefix}-")
        base, _, idx = name.rpartition("-")
        pool, index = (base, int(idx)) if idx.isdigit() and base else (name, None)
        if pool not in self.target.agent_pools:
            raise KubernetesFaultError(f"unknown agent {agent!r}; agent pools: "
                                       f"{', '.join(self.target.agent_pools)}")
        return Component(f"controlplane-agent-{pool}", f"agent-{pool}", index)

    def _running_pods(self, comp: Component) -> list[client.V1Pod]:
        pods = client.CoreV1Api(self._api()).list_namespaced_pod(
            self.target.namespace, label_selector=comp.label_selector).items
        alive = [p for p in pods if p.status and p.status.phase == "Running"
                 and not p.metadata.deletion_timestamp]
        return sorted(alive, key=lambda p: p.metadata.name)

    def _pick(self, comp: Component) -> list[client.V1Pod]:
        pods = self._running_pods(comp)
        if not pods:
            raise KubernetesFaultError(f"no running pod of {comp.deployment} in "
                                       f"{self.target.namespace}")
        if comp.index is None:
            return pods
        return [pods[(comp.index - 1) % len(pods)]]

    # -- kill / stop / start ----------------------------------------------------------------
    def kill(self, target: str) -> dict[str, Any]:
        """Delete one pod of the Deployment with grace 0 (SIGKILL); its ReplicaSet replaces it."""
        comp = self.resolve(target)
        pod = self._pick(comp)[0].metadata.name
        logger.warning("chaos kill: deleting pod %s/%s (grace 0) of %s", self.target.namespace,
                       pod, comp.deployment)
        deleted = self._chaosk8s(terminate_pods, label_selector=comp.label_selector,
                                 name_pattern=f"^{re.escape(pod)}$", grace_period=0,
                                 ns=self.target.namespace)
        return {"target": target, "deployment": comp.deployment, "pods": deleted}

    def _deployment(self, comp: Component) -> client.V1Deployment:
        try:
            return client.AppsV1Api(self._api()).read_namespaced_deployment(
                comp.deployment, self.target.namespace)
        except ApiException as exc:
            raise KubernetesFaultError(f"deployment {self.target.namespace}/{comp.deployment}: "
                                       f"HTTP {exc.status} {exc.reason}") from exc

    def stop(self, target: str) -> dict[str, Any]:
        """Scale the whole Deployment to 0 after recording its replica count."""
        comp = self.resolve(target)
        key = f"stop:{comp.deployment}"
        if (record := self.state.get(key)) is not None:
            return {"target": target, "already": True, **record["undo"]}
        replicas = self._deployment(comp).spec.replicas or 0
        undo = {"namespace": self.target.namespace, "deployment": comp.deployment,
                "replicas": replicas}
        self.state.put(key, "stop", target, undo)
        logger.warning("chaos stop: scaling %s/%s from %d to 0", self.target.namespace,
                       comp.deployment, replicas)
        self._chaosk8s(scale_deployment, name=comp.deployment, replicas=0,
                       ns=self.target.namespace)
        return {"target": target, **undo}

    def start(self, target: str) -> dict[str, Any]:
        """Inverse of stop: scale back to the recorded count (no record: nothing to do)."""
        comp = self.resolve(target)
        return self.undo_stop(f"stop:{comp.deployment}") or {"target": target, "already": True}

    def undo_stop(self, key: str) -> dict[str, Any] | None:
        record = self.state.get(key)
        if record is None:
            return None
        undo = record["undo"]
        logger.warning("chaos start: scaling %s/%s back to %d", undo["namespace"],
                       undo["deployment"], undo["replicas"])
        self._chaosk8s(scale_deployment, name=undo["deployment"], replicas=undo["replicas"],
                       ns=undo["namespace"])
        self.state.pop(key)
        return {"target": record["target"], **undo}

    # -- isolation (hang, partition) --------------------------------------------------------
    def _label_pods(self, namespace: str, pods: list[str], value: str | None) -> None:
        core = client.CoreV1Api(self._api())
        for pod in pods:
            try:
                core.patch_namespaced_pod(pod, namespace, {"metadata": {"labels": {FAULT_LABEL: value}}})
            except ApiException as exc:
                if exc.status != 404 or value is not None:  # a gone pod needs no unlabelling
                    raise KubernetesFaultError(f"label pod {namespace}/{pod}: HTTP {exc.status}") from exc

    def _policy_body(self, name: str, value: str, types: list[str],
                     egress: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"podSelector": {"matchLabels": {FAULT_LABEL: value}},
                                "policyTypes": types}
        if egress:
            spec["egress"] = egress
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": name, "namespace": self.target.namespace,
                             "labels": dict(MANAGED_BY)}, "spec": spec}

    def _create_policy(self, body: dict[str, Any]) -> None:
        try:
            self._chaosk8s(create_network_policy, spec=body, ns=body["metadata"]["namespace"])
        except KubernetesFaultError as exc:
            if not isinstance(exc.__cause__, ApiException) or exc.__cause__.status != 409:
                raise  # 409: left over from a crashed run, already in effect

    def _remove_policy(self, namespace: str, name: str) -> None:
        try:
            self._chaosk8s(remove_network_policy, name=name, ns=namespace)
        except KubernetesFaultError as exc:
            if not isinstance(exc.__cause__, ApiException) or exc.__cause__.status != 404:
                raise

    def _exclude_from_ingress_allows(self, namespace: str) -> dict[str, Any]:
        """Make every ingress-allowing policy skip pods carrying FAULT_LABEL; return the
        original podSelectors so the exact prior state can be put back."""
        net = client.NetworkingV1Api(self._api())
        originals: dict[str, Any] = {}
        for pol in net.list_namespaced_network_policy(namespace).items:
            spec = self._to_dict(pol.spec)
            if _ours(pol) or not spec.get("ingress"):
                continue
            selector = spec.get("podSelector") or {}
            exprs = selector.get("matchExpressions") or []
            if any(e.get("key") == FAULT_LABEL for e in exprs):
                continue  # already narrowed by an earlier, unfinished call
            originals[pol.metadata.name] = copy.deepcopy(selector)
            selector["matchExpressions"] = [*exprs, {"key": FAULT_LABEL, "operator": "DoesNotExist"}]
            net.patch_namespaced_network_policy(pol.metadata.name, namespace,
                                                {"spec": {"podSelector": selector}})
        return originals

    def _restore_policies(self, namespace: str, originals: dict[str, Any]) -> None:
        net = client.NetworkingV1Api(self._api())
        for name, selector in originals.items():
            try:
                body = self._to_dict(net.read_namespaced_network_policy(name, namespace))
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            body["spec"]["podSelector"] = selector  # replace, not merge: exact original
            net.replace_namespaced_network_policy(name, namespace, body)

    def hang(self, target: str) -> dict[str, Any]:
        """Isolate the target pods (ingress + egress): they keep running but nobody reaches
        them and they reach nothing, which clients see as a hang."""
        comp = self.resolve(target)
        key = f"hang:{target}"
        if self.state.get(key) is not None:
            return {"target": target, "already": True}
        ns, value = self.target.namespace, f"hang-{_dns_label(target)}"
        pods = [p.metadata.name for p in self._pick(comp)]
        undo: dict[str, Any] = {"namespace": ns, "pods": pods, "policy": f"gameday-{value}",
                                "label": value, "narrowed": {}}
        self.state.put(key, "hang", target, undo)
        logger.warning("chaos hang: isolating pods %s of %s/%s", pods, ns, comp.deployment)
        self._label_pods(ns, pods, value)
        self._create_policy(self._policy_body(undo["policy"], value, ["Ingress", "Egress"]))
        undo["narrowed"] = self._exclude_from_ingress_allows(ns)
        self.state.put(key, "hang", target, undo)
        return {"target": target, **undo}

    def resume(self, target: str) -> dict[str, Any]:
        return self.undo_isolation(f"hang:{target}") or {"target": target, "already": True}

    def undo_isolation(self, key: str) -> dict[str, Any] | None:
        record = self.state.get(key)
        if record is None:
            return None
        undo = record["undo"]
        logger.warning("chaos heal: removing %s/%s, unlabelling %s", undo["namespace"],
                       undo["policy"], undo["pods"])
        self._restore_policies(undo["namespace"], undo.get("narrowed", {}))
        self._remove_policy(undo["namespace"], undo["policy"])
        self._label_pods(undo["namespace"], undo["pods"], None)
        self.state.pop(key)
        return {"target": record["target"], **undo}

    def partition_agent(self, agent: str) -> dict[str, Any]:
        """Deny egress from the agent's pod(s) to the control-plane API pods; DNS, other pods
        and ``partition_allow_cidrs`` stay reachable."""
        comp = self._agent_component(agent)
        key = f"partition_agent:{agent}"
        if self.state.get(key) is not None:
            return {"target": agent, "already": True}
        ns, value = self.target.namespace, f"partition-{_dns_label(comp.component)}"
        pods = [p.metadata.name for p in self._pick(comp)]
        undo = {"namespace": ns, "pods": pods, "policy": f"gameday-{value}", "label": value,
                "narrowed": {}}
        # Egress allow-list = everything except the API pods (no egress policy exists in
        # the namespace, so nothing else can re-allow them).
        not_api = {"matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "NotIn",
                                         "values": [API_COMPONENT]}]}
        other_ns = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                          "values": [ns]}]}
        egress = [{"to": [{"podSelector": not_api}, {"namespaceSelector": other_ns}]}]
        egress += [{"to": [{"ipBlock": {"cidr": c}} for c in self.target.partition_allow_cidrs]}] \
            if self.target.partition_allow_cidrs else []
        self.state.put(key, "partition_agent", agent, undo)
        logger.warning("chaos partition: agent pods %s in %s lose the control-plane API", pods, ns)
        self._label_pods(ns, pods, value)
        self._create_policy(self._policy_body(undo["policy"], value, ["Egress"], egress))
        return {"target": agent, **undo}

    def heal_agent(self, agent: str) -> dict[str, Any]:
        return self.undo_isolation(f"partition_agent:{agent}") or {"target": agent, "already": True}

    # -- registry ---------------------------------------------------------------------------
    def registry_unreachable(self) -> dict[str, Any]:
        """Add the registry CIDRs to the ``except`` of every workload-namespace egress rule
        that allows the registry port (the only way to take an allow away)."""
        key = "registry_unreachable"
        if self.state.get(key) is not None:
            return {"target": "registry", "already": True}
        if not self.target.registry_cidrs:
            raise KubernetesFaultError("registry_unreachable needs registry_cidrs (the ECR "
                                       "endpoint addresses) in the target config")
        net = client.NetworkingV1Api(self._api())
        originals: dict[str, dict[str, Any]] = {}
        changes: list[tuple[str, str, dict[str, Any]]] = []
        for ns in self.target.workload_namespaces:
            for pol in net.list_namespaced_network_policy(ns).items:
                spec = self._to_dict(pol.spec)
                if self._narrow_egress(spec):
                    originals[f"{ns}/{pol.metadata.name}"] = self._to_dict(pol.spec)
                    changes.append((ns, pol.metadata.name, spec))
        undo = {"policies": originals, "cidrs": list(self.target.registry_cidrs)}
        self.state.put(key, "registry_unreachable", "registry", undo)
        for ns, name, spec in changes:
            logger.warning("chaos registry: %s/%s egress now excludes %s", ns, name,
                           self.target.registry_cidrs)
            body = self._to_dict(net.read_namespaced_network_policy(name, ns))
            body["spec"] = spec
            net.replace_namespaced_network_policy(name, ns, body)
        return {"target": "registry", **undo}

    def _narrow_egress(self, spec: dict[str, Any]) -> bool:
        changed = False
        for rule in spec.get("egress") or []:
            ports = rule.get("ports") or []
            if ports and not any(p.get("port") == self.target.registry_port for p in ports):
                continue
            for peer in rule.get("to") or []:
                block = peer.get("ipBlock")
                if block and _covers_any(block):
                    missing = [c for c in self.target.registry_cidrs if c not in block.get("except", [])]
                    if missing:
                        block["except"] = [*block.get("except", []), *missing]
                        changed = True
        return changed

    def registry_restore(self) -> dict[str, Any]:
        record = self.state.get("registry_unreachable")
        if record is None:
            return {"target": "registry", "already": True}
        net = client.NetworkingV1Api(self._api())
        for ref, spec in record["undo"]["policies"].items():
            ns, name = ref.split("/", 1)
            try:
                body = self._to_dict(net.read_namespaced_network_policy(name, ns))
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            body["spec"] = spec
            logger.warning("chaos registry restore: %s back to its original spec", ref)
            net.replace_namespaced_network_policy(name, ns, body)
        self.state.pop("registry_unreachable")
        return {"target": "registry", **record["undo"]}

    # -- node pools -------------------------------------------------------------------------
    def withdraw_pool(self, pool: str, evict: bool = True) -> dict[str, Any]:
        """Cordon every node of the pool and (``evict``) drain it through the eviction API."""
        if pool == SYSTEM_POOL:
            raise KubernetesFaultError("refusing to withdraw the system pool: the control "
                                       "plane itself runs there (use kill/stop instead)")
        key = f"withdraw_pool:{pool}"
        if self.state.get(key) is not None:
            return {"target": pool, "already": True}
        selector = f"{POOL_LABEL}={pool}"
        nodes = client.CoreV1Api(self._api()).list_node(label_selector=selector).items
        # Restore must leave nodes someone else had cordoned cordoned.
        ours = sorted(n.metadata.name for n in nodes if not (n.spec and n.spec.unschedulable))
        undo = {"mode": "cordon", "pool": pool, "cordoned": ours,
                "already_cordoned": sorted({n.metadata.name for n in nodes} - set(ours))}
        self.state.put(key, "withdraw_pool", pool, undo)
        if not nodes:
            logger.warning("chaos withdraw_pool: pool %s has no nodes right now", pool)
            return {"target": pool, **undo, "drained": []}
        logger.warning("chaos withdraw_pool: cordoning%s nodes %s (%s)",
                       " and draining" if evict else "", ours, selector)
        for node in ours:
            self._chaosk8s(cordon_node, name=node)
        drained: list[str] = []
        if evict:
            # Control-plane and workload pods mount an emptyDir (/tmp): allow evicting them.
            drained = self._chaosk8s(drain_nodes, label_selector=selector,
                                     delete_pods_with_local_storage=True,
                                     timeout=self.target.drain_timeout)
        return {"target": pool, **undo, "drained": drained}

    def restore_pool(self, pool: str) -> dict[str, Any]:
        return self.undo_withdraw(f"withdraw_pool:{pool}") or {"target": pool, "already": True}

    def undo_withdraw(self, key: str) -> dict[str, Any] | None:
        record = self.state.get(key)
        if record is None:
            return None
        undo = record["undo"]
        present = {n.metadata.name for n in client.CoreV1Api(self._api()).list_node(
            label_selector=f"{POOL_LABEL}={undo['pool']}").items}
        back = [n for n in undo["cordoned"] if n in present]  # replaced nodes come uncordoned
        logger.warning("chaos restore_pool: uncordoning %s", back)
        for node in back:
            self._chaosk8s(uncordon_node, name=node)
        self.state.pop(key)
        return {"target": record["target"], **undo, "uncordoned": back}

    # -- zones ------------------------------------------------------------------------------
    def zone_outage(self, zone: str) -> dict[str, Any]:
        """Cordon every node labelled ``topology.kubernetes.io/zone=<zone>`` and delete (grace
        0) the control-plane and workload pods running there: their controllers recreate them
        in the other zones. Nodes someone else had cordoned stay cordoned on restore."""
        key = f"zone_cordon:{zone}"
        if self.state.get(key) is not None:
            return {"target": zone, "already": True}
        core = client.CoreV1Api(self._api())
        nodes = core.list_node(label_selector=f"{ZONE_LABEL}={zone}").items
        if not nodes:
            raise KubernetesFaultError(f"zone_outage: no node labelled {ZONE_LABEL}={zone}")
        names = sorted(n.metadata.name for n in nodes)
        ours = sorted(n.metadata.name for n in nodes if not (n.spec and n.spec.unschedulable))
        undo = {"zone": zone, "cordoned": ours, "already_cordoned": sorted(set(names) - set(ours))}
        self.state.put(key, "zone_cordon", zone, undo)
        logger.warning("chaos zone_outage: cordoning %s (%s=%s)", ours, ZONE_LABEL, zone)
        for node in ours:
            self._chaosk8s(cordon_node, name=node)
        namespaces = {self.target.namespace, *self.target.workload_namespaces}
        deleted = []
        for node in names:
            pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
            for pod in sorted(pods, key=lambda p: (p.metadata.namespace, p.metadata.name)):
                if pod.metadata.namespace not in namespaces or pod.metadata.deletion_timestamp:
                    continue
                ref = f"{pod.metadata.namespace}/{pod.metadata.name}"
                logger.warning("chaos zone_outage: deleting pod %s on %s (grace 0)", ref, node)
                try:
                    core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace,
                                               body=client.V1DeleteOptions(grace_period_seconds=0))
                except ApiException as exc:
                    if exc.status != 404:
                        raise KubernetesFaultError(f"delete pod {ref}: HTTP {exc.status} "
                                                   f"{exc.reason}") from exc
                deleted.append(ref)
        return {"target": zone, **undo, "deleted_pods": deleted}

    def undo_zone_outage(self, key: str) -> dict[str, Any] | None:
        record = self.state.get(key)
        if record is None:
            return None
        undo = record["undo"]
        present = {n.metadata.name for n in client.CoreV1Api(self._api()).list_node(
            label_selector=f"{ZONE_LABEL}={undo['zone']}").items}
        back = [n for n in undo["cordoned"] if n in present]
        logger.warning("chaos restore_zone: uncordoning %s", back)
        for node in back:
            self._chaosk8s(uncordon_node, name=node)
        self.state.pop(key)
        return {"target": record["target"], **undo, "uncordoned": back}

    # -- node drain (rolling upgrade of nodes) ---------------------------------------------
    def drain_node(self, node: str, timeout: float | None = None,
                   retry_seconds: float = 5.0) -> dict[str, Any]:
        """Cordon one node and evict its pods through the eviction API, so every
        PodDisruptionBudget is honoured: an eviction the API refuses (429, the budget has no
        disruption left) is retried every ``retry_seconds`` until ``timeout``, never replaced
        by a plain delete. DaemonSet and mirror pods stay, as with ``kubectl drain``. Raises
        when pods are still there at the deadline (the node stays cordoned; restore uncordons).
        Never run against a real cluster from this repository (docs/upgrades.md)."""
        import time

        key = f"drain_node:{node}"
        if self.state.get(key) is not None:
            return {"target": node, "already": True}
        core = client.CoreV1Api(self._api())
        found = core.list_node(field_selector=f"metadata.name={node}").items
        if not found:
            raise KubernetesFaultError(f"drain_node: no node named {node!r}")
        was_cordoned = bool(found[0].spec and found[0].spec.unschedulable)
        undo = {"node": node, "cordoned": not was_cordoned}
        self.state.put(key, "drain_node", node, undo)
        if not was_cordoned:
            logger.warning("chaos drain_node: cordoning %s", node)
            self._chaosk8s(cordon_node, name=node)
        pending = [p for p in core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}").items if _evictable(p)]
        deadline = time.monotonic() + (timeout if timeout is not None else self.target.drain_timeout)
        evicted: list[str] = []
        refused: dict[str, int] = {}
        while pending:
            waiting = []
            for pod in pending:
                ref = f"{pod.metadata.namespace}/{pod.metadata.name}"
                body = client.V1Eviction(metadata=client.V1ObjectMeta(
                    name=pod.metadata.name, namespace=pod.metadata.namespace))
                try:
                    core.create_namespaced_pod_eviction(pod.metadata.name,
                                                        pod.metadata.namespace, body)
                    evicted.append(ref)
                except ApiException as exc:
                    if exc.status == 404:
                        continue  # gone already
                    if exc.status != 429:
                        raise KubernetesFaultError(f"drain_node {node}: evicting {ref}: "
                                                   f"HTTP {exc.status} {exc.reason}") from exc
                    refused[ref] = refused.get(ref, 0) + 1  # a PodDisruptionBudget says no
                    waiting.append(pod)
            pending = waiting
            if pending and time.monotonic() + retry_seconds > deadline:
                names = sorted(f"{p.metadata.namespace}/{p.metadata.name}" for p in pending)
                raise KubernetesFaultError(
                    f"drain_node {node}: PodDisruptionBudgets still refuse evicting {names} "
                    "at the deadline; the node stays cordoned (restore_all uncordons it)")
            if pending:
                logger.warning("chaos drain_node: %d eviction(s) refused by a "
                               "PodDisruptionBudget; retrying in %.0fs", len(pending), retry_seconds)
                time.sleep(retry_seconds)
        return {"target": node, **undo, "evicted": evicted, "refused_by_pdb": refused}

    def undo_drain(self, key: str) -> dict[str, Any] | None:
        record = self.state.get(key)
        if record is None:
            return None
        undo = record["undo"]
        if undo["cordoned"]:  # a node someone else had cordoned stays cordoned
            logger.warning("chaos restore drain_node: uncordoning %s", undo["node"])
            self._chaosk8s(uncordon_node, name=undo["node"])
        self.state.pop(key)
        return {"target": record["target"], **undo}

    # -- Karpenter NodePools ----------------------------------------------------------------
    def _custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self._api())

    def _nodepool(self, pool: str) -> str:
        if pool == SYSTEM_POOL:
            raise KubernetesFaultError("refusing to withdraw the system pool: the control "
                                       "plane itself runs there (use kill/stop instead)")
        try:
            return self.target.node_pools[pool]
        except KeyError:
            raise KubernetesFaultError(
                f"unknown pool {pool!r} for poolWithdrawal nodepool; Karpenter NodePools "
                f"(nodePools): {', '.join(self.target.node_pools) or 'none'}") from None

    def _nodepool_call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        try:
            return fn(group=KARPENTER_GROUP, version=KARPENTER_VERSION, **kwargs)
        except ApiException as exc:
            raise KubernetesFaultError(f"{what}: HTTP {exc.status} {exc.reason}") from exc

    def withdraw_nodepool(self, pool: str, evict: bool = True) -> dict[str, Any]:
        """Set the pool's NodePool ``spec.limits`` to zero (Karpenter launches nothing that
        does not fit in the remaining limits) and, with ``evict``, delete its NodeClaims:
        Karpenter drains each node through the eviction API (PDBs hold) and terminates the
        instance. Consolidation alone would not do it: non-empty nodes stay. The original
        limits are recorded first; restore puts them back and Karpenter provisions again
        for whatever is pending."""
        name = self._nodepool(pool)
        key = f"withdraw_pool:{pool}"
        if self.state.get(key) is not None:
            return {"target": pool, "already": True}
        api = self._custom()
        obj = self._nodepool_call(f"get NodePool {name}", api.get_cluster_custom_object,
                                  plural="nodepools", name=name)
        annotations = obj.get("metadata", {}).get("annotations") or {}
        if ORIGINAL_LIMITS_ANNOTATION in annotations:  # left by a run that lost its state
            original = json.loads(annotations[ORIGINAL_LIMITS_ANNOTATION])
        else:
            original = obj.get("spec", {}).get("limits")
        undo = {"mode": "nodepool", "pool": pool, "nodepool": name, "limits": original}
        self.state.put(key, "withdraw_pool", pool, undo)
        zero = {k: "0" for k in sorted({*(original or {}), "cpu", "memory"})}
        logger.warning("chaos withdraw_pool: NodePool %s limits %s -> %s", name, original, zero)
        self._nodepool_call(f"patch NodePool {name}", api.patch_cluster_custom_object,
                            plural="nodepools", name=name, _content_type=MERGE_PATCH,
                            body=_limits_patch(zero, obj.get("spec", {}).get("limits") or {},
                                               json.dumps(original)))
        deleted: list[str] = []
        if evict:
            claims = self._nodepool_call(
                f"list NodeClaims of {name}", api.list_cluster_custom_object, plural="nodeclaims",
                label_selector=f"{NODEPOOL_LABEL}={name}").get("items", [])
            for claim in sorted(c["metadata"]["name"] for c in claims):
                logger.warning("chaos withdraw_pool: deleting NodeClaim %s of %s", claim, name)
                try:
                    self._nodepool_call(f"delete NodeClaim {claim}",
                                        api.delete_cluster_custom_object, plural="nodeclaims",
                                        name=claim)
                except KubernetesFaultError as exc:
                    if not isinstance(exc.__cause__, ApiException) or exc.__cause__.status != 404:
                        raise
                deleted.append(claim)
        return {"target": pool, **undo, "deleted_nodeclaims": deleted}

    def undo_withdraw_nodepool(self, key: str) -> dict[str, Any] | None:
        record = self.state.get(key)
        if record is None:
            return None
        undo = record["undo"]
        api = self._custom()
        name = undo["nodepool"]
        obj = self._nodepool_call(f"get NodePool {name}", api.get_cluster_custom_object,
                                  plural="nodepools", name=name)
        logger.warning("chaos restore_pool: NodePool %s limits back to %s", name, undo["limits"])
        self._nodepool_call(f"patch NodePool {name}", api.patch_cluster_custom_object,
                            plural="nodepools", name=name, _content_type=MERGE_PATCH,
                            body=_limits_patch(undo["limits"],
                                               obj.get("spec", {}).get("limits") or {}, None))
        self.state.pop(key)
        return {"target": record["target"], **undo}


    # -- gray network (Chaos Mesh NetworkChaos) ---------------------------------------------
    def _gray_components(self, target: str) -> list[str]:
        """The agent components a gray-network target names: ``agents`` (every pool, as the
        local fault proxy's group) or one pool (``agent:<pool>``, ``<pool>``)."""
        if target == "agents":
            return [f"agent-{p}" for p in self.target.agent_pools]
        comp = self._agent_component(target.removeprefix("agent:"))
        if comp.index is not None:
            raise KubernetesFaultError(
                f"gray network target {target!r}: NetworkChaos selects pods by label, one "
                "replica cannot be named; use agents or agent:<pool>")
        return [comp.component]

    def check_toxic(self, target: str, toxic: Any, where: str) -> chaos_mesh.Netem:
        """The NetworkChaos action for ``toxic`` on ``target``, or KubernetesFaultError naming
        the field that is invalid or has no equivalent (nothing is called)."""
        try:
            netem = chaos_mesh.netem_of(parse_toxic(toxic, where), where)
        except (ToxicError, chaos_mesh.UnmappableToxic) as exc:
            raise KubernetesFaultError(str(exc)) from None
        self._gray_components(target)
        return netem

    def _chaos_mesh_error(self, what: str, exc: ApiException) -> KubernetesFaultError:
        ref = f"{chaos_mesh.GROUP}/{chaos_mesh.VERSION} {chaos_mesh.PLURAL}"
        if exc.status == 404:
            hint = (f"the cluster serves no {ref} in namespace {self.target.namespace}: Chaos "
                    "Mesh (2.8) must be installed in the cluster (helm install chaos-mesh "
                    "chaos-mesh/chaos-mesh -n chaos-mesh --create-namespace --version 2.8.3 "
                    "--set chaosDaemon.runtime=containerd --set chaosDaemon.socketPath="
                    "/run/containerd/containerd.sock; check: kubectl get crd "
                    "networkchaos.chaos-mesh.org)")
        elif exc.status == 403:
            hint = (f"the game day's role may not use {ref} in {self.target.namespace} "
                    "(RBAC: create, get, delete; docs/chaos-cloud.md)")
        else:
            hint = str(exc.body or "")[:300]
        return KubernetesFaultError(f"{what}: HTTP {exc.status} {exc.reason}: {hint}")

    def _network_chaos(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._custom().get_namespaced_custom_object(
                chaos_mesh.GROUP, chaos_mesh.VERSION, namespace, chaos_mesh.PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise self._chaos_mesh_error(f"get NetworkChaos {namespace}/{name}", exc) from exc

    def _poll(self, done: Any) -> bool:
        import time

        deadline = time.monotonic() + self.target.network_chaos_wait
        step = min(0.5, self.target.network_chaos_wait / 10) or 0.01
        while not done():
            if time.monotonic() >= deadline:
                return False
            time.sleep(step)
        return True

    def add_network_chaos(self, target: str, toxic: Any) -> dict[str, Any]:
        """Create a NetworkChaos for ``toxic`` between ``target``'s agent pods and the API
        pods (environments/cloud/network_chaos.py has the mapping and what it approximates); returns
        once Chaos Mesh reports it injected (``AllInjected``). Recorded in the state file
        before the create; the same toxic again is a no-op, other settings under an active
        name are refused (Chaos Mesh refuses changes to a chaos's spec)."""
        where = f"toxic on {target}"
        netem = self.check_toxic(target, toxic, where)
        doc = parse_toxic(toxic, where).to_json()
        ref = f"{target}/{doc['name']}"
        key = f"network_gray:{ref}"
        if (record := self.state.get(key)) is not None:
            if record["undo"]["toxic"] == doc:
                return {"target": ref, "already": True, **record["undo"]}
            raise KubernetesFaultError(
                f"toxic {doc['name']!r} on {target} is in effect with other settings; Chaos "
                "Mesh refuses changes to a chaos's spec: remove the toxic and add it again")
        ns = self.target.namespace
        components = self._gray_components(target)
        agents = sorted(p.metadata.name for c in components
                        for p in self._running_pods(Component(f"controlplane-{c}", c)))
        if not agents:
            raise KubernetesFaultError(f"no running agent pod ({', '.join(components)}) in {ns}")
        api_pods = [p.metadata.name for p in self._pick(Component("controlplane-api",
                                                                    API_COMPONENT))]
        name = f"gameday-gray-{_dns_label(target)}-{_dns_label(doc['name'])}"
        service = f"{self.target.api_service}.{ns}.svc.{self.target.cluster_domain}"
        body = chaos_mesh.network_chaos_body(
            name=name, namespace=ns, netem=netem, source_labels=dict(APP_SELECTOR),
            source_components=components,
            target_labels={**APP_SELECTOR, "app.kubernetes.io/component": API_COMPONENT},
            service_hosts=[service], duration_seconds=self.target.network_chaos_duration,
            labels=dict(MANAGED_BY), annotations={TOXIC_ANNOTATION: json.dumps(doc)})
        undo = {"namespace": ns, "name": name, "toxic": doc}
        self.state.put(key, "network_gray", ref, undo)
        logger.warning("chaos network_gray: NetworkChaos %s/%s (%s %s) agents %s <-> api %s",
                       ns, name, netem.action, netem.direction, agents, api_pods)
        try:
            self._custom().create_namespaced_custom_object(
                chaos_mesh.GROUP, chaos_mesh.VERSION, ns, chaos_mesh.PLURAL, body)
        except ApiException as exc:
            if exc.status != 409:
                self.state.pop(key)  # the API server refused it: nothing was created
                raise self._chaos_mesh_error(f"create NetworkChaos {ns}/{name}", exc) from exc
            existing = self._network_chaos(ns, name) or {}
            theirs = (existing.get("metadata", {}).get("annotations") or {}).get(TOXIC_ANNOTATION)
            if theirs != json.dumps(doc):  # recorded: restore_all deletes it
                raise KubernetesFaultError(
                    f"NetworkChaos {ns}/{name} already exists with other settings (left by a "
                    "run that lost its state file?); restore_all deletes it") from exc
        if not self._poll(lambda: _injected(self._network_chaos(ns, name))):
            status = (self._network_chaos(ns, name) or {}).get("status", {})
            self.undo_network_chaos(key)  # all or nothing
            raise KubernetesFaultError(
                f"NetworkChaos {ns}/{name} not injected within "
                f"{self.target.network_chaos_wait:.0f} s (deleted again); Chaos Mesh "
                f"status: {json.dumps(status.get('conditions', []))[:500]}")
        return {"target": ref, **undo, "action": netem.action, "direction": netem.direction,
                "agent_pods": agents, "api_pods": api_pods}

    def remove_network_chaos(self, target: str, name: str) -> dict[str, Any]:
        ref = f"{target}/{name}"
        return self.undo_network_chaos(f"network_gray:{ref}") or {"target": ref, "already": True}

    def undo_network_chaos(self, key: str) -> dict[str, Any] | None:
        """Delete the recorded NetworkChaos and wait until it is gone: Chaos Mesh's finalizer
        holds the object until the netem rules are removed from every pod."""
        record = self.state.get(key)
        if record is None:
            return None
        undo = record["undo"]
        ns, name = undo["namespace"], undo["name"]
        logger.warning("chaos network_gray: deleting NetworkChaos %s/%s", ns, name)
        try:
            self._custom().delete_namespaced_custom_object(
                chaos_mesh.GROUP, chaos_mesh.VERSION, ns, chaos_mesh.PLURAL, name)
        except ApiException as exc:
            if exc.status != 404:  # gone already, or never created
                raise self._chaos_mesh_error(f"delete NetworkChaos {ns}/{name}", exc) from exc
        if not self._poll(lambda: self._network_chaos(ns, name) is None):
            raise KubernetesFaultError(
                f"NetworkChaos {ns}/{name} still there {self.target.network_chaos_wait:.0f} s "
                "after its delete: Chaos Mesh has not finished recovering the pods (finalizer "
                "chaos-mesh/records; is chaos-daemon running?); the record stays for restore_all")
        self.state.pop(key)
        return {"target": record["target"], **undo}


def _limits_patch(limits: dict[str, str] | None, current: dict[str, Any],
                  original: str | None) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386; CRDs take no strategic merge) that leaves ``spec.limits``
    exactly ``limits`` (``None``: no limits; keys of ``current`` not in it are nulled, i.e.
    removed) and sets (``original``) or removes our annotation."""
    exact = None if limits is None else {**{k: None for k in current}, **limits}
    return {"metadata": {"annotations": {ORIGINAL_LIMITS_ANNOTATION: original}},
            "spec": {"limits": exact}}


def _injected(obj: dict[str, Any] | None) -> bool:
    """Chaos Mesh's ``AllInjected`` condition is true (every selected pod has the rules)."""
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "AllInjected" and c.get("status") == "True" for c in conditions)


def _evictable(pod: client.V1Pod) -> bool:
    """What `kubectl drain` evicts: not DaemonSet pods, not mirror (static) pods, not
    pods already finished."""
    owners = pod.metadata.owner_references or []
    if any(o.kind == "DaemonSet" for o in owners):
        return False
    if "kubernetes.io/config.mirror" in (pod.metadata.annotations or {}):
        return False
    return not (pod.status and pod.status.phase in ("Succeeded", "Failed"))


def _ours(pol: client.V1NetworkPolicy) -> bool:
    labels = pol.metadata.labels or {}
    return labels.get("app.kubernetes.io/managed-by") == MANAGED_BY["app.kubernetes.io/managed-by"]


def _covers_any(block: dict[str, Any]) -> bool:
    """An ipBlock wide enough to be a general-egress allow (a /0 .. /8)."""
    try:
        return int(str(block.get("cidr", "")).split("/")[1]) <= 8
    except (IndexError, ValueError):
        return False

"""NetworkPolicy faults: a target isolated (hang), an agent cut from the API (partition), the
registry taken out of the workloads' egress. NetworkPolicies only ever *allow* (the allowed
traffic of a pod is the union of every policy selecting it), so a "deny" policy of our own
cannot cancel an existing allow rule: where the platform already has allow rules (ingress to
the API, workload egress on 443) they are narrowed for the fault and the exact original spec
is put back afterwards."""

from __future__ import annotations

import copy
import logging
from typing import Any

from chaosk8s.networking.actions import create_network_policy, remove_network_policy
from kubernetes import client
from kubernetes.client.rest import ApiException

from environments.cloud.kube_session import (
    API_COMPONENT,
    FAULT_LABEL,
    MANAGED_BY,
    KubernetesFaultError,
    KubeSession,
    dns_label,
)

logger = logging.getLogger("chaostoolkit")


class IsolationFaults:
    def __init__(self, kube: KubeSession) -> None:
        self.kube = kube

    def _label_pods(self, namespace: str, pods: list[str], value: str | None) -> None:
        core = client.CoreV1Api(self.kube.api())
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
                "metadata": {"name": name, "namespace": self.kube.target.namespace,
                             "labels": dict(MANAGED_BY)}, "spec": spec}

    def _create_policy(self, body: dict[str, Any]) -> None:
        try:
            self.kube.chaosk8s(create_network_policy, spec=body, ns=body["metadata"]["namespace"])
        except KubernetesFaultError as exc:
            if not isinstance(exc.__cause__, ApiException) or exc.__cause__.status != 409:
                raise  # 409: left over from a crashed run, already in effect

    def _remove_policy(self, namespace: str, name: str) -> None:
        try:
            self.kube.chaosk8s(remove_network_policy, name=name, ns=namespace)
        except KubernetesFaultError as exc:
            if not isinstance(exc.__cause__, ApiException) or exc.__cause__.status != 404:
                raise

    def _exclude_from_ingress_allows(self, namespace: str) -> dict[str, Any]:
        """Make every ingress-allowing policy skip pods carrying FAULT_LABEL; return the
        original podSelectors so the exact prior state can be put back."""
        net = client.NetworkingV1Api(self.kube.api())
        originals: dict[str, Any] = {}
        for pol in net.list_namespaced_network_policy(namespace).items:
            spec = self.kube.to_dict(pol.spec)
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
        net = client.NetworkingV1Api(self.kube.api())
        for name, selector in originals.items():
            try:
                body = self.kube.to_dict(net.read_namespaced_network_policy(name, namespace))
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            body["spec"]["podSelector"] = selector  # replace, not merge: exact original
            net.replace_namespaced_network_policy(name, namespace, body)

    def hang(self, target: str) -> dict[str, Any]:
        """Isolate the target pods (ingress + egress): they keep running but nobody reaches
        them and they reach nothing, which clients see as a hang."""
        comp = self.kube.resolve(target)
        key = f"hang:{target}"
        if self.kube.state.get(key) is not None:
            return {"target": target, "already": True}
        ns, value = self.kube.target.namespace, f"hang-{dns_label(target)}"
        pods = [p.metadata.name for p in self.kube.pick(comp)]
        undo: dict[str, Any] = {"namespace": ns, "pods": pods, "policy": f"gameday-{value}",
                                "label": value, "narrowed": {}}
        self.kube.state.put(key, "hang", target, undo)
        logger.warning("chaos hang: isolating pods %s of %s/%s", pods, ns, comp.deployment)
        self._label_pods(ns, pods, value)
        self._create_policy(self._policy_body(undo["policy"], value, ["Ingress", "Egress"]))
        undo["narrowed"] = self._exclude_from_ingress_allows(ns)
        self.kube.state.put(key, "hang", target, undo)
        return {"target": target, **undo}

    def resume(self, target: str) -> dict[str, Any]:
        return self.undo_isolation(f"hang:{target}") or {"target": target, "already": True}

    def undo_isolation(self, key: str) -> dict[str, Any] | None:
        record = self.kube.state.get(key)
        if record is None:
            return None
        undo = record["undo"]
        logger.warning("chaos heal: removing %s/%s, unlabelling %s", undo["namespace"],
                       undo["policy"], undo["pods"])
        self._restore_policies(undo["namespace"], undo.get("narrowed", {}))
        self._remove_policy(undo["namespace"], undo["policy"])
        self._label_pods(undo["namespace"], undo["pods"], None)
        self.kube.state.pop(key)
        return {"target": record["target"], **undo}

    def partition_agent(self, agent: str) -> dict[str, Any]:
        """Deny egress from the agent's pod(s) to the control-plane API pods; DNS, other pods
        and ``partition_allow_cidrs`` stay reachable."""
        comp = self.kube.agent_component(agent)
        key = f"partition_agent:{agent}"
        if self.kube.state.get(key) is not None:
            return {"target": agent, "already": True}
        ns, value = self.kube.target.namespace, f"partition-{dns_label(comp.component)}"
        pods = [p.metadata.name for p in self.kube.pick(comp)]
        undo = {"namespace": ns, "pods": pods, "policy": f"gameday-{value}", "label": value,
                "narrowed": {}}
        # Egress allow-list = everything except the API pods (no egress policy exists in
        # the namespace, so nothing else can re-allow them).
        not_api = {"matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "NotIn",
                                         "values": [API_COMPONENT]}]}
        other_ns = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                          "values": [ns]}]}
        egress = [{"to": [{"podSelector": not_api}, {"namespaceSelector": other_ns}]}]
        egress += [{"to": [{"ipBlock": {"cidr": c}} for c in self.kube.target.partition_allow_cidrs]}] \
            if self.kube.target.partition_allow_cidrs else []
        self.kube.state.put(key, "partition_agent", agent, undo)
        logger.warning("chaos partition: agent pods %s in %s lose the control-plane API", pods, ns)
        self._label_pods(ns, pods, value)
        self._create_policy(self._policy_body(undo["policy"], value, ["Egress"], egress))
        return {"target": agent, **undo}

    def heal_agent(self, agent: str) -> dict[str, Any]:
        return self.undo_isolation(f"partition_agent:{agent}") or {"target": agent, "already": True}

    def registry_unreachable(self) -> dict[str, Any]:
        """Add the registry CIDRs to the ``except`` of every workload-namespace egress rule
        that allows the registry port (the only way to take an allow away)."""
        key = "registry_unreachable"
        if self.kube.state.get(key) is not None:
            return {"target": "registry", "already": True}
        if not self.kube.target.registry_cidrs:
            raise KubernetesFaultError("registry_unreachable needs registry_cidrs (the ECR "
                                       "endpoint addresses) in the target config")
        net = client.NetworkingV1Api(self.kube.api())
        originals: dict[str, dict[str, Any]] = {}
        changes: list[tuple[str, str, dict[str, Any]]] = []
        for ns in self.kube.target.workload_namespaces:
            for pol in net.list_namespaced_network_policy(ns).items:
                spec = self.kube.to_dict(pol.spec)
                if self._narrow_egress(spec):
                    originals[f"{ns}/{pol.metadata.name}"] = self.kube.to_dict(pol.spec)
                    changes.append((ns, pol.metadata.name, spec))
        undo = {"policies": originals, "cidrs": list(self.kube.target.registry_cidrs)}
        self.kube.state.put(key, "registry_unreachable", "registry", undo)
        for ns, name, spec in changes:
            logger.warning("chaos registry: %s/%s egress now excludes %s", ns, name,
                           self.kube.target.registry_cidrs)
            body = self.kube.to_dict(net.read_namespaced_network_policy(name, ns))
            body["spec"] = spec
            net.replace_namespaced_network_policy(name, ns, body)
        return {"target": "registry", **undo}

    def _narrow_egress(self, spec: dict[str, Any]) -> bool:
        changed = False
        for rule in spec.get("egress") or []:
            ports = rule.get("ports") or []
            if ports and not any(p.get("port") == self.kube.target.registry_port for p in ports):
                continue
            for peer in rule.get("to") or []:
                block = peer.get("ipBlock")
                if block and _covers_any(block):
                    missing = [c for c in self.kube.target.registry_cidrs if c not in block.get("except", [])]
                    if missing:
                        block["except"] = [*block.get("except", []), *missing]
                        changed = True
        return changed

    def registry_restore(self) -> dict[str, Any]:
        record = self.kube.state.get("registry_unreachable")
        if record is None:
            return {"target": "registry", "already": True}
        net = client.NetworkingV1Api(self.kube.api())
        for ref, spec in record["undo"]["policies"].items():
            ns, name = ref.split("/", 1)
            try:
                body = self.kube.to_dict(net.read_namespaced_network_policy(name, ns))
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            body["spec"] = spec
            logger.warning("chaos registry restore: %s back to its original spec", ref)
            net.replace_namespaced_network_policy(name, ns, body)
        self.kube.state.pop("registry_unreachable")
        return {"target": "registry", **record["undo"]}


def _ours(pol: client.V1NetworkPolicy) -> bool:
    labels = pol.metadata.labels or {}
    return labels.get("app.kubernetes.io/managed-by") == MANAGED_BY["app.kubernetes.io/managed-by"]


def _covers_any(block: dict[str, Any]) -> bool:
    """An ipBlock wide enough to be a general-egress allow (a /0 .. /8)."""
    try:
        return int(str(block.get("cidr", "")).split("/")[1]) <= 8
    except (IndexError, ValueError):
        return False

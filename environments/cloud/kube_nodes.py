"""Node faults: a pool cordoned and drained, a zone's nodes cordoned and its pods deleted, one
node drained through the eviction API (PodDisruptionBudgets honoured)."""

from __future__ import annotations

import logging
from typing import Any

from chaosk8s.node.actions import cordon_node, drain_nodes, uncordon_node
from kubernetes import client
from kubernetes.client.rest import ApiException

from environments.cloud.kube_session import (
    POOL_LABEL,
    SYSTEM_POOL,
    ZONE_LABEL,
    KubernetesFaultError,
    KubeSession,
)

logger = logging.getLogger("chaostoolkit")


class NodeFaults:
    def __init__(self, kube: KubeSession) -> None:
        self.kube = kube

    def withdraw_pool(self, pool: str, evict: bool = True) -> dict[str, Any]:
        """Cordon every node of the pool and (``evict``) drain it through the eviction API."""
        if pool == SYSTEM_POOL:
            raise KubernetesFaultError("refusing to withdraw the system pool: the control "
                                       "plane itself runs there (use kill/stop instead)")
        key = f"withdraw_pool:{pool}"
        if self.kube.state.get(key) is not None:
            return {"target": pool, "already": True}
        selector = f"{POOL_LABEL}={pool}"
        nodes = client.CoreV1Api(self.kube.api()).list_node(label_selector=selector).items
        # Restore must leave nodes someone else had cordoned cordoned.
        ours = sorted(n.metadata.name for n in nodes if not (n.spec and n.spec.unschedulable))
        undo = {"mode": "cordon", "pool": pool, "cordoned": ours,
                "already_cordoned": sorted({n.metadata.name for n in nodes} - set(ours))}
        self.kube.state.put(key, "withdraw_pool", pool, undo)
        if not nodes:
            logger.warning("chaos withdraw_pool: pool %s has no nodes right now", pool)
            return {"target": pool, **undo, "drained": []}
        logger.warning("chaos withdraw_pool: cordoning%s nodes %s (%s)",
                       " and draining" if evict else "", ours, selector)
        for node in ours:
            self.kube.chaosk8s(cordon_node, name=node)
        drained: list[str] = []
        if evict:
            # Control-plane and workload pods mount an emptyDir (/tmp): allow evicting them.
            drained = self.kube.chaosk8s(drain_nodes, label_selector=selector,
                                     delete_pods_with_local_storage=True,
                                     timeout=self.kube.target.drain_timeout)
        return {"target": pool, **undo, "drained": drained}

    def restore_pool(self, pool: str) -> dict[str, Any]:
        return self.undo_withdraw(f"withdraw_pool:{pool}") or {"target": pool, "already": True}

    def undo_withdraw(self, key: str) -> dict[str, Any] | None:
        record = self.kube.state.get(key)
        if record is None:
            return None
        undo = record["undo"]
        present = {n.metadata.name for n in client.CoreV1Api(self.kube.api()).list_node(
            label_selector=f"{POOL_LABEL}={undo['pool']}").items}
        back = [n for n in undo["cordoned"] if n in present]  # replaced nodes come uncordoned
        logger.warning("chaos restore_pool: uncordoning %s", back)
        for node in back:
            self.kube.chaosk8s(uncordon_node, name=node)
        self.kube.state.pop(key)
        return {"target": record["target"], **undo, "uncordoned": back}

    def zone_outage(self, zone: str) -> dict[str, Any]:
        """Cordon every node labelled ``topology.kubernetes.io/zone=<zone>`` and delete (grace
        0) the control-plane and workload pods running there: their controllers recreate them
        in the other zones. Nodes someone else had cordoned stay cordoned on restore."""
        key = f"zone_cordon:{zone}"
        if self.kube.state.get(key) is not None:
            return {"target": zone, "already": True}
        core = client.CoreV1Api(self.kube.api())
        nodes = core.list_node(label_selector=f"{ZONE_LABEL}={zone}").items
        if not nodes:
            raise KubernetesFaultError(f"zone_outage: no node labelled {ZONE_LABEL}={zone}")
        names = sorted(n.metadata.name for n in nodes)
        ours = sorted(n.metadata.name for n in nodes if not (n.spec and n.spec.unschedulable))
        undo = {"zone": zone, "cordoned": ours, "already_cordoned": sorted(set(names) - set(ours))}
        self.kube.state.put(key, "zone_cordon", zone, undo)
        logger.warning("chaos zone_outage: cordoning %s (%s=%s)", ours, ZONE_LABEL, zone)
        for node in ours:
            self.kube.chaosk8s(cordon_node, name=node)
        namespaces = {self.kube.target.namespace, *self.kube.target.workload_namespaces}
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
        record = self.kube.state.get(key)
        if record is None:
            return None
        undo = record["undo"]
        present = {n.metadata.name for n in client.CoreV1Api(self.kube.api()).list_node(
            label_selector=f"{ZONE_LABEL}={undo['zone']}").items}
        back = [n for n in undo["cordoned"] if n in present]
        logger.warning("chaos restore_zone: uncordoning %s", back)
        for node in back:
            self.kube.chaosk8s(uncordon_node, name=node)
        self.kube.state.pop(key)
        return {"target": record["target"], **undo, "uncordoned": back}

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
        if self.kube.state.get(key) is not None:
            return {"target": node, "already": True}
        core = client.CoreV1Api(self.kube.api())
        found = core.list_node(field_selector=f"metadata.name={node}").items
        if not found:
            raise KubernetesFaultError(f"drain_node: no node named {node!r}")
        was_cordoned = bool(found[0].spec and found[0].spec.unschedulable)
        undo = {"node": node, "cordoned": not was_cordoned}
        self.kube.state.put(key, "drain_node", node, undo)
        if not was_cordoned:
            logger.warning("chaos drain_node: cordoning %s", node)
            self.kube.chaosk8s(cordon_node, name=node)
        pending = [p for p in core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}").items if _evictable(p)]
        deadline = time.monotonic() + (timeout if timeout is not None else self.kube.target.drain_timeout)
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
        record = self.kube.state.get(key)
        if record is None:
            return None
        undo = record["undo"]
        if undo["cordoned"]:  # a node someone else had cordoned stays cordoned
            logger.warning("chaos restore drain_node: uncordoning %s", undo["node"])
            self.kube.chaosk8s(uncordon_node, name=undo["node"])
        self.kube.state.pop(key)
        return {"target": record["target"], **undo}


def _evictable(pod: client.V1Pod) -> bool:
    """What `kubectl drain` evicts: not DaemonSet pods, not mirror (static) pods, not
    pods already finished."""
    owners = pod.metadata.owner_references or []
    if any(o.kind == "DaemonSet" for o in owners):
        return False
    if "kubernetes.io/config.mirror" in (pod.metadata.annotations or {}):
        return False
    return not (pod.status and pod.status.phase in ("Succeeded", "Failed"))

"""A Karpenter NodePool withdrawn: its limits set to zero and its NodeClaims deleted, the
original limits recorded (in the state file and on the object) and put back on restore."""

from __future__ import annotations

import json
import logging
from typing import Any

from kubernetes.client.rest import ApiException

from environments.cloud.kube_session import (
    KARPENTER_GROUP,
    KARPENTER_VERSION,
    MERGE_PATCH,
    NODEPOOL_LABEL,
    ORIGINAL_LIMITS_ANNOTATION,
    SYSTEM_POOL,
    KubernetesFaultError,
    KubeSession,
)

logger = logging.getLogger("chaostoolkit")


class NodePoolFaults:
    def __init__(self, kube: KubeSession) -> None:
        self.kube = kube

    def _nodepool(self, pool: str) -> str:
        if pool == SYSTEM_POOL:
            raise KubernetesFaultError("refusing to withdraw the system pool: the control "
                                       "plane itself runs there (use kill/stop instead)")
        try:
            return self.kube.target.node_pools[pool]
        except KeyError:
            raise KubernetesFaultError(
                f"unknown pool {pool!r} for poolWithdrawal nodepool; Karpenter NodePools "
                f"(nodePools): {', '.join(self.kube.target.node_pools) or 'none'}") from None

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
        if self.kube.state.get(key) is not None:
            return {"target": pool, "already": True}
        api = self.kube.custom()
        obj = self._nodepool_call(f"get NodePool {name}", api.get_cluster_custom_object,
                                  plural="nodepools", name=name)
        annotations = obj.get("metadata", {}).get("annotations") or {}
        if ORIGINAL_LIMITS_ANNOTATION in annotations:  # left by a run that lost its state
            original = json.loads(annotations[ORIGINAL_LIMITS_ANNOTATION])
        else:
            original = obj.get("spec", {}).get("limits")
        undo = {"mode": "nodepool", "pool": pool, "nodepool": name, "limits": original}
        self.kube.state.put(key, "withdraw_pool", pool, undo)
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
        record = self.kube.state.get(key)
        if record is None:
            return None
        undo = record["undo"]
        api = self.kube.custom()
        name = undo["nodepool"]
        obj = self._nodepool_call(f"get NodePool {name}", api.get_cluster_custom_object,
                                  plural="nodepools", name=name)
        logger.warning("chaos restore_pool: NodePool %s limits back to %s", name, undo["limits"])
        self._nodepool_call(f"patch NodePool {name}", api.patch_cluster_custom_object,
                            plural="nodepools", name=name, _content_type=MERGE_PATCH,
                            body=_limits_patch(undo["limits"],
                                               obj.get("spec", {}).get("limits") or {}, None))
        self.kube.state.pop(key)
        return {"target": record["target"], **undo}


def _limits_patch(limits: dict[str, str] | None, current: dict[str, Any],
                  original: str | None) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386; CRDs take no strategic merge) that leaves ``spec.limits``
    exactly ``limits`` (``None``: no limits; keys of ``current`` not in it are nulled, i.e.
    removed) and sets (``original``) or removes our annotation."""
    exact = None if limits is None else {**{k: None for k in current}, **limits}
    return {"metadata": {"annotations": {ORIGINAL_LIMITS_ANNOTATION: original}},
            "spec": {"limits": exact}}

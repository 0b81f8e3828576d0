"""Can a pod land on a pool's nodes? Node labels and taints against a pod's node selector,
required node affinity and tolerations (Kubernetes docs: "Assigning Pods to Nodes",
"Taints and Tolerations"). Pure data; used by the first-deploy rehearsal (provisioning/rehearsal.py).

A pool's labels map each key to the values its nodes may carry (a Karpenter NodePool's
requirements allow several); a selector matches when its value is among them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Taint effects that keep a pod off a node (PreferNoSchedule only discourages).
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
# Managed node group taints are spelled NO_SCHEDULE in the EKS API.
EKS_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute",
               "PREFER_NO_SCHEDULE": "PreferNoSchedule"}


@dataclass(frozen=True)
class Pool:
    name: str
    labels: Mapping[str, frozenset[str]]
    taints: tuple[Mapping[str, str], ...] = ()
    managed: bool = True  # a node group (nodes without an autoscaler), else a Karpenter NodePool


@dataclass(frozen=True)
class Placement:
    """Where a pod may go: nodeSelector, tolerations, required node-affinity terms (ORed; the
    expressions of one term ANDed)."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    affinity_terms: Sequence[Sequence[Mapping[str, Any]]] = ()

    @classmethod
    def of_pod(cls, spec: Mapping[str, Any]) -> Placement:
        terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
                     "nodeSelectorTerms") or []
        return cls(node_selector=spec.get("nodeSelector") or {},
                   tolerations=spec.get("tolerations") or [],
                   affinity_terms=[t.get("matchExpressions") or [] for t in terms])


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, str]) -> bool:
    op = toleration.get("operator", "Equal")
    key = toleration.get("key")
    if key and key != taint.get("key"):
        return False
    if not key and op != "Exists":  # an empty key with Exists tolerates everything
        return False
    if op == "Equal" and toleration.get("value", "") != taint.get("value", ""):
        return False
    effect = toleration.get("effect")
    return not effect or effect == taint.get("effect")


def _expression(expr: Mapping[str, Any], labels: Mapping[str, frozenset[str]]) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), set(expr.get("values") or [])
    have = labels.get(str(key))
    if op == "In":
        return bool(have and have & values)
    if op == "NotIn":
        return not have or bool(have - values)
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    return False  # Gt/Lt: not used here; unknown means "cannot prove it fits"


def why_not(pool: Pool, placement: Placement) -> str | None:
    """None when the pod fits the pool, else the reason it does not."""
    for key, value in placement.node_selector.items():
        if str(value) not in pool.labels.get(key, frozenset()):
            return f"nodeSelector {key}={value} (pool labels {dict(sorted((k, sorted(v)) for k, v in pool.labels.items()))})"
    if placement.affinity_terms and not any(
            all(_expression(e, pool.labels) for e in term) for term in placement.affinity_terms):
        return "required node affinity"
    for taint in pool.taints:
        if taint.get("effect") in BLOCKING_EFFECTS and not any(
                tolerates(t, taint) for t in placement.tolerations):
            return f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} not tolerated"
    return None

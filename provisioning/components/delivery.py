"""The serving layer's add-ons (application layer): Argo Rollouts (canary rollouts with
analysis and automatic rollback) and KEDA (autoscaling on a Prometheus query).

Both are Helm v4 Charts whose CRDs come with the chart (``installCRDs`` / ``crds.install``),
so every ``Rollout``, ``AnalysisTemplate`` and ``ScaledObject`` must be created after them
(the rehearsal's ``crd-first`` rule). Their controllers run on the on-demand ``system`` node
group, like Karpenter's: never on nodes an autoscaler may take away mid-rollout.
"""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from provisioning.components.common import POOL_LABEL, TYPE_PREFIX, Naming, child
from provisioning.versions import ARGO_ROLLOUTS_CHART_VERSION, KEDA_CHART_VERSION

ARGO_NAMESPACE, KEDA_NAMESPACE = "argo-rollouts", "keda"
SYSTEM_PLACEMENT = {"nodeSelector": {POOL_LABEL: "system"},
                    "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists",
                                     "effect": "NoSchedule"}]}


class DeliveryAddons(pulumi.ComponentResource):
    """Namespaces and charts; ``charts`` is what custom resources of them depend on."""

    charts: list[pulumi.Resource]

    def __init__(self, name: str, naming: Naming,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{TYPE_PREFIX}:DeliveryAddons", name, None, opts)
        argo_ns = k8s.core.v1.Namespace(
            f"{name}-ns-{ARGO_NAMESPACE}",
            metadata={"name": ARGO_NAMESPACE, "labels": naming.labels("argo-rollouts")},
            opts=child(self))
        keda_ns = k8s.core.v1.Namespace(
            f"{name}-ns-{KEDA_NAMESPACE}",
            metadata={"name": KEDA_NAMESPACE, "labels": naming.labels("keda")},
            opts=child(self))
        argo = k8s.helm.v4.Chart(
            f"{name}-argo-rollouts",
            chart="argo-rollouts",
            version=ARGO_ROLLOUTS_CHART_VERSION,
            namespace=ARGO_NAMESPACE,
            repository_opts=k8s.helm.v4.RepositoryOptsArgs(repo="https://argoproj.github.io/argo-helm"),
            # Two controllers with leader election: a rollout in progress survives one loss.
            values={"installCRDs": True,
                    "controller": {"replicas": 2, **SYSTEM_PLACEMENT},
                    "dashboard": {"enabled": False}},
            opts=child(self, depends_on=[argo_ns]),
        )
        # KEDA's chart applies top-level nodeSelector/tolerations to the operator, its metrics
        # API server and its admission webhooks (kedacore/charts values.yaml).
        keda = k8s.helm.v4.Chart(
            f"{name}-keda",
            chart="keda",
            version=KEDA_CHART_VERSION,
            namespace=KEDA_NAMESPACE,
            repository_opts=k8s.helm.v4.RepositoryOptsArgs(repo="https://kedacore.github.io/charts"),
            values={"crds": {"install": True}, **SYSTEM_PLACEMENT},
            opts=child(self, depends_on=[keda_ns]),
        )
        self.charts = [argo, keda]
        self.register_outputs({})

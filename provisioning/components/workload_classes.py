"""Workload-class templates per workload namespace: one ServiceAccount and one PodTemplate per
class of controlplane/workload_classes.py.

The PodTemplate is the agents' own Job pod for the class (``class_pod_template``, the same
function the Kubernetes runtime builds Jobs with), so what teams read is what runs: service
account, pool, capacity (spot only for checkpointable classes), security context, logging and
storage connections. The service accounts are the ones those Jobs name; they carry the
namespace's IRSA role (per-class IAM roles are not built: storage connections are declared,
not enforced by IAM; docs/workload-classes.md).
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from controlplane.runtimes.kubernetes import class_pod_template, pool_options
from controlplane.workload_classes import CLASSES
from provisioning.components.common import TYPE_PREFIX, Naming, child


class WorkloadClassTemplates(pulumi.ComponentResource):
    def __init__(self, name: str, namespace: str, image: pulumi.Input[str],
                 role_arn: pulumi.Input[str], naming: Naming,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{TYPE_PREFIX}:WorkloadClassTemplates", name, None, opts)
        labels = naming.labels("workload-classes")
        for wc in CLASSES.values():
            sa = k8s.core.v1.ServiceAccount(
                f"{name}-sa-{wc.name}",
                metadata={"name": wc.service_account, "namespace": namespace, "labels": labels,
                          "annotations": {"eks.amazonaws.com/role-arn": role_arn}},
                # workloads never talk to the Kubernetes API
                automount_service_account_token=False,
                opts=child(self))
            template: dict[str, Any] = class_pod_template(
                wc, pool_options(wc.pool, namespace, wc.service_account), image="placeholder")
            template["spec"]["containers"][0]["image"] = image
            k8s.core.v1.PodTemplate(
                f"{name}-{wc.name}",
                metadata={"name": f"workload-class-{wc.name}", "namespace": namespace,
                          "labels": labels,
                          "annotations": {"gameday.io/description": wc.description}},
                template=template,
                opts=child(self, depends_on=[sa]))
        self.register_outputs({"classes": sorted(CLASSES)})

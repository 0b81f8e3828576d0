"""Kill, stop and start the control plane's Deployments (one pod deleted with grace 0, or the
whole Deployment scaled to 0 and back to its recorded count)."""

from __future__ import annotations

import logging
import re
from typing import Any

from chaosk8s.deployment.actions import scale_deployment
from chaosk8s.pod.actions import terminate_pods
from kubernetes import client
from kubernetes.client.rest import ApiException

from environments.cloud.kube_session import (
    Component,
    KubernetesFaultError,
    KubeSession,
)

logger = logging.getLogger("chaostoolkit")


class WorkloadFaults:
    def __init__(self, kube: KubeSession) -> None:
        self.kube = kube

    def kill(self, target: str) -> dict[str, Any]:
        """Delete one pod of the Deployment with grace 0 (SIGKILL); its ReplicaSet replaces it."""
        comp = self.kube.resolve(target)
        pod = self.kube.pick(comp)[0].metadata.name
        logger.warning("chaos kill: deleting pod %s/%s (grace 0) of %s", self.kube.target.namespace,
                       pod, comp.deployment)
        deleted = self.kube.chaosk8s(terminate_pods, label_selector=comp.label_selector,
                                 name_pattern=f"^{re.escape(pod)}$", grace_period=0,
                                 ns=self.kube.target.namespace)
        return {"target": target, "deployment": comp.deployment, "pods": deleted}

    def _deployment(self, comp: Component) -> client.V1Deployment:
        try:
            return client.AppsV1Api(self.kube.api()).read_namespaced_deployment(
                comp.deployment, self.kube.target.namespace)
        except ApiException as exc:
            raise KubernetesFaultError(f"deployment {self.kube.target.namespace}/{comp.deployment}: "
                                       f"HTTP {exc.status} {exc.reason}") from exc

    def stop(self, target: str) -> dict[str, Any]:
        """Scale the whole Deployment to 0 after recording its replica count."""
        comp = self.kube.resolve(target)
        key = f"stop:{comp.deployment}"
        if (record := self.kube.state.get(key)) is not None:
            return {"target": target, "already": True, **record["undo"]}
        replicas = self._deployment(comp).spec.replicas or 0
        undo = {"namespace": self.kube.target.namespace, "deployment": comp.deployment,
                "replicas": replicas}
        self.kube.state.put(key, "stop", target, undo)
        logger.warning("chaos stop: scaling %s/%s from %d to 0", self.kube.target.namespace,
                       comp.deployment, replicas)
        self.kube.chaosk8s(scale_deployment, name=comp.deployment, replicas=0,
                       ns=self.kube.target.namespace)
        return {"target": target, **undo}

    def start(self, target: str) -> dict[str, Any]:
        """Inverse of stop: scale back to the recorded count (no record: nothing to do)."""
        comp = self.kube.resolve(target)
        return self.undo_stop(f"stop:{comp.deployment}") or {"target": target, "already": True}

    def undo_stop(self, key: str) -> dict[str, Any] | None:
        record = self.kube.state.get(key)
        if record is None:
            return None
        undo = record["undo"]
        logger.warning("chaos start: scaling %s/%s back to %d", undo["namespace"],
                       undo["deployment"], undo["replicas"])
        self.kube.chaosk8s(scale_deployment, name=undo["deployment"], replicas=undo["replicas"],
                       ns=undo["namespace"])
        self.kube.state.pop(key)
        return {"target": record["target"], **undo}



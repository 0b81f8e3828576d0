"""Gray network faults as Chaos Mesh ``NetworkChaos`` objects between the agents and the API
pods (environments/cloud/network_chaos.py has the mapping and what it approximates)."""

from __future__ import annotations

import json
import logging
from typing import Any

from kubernetes.client.rest import ApiException

from environments.cloud import network_chaos as chaos_mesh
from environments.cloud.kube_session import (
    API_COMPONENT,
    APP_SELECTOR,
    MANAGED_BY,
    TOXIC_ANNOTATION,
    Component,
    KubernetesFaultError,
    KubeSession,
    dns_label,
)
from environments.local.toxics import ToxicError, parse_toxic

logger = logging.getLogger("chaostoolkit")


class NetworkChaosFaults:
    def __init__(self, kube: KubeSession) -> None:
        self.kube = kube

    def _gray_components(self, target: str) -> list[str]:
        """The agent components a gray-network target names: ``agents`` (every pool, as the
        local fault proxy's group) or one pool (``agent:<pool>``, ``<pool>``)."""
        if target == "agents":
            return [f"agent-{p}" for p in self.kube.target.agent_pools]
        comp = self.kube.agent_component(target.removeprefix("agent:"))
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
            hint = (f"the cluster serves no {ref} in namespace {self.kube.target.namespace}: Chaos "
                    "Mesh (2.8) must be installed in the cluster (helm install chaos-mesh "
                    "chaos-mesh/chaos-mesh -n chaos-mesh --create-namespace --version 2.8.3 "
                    "--set chaosDaemon.runtime=containerd --set chaosDaemon.socketPath="
                    "/run/containerd/containerd.sock; check: kubectl get crd "
                    "networkchaos.chaos-mesh.org)")
        elif exc.status == 403:
            hint = (f"the game day's role may not use {ref} in {self.kube.target.namespace} "
                    "(RBAC: create, get, delete; docs/chaos-cloud.md)")
        else:
            hint = str(exc.body or "")[:300]
        return KubernetesFaultError(f"{what}: HTTP {exc.status} {exc.reason}: {hint}")

    def _network_chaos(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.kube.custom().get_namespaced_custom_object(
                chaos_mesh.GROUP, chaos_mesh.VERSION, namespace, chaos_mesh.PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise self._chaos_mesh_error(f"get NetworkChaos {namespace}/{name}", exc) from exc

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
        if (record := self.kube.state.get(key)) is not None:
            if record["undo"]["toxic"] == doc:
                return {"target": ref, "already": True, **record["undo"]}
            raise KubernetesFaultError(
                f"toxic {doc['name']!r} on {target} is in effect with other settings; Chaos "
                "Mesh refuses changes to a chaos's spec: remove the toxic and add it again")
        ns = self.kube.target.namespace
        components = self._gray_components(target)
        agents = sorted(p.metadata.name for c in components
                        for p in self.kube.running_pods(Component(f"controlplane-{c}", c)))
        if not agents:
            raise KubernetesFaultError(f"no running agent pod ({', '.join(components)}) in {ns}")
        api_pods = [p.metadata.name for p in self.kube.pick(Component("controlplane-api",
                                                                    API_COMPONENT))]
        name = f"gameday-gray-{dns_label(target)}-{dns_label(doc['name'])}"
        service = f"{self.kube.target.api_service}.{ns}.svc.{self.kube.target.cluster_domain}"
        body = chaos_mesh.network_chaos_body(
            name=name, namespace=ns, netem=netem, source_labels=dict(APP_SELECTOR),
            source_components=components,
            target_labels={**APP_SELECTOR, "app.kubernetes.io/component": API_COMPONENT},
            service_hosts=[service], duration_seconds=self.kube.target.network_chaos_duration,
            labels=dict(MANAGED_BY), annotations={TOXIC_ANNOTATION: json.dumps(doc)})
        undo = {"namespace": ns, "name": name, "toxic": doc}
        self.kube.state.put(key, "network_gray", ref, undo)
        logger.warning("chaos network_gray: NetworkChaos %s/%s (%s %s) agents %s <-> api %s",
                       ns, name, netem.action, netem.direction, agents, api_pods)
        try:
            self.kube.custom().create_namespaced_custom_object(
                chaos_mesh.GROUP, chaos_mesh.VERSION, ns, chaos_mesh.PLURAL, body)
        except ApiException as exc:
            if exc.status != 409:
                self.kube.state.pop(key)  # the API server refused it: nothing was created
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
                f"{self.kube.target.network_chaos_wait:.0f} s (deleted again); Chaos Mesh "
                f"status: {json.dumps(status.get('conditions', []))[:500]}")
        return {"target": ref, **undo, "action": netem.action, "direction": netem.direction,
                "agent_pods": agents, "api_pods": api_pods}

    def remove_network_chaos(self, target: str, name: str) -> dict[str, Any]:
        ref = f"{target}/{name}"
        return self.undo_network_chaos(f"network_gray:{ref}") or {"target": ref, "already": True}

    def undo_network_chaos(self, key: str) -> dict[str, Any] | None:
        """Delete the recorded NetworkChaos and wait until it is gone: Chaos Mesh's finalizer
        holds the object until the netem rules are removed from every pod."""
        record = self.kube.state.get(key)
        if record is None:
            return None
        undo = record["undo"]
        ns, name = undo["namespace"], undo["name"]
        logger.warning("chaos network_gray: deleting NetworkChaos %s/%s", ns, name)
        try:
            self.kube.custom().delete_namespaced_custom_object(
                chaos_mesh.GROUP, chaos_mesh.VERSION, ns, chaos_mesh.PLURAL, name)
        except ApiException as exc:
            if exc.status != 404:  # gone already, or never created
                raise self._chaos_mesh_error(f"delete NetworkChaos {ns}/{name}", exc) from exc
        if not self._poll(lambda: self._network_chaos(ns, name) is None):
            raise KubernetesFaultError(
                f"NetworkChaos {ns}/{name} still there {self.kube.target.network_chaos_wait:.0f} s "
                "after its delete: Chaos Mesh has not finished recovering the pods (finalizer "
                "chaos-mesh/records; is chaos-daemon running?); the record stays for restore_all")
        self.kube.state.pop(key)
        return {"target": record["target"], **undo}

    def _poll(self, done: Any) -> bool:
        import time

        deadline = time.monotonic() + self.kube.target.network_chaos_wait
        step = min(0.5, self.kube.target.network_chaos_wait / 10) or 0.01
        while not done():
            if time.monotonic() >= deadline:
                return False
            time.sleep(step)
        return True



def _injected(obj: dict[str, Any] | None) -> bool:
    """Chaos Mesh's ``AllInjected`` condition is true (every selected pod has the rules)."""
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "AllInjected" and c.get("status") == "True" for c in conditions)

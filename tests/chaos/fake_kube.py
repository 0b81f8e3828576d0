"""A hand-written fake of the CoreV1 / AppsV1 / NetworkingV1 / CustomObjects (Karpenter
``karpenter.sh/v1`` NodePools and NodeClaims, cluster-scoped; Chaos Mesh ``chaos-mesh.org/
v1alpha1`` NetworkChaos, namespaced) API objects, backed by the
recorded cluster objects in ``recorded/``. It keeps JSON dicts (as the API server would),
answers with real ``kubernetes.client`` models and logs every write, so tests can assert
which objects a driver touched. Only the calls the cloud drivers and chaosk8s make exist."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

RECORDED = Path(__file__).parent / "recorded" / "eks-dev-cluster.json"
CUSTOM = ("nodepools", "nodeclaims")  # karpenter.sh/v1, cluster-scoped
CHAOS_MESH = ("chaos-mesh.org", "v1alpha1", "networkchaos")  # namespaced
# What the NetworkChaos CRD of Chaos Mesh 2.8 (config/crd/bases/chaos-mesh.org_networkchaos.yaml)
# checks of the fields the driver sets: enums and the duration pattern.
DURATION = re.compile(r"^[0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h)$")
ENUMS = {"action": {"netem", "delay", "loss", "duplicate", "corrupt", "partition", "bandwidth"},
         "direction": {"to", "from", "both"},
         "mode": {"one", "all", "fixed", "fixed-percent", "random-max-percent"}}


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """JSON merge patch (RFC 7386): None deletes a key."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            if not isinstance(target.get(key), dict):
                target[key] = {}  # RFC 7386: a non-object target becomes {} before merging
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _matches(labels: dict[str, str], selector: str | None) -> bool:
    if not selector:
        return True
    return all(labels.get(k) == v for k, v in (part.split("=", 1) for part in selector.split(",")))


class FakeCluster:
    def __init__(self, recorded: Path = RECORDED) -> None:
        data = json.loads(recorded.read_text())
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {
            kind: {(o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
                   for o in data.get(kind, [])}
            for kind in ("deployments", "pods", "nodes", "networkpolicies", *CUSTOM,
                         "networkchaos")}
        self.writes: list[tuple[str, str, str]] = []  # (verb, kind, "ns/name")
        # "ns/name" -> how many more evictions a PodDisruptionBudget refuses (HTTP 429)
        self.pdb_refusals: dict[str, int] = {}
        self._ser = client.ApiClient()
        # Chaos Mesh: its CRDs installed; its controller reports a NetworkChaos injected
        # (AllInjected) as soon as it exists; its finalizer lets a deleted one go at once.
        self.chaos_mesh_installed = True
        self.chaos_mesh_injects = True
        self.chaos_mesh_recovers = True

    def snapshot(self) -> dict[str, Any]:
        return copy.deepcopy({k: {"/".join(key): o for key, o in v.items()}
                              for k, v in self.objects.items()})

    def model(self, data: Any, kind: str) -> Any:
        return self._ser.deserialize(SimpleNamespace(data=json.dumps(data)), kind)

    def _get(self, kind: str, ns: str, name: str) -> dict[str, Any]:
        try:
            return self.objects[kind][(ns, name)]
        except KeyError:
            raise ApiException(status=404, reason="Not Found") from None

    def _body(self, body: Any) -> dict[str, Any]:
        return body if isinstance(body, dict) else self._ser.sanitize_for_serialization(body)

    def _list(self, kind: str, model: str, ns: str | None = None, label_selector: str | None = None,
              field_selector: str | None = None) -> Any:
        items = []
        for (o_ns, _), obj in sorted(self.objects[kind].items()):
            if ns is not None and o_ns != ns:
                continue
            if not _matches(obj["metadata"].get("labels") or {}, label_selector):
                continue
            if field_selector:
                field, value = field_selector.split("=", 1)
                got = obj["metadata"]["name"] if field == "metadata.name" else obj["spec"].get("nodeName")
                if got != value:
                    continue
            items.append(obj)
        return self.model({"items": items, "metadata": {}}, model)

    # -- CoreV1Api ---------------------------------------------------------------------------
    def list_namespaced_pod(self, namespace: str, label_selector: str | None = None, **_: Any) -> Any:
        return self._list("pods", "V1PodList", namespace, label_selector)

    def list_pod_for_all_namespaces(self, field_selector: str | None = None, **_: Any) -> Any:
        return self._list("pods", "V1PodList", field_selector=field_selector)

    def read_namespaced_pod(self, name: str, namespace: str, **_: Any) -> Any:
        return self.model(self._get("pods", namespace, name), "V1Pod")

    def delete_namespaced_pod(self, name: str, namespace: str, body: Any = None, **_: Any) -> None:
        self._get("pods", namespace, name)
        self.writes.append(("delete", "pod", f"{namespace}/{name}"))
        self.last_delete_options = self._body(body) if body is not None else None
        del self.objects["pods"][(namespace, name)]

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **_: Any) -> None:
        _merge(self._get("pods", namespace, name), self._body(body))
        self.writes.append(("patch", "pod", f"{namespace}/{name}"))

    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: Any, **_: Any) -> None:
        self._get("pods", namespace, name)
        if self.pdb_refusals.get(f"{namespace}/{name}", 0) > 0:
            self.pdb_refusals[f"{namespace}/{name}"] -= 1
            self.writes.append(("evict-refused", "pod", f"{namespace}/{name}"))
            raise ApiException(status=429, reason="Too Many Requests")
        self.writes.append(("evict", "pod", f"{namespace}/{name}"))
        del self.objects["pods"][(namespace, name)]

    def list_node(self, label_selector: str | None = None, field_selector: str | None = None,
                  **_: Any) -> Any:
        return self._list("nodes", "V1NodeList", None, label_selector, field_selector)

    def patch_node(self, name: str, body: Any, **_: Any) -> None:
        node = self._get("nodes", "", name)
        _merge(node, self._body(body))
        if node["spec"].get("unschedulable") is False:  # Go omitempty: the API never shows false
            del node["spec"]["unschedulable"]
        self.writes.append(("patch", "node", name))

    # -- AppsV1Api ---------------------------------------------------------------------------
    def read_namespaced_deployment(self, name: str, namespace: str, **_: Any) -> Any:
        return self.model(self._get("deployments", namespace, name), "V1Deployment")

    def patch_namespaced_deployment(self, name: str, namespace: str, body: Any, **_: Any) -> None:
        _merge(self._get("deployments", namespace, name), self._body(body))
        self.writes.append(("patch", "deployment", f"{namespace}/{name}"))

    # -- NetworkingV1Api ---------------------------------------------------------------------
    def list_namespaced_network_policy(self, namespace: str, **_: Any) -> Any:
        return self._list("networkpolicies", "V1NetworkPolicyList", namespace)

    def read_namespaced_network_policy(self, name: str, namespace: str, **_: Any) -> Any:
        return self.model(self._get("networkpolicies", namespace, name), "V1NetworkPolicy")

    def create_namespaced_network_policy(self, namespace: str, body: Any, **_: Any) -> None:
        body = copy.deepcopy(self._body(body))
        key = (namespace, body["metadata"]["name"])
        if key in self.objects["networkpolicies"]:
            raise ApiException(status=409, reason="AlreadyExists")
        self.objects["networkpolicies"][key] = body
        self.writes.append(("create", "networkpolicy", "/".join(key)))

    def delete_namespaced_network_policy(self, name: str, namespace: str, **_: Any) -> None:
        self._get("networkpolicies", namespace, name)
        del self.objects["networkpolicies"][(namespace, name)]
        self.writes.append(("delete", "networkpolicy", f"{namespace}/{name}"))

    def patch_namespaced_network_policy(self, name: str, namespace: str, body: Any, **_: Any) -> None:
        _merge(self._get("networkpolicies", namespace, name), self._body(body))
        self.writes.append(("patch", "networkpolicy", f"{namespace}/{name}"))

    def replace_namespaced_network_policy(self, name: str, namespace: str, body: Any,
                                          **_: Any) -> None:
        self._get("networkpolicies", namespace, name)
        self.objects["networkpolicies"][(namespace, name)] = copy.deepcopy(self._body(body))
        self.writes.append(("replace", "networkpolicy", f"{namespace}/{name}"))


    # -- CustomObjectsApi (karpenter.sh/v1, cluster-scoped) ----------------------------------
    def _custom(self, group: str, version: str, plural: str) -> str:
        if (group, version, plural) not in {("karpenter.sh", "v1", p) for p in CUSTOM}:
            raise ApiException(status=404, reason=f"no {group}/{version} {plural} in the fake")
        return plural

    def get_cluster_custom_object(self, group: str, version: str, plural: str, name: str,
                                  **_: Any) -> dict[str, Any]:
        return copy.deepcopy(self._get(self._custom(group, version, plural), "", name))

    def list_cluster_custom_object(self, group: str, version: str, plural: str,
                                   label_selector: str | None = None, **_: Any) -> dict[str, Any]:
        kind = self._custom(group, version, plural)
        return {"items": [copy.deepcopy(o) for _, o in sorted(self.objects[kind].items())
                          if _matches(o["metadata"].get("labels") or {}, label_selector)]}

    def patch_cluster_custom_object(self, group: str, version: str, plural: str, name: str,
                                    body: Any, **_: Any) -> dict[str, Any]:
        kind = self._custom(group, version, plural)
        obj = self._get(kind, "", name)
        _merge(obj, self._body(body))  # JSON merge patch, as the driver sends
        for key in ("annotations", "labels"):  # Go omitempty: the API never shows an empty map
            if obj["metadata"].get(key) == {}:
                del obj["metadata"][key]
        self.writes.append(("patch", kind[:-1], name))
        return copy.deepcopy(obj)

    def delete_cluster_custom_object(self, group: str, version: str, plural: str, name: str,
                                     **_: Any) -> None:
        kind = self._custom(group, version, plural)
        self._get(kind, "", name)
        del self.objects[kind][("", name)]
        self.writes.append(("delete", kind[:-1], name))


    # -- CustomObjectsApi (chaos-mesh.org/v1alpha1 NetworkChaos, namespaced) -----------------
    def _chaos_mesh(self, group: str, version: str, plural: str) -> str:
        if (group, version, plural) != CHAOS_MESH or not self.chaos_mesh_installed:
            raise ApiException(status=404, reason="Not Found")  # as for a CRD not installed
        return plural

    def create_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                        plural: str, body: Any, **_: Any) -> dict[str, Any]:
        kind = self._chaos_mesh(group, version, plural)
        body = copy.deepcopy(self._body(body))
        spec = body["spec"]
        bad = [f"spec.{k}" for k, allowed in ENUMS.items() if spec.get(k, "to") not in allowed]
        bad += [f"spec.delay.{k}" for k in ("latency", "jitter")
                if spec.get("action") == "delay" and not DURATION.match(spec["delay"].get(k, "0ms"))]
        bad += ["spec.duration"] if not DURATION.match(spec.get("duration", "0s")) else []
        bad += ["spec.selector"] if not spec.get("selector") else []
        if bad:
            raise ApiException(status=422, reason=f"Invalid: {', '.join(bad)}")
        key = (namespace, body["metadata"]["name"])
        if key in self.objects[kind]:
            raise ApiException(status=409, reason="AlreadyExists")
        if self.chaos_mesh_injects:
            body["status"] = {"conditions": [{"type": "Selected", "status": "True"},
                                             {"type": "AllInjected", "status": "True"}]}
        self.objects[kind][key] = body
        self.writes.append(("create", kind, "/".join(key)))
        return copy.deepcopy(body)

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                     plural: str, name: str, **_: Any) -> dict[str, Any]:
        return copy.deepcopy(self._get(self._chaos_mesh(group, version, plural), namespace, name))

    def delete_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                        plural: str, name: str, **_: Any) -> None:
        kind = self._chaos_mesh(group, version, plural)
        obj = self._get(kind, namespace, name)
        self.writes.append(("delete", kind, f"{namespace}/{name}"))
        if self.chaos_mesh_recovers:
            del self.objects[kind][(namespace, name)]
        else:  # the finalizer holds it
            obj["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z"


@pytest.fixture
def fake_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeCluster]:
    """Every CoreV1/AppsV1/NetworkingV1/CustomObjectsApi built by our drivers or by chaosk8s
    is the fake."""
    fake = FakeCluster()
    for api in ("CoreV1Api", "AppsV1Api", "NetworkingV1Api", "CustomObjectsApi"):
        monkeypatch.setattr(client, api, lambda *_a, **_k: fake)
    # No kubeconfig and not in a pod: chaosk8s builds an unused localhost ApiClient.
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.delenv("CHAOSTOOLKIT_IN_POD", raising=False)
    monkeypatch.delenv("KUBERNETES_CONTEXT", raising=False)
    yield fake

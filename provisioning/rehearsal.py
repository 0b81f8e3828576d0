"""A first deploy rehearsed offline: readiness rules applied in the order the engine would
create resources (provisioning/deploy_graph.py). Mocks accept any order; the real services do not.

Each rule is a pure function ``Graph -> list[Finding]``; its source is in docs/infra.md
("First deploy rehearsed offline"). "At that point" always means: among the resources
guaranteed to exist before this one (``Graph.before``), never merely registered earlier.

* ``addon-nodes``: an EKS add-on whose pods are a Deployment (CoreDNS, ...) stays DEGRADED,
  and Pulumi waits 20 minutes for ACTIVE, unless a node group its pods fit exists first;
* ``pods-nodes``: what Pulumi or Helm waits on to become ready (a Helm release or v4 Chart
  without skipAwait, a Deployment / StatefulSet / Job) needs, for each of its pods, a pool
  existing at that point whose labels and taints admit it (Karpenter NodePools count once
  Karpenter's chart exists); an Argo ``Rollout`` is held to the same (not awaited, but a
  canary with no node never becomes available);
* ``crd-first``: an object of a custom resource needs the chart that installs its CRD
  (with CRDs on) created before it;
* ``karpenter-system``: Karpenter's NodePools / EC2NodeClasses need its chart first, and the
  chart's controller must fit a *node group* existing before the chart (it never runs on
  nodes it launches itself);
* ``job-inputs``: a Job (the migration hook that gates the Deployments) runs images pinned by
  digest and every Secret it reads is created (a Secret, or an ExternalSecret targeting it)
  before it;
* ``setup-jobs-first``: a workload (Deployment, Rollout, Job) that reads a Secret a Job of its
  namespace also reads is created after that Job (the migration, the database role the
  credentials need); two such Jobs are ordered;
* ``log-groups-first``: a log group AWS would create itself at the first write (EKS
  control-plane logs, RDS log exports) is declared, by that exact name, before the cluster or
  instance that writes to it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provisioning.deploy_graph import DEFAULT_NODE_GROUP, EKS_ADDON, EKS_CLUSTER, Graph, Node
from provisioning.deployability import Finding, dig
from provisioning.placement import EKS_EFFECTS, Placement, Pool, why_not

POOL_LABEL = "platform.gameday/pool"
NODE_GROUP_TYPES = frozenset({"eks:index:ManagedNodeGroup", "aws:eks/nodeGroup:NodeGroup",
                              DEFAULT_NODE_GROUP})
KARPENTER_NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
HELM_TYPES = frozenset({"kubernetes:helm.sh/v4:Chart", "kubernetes:helm.sh/v3:Release"})
AWAITED_KINDS = frozenset({"Deployment", "StatefulSet", "Job"})  # a DaemonSet is ready on 0 nodes
# Not awaited by Pulumi (a custom resource), but held to the same placement: a Rollout whose
# pods fit no pool never becomes available and its canary analysis can only fail.
PLACED_KINDS = frozenset({"Rollout"})
# Workloads that run with credentials a setup Job (migration, database role) makes valid.
SETUP_READERS = frozenset({"Deployment", "StatefulSet", "Rollout", "Job"})
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
CRITICAL_ADDONS = {"key": "CriticalAddonsOnly", "operator": "Exists"}

# EKS add-ons whose pods are a Deployment, with the tolerations the add-on ships (EKS user
# guide, "Manage CoreDNS"; containers-roadmap#1389). DaemonSet add-ons (vpc-cni, kube-proxy,
# eks-pod-identity-agent) are ACTIVE with no node and are not listed.
NODE_ADDONS: dict[str, tuple[Mapping[str, Any], ...]] = {
    "coredns": (CRITICAL_ADDONS,
                {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}),
    "aws-ebs-csi-driver": (CRITICAL_ADDONS,),
    "metrics-server": (CRITICAL_ADDONS,),
    "snapshot-controller": (CRITICAL_ADDONS,),
}
DAEMONSET_ADDONS = frozenset({"vpc-cni", "kube-proxy", "eks-pod-identity-agent"})


@dataclass(frozen=True)
class ChartPods:
    """One workload of a chart whose readiness the install waits for, and the values keys
    that place its pods; defaults are the chart's own values.yaml."""

    component: str
    values_path: tuple[str, ...]  # where nodeSelector / tolerations / affinity live
    default_tolerations: tuple[Mapping[str, Any], ...] = ()
    default_affinity: Mapping[str, Any] | None = None


# Karpenter chart values.yaml (v1.5): the controller tolerates CriticalAddonsOnly and, by
# default affinity, avoids nodes Karpenter launched (karpenter.sh/nodepool DoesNotExist).
_KARPENTER_AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [
        {"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"}]}]}}}
CHART_PODS: dict[str, tuple[ChartPods, ...]] = {
    "karpenter": (ChartPods("controller", (), (CRITICAL_ADDONS,), _KARPENTER_AFFINITY),),
    # external-secrets values.yaml: controller, webhook and cert-controller are placed
    # separately (webhook.*, certController.*).
    "external-secrets": (ChartPods("controller", ()), ChartPods("webhook", ("webhook",)),
                         ChartPods("cert-controller", ("certController",))),
    # kube-prometheus-stack values.yaml: what `helm install --wait` waits for (Prometheus and
    # Alertmanager are made later by the operator, not waited for) and its pre-install hooks.
    "kube-prometheus-stack": (
        ChartPods("prometheus-operator", ("prometheusOperator",)),
        ChartPods("admission-webhook-hooks", ("prometheusOperator", "admissionWebhooks", "patch")),
        ChartPods("kube-state-metrics", ("kube-state-metrics",)),
        ChartPods("grafana", ("grafana",)),
    ),
    # argo-rollouts values.yaml: the controller under controller.* (the dashboard is off).
    "argo-rollouts": (ChartPods("controller", ("controller",)),),
    # keda values.yaml: top-level nodeSelector/tolerations/affinity place the operator, the
    # metrics API server and the admission webhooks alike.
    "keda": (ChartPods("operator", ()), ChartPods("metrics-apiserver", ()),
             ChartPods("admission-webhooks", ())),
}

# API group -> the chart installing its CRDs, and how that chart is told to install them.
CRD_CHARTS: dict[str, str] = {
    "karpenter.sh": "karpenter", "karpenter.k8s.aws": "karpenter",
    "external-secrets.io": "external-secrets", "generators.external-secrets.io": "external-secrets",
    "monitoring.coreos.com": "kube-prometheus-stack",
    "argoproj.io": "argo-rollouts", "keda.sh": "keda",
}
CRD_SWITCH: dict[str, tuple[str, ...]] = {  # values key that must not be false
    "external-secrets": ("installCRDs",), "kube-prometheus-stack": ("crds", "enabled"),
    "argo-rollouts": ("installCRDs",), "keda": ("crds", "install"),
}
BUILTIN_GROUPS = frozenset({
    "core", "apps", "batch", "policy", "autoscaling", "networking.k8s.io",
    "rbac.authorization.k8s.io", "scheduling.k8s.io", "storage.k8s.io",
    "coordination.k8s.io", "apiextensions.k8s.io", "admissionregistration.k8s.io",
    "helm.sh", "yaml"})


# --- reading the graph ---------------------------------------------------------------------

def _chart(node: Node) -> str:
    return str(node.props.get("chart", "")).rsplit("/", 1)[-1]


def _group(node: Node) -> str | None:
    """API group of a Kubernetes object type token (``kubernetes:<group>/<v>:<Kind>``)."""
    if not node.type.startswith("kubernetes:") or node.type in HELM_TYPES:
        return None
    group = node.type.split(":")[1].rsplit("/", 1)[0]
    return group


def _scaled_up(node: Node) -> bool:
    scaling = node.props.get("scalingConfig") or {}
    size = scaling.get("desiredSize", scaling.get("minSize", 1))
    return float(size if size is not None else 1) >= 1


def node_group_pool(node: Node) -> Pool:
    labels = {k: frozenset({str(v)}) for k, v in (node.props.get("labels") or {}).items()}
    # Labels EKS puts on every managed node (EKS user guide, "Managed node groups").
    labels["eks.amazonaws.com/capacityType"] = frozenset(
        {str(node.props.get("capacityType") or "ON_DEMAND")})
    taints = tuple({**t, "effect": EKS_EFFECTS.get(t.get("effect", ""), t.get("effect", ""))}
                   for t in node.props.get("taints") or [])
    return Pool(node.name, labels, taints, managed=True)


def karpenter_pool(node: Node) -> Pool:
    template = dig(node.props, "spec", "template") or {}
    labels: dict[str, frozenset[str]] = {
        k: frozenset({str(v)}) for k, v in (dig(template, "metadata", "labels") or {}).items()}
    for req in dig(template, "spec", "requirements") or []:
        if req.get("operator") == "In":
            labels[req["key"]] = frozenset(str(v) for v in req.get("values") or [])
    labels["karpenter.sh/nodepool"] = frozenset({str(dig(node.props, "metadata", "name"))})
    return Pool(node.name, labels, tuple(dig(template, "spec", "taints") or []), managed=False)


def pools_at(graph: Graph, node: Node) -> list[Pool]:
    """Pools that can hold a pod when ``node`` is created: node groups with at least one
    node, and Karpenter NodePools once Karpenter's chart exists."""
    existing = graph.existing(node)
    karpenter_up = any(n.type in HELM_TYPES and _chart(n) == "karpenter" for n in existing)
    pools = [node_group_pool(n) for n in existing if n.type in NODE_GROUP_TYPES and _scaled_up(n)]
    if karpenter_up:
        pools += [karpenter_pool(n) for n in existing if n.type == KARPENTER_NODEPOOL]
    return pools


def chart_placements(node: Node) -> list[tuple[str, Placement]] | None:
    """(component, placement) per waited-for workload of a chart; None for an unknown chart."""
    pods = CHART_PODS.get(_chart(node))
    if pods is None:
        return None
    values = node.props.get("values") or {}
    out = []
    for p in pods:
        at = dig(values, *p.values_path) if p.values_path else values
        at = at if isinstance(at, Mapping) else {}
        spec = {"nodeSelector": at.get("nodeSelector") or {},
                "tolerations": at.get("tolerations", list(p.default_tolerations)),
                "affinity": at.get("affinity", p.default_affinity) or {}}
        out.append((p.component, Placement.of_pod(spec)))
    return out


def _fits(pools: Sequence[Pool], placement: Placement) -> str | None:
    if not pools:
        return "no node pool exists at that point"
    reasons = [f"{p.name}: {why}" for p in pools if (why := why_not(p, placement))]
    return None if len(reasons) < len(pools) else "; ".join(reasons)


def _awaits(node: Node) -> bool:
    if node.type in HELM_TYPES:
        return node.props.get("skipAwait") is not True
    annotations = dig(node.props, "metadata", "annotations") or {}
    return (node.props.get("kind") in AWAITED_KINDS
            and annotations.get("pulumi.com/skipAwait") != "true"
            and dig(node.props, "spec", "replicas") not in (0, 0.0))


# --- rules ---------------------------------------------------------------------------------

def rule_addon_nodes(graph: Graph) -> list[Finding]:
    out = []
    for node in graph.nodes.values():
        if node.type != EKS_ADDON:
            continue
        name = str(node.props.get("addonName"))
        if name in DAEMONSET_ADDONS:
            continue
        if name not in NODE_ADDONS:
            out.append(Finding("addon-nodes", node.label, f"add-on {name!r} has no readiness "
                               "facts (provisioning/rehearsal.py NODE_ADDONS)"))
            continue
        raw = node.props.get("configurationValues") or {}
        config = json.loads(raw) if isinstance(raw, str) and raw else raw
        placement = Placement(node_selector=config.get("nodeSelector") or {},
                              tolerations=config.get("tolerations") or NODE_ADDONS[name])
        groups = [p for p in pools_at(graph, node) if p.managed]
        if (why := _fits(groups, placement)) is not None:
            out.append(Finding("addon-nodes", node.label,
                               f"add-on {name!r} is created before any node group its pods "
                               f"fit ({why}): it stays DEGRADED and the create times out"))
    return out


def rule_pods_nodes(graph: Graph) -> list[Finding]:
    out = []
    for node in graph.nodes.values():
        if not _awaits(node) and node.props.get("kind") not in PLACED_KINDS:
            continue
        if node.type in HELM_TYPES:
            placements = chart_placements(node)
            if placements is None:
                out.append(Finding("pods-nodes", node.label, f"chart {_chart(node)!r} has no "
                                   "placement facts (provisioning/rehearsal.py CHART_PODS)"))
                continue
        else:
            template = dig(node.props, "spec", "template", "spec") or {}
            placements = [(str(node.props.get("kind")), Placement.of_pod(template))]
        pools = pools_at(graph, node)
        for component, placement in placements:
            if (why := _fits(pools, placement)) is not None:
                out.append(Finding("pods-nodes", node.label,
                                   f"{component} pods fit no pool existing at that point ({why})"))
    return out


def rule_crd_first(graph: Graph) -> list[Finding]:
    out = []
    for node in graph.nodes.values():
        group = _group(node)
        if group is None or group in BUILTIN_GROUPS or "." not in group:
            continue
        chart = CRD_CHARTS.get(group)
        if chart is None:
            out.append(Finding("crd-first", node.label, f"API group {group!r}: no known chart "
                               "installs its CRD (provisioning/rehearsal.py CRD_CHARTS)"))
            continue
        installers = [n for n in graph.existing(node) if n.type in HELM_TYPES and _chart(n) == chart]
        if not installers:
            out.append(Finding("crd-first", node.label, f"created before the {chart!r} chart "
                               f"that installs the {group} CRDs"))
            continue
        for n in installers:
            switch = CRD_SWITCH.get(chart)
            if n.props.get("skipCrds") is True or (
                    switch and dig(n.props.get("values") or {}, *switch) is False):
                out.append(Finding("crd-first", node.label, f"the {chart!r} chart "
                                   f"({n.name}) is installed with its CRDs turned off"))
    return out


def rule_karpenter_system(graph: Graph) -> list[Finding]:
    out = []
    for node in graph.nodes.values():
        if _group(node) in ("karpenter.sh", "karpenter.k8s.aws") and not any(
                n.type in HELM_TYPES and _chart(n) == "karpenter" for n in graph.existing(node)):
            out.append(Finding("karpenter-system", node.label,
                               "created before Karpenter's controller chart"))
        if node.type in HELM_TYPES and _chart(node) == "karpenter":
            groups = [p for p in pools_at(graph, node) if p.managed]
            for component, placement in chart_placements(node) or []:
                if (why := _fits(groups, placement)) is not None:
                    out.append(Finding("karpenter-system", node.label,
                                       f"Karpenter's {component} fits no node group existing "
                                       f"before it ({why})"))
    return out


def _secret_refs(pod: Mapping[str, Any]) -> set[str]:
    names: set[str] = set()
    for c in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
        for env in c.get("env") or []:
            if ref := dig(env, "valueFrom", "secretKeyRef", "name"):
                names.add(str(ref))
        for src in c.get("envFrom") or []:
            if ref := dig(src, "secretRef", "name"):
                names.add(str(ref))
    for vol in pod.get("volumes") or []:
        if ref := dig(vol, "secret", "secretName"):
            names.add(str(ref))
    return names


def _secrets_made(nodes: Sequence[Node], namespace: str) -> set[str]:
    made = set()
    for n in nodes:
        ns = dig(n.props, "metadata", "namespace")
        if ns != namespace:
            continue
        if n.props.get("kind") == "Secret":
            made.add(str(dig(n.props, "metadata", "name")))
        elif n.props.get("kind") == "ExternalSecret":
            made.add(str(dig(n.props, "spec", "target", "name") or dig(n.props, "metadata", "name")))
    return made


def rule_job_inputs(graph: Graph) -> list[Finding]:
    out = []
    for node in graph.nodes.values():
        if node.props.get("kind") != "Job":
            continue
        pod = dig(node.props, "spec", "template", "spec") or {}
        for c in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
            if not DIGEST.search(str(c.get("image", ""))):
                out.append(Finding("job-inputs", node.label, f"container {c.get('name')!r} "
                                   f"image {c.get('image')!r} is not pinned by digest"))
        namespace = str(dig(node.props, "metadata", "namespace"))
        missing = _secret_refs(pod) - _secrets_made(graph.existing(node), namespace)
        for name in sorted(missing):
            out.append(Finding("job-inputs", node.label, f"reads Secret {namespace}/{name}, "
                               "which nothing created before it"))
    return out


def rule_setup_jobs_first(graph: Graph) -> list[Finding]:
    """A workload that reads a Secret a Job of its namespace also reads runs after that Job
    (the Job is the setup those credentials need: the schema migration, the database role);
    two Jobs reading the same Secret run one after the other, never in parallel."""
    jobs: dict[str, list[tuple[Node, set[str]]]] = {}
    readers: list[tuple[Node, str, set[str]]] = []
    for node in graph.nodes.values():
        kind = node.props.get("kind")
        if kind not in SETUP_READERS or not node.type.startswith("kubernetes:"):
            continue
        ns = str(dig(node.props, "metadata", "namespace"))
        reads = _secret_refs(dig(node.props, "spec", "template", "spec") or {})
        readers.append((node, ns, reads))
        if kind == "Job":
            jobs.setdefault(ns, []).append((node, reads))
    out = []
    for node, ns, reads in readers:
        for job, job_reads in jobs.get(ns, []):
            shared = sorted(reads & job_reads)
            if job.urn == node.urn or not shared or job.urn in graph.before(node):
                continue
            if node.props.get("kind") == "Job":
                if node.urn in graph.before(job) or node.urn > job.urn:
                    continue  # ordered the other way, or the pair is reported once
                out.append(Finding("setup-jobs-first", node.label, f"runs in parallel with "
                                   f"{job.label}: both read Secret {ns}/{', '.join(shared)} and "
                                   "neither waits for the other"))
            else:
                out.append(Finding("setup-jobs-first", node.label, f"reads Secret "
                                   f"{ns}/{', '.join(shared)} but is created before "
                                   f"{job.label}, the setup that makes it usable"))
    return out


LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"


def aws_made_log_groups(node: Node) -> list[str]:
    """Log groups AWS creates itself (no retention, no KMS, no tags) when ``node`` first
    writes to one that does not exist: EKS control-plane logs, RDS log exports."""
    if node.type in (EKS_CLUSTER, "aws:eks/cluster:Cluster") and \
            node.props.get("enabledClusterLogTypes") and node.props.get("name"):
        return [f"/aws/eks/{node.props['name']}/cluster"]
    if node.type == "aws:rds/instance:Instance" and node.props.get("identifier"):
        return [f"/aws/rds/instance/{node.props['identifier']}/{export}"
                for export in node.props.get("enabledCloudwatchLogsExports") or []]
    return []


def rule_log_groups_first(graph: Graph) -> list[Finding]:
    out = []
    for node in graph.nodes.values():
        wanted = aws_made_log_groups(node)
        if not wanted:
            continue
        declared = {str(n.props.get("name")) for n in graph.existing(node) if n.type == LOG_GROUP}
        for group in wanted:
            if group not in declared:
                out.append(Finding("log-groups-first", node.label, f"log group {group} is not "
                                   "declared before it: AWS creates it at the first write "
                                   "with no retention, KMS key or tags, and declaring it "
                                   "later fails as already existing"))
    return out


RULES: dict[str, Callable[[Graph], list[Finding]]] = {
    "addon-nodes": rule_addon_nodes,
    "pods-nodes": rule_pods_nodes,
    "crd-first": rule_crd_first,
    "karpenter-system": rule_karpenter_system,
    "job-inputs": rule_job_inputs,
    "setup-jobs-first": rule_setup_jobs_first,
    "log-groups-first": rule_log_groups_first,
}


def rehearse(graph: Graph) -> list[Finding]:
    """Every rule's findings (empty = the first deploy would come up); the graph must also
    have a creation order (no cycle)."""
    graph.order()
    return [f for rule in RULES.values() for f in rule(graph)]

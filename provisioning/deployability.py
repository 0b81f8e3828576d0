"""Deployability checks over the resources a stack declares (rendered offline, e.g. under
Pulumi mocks): what a first ``pulumi up`` needs to *exist* and to be *wired*, which a policy
that inspects one resource at a time cannot see.

Each check is a pure function of the declared resources and returns findings (empty = pass):

* ``namespaces``: every namespaced object, chart and release names a declared Namespace;
* ``references``: every Secret / ConfigMap / ServiceAccount a pod template uses is created by
  the program (or an ExternalSecret targets it) or is listed in ``EXTERNAL_OBJECTS``;
* ``selectors``: Service, PodDisruptionBudget, ServiceMonitor and PodMonitor selectors match
  pods/Services the program declares, and Prometheus selects the PrometheusRules and monitors;
* ``hooks``: a chart that relies on Helm hooks is installed by a Helm release (which runs
  them), never by ``helm.v4.Chart`` (which skips them);
* ``required``: per bucket a public-access block and default encryption; EKS secrets
  encryption; the GPU taint tolerated by the NVIDIA device plugin; an autoscaler wherever
  capacity must come from one;
* ``node-tags``: owner / cost-center tags reach every node and its volumes;
* ``retention``: CloudWatch log retention is a value CloudWatch accepts;
* ``alarms``: each alarm carries exactly the dimensions its metric is published with;
* ``capacity``: a workload-class pod template allows spot only for a checkpointable class, and
  exactly the capacity its class declares;
* ``delivery``: every Argo Rollout keeps two replicas (its KEDA ScaledObject's minimum), a PDB,
  readiness on every container and a zone spread, and rolls back by itself: its canary's
  Services exist, every AnalysisTemplate it names exists and gets the arguments it needs, and
  the analyses measure each of ``CANARY_SIGNALS``; every ScaledObject scales something that
  exists.

Facts about third-party charts and AWS metrics live in the tables below, with their source.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from controlplane import workload_classes
from controlplane.runtimes.kubernetes import CAPACITY_TYPE_LABEL, LABEL_PREFIX
from provisioning.components.common import REQUIRED_TAGS


class Declared(Protocol):
    """One declared resource: Pulumi type token, resource name, id, input properties."""

    @property
    def type(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def id(self) -> str: ...
    @property
    def props(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Finding:
    check: str
    resource: str
    message: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.resource}: {self.message}"


WORKLOAD_CLASS_LABEL = f"{LABEL_PREFIX}/workload-class"

BUILTIN_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})

# Objects a pod may reference that the program does not create, with who creates them.
# Anything else referenced and not declared is a finding.
EXTERNAL_OBJECTS: dict[tuple[str, str], str] = {
    ("Secret", "gameday-project-token"):
        "the operator, after seeding the `gameday` project (docs/scheduling.md); only stacks "
        "with gameDay enabled reference it",
}

# Charts whose install depends on Helm hooks (pre-install/post-install Jobs). helm.v4.Chart
# skips hooks (pulumi-kubernetes#3284). kube-prometheus-stack: the admission webhook's
# certificate is made by the pre-install "admission-create" Job (templates/prometheus-operator/
# admission-webhooks/job-patch/); without it the operator never starts.
CHARTS_NEEDING_HOOKS = frozenset({"kube-prometheus-stack"})

# CloudWatch Logs PutRetentionPolicy: the only values it accepts (days).
LOG_RETENTION_DAYS = frozenset({1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731,
                                1096, 1827, 2192, 2557, 2922, 3288, 3653})

# The dimensions each alarmed metric is published with (AWS docs: "Amazon S3 CloudWatch
# metrics", replication metrics; "Amazon RDS CloudWatch metrics"). An alarm whose dimensions
# differ matches no datapoint and never fires.
METRIC_DIMENSIONS: dict[tuple[str, str], frozenset[str]] = {
    **{("AWS/RDS", m): frozenset({"DBInstanceIdentifier"}) for m in (
        "CPUUtilization", "FreeStorageSpace", "WriteLatency", "ReadLatency",
        "DatabaseConnections", "ReplicaLag")},
    **{("AWS/S3", m): frozenset({"BucketName", "FilterId"}) for m in (
        "4xxErrors", "5xxErrors", "AllRequests", "FirstByteLatency", "TotalRequestLatency")},
    **{("AWS/S3", m): frozenset({"SourceBucket", "DestinationBucket", "RuleId"}) for m in (
        "OperationsFailedReplication", "ReplicationLatency", "BytesPendingReplication",
        "OperationsPendingReplication")},
}

HELM_CHART = "kubernetes:helm.sh/v4:Chart"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
# Rollout: Argo Rollouts' replacement for a Deployment (same spec.template).
POD_TEMPLATE_KINDS = frozenset({"Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob",
                                "Rollout"})
CLUSTER_SCOPED_KINDS = frozenset({
    "Namespace", "PriorityClass", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
    "StorageClass", "NodePool", "EC2NodeClass", "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration", "PersistentVolume"})
GPU_TAINT_KEY = "nvidia.com/gpu"
PUBLIC_ACCESS_BLOCK = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
BUCKET_ENCRYPTION = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
AUTOSCALER_CHARTS = frozenset({"karpenter", "cluster-autoscaler"})


# --- helpers ------------------------------------------------------------------------------

def _k8s(resources: Iterable[Declared]) -> list[Declared]:
    return [r for r in resources if r.type.startswith("kubernetes:") and r.props.get("kind")]


def _meta(r: Declared) -> dict[str, Any]:
    return r.props.get("metadata") or {}


def _ns(r: Declared) -> str | None:
    return _meta(r).get("namespace")


def _helm(resources: Iterable[Declared]) -> list[Declared]:
    return [r for r in resources if r.type in (HELM_CHART, HELM_RELEASE)]


def _chart_name(r: Declared) -> str:
    return str(r.props.get("chart", "")).rsplit("/", 1)[-1]


def _release_name(r: Declared) -> str:
    """What ``.Release.Name`` is: a v3 Release's ``name``; a v4 Chart's ``name`` input, else
    the Pulumi resource name."""
    return str(r.props.get("name") or r.name)


def pod_template(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pod template of a workload manifest (CronJob: its job template's), else None."""
    kind, spec = obj.get("kind"), obj.get("spec") or {}
    if kind == "PodTemplate":  # the template is the object's own field, not under spec
        return obj.get("template") or None
    if kind not in POD_TEMPLATE_KINDS:
        return None
    if kind == "CronJob":
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    return spec.get("template") or None


def pod_templates(r: Declared) -> list[dict[str, Any]]:
    template = pod_template(r.props)
    return [template] if template else []


def _matches(selector: Mapping[str, Any] | None, labels: Mapping[str, Any]) -> bool:
    """A LabelSelector (matchLabels + matchExpressions) or a plain map against labels."""
    if selector is None:
        return False
    plain = {k: v for k, v in selector.items() if k not in ("matchLabels", "matchExpressions")}
    wanted = {**plain, **(selector.get("matchLabels") or {})}
    if any(labels.get(k) != v for k, v in wanted.items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        present = key in labels
        if (op == "In" and labels.get(key) not in values) or \
           (op == "NotIn" and present and labels.get(key) in values) or \
           (op == "Exists" and not present) or (op == "DoesNotExist" and present):
            return False
    return True


def dig(value: Any, *path: str) -> Any:
    """``value[path[0]][path[1]]...``, None where a step is missing or not a mapping."""
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


# --- checks -------------------------------------------------------------------------------

def check_namespaces(resources: list[Declared]) -> list[Finding]:
    declared = {_meta(r).get("name") for r in _k8s(resources) if r.props["kind"] == "Namespace"}
    known = declared | BUILTIN_NAMESPACES
    out = []
    for r in _k8s(resources):
        ns = _ns(r)
        if r.props["kind"] in CLUSTER_SCOPED_KINDS:
            continue
        if ns is None:
            out.append(Finding("namespaces", r.name, f"{r.props['kind']} has no namespace"))
        elif ns not in known:
            out.append(Finding("namespaces", r.name,
                               f"namespace {ns!r} is never created by the program"))
    for r in _helm(resources):
        ns = r.props.get("namespace") or "default"
        if ns not in known:
            out.append(Finding("namespaces", r.name, f"chart {_chart_name(r)!r} installs into "
                               f"namespace {ns!r}, which is never created (Helm v4 Chart does "
                               "not create namespaces)"))
    return out


def _pod_references(template: dict[str, Any]) -> list[tuple[str, str]]:
    spec = template.get("spec") or {}
    refs = [("ServiceAccount", spec.get("serviceAccountName") or "default")]
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        for env in c.get("env") or []:
            source = env.get("valueFrom") or {}
            if "secretKeyRef" in source and not source["secretKeyRef"].get("optional"):
                refs.append(("Secret", source["secretKeyRef"]["name"]))
            if "configMapKeyRef" in source and not source["configMapKeyRef"].get("optional"):
                refs.append(("ConfigMap", source["configMapKeyRef"]["name"]))
        for src in c.get("envFrom") or []:
            for kind, key in (("Secret", "secretRef"), ("ConfigMap", "configMapRef")):
                if key in src and not src[key].get("optional"):
                    refs.append((kind, src[key]["name"]))
    for vol in spec.get("volumes") or []:
        if "secret" in vol and not vol["secret"].get("optional"):
            refs.append(("Secret", vol["secret"]["secretName"]))
        if "configMap" in vol and not vol["configMap"].get("optional"):
            refs.append(("ConfigMap", vol["configMap"]["name"]))
    return refs


def check_references(resources: list[Declared],
                     external: Mapping[tuple[str, str], str] | None = None) -> list[Finding]:
    external = EXTERNAL_OBJECTS if external is None else external
    made: set[tuple[str, str | None, str]] = set()
    for r in _k8s(resources):
        kind, ns, name = r.props["kind"], _ns(r), _meta(r).get("name")
        made.add((kind, ns, name))
        if kind == "ExternalSecret":  # the Secret it writes (target.name defaults to its own)
            made.add(("Secret", ns, dig(r.props, "spec", "target", "name") or name))
        if kind == "Namespace":
            made.add(("ServiceAccount", name, "default"))  # Kubernetes makes it
    out = []
    for r in _k8s(resources):
        ns = _ns(r)
        for template in pod_templates(r):
            for kind, name in _pod_references(template):
                if (kind, ns, name) in made or (kind, name) in external:
                    continue
                if kind == "ServiceAccount" and name == "default" and ns in BUILTIN_NAMESPACES:
                    continue
                out.append(Finding("references", r.name, f"{kind} {ns}/{name} is referenced but "
                                   "never created by the program nor listed as external"))
    return out


def _prometheus_values(resources: list[Declared]) -> list[tuple[Declared, dict[str, Any]]]:
    return [(r, dig(r.props, "values", "prometheus", "prometheusSpec") or {})
            for r in _helm(resources) if _chart_name(r) == "kube-prometheus-stack"]


def check_selectors(resources: list[Declared]) -> list[Finding]:
    objs = _k8s(resources)
    pods = [(_ns(r), (t.get("metadata") or {}).get("labels") or {}, t)
            for r in objs for t in pod_templates(r)]
    services = [r for r in objs if r.props["kind"] == "Service"]
    out = []

    def pods_matching(ns: str | None, selector: Mapping[str, Any] | None) -> list[dict[str, Any]]:
        return [t for pns, labels, t in pods if pns == ns and _matches(selector, labels)]

    for r in objs:
        kind, ns, spec = r.props["kind"], _ns(r), r.props.get("spec") or {}
        if kind == "Service" and spec.get("selector") is not None:
            if not pods_matching(ns, spec["selector"]):
                out.append(Finding("selectors", r.name, "Service selector matches no pod template"))
        elif kind == "PodDisruptionBudget":
            if not pods_matching(ns, spec.get("selector")):
                out.append(Finding("selectors", r.name, "PDB selector matches no pod template"))
        elif kind == "ServiceMonitor":
            ports = {e.get("port") for e in spec.get("endpoints") or []}
            hits = [s for s in services if _ns(s) == ns
                    and _matches(spec.get("selector"), _meta(s).get("labels") or {})]
            if not hits:
                out.append(Finding("selectors", r.name, "ServiceMonitor selects no Service"))
            elif not any(ports <= {p.get("name") for p in (s.props.get("spec") or {}).get("ports") or []}
                         for s in hits):
                out.append(Finding("selectors", r.name, f"no selected Service has ports {sorted(ports)}"))
        elif kind == "PodMonitor":
            ports = {e.get("port") for e in spec.get("podMetricsEndpoints") or []}
            hits = pods_matching(ns, spec.get("selector"))
            if not hits:
                out.append(Finding("selectors", r.name, "PodMonitor selects no pod template"))
            for t in hits:
                names = {p.get("name") for c in (t.get("spec") or {}).get("containers") or []
                         for p in c.get("ports") or []}
                if not ports <= names:
                    out.append(Finding("selectors", r.name,
                                       f"a selected pod has no port named {sorted(ports - names)}"))
    # Prometheus (kube-prometheus-stack) must select the rules and monitors the program makes.
    proms = _prometheus_values(resources)
    wanted = {"PrometheusRule": "ruleSelector", "ServiceMonitor": "serviceMonitorSelector",
              "PodMonitor": "podMonitorSelector"}
    for r in objs:
        key = wanted.get(r.props["kind"])
        if key is None:
            continue
        labels = _meta(r).get("labels") or {}
        if not proms:
            out.append(Finding("selectors", r.name, f"{r.props['kind']} but no Prometheus "
                               "(kube-prometheus-stack) is installed to load it"))
        for chart, spec in proms:
            selector = spec.get(key)
            if selector is None:
                # The chart's default: {release: <release name>} (…SelectorNilUsesHelmValues).
                selector = {"matchLabels": {"release": _release_name(chart)}}
            if not _matches(selector, labels):
                out.append(Finding("selectors", r.name, f"Prometheus of {chart.name} does not "
                                   f"select it ({key} {selector}, labels {labels})"))
    return out


def check_hooks(resources: list[Declared]) -> list[Finding]:
    return [Finding("hooks", r.name, f"chart {_chart_name(r)!r} needs Helm hooks, which "
                    "helm.v4.Chart skips: install it with a helm.v3.Release")
            for r in resources if r.type == HELM_CHART and _chart_name(r) in CHARTS_NEEDING_HOOKS]


def _bucket_keys(r: Declared) -> set[str]:
    return {k for k in (r.id, r.props.get("bucket"), r.props.get("id")) if k}


def check_required(resources: list[Declared]) -> list[Finding]:
    out = []
    by_type: dict[str, list[Declared]] = {}
    for r in resources:
        by_type.setdefault(r.type, []).append(r)
    for bucket in by_type.get("aws:s3/bucket:Bucket", []):
        keys = _bucket_keys(bucket)
        for typ, what in ((PUBLIC_ACCESS_BLOCK, "public-access block"),
                          (BUCKET_ENCRYPTION, "default encryption")):
            blocks = [b for b in by_type.get(typ, []) if b.props.get("bucket") in keys]
            if not blocks:
                out.append(Finding("required", bucket.name, f"bucket has no {what}"))
            elif typ == PUBLIC_ACCESS_BLOCK and not all(
                    blocks[0].props.get(k) for k in ("blockPublicAcls", "blockPublicPolicy",
                                                     "ignorePublicAcls", "restrictPublicBuckets")):
                out.append(Finding("required", bucket.name, "public-access block leaves a "
                                   "setting off"))
    for cluster in by_type.get("eks:index:Cluster", []):
        if not cluster.props.get("encryptionConfigKeyArn"):
            out.append(Finding("required", cluster.name, "EKS secrets are not KMS-encrypted "
                               "(encryptionConfigKeyArn)"))
    gpu_nodes = _gpu_capacity(resources)
    plugins = [r for r in _k8s(resources) if r.props["kind"] == "DaemonSet"
               and "nvidia-device-plugin" in str(_meta(r).get("name"))]
    if gpu_nodes and _needs_device_plugin(resources):
        tolerated = [p for p in plugins for t in pod_templates(p)
                     if any(tol.get("key") == GPU_TAINT_KEY and tol.get("operator") == "Exists"
                            for tol in (t.get("spec") or {}).get("tolerations") or [])]
        if not tolerated:
            out.append(Finding("required", "nvidia-device-plugin", "no device plugin tolerates "
                               f"the {GPU_TAINT_KEY} taint: GPUs are never advertised"))
    if _needs_autoscaler(resources) and not any(_chart_name(r) in AUTOSCALER_CHARTS
                                                for r in _helm(resources)):
        out.append(Finding("required", "autoscaler", "node capacity must come from an "
                           "autoscaler (a pool at min 0 or NodePools) but none is installed"))
    return out


def _gpu_capacity(resources: list[Declared]) -> bool:
    for r in resources:
        if r.type == "eks:index:ManagedNodeGroup" and any(
                t.get("key") == GPU_TAINT_KEY for t in r.props.get("taints") or []):
            return True
        if r.props.get("kind") == "NodePool" and any(
                t.get("key") == GPU_TAINT_KEY
                for t in dig(r.props, "spec", "template", "spec", "taints") or []):
            return True
    return False


def _needs_device_plugin(resources: list[Declared]) -> bool:
    """AL2023 NVIDIA nodes need the plugin deployed; Bottlerocket NVIDIA ships its own."""
    for r in resources:
        if r.type == "eks:index:ManagedNodeGroup" and "BOTTLEROCKET" in str(
                r.props.get("amiType")) and any(
                t.get("key") == GPU_TAINT_KEY for t in r.props.get("taints") or []):
            return False
        if r.props.get("kind") == "EC2NodeClass" and any(
                "bottlerocket" in str(a.get("alias", "")).lower()
                for a in dig(r.props, "spec", "amiSelectorTerms") or []) and \
                "gpu" in str(_meta(r).get("name")):
            return False
    return True


def _needs_autoscaler(resources: list[Declared]) -> bool:
    for r in resources:
        if r.type == "eks:index:ManagedNodeGroup" and \
                (r.props.get("scalingConfig") or {}).get("minSize") == 0:
            return True
        if r.props.get("kind") == "NodePool":
            return True
    return False


def check_node_tags(resources: list[Declared],
                    required: Iterable[str] = REQUIRED_TAGS) -> list[Finding]:
    """The tags that attribute spend (owner, cost center …) reach every node and its disks:
    a managed node group through its launch template's tag specifications (the group's own
    tags stay on the group), a Karpenter EC2NodeClass through ``spec.tags``."""
    required = list(required)
    templates = {r.id: r for r in resources if r.type == "aws:ec2/launchTemplate:LaunchTemplate"}
    out = []
    for r in resources:
        if r.type == "eks:index:ManagedNodeGroup":
            lt = templates.get(str((r.props.get("launchTemplate") or {}).get("id")))
            if lt is None:
                out.append(Finding("node-tags", r.name, "no launch template: the node group's "
                                   "tags never reach its instances or volumes"))
                continue
            specs = {s.get("resourceType"): s.get("tags") or {}
                     for s in lt.props.get("tagSpecifications") or []}
            for kind in ("instance", "volume"):
                missing = [t for t in required if not specs.get(kind, {}).get(t)]
                if missing:
                    out.append(Finding("node-tags", r.name, f"its launch template tags no "
                                       f"{kind} with {missing}"))
        elif r.props.get("kind") == "EC2NodeClass":
            tags = dig(r.props, "spec", "tags") or {}
            missing = [t for t in required if not tags.get(t)]
            if missing:
                out.append(Finding("node-tags", r.name, f"EC2NodeClass tags lack {missing}"))
    return out


def check_retention(resources: list[Declared]) -> list[Finding]:
    out = []
    for r in resources:
        if r.type != "aws:cloudwatch/logGroup:LogGroup":
            continue
        days = r.props.get("retentionInDays")
        if days is None:
            out.append(Finding("retention", r.name, "log group keeps logs forever (no "
                               "retentionInDays)"))
        elif int(days) not in LOG_RETENTION_DAYS:
            out.append(Finding("retention", r.name, f"retentionInDays {days} is not a value "
                               f"CloudWatch accepts ({sorted(LOG_RETENTION_DAYS)})"))
    return out


def check_alarms(resources: list[Declared]) -> list[Finding]:
    out = []
    for r in resources:
        if r.type != "aws:cloudwatch/metricAlarm:MetricAlarm" or r.props.get("metricQueries"):
            continue
        key = (r.props.get("namespace"), r.props.get("metricName"))
        expected = METRIC_DIMENSIONS.get(key)  # type: ignore[arg-type]
        have = set((r.props.get("dimensions") or {}).keys())
        if expected is None:
            out.append(Finding("alarms", r.name, f"metric {key[0]}/{key[1]} has no known "
                               "dimension set (add it to METRIC_DIMENSIONS with its source)"))
        elif have != expected:
            out.append(Finding("alarms", r.name, f"dimensions {sorted(have)} differ from the "
                               f"ones {key[1]} is published with {sorted(expected)}: it never "
                               "fires"))
    return out


def _capacity_types(template: Mapping[str, Any]) -> set[str] | None:
    """The Karpenter capacity types a pod may land on; None = unconstrained (any)."""
    terms = dig(template, "spec", "affinity", "nodeAffinity",
                 "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms") or []
    allowed: set[str] = set()
    for term in terms:
        exprs = [e for e in term.get("matchExpressions") or []
                 if e.get("key") == CAPACITY_TYPE_LABEL and e.get("operator") == "In"]
        if not exprs:
            return None  # one term without the requirement admits any capacity
        allowed |= set(exprs[0].get("values") or [])
    selected = (dig(template, "spec", "nodeSelector") or {}).get(CAPACITY_TYPE_LABEL)
    if selected:
        return {selected} if not terms else allowed & {selected}
    return allowed if terms else None


def check_capacity(resources: list[Declared]) -> list[Finding]:
    """A workload-class template may allow spot capacity only for a checkpointable class, and
    must allow exactly what the class declares (the agents' Jobs follow the same table)."""
    out = []
    for r in _k8s(resources):
        for template in pod_templates(r):
            name = (dig(template, "metadata", "labels") or {}).get(WORKLOAD_CLASS_LABEL)
            if name is None:
                continue
            wc = workload_classes.CLASSES.get(name)
            if wc is None:
                out.append(Finding("capacity", r.name, f"unknown workload class {name!r}"))
                continue
            allowed = _capacity_types(template)
            if (allowed is None or "spot" in allowed) and not wc.checkpointable:
                out.append(Finding("capacity", r.name, f"class {name!r} is not checkpointable "
                                   "but its pods may run on spot capacity"))
            elif allowed != set(wc.capacity_types):
                out.append(Finding("capacity", r.name, f"class {name!r} allows "
                                   f"{sorted(allowed or ['any'])}, its table says "
                                   f"{sorted(wc.capacity_types)}"))
    return out


# What a canary must be measured on before it is promoted (metric names of its analyses):
# errors, latency, and prediction quality on the golden set (provisioning/components/serving.py).
CANARY_SIGNALS = ("error-ratio", "p99-latency", "golden-set")


def _analysis_refs(canary: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], bool]]:
    """(analysis block, runs in the background) of a canary strategy: its background
    ``analysis`` and each step's ``analysis``."""
    refs = [(canary["analysis"], True)] if canary.get("analysis") else []
    refs += [(step["analysis"], False) for step in canary.get("steps") or [] if step.get("analysis")]
    return refs


def _rollout_findings(r: Declared, objs: list[Declared]) -> list[str]:
    ns, name, spec = _ns(r), _meta(r).get("name"), r.props.get("spec") or {}
    template = pod_template(r.props) or {}
    pod, labels = template.get("spec") or {}, (template.get("metadata") or {}).get("labels") or {}

    def of(kind: str) -> list[Declared]:
        return [o for o in objs if o.props["kind"] == kind and _ns(o) == ns]

    problems = []
    scalers = [o for o in of("ScaledObject")
               if dig(o.props, "spec", "scaleTargetRef", "kind") == "Rollout"
               and dig(o.props, "spec", "scaleTargetRef", "name") == name]
    least = (dig(scalers[0].props, "spec", "minReplicaCount") if scalers
             else spec.get("replicas", 1))
    if int(least if least is not None else 0) < 2:
        problems.append(f"runs with as few as {least} replica(s) "
                        f"({'its ScaledObject minReplicaCount' if scalers else 'spec.replicas'}): "
                        "one lost pod stops it")
    if not any(_matches(dig(o.props, "spec", "selector"), labels) for o in of("PodDisruptionBudget")):
        problems.append("no PodDisruptionBudget selects its pods")
    for c in pod.get("containers") or []:
        if not c.get("readinessProbe"):
            problems.append(f"container {c.get('name')!r} has no readinessProbe: a pod gets "
                            "traffic before it can answer")
    if not any(t.get("topologyKey") == "topology.kubernetes.io/zone"
               and t.get("whenUnsatisfiable") == "DoNotSchedule"
               for t in pod.get("topologySpreadConstraints") or []):
        problems.append("no zone spread with whenUnsatisfiable DoNotSchedule: one zone can "
                        "hold every replica")
    canary = dig(spec, "strategy", "canary")
    if not isinstance(canary, Mapping):
        return problems + ["no canary strategy: a bad version reaches every replica"]
    services = {_meta(o).get("name") for o in of("Service")}
    for key in ("canaryService", "stableService"):
        if canary.get(key) not in services:
            problems.append(f"strategy.canary.{key} {canary.get(key)!r} is not a Service of {ns}")
    templates = {_meta(o).get("name"): o for o in of("AnalysisTemplate")}
    measured: set[str] = set()
    refs = _analysis_refs(canary)
    if not any(background for _, background in refs):
        problems.append("no background analysis: nothing aborts the canary between steps")
    for block, _ in refs:
        passed = {a.get("name") for a in block.get("args") or []}
        for ref in block.get("templates") or []:
            tpl = templates.get(ref.get("templateName"))
            if tpl is None:
                problems.append(f"analysis template {ref.get('templateName')!r} is not an "
                                f"AnalysisTemplate of {ns}: the AnalysisRun fails, the rollout stalls")
                continue
            for arg in dig(tpl.props, "spec", "args") or []:
                if "value" not in arg and "valueFrom" not in arg and arg.get("name") not in passed:
                    problems.append(f"analysis template {ref['templateName']!r} needs argument "
                                    f"{arg.get('name')!r}, which the Rollout does not pass")
            measured |= {m.get("name") for m in dig(tpl.props, "spec", "metrics") or []}
    missing = [sig for sig in CANARY_SIGNALS if sig not in measured]
    if missing:
        problems.append(f"the canary is never measured on {missing}: a version failing them "
                        "would be promoted")
    return problems


def check_delivery(resources: list[Declared]) -> list[Finding]:
    objs = _k8s(resources)
    out = [Finding("delivery", r.name, problem) for r in objs if r.props["kind"] == "Rollout"
           for problem in _rollout_findings(r, objs)]
    for so in (o for o in objs if o.props["kind"] == "ScaledObject"):
        target = dig(so.props, "spec", "scaleTargetRef") or {}
        kind, name = target.get("kind", "Deployment"), target.get("name")
        if not any(o.props["kind"] == kind and _ns(o) == _ns(so) and _meta(o).get("name") == name
                   for o in objs):
            out.append(Finding("delivery", so.name, f"scales {kind} {_ns(so)}/{name}, which the "
                               "program never creates"))
    return out


CHECKS: dict[str, Callable[[list[Declared]], list[Finding]]] = {
    "namespaces": check_namespaces,
    "references": check_references,
    "selectors": check_selectors,
    "hooks": check_hooks,
    "required": check_required,
    "node-tags": check_node_tags,
    "retention": check_retention,
    "alarms": check_alarms,
    "capacity": check_capacity,
    "delivery": check_delivery,
}


def check_all(resources: Iterable[Declared]) -> list[Finding]:
    listed = list(resources)
    return [f for check in CHECKS.values() for f in check(listed)]

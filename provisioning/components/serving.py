"""Model serving (application layer): the model server as an Argo Rollouts ``Rollout`` with a
canary that is analysed and rolled back automatically, scaled by KEDA on request rate.

* the server: KServe's Python model server (``python -m controlplane.serving.server``, the
  serving image), Open Inference Protocol v2 over HTTP; ready (``GET /v2/models/<name>/ready``)
  only once the model is loaded and had its sha256, so no replica takes traffic before it can
  answer; the model read from ``models/<name>/<version>/`` of the artifact bucket with its own
  IRSA role (read-only, that prefix only);
* availability: at least two replicas (KEDA's ``minReplicaCount``), a PodDisruptionBudget,
  zones spread with ``DoNotSchedule``, on-demand capacity of the ``cpu`` pool only;
* the canary: the steps' weights (by replica ratio: there is no traffic router), a background
  analysis on the canary's own pods (error ratio, p99 latency; Prometheus) and, after the first
  step, the golden set sent to the canary (a Job, ``provisioning.serving_golden``). A failed or
  unjudged measurement aborts the rollout: the stable ReplicaSet, the last good model, keeps
  serving. A missing series is an error, never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from provisioning.components.common import (
    POOL_LABEL,
    PROMETHEUS_URL,
    TYPE_PREFIX,
    Naming,
    child,
)
from provisioning.components.observability import METRICS_PORT_NAME, RULE_LABEL
from provisioning.config import ServedModelVersion, ServingConfig
from provisioning.deployability import CANARY_SIGNALS

# The analyses' metric names: what the `delivery` check requires a canary be measured on.
ERRORS, LATENCY, GOLDEN_SET = CANARY_SIGNALS

SERVICE_ACCOUNT = "model-server"
ROLLOUT = "model-server"
STABLE_SERVICE, CANARY_SERVICE = "model-server", "model-server-canary"
# KServe's own latency histogram (kserve/metrics.py, label model_name): its _count is the
# number of predictions answered, the autoscaler's request rate.
LATENCY_METRIC = "request_predict_seconds"
# Requests by HTTP status: what the error ratio reads. Not a KServe default: the model
# server must export it (docs/infra.md, "Serving and tracking").
REQUESTS_METRIC = "model_server_requests_total"
CAPACITY_TYPE = "karpenter.sh/capacity-type"
RUN_AS = 10001  # the Dockerfile's non-root user
# The serving side's server CLI (docs/serving.md): the `serving` image's entrypoint too.
SERVER_COMMAND = ("python", "-m", "controlplane.serving.server")


@dataclass(frozen=True)
class ServingInputs:
    cfg: ServingConfig
    version: ServedModelVersion
    bucket_name: pulumi.Input[str]
    region: str
    image: pulumi.Input[str]
    # The control-plane image (pinned by digest): runs the golden-set check.
    check_image: pulumi.Input[str]
    role_arn: pulumi.Input[str]


def canary_pods(namespace: str) -> str:
    """PromQL matchers of the canary's pods: the Rollout names its ReplicaSets
    ``<rollout>-<pod template hash>``, whose pods Prometheus labels ``pod``."""
    return f'namespace="{namespace}", pod=~"{ROLLOUT}-{{{{args.canary-hash}}}}-.*"'


def error_ratio_query(namespace: str, window: str = "2m") -> str:
    pods = canary_pods(namespace)
    return (f'sum(rate({REQUESTS_METRIC}{{{pods}, code=~"5.."}}[{window}])) / '
            f'sum(rate({REQUESTS_METRIC}{{{pods}}}[{window}]))')


def p99_latency_query(namespace: str, window: str = "2m") -> str:
    return (f"histogram_quantile(0.99, sum by (le) (rate({LATENCY_METRIC}_bucket"
            f"{{{canary_pods(namespace)}}}[{window}])))")


def request_rate_query(namespace: str, model: str, window: str = "1m") -> str:
    return f'sum(rate({LATENCY_METRIC}_count{{namespace="{namespace}", model_name="{model}"}}[{window}]))'


def serving_pod_placement() -> dict[str, Any]:
    """The ``cpu`` Karpenter pool, on-demand capacity only: a spot reclaim of two replicas at
    once would stop serving (the pool itself may be spot for batch work)."""
    return {
        "nodeSelector": {POOL_LABEL: "cpu"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": CAPACITY_TYPE, "operator": "In", "values": ["on-demand"]}]}]}}},
    }


class Serving(pulumi.ComponentResource):
    """Pass the delivery add-ons' charts and the Prometheus stack in ``opts.depends_on``."""

    namespace: str

    def __init__(self, name: str, inputs: ServingInputs, naming: Naming,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{TYPE_PREFIX}:Serving", name, None, opts)
        cfg = inputs.cfg
        self.namespace = ns = cfg.namespace
        self._naming, self._in, self._name = naming, inputs, name
        labels = {**naming.labels("model-server"), "app.kubernetes.io/name": "model-server"}
        self.selector = {"app.kubernetes.io/name": "model-server",
                         "app.kubernetes.io/component": "model-server"}
        namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata={"name": ns, "labels": {
                **naming.labels("serving"), "pod-security.kubernetes.io/enforce": "restricted"}},
            opts=child(self))
        opts_ns = child(self, depends_on=[namespace])
        k8s.core.v1.ServiceAccount(
            f"{name}-sa", metadata={"name": SERVICE_ACCOUNT, "namespace": ns, "labels": labels,
                                    "annotations": {"eks.amazonaws.com/role-arn": inputs.role_arn}},
            automount_service_account_token=False, opts=opts_ns)
        for logical, svc in (("stable", STABLE_SERVICE), ("canary", CANARY_SERVICE)):
            # Argo Rollouts points each Service's selector at its ReplicaSet's pods.
            k8s.core.v1.Service(
                f"{name}-svc-{logical}",
                metadata={"name": svc, "namespace": ns, "labels": labels},
                spec={"selector": self.selector,
                      "ports": [{"name": METRICS_PORT_NAME, "port": cfg.port, "targetPort": cfg.port}]},
                opts=opts_ns)
        metrics_tpl = self._metrics_analysis(opts_ns)
        golden_tpl = self._golden_analysis(opts_ns)
        self.rollout = k8s.apiextensions.CustomResource(
            f"{name}-rollout",
            api_version="argoproj.io/v1alpha1",
            kind="Rollout",
            metadata={"name": ROLLOUT, "namespace": ns, "labels": labels},
            # No spec.replicas: KEDA's HPA owns the count; a `pulumi up` must not reset it.
            spec={"selector": {"matchLabels": self.selector},
                  "revisionHistoryLimit": 3,
                  "template": {"metadata": {"labels": {**labels, **self.selector}},
                               "spec": self._pod_spec()},
                  "strategy": {"canary": self._canary()}},
            opts=child(self, depends_on=[namespace, metrics_tpl, golden_tpl]),
        )
        k8s.policy.v1.PodDisruptionBudget(
            f"{name}-pdb", metadata={"name": ROLLOUT, "namespace": ns, "labels": labels},
            spec={"minAvailable": cfg.autoscaling.min_replicas - 1,
                  "selector": {"matchLabels": self.selector}},
            opts=opts_ns)
        auto = cfg.autoscaling
        k8s.apiextensions.CustomResource(
            f"{name}-scaler",
            api_version="keda.sh/v1alpha1",
            kind="ScaledObject",
            metadata={"name": ROLLOUT, "namespace": ns, "labels": labels},
            spec={"scaleTargetRef": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
                                     "name": ROLLOUT},
                  "minReplicaCount": auto.min_replicas, "maxReplicaCount": auto.max_replicas,
                  "pollingInterval": 15, "cooldownPeriod": 300,
                  # Prometheus unreadable for 3 polls: hold this many, never scale in blind.
                  "fallback": {"failureThreshold": 3,
                               "replicas": auto.fallback_replicas or auto.max_replicas},
                  "triggers": [{"type": "prometheus", "metricType": "AverageValue", "metadata": {
                      "serverAddress": PROMETHEUS_URL,
                      "query": request_rate_query(ns, cfg.model.name),
                      "threshold": f"{auto.target_requests_per_second:g}"}}]},
            opts=child(self, depends_on=[self.rollout]),
        )
        k8s.apiextensions.CustomResource(
            f"{name}-pod-monitor",
            api_version="monitoring.coreos.com/v1",
            kind="PodMonitor",
            metadata={"name": "model-server", "namespace": ns,
                      "labels": {**naming.labels("serving-monitor"), **RULE_LABEL}},
            spec={"selector": {"matchLabels": self.selector},
                  "podMetricsEndpoints": [{"port": METRICS_PORT_NAME, "path": "/metrics",
                                           "interval": "15s"}]},
            opts=opts_ns)
        k8s.networking.v1.NetworkPolicy(
            f"{name}-ingress",
            metadata={"name": "model-server-ingress", "namespace": ns,
                      "labels": naming.labels("network-policy")},
            spec={"podSelector": {}, "policyTypes": ["Ingress"],
                  "ingress": [{"ports": [{"port": cfg.port, "protocol": "TCP"}]}]},
            opts=opts_ns)
        self.register_outputs({"namespace": ns})

    # -- pods ---------------------------------------------------------------------------------
    def _pod_spec(self) -> dict[str, Any]:
        cfg, model, served = self._in.cfg, self._in.cfg.model, self._in.version
        container = {
            "name": "model-server",
            "image": self._in.image,
            # The serving side's server CLI (docs/serving.md); it reads
            # <store>/<bucket>/models/<name>/<version>/model.json and checks its sha256.
            "command": list(SERVER_COMMAND),
            "args": ["--model", model.name, "--version", served.version, "--sha256", served.sha256,
                     "--store", f"https://s3.{self._in.region}.amazonaws.com",
                     "--bucket", self._in.bucket_name, "--port", str(cfg.port),
                     "--host", "0.0.0.0"],
            "env": [{"name": "AWS_REGION", "value": self._in.region}],
            "ports": [{"name": METRICS_PORT_NAME, "containerPort": cfg.port}],
            "resources": {"requests": cfg.resources.model_dump(),
                          "limits": {"memory": cfg.resources.memory}},
            # Ready only once the model is loaded (Open Inference Protocol v2).
            "readinessProbe": {"httpGet": {"path": f"/v2/models/{model.name}/ready",
                                           "port": cfg.port},
                               "periodSeconds": 5, "failureThreshold": 2},
            "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": cfg.port},
                              "periodSeconds": 10, "failureThreshold": 3,
                              "initialDelaySeconds": 10},
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        }
        return {
            "serviceAccountName": SERVICE_ACCOUNT,
            "automountServiceAccountToken": True,  # the IRSA web identity token
            "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS,
                                "fsGroup": RUN_AS, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                 "whenUnsatisfiable": "DoNotSchedule",
                 "labelSelector": {"matchLabels": self.selector}},
                {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                 "whenUnsatisfiable": "ScheduleAnyway",
                 "labelSelector": {"matchLabels": self.selector}}],
            **serving_pod_placement(),
        }

    # -- the canary and its analysis ----------------------------------------------------------
    def _canary(self) -> dict[str, Any]:
        rollout = self._in.cfg.rollout
        version_arg = {"name": "model-version", "value": self._in.version.version}
        hash_arg = {"name": "canary-hash", "valueFrom": {"podTemplateHashValue": "Latest"}}
        steps: list[dict[str, Any]] = []
        for i, weight in enumerate(rollout.steps):
            steps.append({"setWeight": weight})
            if i == 0:  # the golden set once the canary serves, before more traffic goes to it
                steps.append({"analysis": {"templates": [{"templateName": "model-golden-set"}],
                                           "args": [version_arg]}})
            steps.append({"pause": {"duration": f"{rollout.step_seconds}s"}})
        return {
            "canaryService": CANARY_SERVICE,
            "stableService": STABLE_SERVICE,
            "maxUnavailable": 0,
            "maxSurge": "25%",
            "steps": steps,
            # From the first step to promotion; a failure aborts: back to the stable pods.
            "analysis": {"templates": [{"templateName": "model-canary-metrics"}],
                         "startingStep": 1, "args": [hash_arg]},
        }

    def _metrics_analysis(self, opts: pulumi.ResourceOptions) -> pulumi.Resource:
        rollout, ns = self._in.cfg.rollout, self.namespace

        def metric(name: str, query: str, limit: float) -> dict[str, Any]:
            # An empty result makes `result[0]` an error: consecutive errors fail the metric,
            # so a canary nobody can measure is never promoted.
            return {"name": name, "interval": f"{rollout.interval_seconds}s", "failureLimit": 0,
                    "consecutiveErrorLimit": 2,
                    "successCondition": f"result[0] <= {limit:g}",
                    "provider": {"prometheus": {"address": PROMETHEUS_URL, "query": query}}}

        return k8s.apiextensions.CustomResource(
            f"{self._name}-analysis-metrics",
            api_version="argoproj.io/v1alpha1",
            kind="AnalysisTemplate",
            metadata={"name": "model-canary-metrics", "namespace": ns,
                      "labels": self._naming.labels("serving-analysis")},
            spec={"args": [{"name": "canary-hash"}],
                  "metrics": [metric(ERRORS, error_ratio_query(ns), rollout.max_error_ratio),
                              metric(LATENCY, p99_latency_query(ns),
                                     rollout.max_p99_latency_ms / 1000)]},
            opts=opts)

    def _golden_analysis(self, opts: pulumi.ResourceOptions) -> pulumi.Resource:
        cfg, ns = self._in.cfg, self.namespace
        name = cfg.model.name
        golden = pulumi.Output.concat("s3://", self._in.bucket_name,
                                      f"/models/{name}/{{{{args.model-version}}}}/golden.json")
        container = {
            "name": GOLDEN_SET,
            "image": self._in.check_image,
            "command": ["python", "-m", "provisioning.serving_golden"],
            "args": ["--url", f"http://{CANARY_SERVICE}.{ns}.svc:{cfg.port}", "--model", name,
                     "--version", "{{args.model-version}}", "--golden", golden,
                     "--min-agreement", f"{cfg.rollout.min_golden_agreement:g}"],
            "env": [{"name": "AWS_REGION", "value": self._in.region}],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                          "limits": {"memory": "128Mi"}},
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]}},
        }
        pod = {"serviceAccountName": SERVICE_ACCOUNT, "automountServiceAccountToken": True,
               "restartPolicy": "Never",
               "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS,
                                   "seccompProfile": {"type": "RuntimeDefault"}},
               "containers": [container], **serving_pod_placement()}
        return k8s.apiextensions.CustomResource(
            f"{self._name}-analysis-golden",
            api_version="argoproj.io/v1alpha1",
            kind="AnalysisTemplate",
            metadata={"name": "model-golden-set", "namespace": ns,
                      "labels": self._naming.labels("serving-analysis")},
            spec={"args": [{"name": "model-version"}],
                  "metrics": [{"name": GOLDEN_SET, "count": 1, "failureLimit": 0,
                               "provider": {"job": {"spec": {
                                   "backoffLimit": 0, "activeDeadlineSeconds": 600,
                                   "template": {"spec": pod}}}}}]},
            opts=opts)

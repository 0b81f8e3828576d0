"""The ML control plane on Kubernetes: namespaces, identities, Deployments (API,
reconciler, one agent per pool), disruption budgets, network isolation, quotas, priorities.

Scheduling rule: control-plane pods run only on the on-demand ``system`` pool (node
selector + required ON_DEMAND affinity, no GPU toleration); workloads run only in the
workload namespaces, which cannot reach the database subnets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from provisioning.components.common import GPU_RESOURCE, POOL_LABEL, TYPE_PREFIX, Naming, child
from provisioning.components.gameday import (
    WORKLOAD_POOLS,
    GameDayInputs,
    GameDaySchedule,
    node_pool_names,
)
from provisioning.components.workload_classes import WorkloadClassTemplates
from provisioning.config import (
    ControlPlaneConfig,
    GpuNodePoolConfig,
    NodePoolsConfig,
    load_stack_config,
)
from provisioning.objectives import ApiSettings

API_PORT = 8080
METRICS_PORT = 9090
DB_SECRET = "controlplane-db"  # key "dsn", synced from the RDS-managed secret
AGENT_TOKEN_SECRET = "controlplane-agent-token"  # key "token", generated in-cluster (External Secrets)
ESO_NAMESPACE = "external-secrets"
AGENT_TOKEN_ENV = {"name": "AGENT_TOKEN",
                   "valueFrom": {"secretKeyRef": {"name": AGENT_TOKEN_SECRET, "key": "token"}}}
RUN_AS = 10001  # matches the Dockerfile's non-root user
ESO_CHART_VERSION = "0.10.7"
PRIORITY = {"controlplane": 1_000_000, "workload-high": 10_000, "workload": 1_000}


@dataclass(frozen=True)
class ControlPlaneInputs:
    """Everything the Kubernetes layer needs from the AWS layer."""

    cfg: ControlPlaneConfig
    pools: NodePoolsConfig
    api: ApiSettings
    region: str
    zones: list[str]
    bucket_name: pulumi.Input[str]
    database_address: pulumi.Input[str]
    database_secret_arn: pulumi.Input[str]
    database_cidrs: pulumi.Input[list[str]]
    # The control-plane image reference and its pin (digest or tag, names the migrate Job).
    image: pulumi.Input[str]
    image_pin: str
    # The harness image of the scheduled game day (None when it is disabled).
    game_day_image: pulumi.Input[str] | None = None
    role_arns: dict[str, pulumi.Input[str]] = field(default_factory=dict)
    # (namespace, port) of the tracking server, which training workloads log to.
    tracking_endpoint: tuple[str, int] | None = None


def _meta(name: str, namespace: str | None, labels: dict[str, str], **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels, **extra}
    if namespace:
        meta["namespace"] = namespace
    return meta


def control_plane_pod_placement() -> dict[str, Any]:
    """On-demand system nodes only; never spot, never GPU (no nvidia.com/gpu toleration)."""
    return {
        "nodeSelector": {POOL_LABEL: "system"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "eks.amazonaws.com/capacityType", "operator": "In", "values": ["ON_DEMAND"]},
            ]}]}}},
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoSchedule"}],
    }


def _security_context() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}}


class ControlPlane(pulumi.ComponentResource):
    namespace: str
    workload_namespaces: list[str]

    def __init__(
        self,
        name: str,
        inputs: ControlPlaneInputs,
        naming: Naming,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:ControlPlane", name, None, opts)
        self._naming, self._in, self._name = naming, inputs, name
        cfg = inputs.cfg
        self.namespace = cfg.namespace
        self.workload_namespaces = [w.name for w in cfg.workload_namespaces]
        self._priority_classes()
        cp_ns = self._namespace(cfg.namespace, "controlplane", pss="restricted")
        self._cp_opts = child(self, depends_on=[cp_ns])
        self._service_accounts()
        db_secret, agent_token = self._secrets()
        migrate = self._migrate_job(depends_on=[db_secret, agent_token])
        deps = [migrate]
        self._deployment("api", inputs.api.replicas,
                         ["controlplane", "api", "--host", "0.0.0.0", "--port", str(API_PORT)],
                         API_PORT, cfg.api.resources.model_dump(), depends_on=deps,
                         spread_required=inputs.api.spread_across_zones)
        self._pdb("api", min_available=inputs.api.pdb_min_available)
        k8s.core.v1.Service(
            f"{name}-api-svc",
            metadata=_meta("controlplane-api", cfg.namespace, naming.labels("api")),
            spec={"selector": self._selector("api"),
                  "ports": [{"name": "http", "port": API_PORT, "targetPort": API_PORT}]},
            opts=self._cp_opts,
        )
        # The reconciler serves /healthz (loop alive), /readyz (database reachable) and
        # /metrics on METRICS_PORT (controlplane/health.py); it must listen on the pod IP,
        # not the CLI's loopback default, for the kubelet probes and the scrape to reach it.
        self._deployment("reconciler", cfg.reconciler.replicas,
                         ["controlplane", "reconciler", "--metrics-host", "0.0.0.0",
                          "--metrics-port", str(METRICS_PORT)],
                         METRICS_PORT, cfg.reconciler.resources.model_dump(), depends_on=deps,
                         spread_required=False)
        if cfg.reconciler.replicas > 1:
            self._pdb("reconciler", min_available=cfg.reconciler.replicas - 1)
        for pool, agent in cfg.agents.items():
            # Agents run on system nodes and launch Jobs onto their pool; the contract
            # defines no health endpoints for them, so no HTTP probes.
            self._deployment(f"agent-{pool}", agent.replicas, self._agent_args(pool, agent.cpu_slots),
                             METRICS_PORT, {"cpu": "100m", "memory": "256Mi"}, depends_on=deps,
                             spread_required=False, automount=True, probes=False,
                             extra_env=self._agent_env(pool))
        self._controlplane_network_policies()
        workload_ns = [self._workload_namespace(ws) for ws in cfg.workload_namespaces]
        # Scheduled game day (provisioning/components/gameday.py, docs/scheduling.md): a CronJob with
        # the control-plane placement, its own least-privilege service account and IRSA role.
        game_day = load_stack_config().game_day  # validated before any resource was declared
        self.game_day: GameDaySchedule | None = None
        if game_day.enabled:
            if inputs.game_day_image is None:  # the slim control-plane image cannot run it
                raise ValueError("the scheduled game day needs the harness image")
            self.game_day = GameDaySchedule(
                f"{name}-gameday",
                GameDayInputs(
                    cfg=game_day, environment=naming.environment, namespace=cfg.namespace,
                    workload_namespaces=self.workload_namespaces, agent_pools=list(cfg.agents),
                    region=inputs.region, bucket_names=[inputs.bucket_name],
                    # Names as database.py / cluster.py / autoscaling.py declare them.
                    database_identifier=naming.name("controlplane"), cluster_name=naming.prefix,
                    node_pools=node_pool_names(WORKLOAD_POOLS),
                    role_arn=inputs.role_arns.get("gameday"), selector=self._selector("gameday"),
                    image=inputs.game_day_image,
                    container=self._container, pod_spec=self._pod_spec,
                ),
                naming,
                opts=child(self, depends_on=[cp_ns, *workload_ns]),
            )
        self.register_outputs({"namespace": self.namespace, "workload_namespaces": self.workload_namespaces})

    # -- helpers -----------------------------------------------------------------------
    def _selector(self, component: str) -> dict[str, str]:
        return {"app.kubernetes.io/name": "controlplane", "app.kubernetes.io/component": component}

    def _namespace(self, ns: str, component: str, pss: str) -> k8s.core.v1.Namespace:
        labels = {**self._naming.labels(component), "pod-security.kubernetes.io/enforce": pss}
        return k8s.core.v1.Namespace(f"{self._name}-ns-{ns}", metadata=_meta(ns, None, labels),
                                     opts=child(self))

    def _priority_classes(self) -> None:
        for cls, value in PRIORITY.items():
            k8s.scheduling.v1.PriorityClass(
                f"{self._name}-priority-{cls}",
                metadata=_meta(self._naming.name(cls), None, self._naming.labels()),
                value=value,
                global_default=False,
                # Workload classes never evict running work to make room for more work.
                preemption_policy="PreemptLowerPriority" if cls == "controlplane" else "Never",
                description=f"{cls} pods of {self._naming.prefix}",
                opts=child(self),
            )

    def _service_accounts(self) -> None:
        for sa in ("api", "reconciler", "migrate", "external-secrets-db",
                   *(f"agent-{p}" for p in self._in.cfg.agents)):
            annotations = {}
            if sa in self._in.role_arns:
                annotations["eks.amazonaws.com/role-arn"] = self._in.role_arns[sa]
            k8s.core.v1.ServiceAccount(
                f"{self._name}-sa-{sa}",
                metadata=_meta(sa, self.namespace, self._naming.labels(sa), annotations=annotations),
                automount_service_account_token=sa.startswith("agent-") or sa == "external-secrets-db",
                opts=self._cp_opts,
            )

    def _secrets(self) -> tuple[pulumi.Resource, pulumi.Resource]:
        """External Secrets, then the two Secrets the pods need: the database DSN and the
        agent token. Neither value is ever in Pulumi state."""
        # Helm v4 Chart installs templates only: the namespace is the program's to create.
        eso_ns = k8s.core.v1.Namespace(
            f"{self._name}-ns-{ESO_NAMESPACE}",
            metadata=_meta(ESO_NAMESPACE, None, self._naming.labels("external-secrets")),
            opts=child(self))
        chart = k8s.helm.v4.Chart(
            f"{self._name}-external-secrets",
            chart="external-secrets",
            version=ESO_CHART_VERSION,
            namespace=ESO_NAMESPACE,
            repository_opts=k8s.helm.v4.RepositoryOptsArgs(repo="https://charts.external-secrets.io"),
            values={"installCRDs": True, "nodeSelector": {POOL_LABEL: "system"},
                    "tolerations": control_plane_pod_placement()["tolerations"]},
            opts=child(self, depends_on=[eso_ns]),
        )
        return self._database_secret(chart), self._agent_token(chart)

    def _agent_token(self, chart: pulumi.Resource) -> pulumi.Resource:
        """The agents' token, generated once in the cluster by External Secrets' Password
        generator (refreshInterval 0: never regenerated); the migrate Job registers it with
        the control plane (`controlplane migrate --agent-token-env`)."""
        ns, labels = self.namespace, self._naming.labels("external-secrets")
        generator = k8s.apiextensions.CustomResource(
            f"{self._name}-agent-token-generator",
            api_version="generators.external-secrets.io/v1alpha1",
            kind="Password",
            metadata=_meta(AGENT_TOKEN_SECRET, ns, labels),
            spec={"length": 48, "digits": 12, "symbols": 0, "noUpper": False, "allowRepeat": True},
            opts=child(self, depends_on=[chart, *self._cp_opts.depends_on]),  # type: ignore[list-item]
        )
        return k8s.apiextensions.CustomResource(
            f"{self._name}-agent-token",
            api_version="external-secrets.io/v1beta1",
            kind="ExternalSecret",
            metadata=_meta(AGENT_TOKEN_SECRET, ns, labels),
            spec={
                "refreshInterval": "0",
                "target": {"name": AGENT_TOKEN_SECRET, "creationPolicy": "Owner",
                           "template": {"data": {"token": "{{ .password }}"}}},
                "dataFrom": [{"sourceRef": {"generatorRef": {
                    "apiVersion": "generators.external-secrets.io/v1alpha1", "kind": "Password",
                    "name": AGENT_TOKEN_SECRET}}}],
            },
            opts=child(self, depends_on=[generator]),
        )

    def _database_secret(self, chart: pulumi.Resource) -> pulumi.Resource:
        """DSN secret synced by External Secrets from the RDS-managed master secret, so the
        password is never in Pulumi state and follows RDS rotation."""
        ns = self.namespace
        store = k8s.apiextensions.CustomResource(
            f"{self._name}-secret-store",
            api_version="external-secrets.io/v1beta1",
            kind="SecretStore",
            metadata=_meta("aws-secrets-manager", ns, self._naming.labels("external-secrets")),
            spec={"provider": {"aws": {
                "service": "SecretsManager", "region": self._in.region,
                "auth": {"jwt": {"serviceAccountRef": {"name": "external-secrets-db"}}}}}},
            opts=child(self, depends_on=[chart, *self._cp_opts.depends_on]),  # type: ignore[list-item]
        )
        dsn = pulumi.Output.concat(
            "postgresql://{{ .username | urlquery }}:{{ .password | urlquery }}@",
            self._in.database_address, ":5432/controlplane?sslmode=require",
        )
        return k8s.apiextensions.CustomResource(
            f"{self._name}-db-secret",
            api_version="external-secrets.io/v1beta1",
            kind="ExternalSecret",
            metadata=_meta(DB_SECRET, ns, self._naming.labels("external-secrets")),
            spec={
                "refreshInterval": "1h",
                "secretStoreRef": {"name": "aws-secrets-manager", "kind": "SecretStore"},
                "target": {"name": DB_SECRET, "template": {"data": {"dsn": dsn}}},
                "dataFrom": [{"extract": {"key": self._in.database_secret_arn}}],
            },
            opts=child(self, depends_on=[store]),
        )

    def _container(self, component: str, args: list[Any], port: int | None,
                   resources: dict[str, str], probes: bool = True) -> dict[str, Any]:
        c: dict[str, Any] = {
            "name": component,
            "image": self._in.image,
            "command": ["gameday"],
            "args": args,
            "env": [{"name": "CONTROLPLANE_DSN",
                     "valueFrom": {"secretKeyRef": {"name": DB_SECRET, "key": "dsn"}}}],
            "resources": {"requests": resources, "limits": {"memory": resources["memory"]}},
            "securityContext": _security_context(),
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        }
        if port is not None:
            c["ports"] = [{"name": "http", "containerPort": port}]
        if probes and port is not None:
            c["readinessProbe"] = {"httpGet": {"path": "/readyz", "port": port},
                                   "periodSeconds": 5, "failureThreshold": 2}
            c["livenessProbe"] = {"httpGet": {"path": "/healthz", "port": port},
                                  "periodSeconds": 10, "failureThreshold": 3}
        return c

    def _pod_spec(self, sa: str, containers: list[dict[str, Any]], automount: bool) -> dict[str, Any]:
        return {
            "serviceAccountName": sa,
            "automountServiceAccountToken": automount,
            "priorityClassName": self._naming.name("controlplane"),
            "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS,
                                "fsGroup": RUN_AS, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": containers,
            "volumes": [{"name": "tmp", "emptyDir": {}}],
            **control_plane_pod_placement(),
        }

    def _migrate_job(self, depends_on: list[pulumi.Resource]) -> k8s.batch.v1.Job:
        """Schema migrations run once per image before any replica starts (idempotent)."""
        ref = self._in.image_pin
        suffix = ref.removeprefix("sha256:")[:12].lower().replace(".", "-").replace("_", "-")
        container = self._container("migrate", ["controlplane", "migrate", "--agent-token-env",
                                                "AGENT_TOKEN"], None,
                                    {"cpu": "100m", "memory": "256Mi"}, probes=False)
        container["env"].append(AGENT_TOKEN_ENV)  # the token migrate registers
        spec = self._pod_spec("migrate", [container], automount=False)
        spec["restartPolicy"] = "Never"
        return k8s.batch.v1.Job(
            f"{self._name}-migrate",
            metadata=_meta(f"controlplane-migrate-{suffix}".rstrip("-"), self.namespace,
                           self._naming.labels("migrate")),
            spec={"backoffLimit": 3, "activeDeadlineSeconds": 900,
                  "template": {"metadata": {"labels": {**self._selector("migrate")}}, "spec": spec}},
            opts=child(self, depends_on=[*depends_on, *self._cp_opts.depends_on]),  # type: ignore[list-item]
        )

    def _deployment(self, component: str, replicas: int, args: list[Any], port: int,
                    resources: dict[str, str], depends_on: list[pulumi.Resource],
                    spread_required: bool, automount: bool = False, probes: bool = True,
                    extra_env: list[dict[str, Any]] | None = None) -> None:
        selector = self._selector(component)
        container = self._container(component, args, port, resources, probes=probes)
        container["env"] += extra_env or []
        spec = self._pod_spec(component, [container], automount)
        spec["topologySpreadConstraints"] = [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
             # The API must survive an AZ loss: refuse to stack replicas in one zone.
             "whenUnsatisfiable": "DoNotSchedule" if spread_required else "ScheduleAnyway",
             "labelSelector": {"matchLabels": selector}},
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
             "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": selector}},
        ]
        k8s.apps.v1.Deployment(
            f"{self._name}-{component}",
            metadata=_meta(f"controlplane-{component}", self.namespace, self._naming.labels(component)),
            spec={
                "replicas": replicas,
                "selector": {"matchLabels": selector},
                "strategy": {"type": "RollingUpdate",
                             "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                "template": {"metadata": {"labels": {**selector, **self._naming.labels(component)}},
                             "spec": spec},
            },
            opts=child(self, depends_on=[*depends_on, *self._cp_opts.depends_on]),  # type: ignore[list-item]
        )

    def _pdb(self, component: str, min_available: int) -> None:
        k8s.policy.v1.PodDisruptionBudget(
            f"{self._name}-{component}-pdb",
            metadata=_meta(f"controlplane-{component}", self.namespace, self._naming.labels(component)),
            spec={"minAvailable": min_available, "selector": {"matchLabels": self._selector(component)}},
            opts=self._cp_opts,
        )

    def _agent_env(self, pool: str) -> list[dict[str, Any]]:
        return [
            AGENT_TOKEN_ENV,
            # Read by the kubernetes runtime: where Jobs go and which nodes they select.
            {"name": "AGENT_K8S_NAMESPACE", "value": self.workload_namespaces[0]},
            {"name": "AGENT_K8S_POOL_LABEL", "value": f"{POOL_LABEL}={pool}"},
        ]

    def _agent_args(self, pool: str, cpu_slots: int) -> list[Any]:
        cfg = self._in.pools.gpu if pool == "gpu" else self._in.pools.cpu
        args: list[Any] = ["controlplane", "agent", "--runtime", "kubernetes",
                "--api", f"http://controlplane-api.{self.namespace}.svc:{API_PORT}",
                "--token", "$(AGENT_TOKEN)", "--name", f"{self._naming.prefix}-{pool}",
                "--pool", pool, "--zone", "multi-az", "--region", self._in.region,
                "--cpu-slots", str(cpu_slots),
                # on the pod IP, not the CLI's loopback default: the PodMonitor scrapes it
                "--metrics-host", "0.0.0.0", "--metrics-port", str(METRICS_PORT),
                "--bucket", self._in.bucket_name]
        if isinstance(cfg, GpuNodePoolConfig):
            args += ["--accelerator-type", cfg.accelerator_type,
                     "--accelerator-count", str(cfg.accelerators_per_node * cfg.max_size)]
        return args

    def _controlplane_network_policies(self) -> None:
        labels = self._naming.labels("network-policy")
        k8s.networking.v1.NetworkPolicy(
            f"{self._name}-cp-default-deny",
            metadata=_meta("default-deny-ingress", self.namespace, labels),
            spec={"podSelector": {}, "policyTypes": ["Ingress"]},
            opts=self._cp_opts,
        )
        k8s.networking.v1.NetworkPolicy(
            f"{self._name}-cp-allow-api",
            metadata=_meta("allow-api-ingress", self.namespace, labels),
            spec={"podSelector": {"matchLabels": self._selector("api")}, "policyTypes": ["Ingress"],
                  "ingress": [{"ports": [{"port": API_PORT, "protocol": "TCP"}]}]},
            opts=self._cp_opts,
        )
        k8s.networking.v1.NetworkPolicy(
            f"{self._name}-cp-allow-metrics",
            metadata=_meta("allow-metrics-scrape", self.namespace, labels),
            spec={"podSelector": {}, "policyTypes": ["Ingress"],
                  "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {
                      "kubernetes.io/metadata.name": "monitoring"}}}],
                      "ports": [{"port": METRICS_PORT, "protocol": "TCP"},
                                {"port": API_PORT, "protocol": "TCP"}]}]},
            opts=self._cp_opts,
        )

    def _tracking_egress(self) -> list[dict[str, Any]]:
        """Training runs log their metrics to the tracking server (its namespace, its port)."""
        if self._in.tracking_endpoint is None:
            return []
        namespace, port = self._in.tracking_endpoint
        return [{"to": [{"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": namespace}}}],
                 "ports": [{"port": port, "protocol": "TCP"}]}]

    def _workload_namespace(self, ws: Any) -> k8s.core.v1.Namespace:
        ns_res = self._namespace(ws.name, "workloads", pss="baseline")
        opts = child(self, depends_on=[ns_res])
        labels = self._naming.labels("workloads")
        n = f"{self._name}-{ws.name}"
        # Workloads reach DNS and HTTPS (S3 endpoint, STS, registries) only, and never
        # the database subnets.
        k8s.networking.v1.NetworkPolicy(
            f"{n}-isolation",
            metadata=_meta("workload-isolation", ws.name, labels),
            spec={
                "podSelector": {},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [],
                "egress": [
                    {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                             "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                     "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
                    {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": self._in.database_cidrs}}],
                     "ports": [{"port": 443, "protocol": "TCP"}]},
                    *self._tracking_egress(),
                ],
            },
            opts=opts,
        )
        k8s.core.v1.ServiceAccount(
            f"{n}-sa",
            metadata=_meta("workload", ws.name, labels, annotations={
                "eks.amazonaws.com/role-arn": self._in.role_arns.get(f"workload-{ws.name}", "")}),
            automount_service_account_token=False,
            opts=opts,
        )
        WorkloadClassTemplates(f"{n}-classes", ws.name, self._in.image,
                               self._in.role_arns.get(f"workload-{ws.name}", ""), self._naming,
                               opts=opts)
        k8s.core.v1.ResourceQuota(
            f"{n}-quota",
            metadata=_meta("workload-quota", ws.name, labels),
            spec={"hard": {"requests.cpu": ws.cpu, "requests.memory": ws.memory,
                           "limits.memory": ws.memory, f"requests.{GPU_RESOURCE}": str(ws.gpus),
                           "count/jobs.batch": str(ws.max_jobs), "pods": str(ws.max_jobs * 2)}},
            opts=opts,
        )
        k8s.core.v1.LimitRange(
            f"{n}-limits",
            metadata=_meta("workload-defaults", ws.name, labels),
            spec={"limits": [{"type": "Container",
                              "default": {"cpu": "1", "memory": "2Gi"},
                              "defaultRequest": {"cpu": "500m", "memory": "1Gi"},
                              "max": {"memory": ws.memory}}]},
            opts=opts,
        )
        # Agents create and watch batch Jobs here; nothing else.
        k8s.rbac.v1.Role(
            f"{n}-agent-role",
            metadata=_meta("controlplane-agent", ws.name, labels),
            rules=[
                {"apiGroups": ["batch"], "resources": ["jobs"],
                 "verbs": ["create", "get", "list", "watch", "delete"]},
                {"apiGroups": [""], "resources": ["pods", "pods/log", "events"], "verbs": ["get", "list", "watch"]},
            ],
            opts=opts,
        )
        k8s.rbac.v1.RoleBinding(
            f"{n}-agent-binding",
            metadata=_meta("controlplane-agent", ws.name, labels),
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "controlplane-agent"},
            subjects=[{"kind": "ServiceAccount", "name": f"agent-{p}", "namespace": self.namespace}
                      for p in self._in.cfg.agents],
            opts=opts,
        )
        return ns_res

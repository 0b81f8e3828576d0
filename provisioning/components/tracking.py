"""Experiment tracking (application layer): the MLflow tracking server on the platform's
PostgreSQL (Multi-AZ RDS: its own database and role) with artifacts under a prefix of the
platform's bucket, proxied by the server (``--serve-artifacts``: training pods need no S3
grant for it).

Creation order, each step waiting for the one before (the rehearsal's ``setup-jobs-first``
rule checks it on the captured graph):

1. External Secrets objects in the tracking namespace: the RDS master DSN (``tracking-db-admin``,
   read with this namespace's own IRSA role) and the tracking role's password, generated in the
   cluster (``tracking-db``: ``password`` and the backend-store ``uri``; never in Pulumi state);
2. Job ``tracking-db-init`` (control-plane image, ``provisioning.tracking_db``): the role and
   the database;
3. Job ``tracking-db-upgrade`` (tracking image): ``mlflow db upgrade``, once, so two replicas
   never race to create the schema;
4. Deployment ``mlflow`` (>= 2 replicas, zones spread, PDB, ready on ``/health``), Service.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from provisioning.components.common import TYPE_PREFIX, Naming, child
from provisioning.components.controlplane import control_plane_pod_placement
from provisioning.config import TrackingConfig

TRACKING_SA = "mlflow"
# Not "external-secrets-db": that is the control plane's reader, with its own role.
DB_READER_SA = "tracking-secrets-reader"
ADMIN_SECRET, ROLE_SECRET = "tracking-db-admin", "tracking-db"
SERVICE = "mlflow"
RUN_AS = 10001  # the Dockerfile's non-root user
MLFLOW = "mlflow"  # the `tracking` image's entrypoint: `mlflow server`, `mlflow db upgrade`
DB_PORT = 5432
ADMIN_DATABASE = "controlplane"  # the instance's initial database (components/database.py)


@dataclass(frozen=True)
class TrackingInputs:
    cfg: TrackingConfig
    bucket_name: pulumi.Input[str]
    region: str
    database_address: pulumi.Input[str]
    database_secret_arn: pulumi.Input[str]
    image: pulumi.Input[str]
    image_pin: str
    # The control-plane image (pinned by digest): runs provisioning.tracking_db.
    setup_image: pulumi.Input[str]
    setup_pin: str
    role_arn: pulumi.Input[str]
    db_reader_role_arn: pulumi.Input[str]


def _suffix(pin: str) -> str:
    return pin.removeprefix("sha256:")[:12].lower().replace(".", "-").replace("_", "-")


def _security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}}


class Tracking(pulumi.ComponentResource):
    """Pass the External Secrets chart (the control plane) in ``opts.depends_on``."""

    namespace: str

    def __init__(self, name: str, inputs: TrackingInputs, naming: Naming,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{TYPE_PREFIX}:Tracking", name, None, opts)
        cfg = inputs.cfg
        self.namespace = ns = cfg.namespace
        self._in, self._naming, self._name = inputs, naming, name
        self.selector = {"app.kubernetes.io/name": "mlflow", "app.kubernetes.io/component": "tracking"}
        self._labels = {**naming.labels("tracking"), "app.kubernetes.io/name": "mlflow"}
        namespace = k8s.core.v1.Namespace(
            f"{name}-ns", metadata={"name": ns, "labels": {
                **naming.labels("tracking"), "pod-security.kubernetes.io/enforce": "restricted"}},
            opts=child(self))
        self._opts_ns = opts_ns = child(self, depends_on=[namespace])
        for logical, sa, role in (("sa", TRACKING_SA, inputs.role_arn),
                                  ("sa-db-reader", DB_READER_SA, inputs.db_reader_role_arn)):
            k8s.core.v1.ServiceAccount(
                f"{name}-{logical}",
                metadata={"name": sa, "namespace": ns, "labels": self._labels,
                          "annotations": {"eks.amazonaws.com/role-arn": role}},
                automount_service_account_token=sa == DB_READER_SA, opts=opts_ns)
        k8s.core.v1.ServiceAccount(
            f"{name}-sa-setup", metadata={"name": "tracking-setup", "namespace": ns,
                                          "labels": self._labels},
            automount_service_account_token=False, opts=opts_ns)
        admin, role_secret = self._secrets(namespace)
        init = self._init_job([admin, role_secret])
        upgrade = self._upgrade_job([role_secret, init])
        self._server([role_secret, upgrade])
        self.register_outputs({"namespace": ns})

    def _secrets(self, namespace: pulumi.Resource) -> tuple[pulumi.Resource, pulumi.Resource]:
        ns, cfg, labels = self.namespace, self._in.cfg, self._naming.labels("external-secrets")
        opts = child(self, depends_on=[namespace])
        store = k8s.apiextensions.CustomResource(
            f"{self._name}-secret-store",
            api_version="external-secrets.io/v1beta1", kind="SecretStore",
            metadata={"name": "aws-secrets-manager", "namespace": ns, "labels": labels},
            spec={"provider": {"aws": {"service": "SecretsManager", "region": self._in.region,
                                       "auth": {"jwt": {"serviceAccountRef": {"name": DB_READER_SA}}}}}},
            opts=opts)
        admin = k8s.apiextensions.CustomResource(
            f"{self._name}-db-admin",
            api_version="external-secrets.io/v1beta1", kind="ExternalSecret",
            metadata={"name": ADMIN_SECRET, "namespace": ns, "labels": labels},
            spec={"refreshInterval": "1h",
                  "secretStoreRef": {"name": "aws-secrets-manager", "kind": "SecretStore"},
                  "target": {"name": ADMIN_SECRET, "template": {"data": {"dsn": pulumi.Output.concat(
                      "postgresql://{{ .username | urlquery }}:{{ .password | urlquery }}@",
                      self._in.database_address, f":{DB_PORT}/{ADMIN_DATABASE}?sslmode=require")}}},
                  "dataFrom": [{"extract": {"key": self._in.database_secret_arn}}]},
            opts=child(self, depends_on=[store]))
        generator = k8s.apiextensions.CustomResource(
            f"{self._name}-db-password-generator",
            api_version="generators.external-secrets.io/v1alpha1", kind="Password",
            metadata={"name": ROLE_SECRET, "namespace": ns, "labels": labels},
            spec={"length": 40, "digits": 10, "symbols": 0, "noUpper": False, "allowRepeat": True},
            opts=opts)
        role = k8s.apiextensions.CustomResource(
            f"{self._name}-db-role",
            api_version="external-secrets.io/v1beta1", kind="ExternalSecret",
            metadata={"name": ROLE_SECRET, "namespace": ns, "labels": labels},
            # Generated once (refreshInterval 0): the init Job sets it on the role.
            spec={"refreshInterval": "0",
                  "target": {"name": ROLE_SECRET, "creationPolicy": "Owner", "template": {"data": {
                      "password": "{{ .password }}",
                      "uri": pulumi.Output.concat(
                          f"postgresql://{cfg.role}:{{{{ .password | urlquery }}}}@",
                          self._in.database_address,
                          f":{DB_PORT}/{cfg.database}?sslmode=require")}}},
                  "dataFrom": [{"sourceRef": {"generatorRef": {
                      "apiVersion": "generators.external-secrets.io/v1alpha1", "kind": "Password",
                      "name": ROLE_SECRET}}}]},
            opts=child(self, depends_on=[generator]))
        return admin, role

    def _pod(self, sa: str, container: dict[str, Any], job: bool) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "serviceAccountName": sa,
            "automountServiceAccountToken": sa == TRACKING_SA,  # the IRSA web identity token
            "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS,
                                "fsGroup": RUN_AS, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{**container, "securityContext": _security(),
                            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
            # On-demand system nodes, like the control plane: a run's metrics must not wait
            # for a spot node to come back.
            **control_plane_pod_placement(),
        }
        if job:
            spec["restartPolicy"] = "Never"
        return spec

    def _job(self, logical: str, pin: str, container: dict[str, Any],
             depends_on: list[pulumi.Resource]) -> pulumi.Resource:
        return k8s.batch.v1.Job(
            f"{self._name}-{logical}",
            metadata={"name": f"tracking-{logical}-{_suffix(pin)}".rstrip("-"),
                      "namespace": self.namespace, "labels": self._labels},
            spec={"backoffLimit": 3, "activeDeadlineSeconds": 600,
                  "template": {"metadata": {"labels": {"app.kubernetes.io/name": "mlflow",
                                                       "app.kubernetes.io/component": logical}},
                               "spec": self._pod("tracking-setup", container, job=True)}},
            opts=child(self, depends_on=depends_on))

    def _init_job(self, depends_on: list[pulumi.Resource]) -> pulumi.Resource:
        cfg = self._in.cfg
        return self._job("db-init", self._in.setup_pin, {
            "name": "db-init", "image": self._in.setup_image,
            "command": ["python", "-m", "provisioning.tracking_db"],
            "args": ["--role", cfg.role, "--database", cfg.database],
            "env": [{"name": "ADMIN_DSN", "valueFrom": {"secretKeyRef": {"name": ADMIN_SECRET, "key": "dsn"}}},
                    {"name": "ROLE_PASSWORD",
                     "valueFrom": {"secretKeyRef": {"name": ROLE_SECRET, "key": "password"}}}],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "128Mi"}},
        }, depends_on)

    def _backend_env(self) -> list[dict[str, Any]]:
        return [{"name": "MLFLOW_BACKEND_STORE_URI",
                 "valueFrom": {"secretKeyRef": {"name": ROLE_SECRET, "key": "uri"}}},
                {"name": "AWS_REGION", "value": self._in.region}]

    def _upgrade_job(self, depends_on: list[pulumi.Resource]) -> pulumi.Resource:
        return self._job("db-upgrade", self._in.image_pin, {
            "name": "db-upgrade", "image": self._in.image,
            "command": [MLFLOW, "db", "upgrade", "$(MLFLOW_BACKEND_STORE_URI)"],
            "env": self._backend_env(),
            "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "512Mi"}},
        }, depends_on)

    def _server(self, depends_on: list[pulumi.Resource]) -> None:
        cfg, ns = self._in.cfg, self.namespace
        container = {
            "name": "mlflow", "image": self._in.image,
            "command": [MLFLOW, "server"],
            "args": ["--host", "0.0.0.0", "--port", str(cfg.port),
                     "--backend-store-uri", "$(MLFLOW_BACKEND_STORE_URI)",
                     "--serve-artifacts", "--artifacts-destination",
                     pulumi.Output.concat("s3://", self._in.bucket_name, f"/{cfg.artifact_prefix}")],
            "env": self._backend_env(),
            "ports": [{"name": "http", "containerPort": cfg.port}],
            "resources": {"requests": cfg.resources.model_dump(),
                          "limits": {"memory": cfg.resources.memory}},
            "readinessProbe": {"httpGet": {"path": "/health", "port": cfg.port},
                               "periodSeconds": 5, "failureThreshold": 2},
            "livenessProbe": {"httpGet": {"path": "/health", "port": cfg.port},
                              "periodSeconds": 10, "failureThreshold": 3, "initialDelaySeconds": 20},
        }
        spec = self._pod(TRACKING_SA, container, job=False)
        spec["topologySpreadConstraints"] = [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
             "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": self.selector}}]
        k8s.apps.v1.Deployment(
            f"{self._name}-server",
            metadata={"name": SERVICE, "namespace": ns, "labels": self._labels},
            spec={"replicas": cfg.replicas, "selector": {"matchLabels": self.selector},
                  "strategy": {"type": "RollingUpdate",
                               "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                  "template": {"metadata": {"labels": {**self._labels, **self.selector}},
                               "spec": spec}},
            opts=child(self, depends_on=depends_on))
        opts = self._opts_ns
        k8s.core.v1.Service(
            f"{self._name}-svc", metadata={"name": SERVICE, "namespace": ns, "labels": self._labels},
            spec={"selector": self.selector,
                  "ports": [{"name": "http", "port": cfg.port, "targetPort": cfg.port}]},
            opts=opts)
        k8s.policy.v1.PodDisruptionBudget(
            f"{self._name}-pdb", metadata={"name": SERVICE, "namespace": ns, "labels": self._labels},
            spec={"minAvailable": cfg.replicas - 1, "selector": {"matchLabels": self.selector}},
            opts=opts)
        k8s.networking.v1.NetworkPolicy(
            f"{self._name}-ingress",
            metadata={"name": "mlflow-ingress", "namespace": ns,
                      "labels": self._naming.labels("network-policy")},
            spec={"podSelector": {}, "policyTypes": ["Ingress"],
                  "ingress": [{"ports": [{"port": cfg.port, "protocol": "TCP"}]}]},
            opts=opts)

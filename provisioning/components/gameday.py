"""The scheduled game day: a CronJob in the control-plane namespace that runs
``gameday gate`` against this stack (docs/scheduling.md).

- never overlaps: ``concurrencyPolicy: Forbid`` (the in-environment lock of ``gameday gate``
  is the second guard), ``backoffLimit: 0`` (a failed game day is reported, not retried);
- never inside a declared freeze window: ``gameday gate`` refuses inside the windows of
  ``chaos/freeze-windows.yaml``, which this component ships in the ``gameday-target``
  ConfigMap so the cluster follows the repository's windows at deploy time, not the image's;
- least privilege: its own service account ``gameday`` with exactly the Kubernetes verbs the
  cloud fault drivers call (docs/chaos-cloud.md) plus the game-day Lease (the in-cluster lock,
  environments/cloud/lock.py), and an IRSA role scoped to this stack's RDS instance, artifact bucket
  and the instances of the workload pools' Karpenter NodePools (``identity.game_day_identity``);
- credentials (store DSN, agent token, its project's token) come from Secrets as env vars,
  never from the ConfigMap; the target file only names the variables;
- control-plane placement: on-demand system nodes, never spot or GPU, non-root, read-only
  root filesystem, like every other control-plane pod.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from environments.cloud.lock import LEASE_NAME
from provisioning.components.common import (
    GAME_DAY_ARCHIVE_PREFIX,
    PROMETHEUS_URL,
    TYPE_PREFIX,
    Naming,
    child,
)
from provisioning.config import ConfigError, GameDayConfig

SERVICE_ACCOUNT = "gameday"
CRONJOB = "gameday"
TARGET_CONFIGMAP = "gameday-target"
TARGET_DIR = "/etc/gameday"
TARGET_PATH = f"{TARGET_DIR}/target.json"
FREEZE_PATH = f"{TARGET_DIR}/freeze-windows.yaml"
RUNS_DIR = "/runs"
FREEZE_FILE = Path(__file__).resolve().parents[2] / "chaos" / "freeze-windows.yaml"
# The API Service ControlPlane declares (controlplane.py: "controlplane-api", API_PORT); not
# imported from there because controlplane.py imports this module.
API_SERVICE, API_PORT = "controlplane-api", 8080
# Credentials of the runner, as env vars from Secrets (never in the ConfigMap; the target file
# names the variables: environments/cloud/env.py). (env var, secret, key)
DB_SECRET, AGENT_TOKEN_SECRET = "controlplane-db", "controlplane-agent-token"
PROJECT_TOKEN_SECRET = "gameday-project-token"  # created by the operator, like the agent token
PLATFORM_PROJECT = "gameday"  # the control-plane project the game day submits as
CREDENTIALS = (
    # snapshot of the store after the run (the evidence the verdict is computed from)
    ("GAMEDAY_ADMIN_DSN", DB_SECRET, "dsn"),
    # the fencing probe replays a stale agent's late report with an agent token
    ("GAMEDAY_AGENT_TOKEN", AGENT_TOKEN_SECRET, "token"),
    # background load and experiment submissions
    ("GAMEDAY_PROJECT_TOKEN", PROJECT_TOKEN_SECRET, "token"),
)
# A start missed by more than this (controller down, previous run still active under Forbid)
# is skipped rather than run late at an hour nobody planned for.
STARTING_DEADLINE_SECONDS = 600
SUCCESSFUL_HISTORY, FAILED_HISTORY = 3, 5
RBAC_GROUP = "rbac.authorization.k8s.io"
# Pools a game day may withdraw or lose a node of; the system pool runs the control plane and
# this CronJob's own pod and is out of the role's reach.
WORKLOAD_POOLS = ("cpu", "gpu")
KARPENTER_GROUP = "karpenter.sh"  # NodePool / NodeClaim API group (provisioning/components/autoscaling.py)


def node_pool_names(pools: tuple[str, ...] = WORKLOAD_POOLS) -> dict[str, str]:
    """pool -> Karpenter NodePool name: autoscaling.py names each NodePool after its pool
    (tests/infra/test_gameday_schedule.py checks it against the rendered NodePools)."""
    return {pool: pool for pool in pools}

# Kubernetes verbs the cloud drivers call (environments/cloud/kubernetes.py, chaosk8s), nothing more.
CONTROL_PLANE_RULES: list[dict[str, Any]] = [
    # kill: list + delete one pod; hang/partition: label the target pods (patch).
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "delete", "patch"]},
    # stop/start: read the replica count, scale to 0 and back.
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "patch"]},
    {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch"]},
    # hang/partition: own policies (create/delete), narrow the allow policies (patch) and put
    # their exact original back (replace = update).
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
     "verbs": ["get", "list", "create", "patch", "update", "delete"]},
]
WORKLOAD_RULES: list[dict[str, Any]] = [
    # registry_unreachable / registry_restore: read and replace workload-isolation.
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
     "verbs": ["get", "list", "update"]},
]
# The one-game-day-at-a-time lock (environments/cloud/lock.py): create the Lease once, then read,
# renew, take over when expired and release it by update. resourceNames cannot restrict
# create (the name is not known to the authorizer before the object exists).
LEASE_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [LEASE_NAME],
     "verbs": ["get", "update"]},
]
CLUSTER_RULES: list[dict[str, Any]] = [
    # withdraw_pool/restore_pool (mode cordon): cordon/uncordon; drain through the eviction API.
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    # withdraw_pool/restore_pool (mode nodepool, the default): read and patch the limits of
    # the workload pools' NodePools only (resourceNames) ...
    {"apiGroups": [KARPENTER_GROUP], "resources": ["nodepools"],
     "resourceNames": sorted(node_pool_names().values()), "verbs": ["get", "patch"]},
    # ... and delete their NodeClaims, found by label. NodeClaim names are generated, so
    # resourceNames cannot narrow this; only Karpenter pools have NodeClaims and system is a
    # managed node group, so the system pool's nodes are out of reach.
    {"apiGroups": [KARPENTER_GROUP], "resources": ["nodeclaims"], "verbs": ["list", "delete"]},
]


@dataclass(frozen=True)
class GameDayInputs:
    cfg: GameDayConfig
    environment: str
    namespace: str
    workload_namespaces: list[str]
    agent_pools: list[str]
    region: str
    bucket_names: list[pulumi.Input[str]]
    database_identifier: str
    cluster_name: str
    node_pools: dict[str, str]  # workload pool -> Karpenter NodePool name
    role_arn: pulumi.Input[str] | None
    selector: dict[str, str]
    # The harness image (Dockerfile target `gameday`); it carries the workload too.
    image: pulumi.Input[str]
    # ControlPlane's builders, so this pod gets the same image, security context and placement.
    container: Callable[..., dict[str, Any]]
    pod_spec: Callable[..., dict[str, Any]]


def args_for(cfg: GameDayConfig, environment: str, archive: pulumi.Input[str]) -> list[Any]:
    # The pod's /runs is an emptyDir: the archive in the artifact bucket is what outlives it
    # (history, baselines).
    args = ["gate", "--env", environment, "--suite", cfg.suite, "--target", TARGET_PATH,
            "--runs-dir", RUNS_DIR, "--freeze-file", FREEZE_PATH, "--archive", archive,
            # skip (exit 5) when an SLO the suite touches is below the env's budget floor
            "--budget-check"]
    if cfg.allow_prod and environment == "prod":
        args.append("--allow-prod")
    return args


def freeze_windows_text(path: Path = FREEZE_FILE) -> str:
    """The declared freeze windows, validated here so a broken file stops `pulumi up`
    instead of silently disabling the guard in the cluster."""
    from environments.schedule import ScheduleError, load_freeze_windows

    if not path.exists():
        raise ConfigError(f"scheduled game days need the freeze windows file {path}")
    try:
        load_freeze_windows(path)
    except ScheduleError as exc:
        raise ConfigError(f"freeze windows for the game-day CronJob: {exc}") from None
    return path.read_text()


def _target(inputs: GameDayInputs, project: str, stack: str, image: pulumi.Input[str]
            ) -> pulumi.Output[str]:
    """The target file of ``gameday gate --target`` (environments/cloud/env.py): what the cloud
    fault drivers read (environments/cloud/driver.py ``CloudTarget.KEYS``) plus the runner's keys,
    built from what this program declares. Credentials are not in it: it only names the env
    vars that hold them (``CREDENTIALS``)."""
    def render(image: str, buckets: list[str]) -> str:
        return json.dumps({
            # runner keys (environments/cloud/env.py)
            "apiUrl": f"http://{API_SERVICE}.{inputs.namespace}.svc:{API_PORT}",
            "prometheusUrl": PROMETHEUS_URL,
            # the control-plane image carries the sample training workload (controlplane/workload)
            "workloadImage": image,
            "platformProject": PLATFORM_PROJECT,
            "adminDsnEnv": CREDENTIALS[0][0],
            "agentTokenEnv": CREDENTIALS[1][0],
            "projectTokenEnv": CREDENTIALS[2][0],
            # fault-driver keys (CloudTarget)
            "environment": inputs.environment,
            "project": project,
            "stack": stack,
            "region": inputs.region,
            "clusterName": inputs.cluster_name,
            "controlPlaneNamespace": inputs.namespace,
            "workloadNamespaces": inputs.workload_namespaces,
            # Deployments are controlplane-api, controlplane-reconciler, controlplane-agent-<pool>.
            "agentPools": inputs.agent_pools,
            "artifactBucket": buckets[0],
            "artifactBuckets": buckets,
            "databaseIdentifier": inputs.database_identifier,
            # Karpenter owns the workload pools; the system node group is never a target.
            "nodePools": inputs.node_pools,
        }, indent=2, sort_keys=True)

    return pulumi.Output.all(image, *inputs.bucket_names).apply(
        lambda v: render(v[0], list(v[1:])))


class GameDaySchedule(pulumi.ComponentResource):
    cronjob_name: str

    def __init__(
        self,
        name: str,
        inputs: GameDayInputs,
        naming: Naming,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:GameDaySchedule", name, None, opts)
        cfg, ns = inputs.cfg, inputs.namespace
        if not cfg.enabled or cfg.schedule is None:
            raise ConfigError("GameDaySchedule needs gameDay.enabled: true and gameDay.schedule")
        deps = list((opts.depends_on if opts and isinstance(opts.depends_on, list) else []) or [])
        o = child(self, depends_on=deps)
        labels = {**naming.labels("gameday"), **inputs.selector}

        def meta(obj_name: str, namespace: str | None, **extra: Any) -> dict[str, Any]:
            m: dict[str, Any] = {"name": obj_name, "labels": labels, **extra}
            if namespace:
                m["namespace"] = namespace
            return m

        annotations = {"eks.amazonaws.com/role-arn": inputs.role_arn} if inputs.role_arn else {}
        sa = k8s.core.v1.ServiceAccount(
            f"{name}-sa",
            metadata=meta(SERVICE_ACCOUNT, ns, annotations=annotations),
            automount_service_account_token=True,  # the drivers talk to the Kubernetes API
            opts=o,
        )
        subject = [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": ns}]
        k8s.rbac.v1.Role(f"{name}-role", metadata=meta(SERVICE_ACCOUNT, ns),
                         rules=[*CONTROL_PLANE_RULES, *LEASE_RULES], opts=o)
        k8s.rbac.v1.RoleBinding(
            f"{name}-binding", metadata=meta(SERVICE_ACCOUNT, ns),
            role_ref={"apiGroup": RBAC_GROUP, "kind": "Role", "name": SERVICE_ACCOUNT},
            subjects=subject, opts=o)
        for wns in inputs.workload_namespaces:
            k8s.rbac.v1.Role(f"{name}-{wns}-role", metadata=meta(SERVICE_ACCOUNT, wns),
                             rules=WORKLOAD_RULES, opts=o)
            k8s.rbac.v1.RoleBinding(
                f"{name}-{wns}-binding", metadata=meta(SERVICE_ACCOUNT, wns),
                role_ref={"apiGroup": RBAC_GROUP, "kind": "Role", "name": SERVICE_ACCOUNT},
                subjects=subject, opts=o)
        cluster_role = naming.name("gameday")  # cluster-scoped: unique per stack
        k8s.rbac.v1.ClusterRole(f"{name}-clusterrole", metadata=meta(cluster_role, None),
                                rules=CLUSTER_RULES, opts=o)
        k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-clusterbinding", metadata=meta(cluster_role, None),
            role_ref={"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": cluster_role},
            subjects=subject, opts=o)

        archive = pulumi.Output.concat("s3://", inputs.bucket_names[0], f"/{GAME_DAY_ARCHIVE_PREFIX}")
        container = inputs.container("gameday", args_for(cfg, inputs.environment, archive), None,
                                     {"cpu": "500m", "memory": "1Gi"}, probes=False)
        container["image"] = inputs.image
        self.target_json = _target(inputs, naming.project, naming.stack, container["image"])
        target = k8s.core.v1.ConfigMap(
            f"{name}-target",
            metadata=meta(TARGET_CONFIGMAP, ns),
            data={"target.json": self.target_json, "freeze-windows.yaml": freeze_windows_text()},
            opts=o,
        )

        container["env"] = [
            # chaosk8s: use the in-cluster service account, not a kubeconfig file.
            {"name": "CHAOSTOOLKIT_IN_POD", "value": "true"},
            {"name": "AWS_REGION", "value": inputs.region},
            {"name": "AWS_DEFAULT_REGION", "value": inputs.region},
            # Read-only root filesystem: everything writable lives in the emptyDirs.
            {"name": "HOME", "value": "/tmp"},
            {"name": "GAMEDAY_HOME", "value": f"{RUNS_DIR}/.gameday"},
            # credentials the runner reads (names in target.json); the kubelet resolves them,
            # the service account gets no Secret access
            *({"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
              for var, secret, key in CREDENTIALS),
        ]
        container["workingDir"] = RUNS_DIR
        container["volumeMounts"] = [
            *container["volumeMounts"],
            {"name": "runs", "mountPath": RUNS_DIR},
            {"name": "target", "mountPath": TARGET_DIR, "readOnly": True},
        ]
        pod = inputs.pod_spec(SERVICE_ACCOUNT, [container], automount=True)
        pod["restartPolicy"] = "Never"
        pod["volumes"] = [
            *pod["volumes"],
            {"name": "runs", "emptyDir": {}},
            {"name": "target", "configMap": {"name": TARGET_CONFIGMAP, "defaultMode": 0o444}},
        ]
        self.cronjob_name = CRONJOB
        k8s.batch.v1.CronJob(
            f"{name}-cronjob",
            metadata=meta(CRONJOB, ns),
            spec={
                "schedule": cfg.schedule,
                "timeZone": cfg.time_zone,
                "concurrencyPolicy": "Forbid",
                "startingDeadlineSeconds": STARTING_DEADLINE_SECONDS,
                "successfulJobsHistoryLimit": SUCCESSFUL_HISTORY,
                "failedJobsHistoryLimit": FAILED_HISTORY,
                "suspend": False,
                "jobTemplate": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "backoffLimit": 0,
                        "activeDeadlineSeconds": cfg.active_deadline_seconds,
                        "template": {"metadata": {"labels": labels}, "spec": pod},
                    },
                },
            },
            opts=child(self, depends_on=[*deps, sa, target]),
        )
        self.register_outputs({"cronjob": CRONJOB, "namespace": ns, "schedule": cfg.schedule,
                               "target_json": self.target_json})

"""Typed, validated stack configuration for the Pulumi program.

Everything a stack file (``Pulumi.<stack>.yaml``) may say is declared here as pydantic
models with ``extra="forbid"``: an unknown or misspelled key fails *before* any resource is
declared, with the stack file, the dotted key path and the reason in one message.
Config keys are camelCase (Pulumi's convention); Python attributes are snake_case.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from enum import Enum
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, Literal

import pulumi
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from provisioning import versions
from provisioning.deployability import LOG_RETENTION_DAYS

PROJECT = "mlplatform"
# Repositories `gameday infra image` pushes the control-plane and harness targets to.
CONTROL_PLANE_REPOSITORY, HARNESS_REPOSITORY = "controlplane", "gameday"
# Repositories of the model server and the tracking server images (the Dockerfile's `serving`
# and `tracking` targets; their digests are recorded like the others, `mlplatform:images`).
SERVING_REPOSITORY, TRACKING_REPOSITORY = "serving", "tracking"

# Keys of the form "<project>:<key>" that this program reads; anything else under the
# project namespace is a typo or a stale key and is refused.
TOP_LEVEL_KEYS = (
    "environment", "owner", "costCenter", "allowSpot", "network", "cluster", "nodePools",
    "registry", "artifacts", "database", "controlPlane", "observability", "gameDay",
    "deployRunner", "serving", "tracking",
)


class ConfigError(pulumi.RunError):
    """A stack config that is malformed or contradicts policy/objectives.

    Subclasses ``pulumi.RunError`` so `pulumi up` prints only the message, not a traceback.
    """


class Environment(str, Enum):
    DEV = "dev"
    STAGING = "staging"
    PROD = "prod"

    @property
    def protected(self) -> bool:
        """Environments whose data must survive an accidental `pulumi destroy`."""
        return self in (Environment.STAGING, Environment.PROD)


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )


DnsLabel = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
InstanceType = Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")]


def _cloudwatch_retention(days: int) -> int:
    if days not in LOG_RETENTION_DAYS:
        raise ValueError(f"{days} is not a retention CloudWatch Logs accepts; one of "
                         f"{sorted(LOG_RETENTION_DAYS)}")
    return days


LogRetentionDays = Annotated[int, AfterValidator(_cloudwatch_retention)]


class NetworkConfig(_Model):
    cidr: str = "10.0.0.0/16"
    availability_zones: list[str] = Field(min_length=2, max_length=3)
    # "perAz" survives the loss of one AZ's NAT; "single" is a cost trade-off for dev.
    nat_gateways: Literal["single", "perAz"] = "perAz"
    flow_log_retention_days: LogRetentionDays = 30

    @model_validator(mode="after")
    def _distinct_zones(self) -> NetworkConfig:
        if len(set(self.availability_zones)) != len(self.availability_zones):
            raise ValueError(f"availabilityZones must be distinct, got {self.availability_zones}")
        return self


# Example address ranges: a CIDR inside one is a placeholder copied from documentation.
DOCUMENTATION_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"))


class ClusterConfig(_Model):
    # Pinned: the Kubernetes manifests are validated against this exact version's schema.
    kubernetes_version: Annotated[str, Field(pattern=r"^1\.\d{2}$")]
    endpoint_public_access: bool = False
    public_access_cidrs: list[str] = Field(default_factory=list)
    # /aws/eks/<cluster>/cluster, declared before the cluster (components/cluster.py)
    log_retention_days: LogRetentionDays = 90
    # a kubernetesVersion past EKS standard support is refused without it (provisioning/versions.py)
    allow_extended_support: bool = False

    @field_validator("public_access_cidrs")
    @classmethod
    def _real_cidrs(cls, cidrs: list[str]) -> list[str]:
        for cidr in cidrs:
            try:
                net = ipaddress.ip_network(cidr, strict=True)
            except ValueError as exc:
                raise ValueError(f"{cidr!r} is not a CIDR block ({exc})") from None
            placeholder = next((d for d in DOCUMENTATION_NETWORKS
                                if net.version == d.version and net.subnet_of(d)), None)  # type: ignore[arg-type]
            if placeholder is not None:
                raise ValueError(
                    f"{cidr!r} is a documentation range ({placeholder}, RFC 5737/3849), not your "
                    "network: set your deploy machine's egress CIDR, or set "
                    "endpointPublicAccess: false and deploy through the in-VPC runner "
                    "(docs/infra.md, Deploy path)")
        return cidrs

    @model_validator(mode="after")
    def _public_needs_cidrs(self) -> ClusterConfig:
        if self.endpoint_public_access and not self.public_access_cidrs:
            raise ValueError("endpointPublicAccess needs publicAccessCidrs (never 0.0.0.0/0 by default)")
        return self


class CapacityType(str, Enum):
    ON_DEMAND = "ON_DEMAND"
    SPOT = "SPOT"


class NodePoolConfig(_Model):
    instance_types: list[InstanceType] = Field(min_length=1)
    min_size: int = Field(ge=0)
    max_size: int = Field(ge=1)
    desired_size: int | None = Field(default=None, ge=0)
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    disk_size_gb: int = Field(default=50, ge=20, le=16384)

    @model_validator(mode="after")
    def _sizes(self) -> NodePoolConfig:
        if self.min_size > self.max_size:
            raise ValueError(f"minSize {self.min_size} is greater than maxSize {self.max_size}")
        desired = self.desired_size if self.desired_size is not None else self.min_size
        if not self.min_size <= desired <= self.max_size:
            raise ValueError(f"desiredSize {desired} is outside [minSize, maxSize]")
        return self


class GpuNodePoolConfig(NodePoolConfig):
    # AL2 GPU AMIs are end-of-life; both remaining choices ship the NVIDIA driver.
    ami_type: Literal["AL2023_x86_64_NVIDIA", "BOTTLEROCKET_x86_64_NVIDIA"] = "AL2023_x86_64_NVIDIA"
    accelerator_type: DnsLabel
    accelerators_per_node: int = Field(default=1, ge=1, le=16)
    min_size: int = Field(default=0, ge=0, le=0)  # scale to zero: GPUs are paid by the hour

    @property
    def needs_device_plugin(self) -> bool:
        """Bottlerocket NVIDIA variants run the device plugin themselves; AL2023 does not."""
        return self.ami_type == "AL2023_x86_64_NVIDIA"


class NodePoolsConfig(_Model):
    system: NodePoolConfig
    cpu: NodePoolConfig
    gpu: GpuNodePoolConfig

    @model_validator(mode="after")
    def _system_on_demand(self) -> NodePoolsConfig:
        if self.system.capacity_type is not CapacityType.ON_DEMAND:
            raise ValueError("system.capacityType must be ON_DEMAND: the control plane never runs on spot")
        if self.system.min_size < 2:
            raise ValueError("system.minSize must be >= 2 so the control plane survives a node loss")
        # cpu/gpu are Karpenter NodePools (provisioning/components/autoscaling.py): they have no
        # minimum, so a non-zero minSize/desiredSize would be silently ignored.
        for name, pool in (("cpu", self.cpu), ("gpu", self.gpu)):
            if pool.min_size or pool.desired_size:
                raise ValueError(f"{name}.minSize/desiredSize must be 0 or unset: the {name} pool is "
                                 "a Karpenter NodePool that scales from zero on demand")
        return self


class RegistryConfig(_Model):
    repositories: list[Annotated[str, Field(pattern=r"^[a-z0-9]+([._/-][a-z0-9]+)*$")]] = Field(
        default_factory=lambda: [CONTROL_PLANE_REPOSITORY, HARNESS_REPOSITORY, "workloads/trainer"],
        min_length=1,
    )
    keep_tagged_images: int = Field(default=50, ge=1)
    untagged_expiry_days: int = Field(default=7, ge=1)


class ArtifactsConfig(_Model):
    replica_region: str | None = None
    noncurrent_version_expiry_days: int = Field(default=30, ge=1)
    abort_incomplete_upload_days: int = Field(default=2, ge=1)


class DatabaseConfig(_Model):
    instance_class: Annotated[str, Field(pattern=r"^db\.[a-z0-9]+\.[a-z0-9]+$")]
    engine_version: str = "16"
    allocated_storage_gb: int = Field(default=50, ge=20)
    max_allocated_storage_gb: int = Field(default=200, ge=20)
    # None = derive from the db-primary-loss objective; an explicit value is checked against it.
    multi_az: bool | None = None
    backup_retention_days: int | None = Field(default=None, ge=0, le=35)
    deletion_protection: bool | None = None
    # /aws/rds/instance/<id>/<export>, declared before the instance (components/database.py)
    log_retention_days: LogRetentionDays = 30

    @field_validator("engine_version")
    @classmethod
    def _major_only(cls, version: str) -> str:
        # Minor upgrades are automatic (auto_minor_version_upgrade): a pinned minor would show
        # as a downgrade in every preview after AWS applies one.
        if not re.fullmatch(r"1[5-7]", version):
            raise ValueError(f"{version!r}: give the major version only (15, 16 or 17); minor "
                             "versions are upgraded automatically")
        return version

    @model_validator(mode="after")
    def _storage(self) -> DatabaseConfig:
        if self.max_allocated_storage_gb < self.allocated_storage_gb:
            raise ValueError("maxAllocatedStorageGb must be >= allocatedStorageGb")
        return self


DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


class ImageConfig(_Model):
    repository: Annotated[str, Field(min_length=1)]
    tag: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
    digest: str | None = Field(default=None, pattern=DIGEST_RE.pattern)

    @model_validator(mode="after")
    def _one_ref(self) -> ImageConfig:
        if (self.tag is None) == (self.digest is None):
            raise ValueError("set exactly one of tag or digest")
        if self.tag == "latest":
            raise ValueError("tag 'latest' is mutable; pin a version or a digest")
        return self

    @property
    def reference(self) -> str:
        return f"{self.repository}@{self.digest}" if self.digest else f"{self.repository}:{self.tag}"


class ContainerResources(_Model):
    cpu: Annotated[str, Field(pattern=r"^\d+(\.\d+)?m?$")] = "250m"
    memory: Annotated[str, Field(pattern=r"^\d+(Ki|Mi|Gi)$")] = "512Mi"


class DeploymentConfig(_Model):
    replicas: int = Field(ge=1, le=50)
    resources: ContainerResources = Field(default_factory=ContainerResources)


class AgentConfig(_Model):
    replicas: int = Field(default=1, ge=1, le=10)
    cpu_slots: int = Field(default=4, ge=1)


class WorkloadNamespaceConfig(_Model):
    name: DnsLabel
    cpu: Annotated[str, Field(pattern=r"^\d+$")] = "64"
    memory: Annotated[str, Field(pattern=r"^\d+(Gi|Ti)$")] = "256Gi"
    gpus: int = Field(default=8, ge=0)
    max_jobs: int = Field(default=100, ge=1)


class ControlPlaneConfig(_Model):
    namespace: DnsLabel = "mlp-controlplane"
    # Unset (the default): the registry's `controlplane` repository at the digest the
    # application stack records (`mlplatform:images.controlplane`, `gameday infra image`).
    # Set: an image from elsewhere.
    image: ImageConfig | None = None
    api: DeploymentConfig
    reconciler: DeploymentConfig
    agents: dict[Literal["cpu", "gpu"], AgentConfig] = Field(
        default_factory=lambda: {"cpu": AgentConfig(), "gpu": AgentConfig()}
    )
    workload_namespaces: list[WorkloadNamespaceConfig] = Field(
        default_factory=lambda: [WorkloadNamespaceConfig(name="mlp-workloads")], min_length=1
    )


class ObservabilityConfig(_Model):
    install_prometheus_stack: bool = True
    alarm_email: str | None = Field(default=None, pattern=r"^[^@\s]+@[^@\s]+$")


# -- scheduled game days ----------------------------------------------------------------------
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (field name, lowest, highest, names mapped to numbers) in Kubernetes CronJob order.
_CRON_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, {m: i + 1 for i, m in enumerate(_MONTHS)}),
    ("day-of-week", 0, 7, {d: i for i, d in enumerate(_WEEKDAYS)}),  # 0 and 7 are Sunday
)


def validate_cron(expr: str) -> str:
    """Check a 5-field cron expression (what a Kubernetes CronJob's ``schedule`` accepts:
    ``*``, ``a``, ``a-b``, lists, ``/step``, month/weekday names); return it normalised.

    Raises ValueError naming the offending field and value."""
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(
            f"{expr!r} is not a 5-field cron expression (minute hour day-of-month month "
            f"day-of-week), it has {len(fields)} field(s); e.g. '0 6 * * 2' = Tuesdays 06:00"
            + ("; set the zone with gameDay.timeZone, not TZ= in the schedule"
               if "TZ=" in expr else "")
        )
    for text, (name, lo, hi, names) in zip(fields, _CRON_FIELDS):
        def value(token: str, text: str = text, name: str = name, lo: int = lo, hi: int = hi,
                  names: dict[str, int] = names) -> int:
            if token.lower() in names:
                return names[token.lower()]
            if not token.isdigit():
                raise ValueError(f"{expr!r}: {name} field {text!r}: {token!r} is not a number"
                                 + (f" or a name ({', '.join(names)})" if names else ""))
            if not lo <= int(token) <= hi:
                raise ValueError(f"{expr!r}: {name} field {text!r}: {token} is outside {lo}-{hi}")
            return int(token)

        for part in text.split(","):
            base, slash, step = part.partition("/")
            if slash and (not step.isdigit() or int(step) < 1):
                raise ValueError(f"{expr!r}: {name} field {text!r}: step {step!r} must be a "
                                 "positive integer")
            if base == "*":
                continue
            first, dash, last = base.partition("-")
            if not first:
                raise ValueError(f"{expr!r}: {name} field {text!r}: empty value")
            start = value(first)
            if dash and start > value(last):
                raise ValueError(f"{expr!r}: {name} field {text!r}: range {base!r} runs backwards")
    return " ".join(fields)


def validate_time_zone(tz: str) -> str:
    """An IANA zone name (what a CronJob's ``timeZone`` accepts); refuses offsets like
    ``UTC+1`` and local abbreviations that the API server would reject at deploy time."""
    import zoneinfo

    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        available = zoneinfo.available_timezones()
        if available or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*", tz):
            raise ValueError(f"{tz!r} is not an IANA time zone name (e.g. 'Etc/UTC', "
                             "'Europe/Berlin')") from None
    return tz


class GameDayConfig(_Model):
    """The scheduled game day (``provisioning/components/gameday.py``): a CronJob in the control-plane
    namespace that runs ``gameday gate`` against this stack. Off unless ``enabled``."""

    enabled: bool = False
    # 5-field cron in timeZone; required when enabled.
    schedule: str | None = None
    time_zone: str = "Etc/UTC"
    suite: Literal["ci", "core", "full"] = "core"
    # prod game days are refused unless explicitly allowed (passed on as --allow-prod).
    allow_prod: bool = False
    active_deadline_seconds: int = Field(default=3600, ge=300, le=86400)
    # The harness image (Dockerfile target `gameday`): the control-plane image is slim and
    # cannot run `gameday gate`. Unset: the registry's `gameday` repository at the digest the
    # application stack records (`mlplatform:images.gameday`).
    image: ImageConfig | None = None

    @field_validator("schedule")
    @classmethod
    def _cron(cls, v: str | None) -> str | None:
        return None if v is None else validate_cron(v)

    @field_validator("time_zone")
    @classmethod
    def _tz(cls, v: str) -> str:
        return validate_time_zone(v)

    @model_validator(mode="after")
    def _schedule_when_enabled(self) -> GameDayConfig:
        if self.enabled and self.schedule is None:
            raise ValueError("schedule is required when enabled is true (5-field cron, "
                             "e.g. '0 6 * * 2')")
        return self


# -- model serving and experiment tracking (docs/infra.md "Serving and tracking") --------------
PgIdentifier = Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_]{0,62}$")]
S3Prefix = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]


class ServedModel(_Model):
    """The model the environment serves; which version (and its digest) is the application
    stack's ``servedModel``, recorded when it is published, like the image digests."""

    name: DnsLabel


class ServingAutoscaling(_Model):
    """KEDA ScaledObject on the request rate Prometheus sees (provisioning/components/serving.py)."""

    # At least two: one replica lost (a node, a zone, an eviction) must not stop serving.
    min_replicas: int = Field(default=2, ge=1, le=100)
    max_replicas: int = Field(default=10, ge=1, le=200)
    target_requests_per_second: float = Field(default=20.0, gt=0)
    # Replicas KEDA holds while Prometheus cannot be read (its `fallback`): never below min.
    fallback_replicas: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _bounds(self) -> ServingAutoscaling:
        if self.min_replicas < 2:
            raise ValueError(f"minReplicas is {self.min_replicas}: serving needs at least 2 "
                             "replicas so one lost pod, node or zone does not stop it")
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"maxReplicas {self.max_replicas} is below minReplicas "
                             f"{self.min_replicas}")
        if self.fallback_replicas is not None and not (
                self.min_replicas <= self.fallback_replicas <= self.max_replicas):
            raise ValueError(f"fallbackReplicas {self.fallback_replicas} is outside "
                             f"[minReplicas, maxReplicas] = [{self.min_replicas}, "
                             f"{self.max_replicas}]")
        return self


class ServingRollout(_Model):
    """The canary (Argo Rollouts): weights, and the analysis that rolls it back."""

    # Canary weights in percent, strictly increasing, each below 100 (the last step promotes).
    steps: list[Annotated[int, Field(ge=1, le=99)]] = Field(
        default_factory=lambda: [10, 25, 50], min_length=1)
    # How long each step holds while the analysis runs, and how often it measures.
    step_seconds: int = Field(default=300, ge=60, le=3600)
    interval_seconds: int = Field(default=60, ge=15, le=600)
    # Rollback thresholds on the canary's own pods.
    max_error_ratio: float = Field(default=0.01, gt=0, lt=1)
    max_p99_latency_ms: int = Field(default=500, ge=1)
    # Share of the golden set the canary must answer as expected (1.0 = every case).
    min_golden_agreement: float = Field(default=1.0, gt=0, le=1)

    @field_validator("steps")
    @classmethod
    def _increasing(cls, steps: list[int]) -> list[int]:
        if any(b <= a for a, b in pairwise(steps)):
            raise ValueError(f"{steps}: canary weights must increase strictly (percent, 1-99)")
        return steps

    @model_validator(mode="after")
    def _interval_fits(self) -> ServingRollout:
        if self.interval_seconds * 2 > self.step_seconds:
            raise ValueError(f"intervalSeconds {self.interval_seconds} leaves fewer than two "
                             f"measurements per step (stepSeconds {self.step_seconds})")
        return self


class ServingConfig(_Model):
    """The model server (KServe's Python server, Open Inference Protocol v2 over HTTP)."""

    namespace: DnsLabel = "mlp-serving"
    # Unset: the registry's `serving` repository at `mlplatform:images.serving`.
    image: ImageConfig | None = None
    port: int = Field(default=8080, ge=1024, le=65535)
    model: ServedModel
    resources: ContainerResources = Field(default_factory=lambda: ContainerResources(
        cpu="500m", memory="1Gi"))
    autoscaling: ServingAutoscaling = Field(default_factory=ServingAutoscaling)
    rollout: ServingRollout = Field(default_factory=ServingRollout)


class TrackingConfig(_Model):
    """The MLflow tracking server: backend store on the platform's PostgreSQL (its own database
    and role), artifacts under a prefix of the platform's bucket."""

    namespace: DnsLabel = "mlp-tracking"
    # Unset: the registry's `tracking` repository at `mlplatform:images.tracking` (an image
    # with mlflow==3.17.2, psycopg2 and boto3, the Dockerfile's `tracking` target: the upstream
    # image has no PostgreSQL driver).
    image: ImageConfig | None = None
    replicas: int = Field(default=2, ge=1, le=20)
    port: int = Field(default=5000, ge=1024, le=65535)
    database: PgIdentifier = "mlflow"
    role: PgIdentifier = "mlflow"
    artifact_prefix: S3Prefix = "mlflow"
    resources: ContainerResources = Field(default_factory=lambda: ContainerResources(
        cpu="500m", memory="1Gi"))

    @model_validator(mode="after")
    def _ha(self) -> TrackingConfig:
        if self.replicas < 2:
            raise ValueError(f"replicas is {self.replicas}: the tracking server needs at least "
                             "2 so a training run's metrics survive one lost pod")
        if self.image is not None and self.image.digest is None:
            raise ValueError("image must be pinned by digest: a Job runs it (`mlflow db "
                             "upgrade`) and a tag may move between the Job and the server")
        if self.database == "controlplane" or self.role == "controlplane":
            raise ValueError("database/role 'controlplane' belong to the control plane: the "
                             "tracking server gets its own")
        return self


class DeployRunnerConfig(_Model):
    """The in-VPC deploy path (``provisioning/components/deploy_runner.py``): CodeBuild projects that
    build the images and run the application stack's `pulumi up` next to a private endpoint."""

    # Unset = true exactly when cluster.endpointPublicAccess is false (StackConfig fills it).
    enabled: bool = False
    # Where the stacks' state lives: s3://bucket[/prefix][?query] or https://api.pulumi.com.
    backend_url: str | None = None
    compute_type: Literal["BUILD_GENERAL1_SMALL", "BUILD_GENERAL1_MEDIUM",
                          "BUILD_GENERAL1_LARGE", "BUILD_GENERAL1_XLARGE",
                          "BUILD_GENERAL1_2XLARGE"] = "BUILD_GENERAL1_SMALL"
    timeout_minutes: int = Field(default=60, ge=5, le=480)

    @field_validator("backend_url")
    @classmethod
    def _backend_scheme(cls, url: str | None) -> str | None:
        if url is not None and not re.fullmatch(
                r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^?\s]*)?(\?\S*)?|https://[^/\s]+(/\S*)?",
                url):
            raise ValueError(f"{url!r} is not a Pulumi backend this runner can log in to: "
                             "s3://<bucket>[/prefix] or https://<host> (e.g. https://api.pulumi.com)")
        return url

    @model_validator(mode="after")
    def _backend_when_enabled(self) -> DeployRunnerConfig:
        if self.enabled and self.backend_url is None:
            raise ValueError("backendUrl is required when the deploy runner is enabled (it is "
                             "by default when cluster.endpointPublicAccess is false): "
                             "s3://<state-bucket>[/prefix] or https://api.pulumi.com")
        return self


class StackConfig(_Model):
    environment: Environment
    owner: Annotated[str, Field(min_length=1)]
    cost_center: Annotated[str, Field(min_length=1)]
    allow_spot: bool = False
    network: NetworkConfig
    cluster: ClusterConfig
    node_pools: NodePoolsConfig
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    artifacts: ArtifactsConfig = Field(default_factory=ArtifactsConfig)
    database: DatabaseConfig
    control_plane: ControlPlaneConfig
    observability: ObservabilityConfig = Field(default_factory=ObservabilityConfig)
    game_day: GameDayConfig = Field(default_factory=GameDayConfig)
    deploy_runner: DeployRunnerConfig = Field(default_factory=DeployRunnerConfig)
    # Unset: not deployed.
    serving: ServingConfig | None = None
    tracking: TrackingConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _deploy_runner_default(cls, data: Any) -> Any:
        """deployRunner.enabled defaults to true exactly when the cluster endpoint is private
        (then only something inside the VPC can run the application stack's `pulumi up`)."""
        if not isinstance(data, Mapping):
            return data
        key = "deploy_runner" if "deploy_runner" in data else "deployRunner"
        runner, cluster = data.get(key) or {}, data.get("cluster")
        if isinstance(runner, Mapping) and "enabled" not in runner and isinstance(cluster, Mapping):
            public = cluster.get("endpointPublicAccess", cluster.get("endpoint_public_access"))
            return {**data, key: {**runner, "enabled": public is not True}}
        return data

    @model_validator(mode="after")
    def _environment_rules(self) -> StackConfig:
        pools = {"cpu": self.node_pools.cpu, "gpu": self.node_pools.gpu}
        spot = [name for name, p in pools.items() if p.capacity_type is CapacityType.SPOT]
        if spot and not self.allow_spot:
            raise ValueError(f"nodePools {spot} use SPOT but allowSpot is false for this environment")
        if self.environment is Environment.PROD:
            if len(self.network.availability_zones) != 3:
                raise ValueError("prod needs 3 availabilityZones")
            if self.network.nat_gateways != "perAz":
                raise ValueError("prod needs natGateways: perAz")
        if self.environment.protected and self.database.deletion_protection is False:
            raise ValueError(f"database.deletionProtection cannot be false in {self.environment.value}")
        if (self.game_day.enabled and self.game_day.image is None
                and HARNESS_REPOSITORY not in self.registry.repositories):
            raise ValueError(
                "gameDay.image is required when enabled is true, unless registry.repositories "
                f"lists {HARNESS_REPOSITORY!r} (the harness image, `docker build --target "
                "gameday`, not the slim control-plane one; `gameday infra image` pushes it there)")
        for key, section, repo in (("serving", self.serving, SERVING_REPOSITORY),
                                   ("tracking", self.tracking, TRACKING_REPOSITORY)):
            if section is not None and section.image is None and repo not in self.registry.repositories:
                raise ValueError(f"{key}.image is required unless registry.repositories lists "
                                 f"{repo!r} (its digest then goes in the application stack's "
                                 f"mlplatform:images.{repo})")
        if self.serving is not None and not self.observability.install_prometheus_stack:
            raise ValueError("serving needs observability.installPrometheusStack: true (its "
                             "autoscaler and its canary analysis read Prometheus)")
        if self.serving is not None and self.serving.namespace in (
                self.control_plane.namespace, *(w.name for w in self.control_plane.workload_namespaces)):
            raise ValueError(f"serving.namespace {self.serving.namespace!r} is already the control "
                             "plane's or a workload namespace: give it its own")
        if self.tracking is not None and self.tracking.namespace in (
                self.control_plane.namespace, *(w.name for w in self.control_plane.workload_namespaces),
                *((self.serving.namespace,) if self.serving else ())):
            raise ValueError(f"tracking.namespace {self.tracking.namespace!r} is already used by "
                             "another component: give it its own")
        if self.control_plane.image is None and CONTROL_PLANE_REPOSITORY not in self.registry.repositories:
            raise ValueError(
                "controlPlane.image is required unless registry.repositories lists "
                f"{CONTROL_PLANE_REPOSITORY!r} (where `gameday infra image` pushes it)")
        return self


def _loc(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        parts.append(f"[{item}]" if isinstance(item, int) else ("." if parts else "") + str(item))
    return "".join(parts)


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        where = _loc(tuple(err["loc"]))
        reason = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        if err["type"] == "extra_forbidden":
            reason = "unknown key (misspelled or not supported)"
        lines.append(f"  {PROJECT}:{where or '<root>'}: {reason}")
    return f"invalid stack config in {source}:\n" + "\n".join(lines)


def parse_stack_config(raw: Mapping[str, Any], source: str = "stack config") -> StackConfig:
    """Validate a mapping of top-level keys (already JSON-decoded) into a StackConfig."""
    unknown = sorted(set(raw) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise ConfigError(
            f"invalid stack config in {source}: unknown key(s) "
            + ", ".join(f"{PROJECT}:{k}" for k in unknown)
            + f"; allowed: {', '.join(TOP_LEVEL_KEYS)}"
        )
    try:
        cfg = StackConfig.model_validate(dict(raw))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None
    check_game_day(cfg, source)
    try:
        versions.check_versions(cfg.cluster.kubernetes_version,
                                cfg.cluster.allow_extended_support, source)
    except versions.VersionError as exc:
        raise ConfigError(str(exc)) from None
    return cfg


def check_game_day(cfg: StackConfig, source: str = "stack config") -> None:
    """Scheduled fault injection into prod needs an explicit, separate opt-in."""
    gd = cfg.game_day
    if cfg.environment is Environment.PROD and gd.enabled and not gd.allow_prod:
        raise ConfigError(
            f"invalid stack config in {source}:\n"
            f"  {PROJECT}:gameDay.allowProd: must be true to schedule game days in prod "
            f"({PROJECT}:gameDay.enabled is true); the CronJob would inject faults into "
            "production (it passes --allow-prod to `gameday gate`)"
        )


# -- layers ------------------------------------------------------------------------------
class Layer(str, Enum):
    """What a stack of this project deploys (docs/infra.md "Stacks in layers").

    platform: AWS only (network, cluster, node roles, registries, buckets, database, IAM,
    alarms, the in-VPC deploy runner); needs AWS credentials, never the cluster endpoint.
    application: what runs in the cluster (Karpenter's controller and NodePools, the device
    plugin, the control plane, charts, the game-day CronJob), with the platform's values
    read through a StackReference and the images pinned by digest."""

    PLATFORM = "platform"
    APPLICATION = "application"


Digest = Annotated[str, Field(pattern=DIGEST_RE.pattern)]


class ImageDigests(_Model):
    """Digests of the images `gameday infra image` pushed to the platform's registry."""

    controlplane: Digest | None = None
    gameday: Digest | None = None
    serving: Digest | None = None
    tracking: Digest | None = None


class ServedModelVersion(_Model):
    """What the model server loads: ``models/<serving.model.name>/<version>/model.json`` of the
    artifact bucket, only if its bytes have ``sha256`` (a torn or substituted object is never
    served). A new version here is a new canary."""

    version: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class ApplicationConfig(_Model):
    """The application stack's own keys: everything else is the environment's, read from
    the platform stack's file, so the two layers cannot disagree about it."""

    layer: Literal["application"]
    # The platform stack: its name in this project (`dev`) or fully qualified
    # (`org/mlplatform/dev`).
    platform_stack: Annotated[str, Field(pattern=r"^([A-Za-z0-9_.-]+/){0,2}[A-Za-z0-9_.-]+$")]
    images: ImageDigests = Field(default_factory=ImageDigests)
    # Required where the environment sets `serving`.
    served_model: ServedModelVersion | None = None

    @property
    def platform_stack_name(self) -> str:
        return self.platform_stack.rsplit("/", 1)[-1]


APPLICATION_KEYS = ("layer", "platformStack", "images", "servedModel")
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _project_config() -> dict[str, Any]:
    """This stack's ``mlplatform:*`` keys, JSON-decoded."""
    # pulumi.Config cannot list keys; the runtime's config map can, and listing is the only
    # way to refuse a misspelled top-level key instead of silently ignoring it.
    prefix = f"{PROJECT}:"
    raw: dict[str, Any] = {}
    # The engine passes config as the PULUMI_CONFIG JSON bag; tests set it explicitly.
    merged = {**pulumi.runtime.config.get_config_env(), **pulumi.runtime.config.CONFIG.get()}
    for key, value in merged.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix):]
        # Structured values arrive JSON-encoded; scalars stay strings (a cost center "1234"
        # must not turn into an int).
        if isinstance(value, str) and (value.lstrip()[:1] in ("{", "[") or value in ("true", "false")):
            raw[name] = json.loads(value)
        else:
            raw[name] = value
    return raw


def load_layer() -> Layer:
    value = _project_config().get("layer", Layer.PLATFORM.value)
    try:
        return Layer(value)
    except ValueError:
        raise ConfigError(
            f"invalid stack config in Pulumi.{pulumi.get_stack()}.yaml: {PROJECT}:layer is "
            f"{value!r}; allowed: {', '.join(x.value for x in Layer)}") from None


def read_environment_settings(stack: str) -> dict[str, Any]:
    """The ``mlplatform:*`` keys of ``Pulumi.<stack>.yaml`` in this checkout (plain values;
    an encrypted value cannot be read here and is refused)."""
    import yaml

    path = PROJECT_ROOT / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        raise ConfigError(f"{path.name} not found next to Pulumi.yaml: the application stack "
                          f"reads the environment's settings from its platform stack's file "
                          f"({PROJECT}:platformStack is {stack!r})")
    doc = yaml.safe_load(path.read_text()) or {}
    prefix = f"{PROJECT}:"
    out: dict[str, Any] = {}
    for key, value in (doc.get("config") or {}).items():
        if not key.startswith(prefix):
            continue
        if isinstance(value, Mapping) and "secure" in value:
            raise ConfigError(f"{path.name}: {key} is encrypted; the application stack reads "
                              "this file directly and cannot decrypt it (keep secrets in "
                              "Secrets Manager, not in environment settings)")
        out[key[len(prefix):]] = value
    return out


def load_application_config() -> ApplicationConfig:
    """The application stack's own keys; an environment setting here is refused (it
    belongs in the platform stack's file, which this layer reads)."""
    raw = _project_config()
    source = f"Pulumi.{pulumi.get_stack()}.yaml"
    misplaced = sorted(set(raw) & set(TOP_LEVEL_KEYS))
    if misplaced:
        raise ConfigError(
            f"invalid stack config in {source}: "
            + ", ".join(f"{PROJECT}:{k}" for k in misplaced)
            + " belong(s) in the platform stack's file (Pulumi.<platformStack>.yaml): the "
            "application stack reads the environment's settings from there")
    unknown = sorted(set(raw) - set(APPLICATION_KEYS))
    if unknown:
        raise ConfigError(f"invalid stack config in {source}: unknown key(s) "
                          + ", ".join(f"{PROJECT}:{k}" for k in unknown)
                          + f"; allowed: {', '.join(APPLICATION_KEYS)}")
    try:
        return ApplicationConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


def load_stack_config() -> StackConfig:
    """The environment's settings, validated at the edge: this stack's own config on a
    platform stack; on an application stack, its platform stack's file."""
    if load_layer() is Layer.APPLICATION:
        app = load_application_config()
        stack = app.platform_stack_name
        raw = read_environment_settings(stack)
        if raw.get("layer", Layer.PLATFORM.value) != Layer.PLATFORM.value:
            raise ConfigError(f"{PROJECT}:platformStack {app.platform_stack!r} in "
                              f"Pulumi.{pulumi.get_stack()}.yaml is not a platform stack "
                              f"(its {PROJECT}:layer is {raw['layer']!r})")
        raw.pop("layer", None)
        return parse_stack_config(
            raw, source=f"Pulumi.{stack}.yaml (read by the application stack {pulumi.get_stack()})")
    raw = _project_config()
    misplaced = sorted(set(raw) & (set(APPLICATION_KEYS) - {"layer"}))
    if misplaced:
        raise ConfigError(
            f"invalid stack config in Pulumi.{pulumi.get_stack()}.yaml: "
            + ", ".join(f"{PROJECT}:{k}" for k in misplaced)
            + f" belong(s) in an application stack ({PROJECT}:layer: application)")
    raw.pop("layer", None)
    return parse_stack_config(raw, source=f"Pulumi.{pulumi.get_stack()}.yaml")


def check_default_tags(expected: Mapping[str, str]) -> None:
    """``aws:defaultTags`` must carry the stack's tags: the AWS provider then tags what other
    components create inside (pulumi-eks's OIDC provider, launch templates, security groups),
    which the program cannot tag itself. Refused when missing or when it disagrees."""
    raw = pulumi.Config("aws").get_object("defaultTags")
    tags = (raw or {}).get("tags") if isinstance(raw, Mapping) else None
    if not isinstance(tags, Mapping):
        raise ConfigError("aws:defaultTags.tags is not set in the stack config: set it to "
                          f"{dict(expected)} so resources other components create are tagged")
    wrong = {k: (tags.get(k), v) for k, v in expected.items() if tags.get(k) != v}
    if wrong:
        detail = "; ".join(f"aws:defaultTags.tags.{k} is {have!r}, expected {want!r}"
                           for k, (have, want) in sorted(wrong.items()))
        raise ConfigError(f"{detail} (from mlplatform:owner/costCenter/environment, the "
                          "project, the stack and the recovery objectives in slo/specs: "
                          "docs/inventory.md)")


def aws_region() -> str:
    region = pulumi.Config("aws").get("region")
    if not region:
        raise ConfigError("aws:region is not set in the stack config")
    return region

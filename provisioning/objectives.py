"""The one place where recovery objectives (slo/) become infrastructure decisions.

Pure functions: they take objective-shaped objects (anything with the attributes of
``slo.specs.RecoveryObjective``) and the validated stack config, and return settings or
raise ``ObjectiveConflict`` naming the objective, the config key and the reason. No
Pulumi, no I/O, no import of slo/, so they are unit-tested with small hand-made objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from provisioning.components.common import DataClass
from provisioning.config import (
    ArtifactsConfig,
    CapacityType,
    ConfigError,
    DatabaseConfig,
    DeploymentConfig,
    Environment,
    GpuNodePoolConfig,
)

# RDS uploads transaction logs to S3 every 5 minutes: PITR can lose up to this much.
RDS_PITR_GRANULARITY_SECONDS = 300.0
# Recovering a single-AZ instance (host replacement or restore to a new instance) is not
# bounded by AWS below tens of minutes; an RTO under this needs a standing standby.
SINGLE_AZ_RECOVERY_SECONDS = 1800.0
# Without a warm second replica, an API pod loss costs a reschedule + image pull + start,
# measured in tens of seconds to minutes; an RTO below this needs >= 2 ready replicas.
API_COLD_START_SECONDS = 120.0
# CloudWatch's standard-resolution period for RDS/S3 metrics.
CLOUDWATCH_PERIOD_SECONDS = 60

REQUIRED_FAILURE_CLASSES = (
    "api-replica-loss",
    "db-primary-loss",
    "artifact-store-unavailable",
    "node-interruption-checkpoint",
)


class ObjectiveConflict(ConfigError):
    """The stack config cannot meet a declared recovery objective."""

    def __init__(self, objective: str, key: str, reason: str) -> None:
        self.objective, self.key, self.reason = objective, key, reason
        super().__init__(f"stack config contradicts objective {objective!r}: {key}: {reason}")


class RpoLike(Protocol):
    acknowledged_submissions: int
    checkpoint_progress_intervals: float
    artifacts: int


class ObjectiveLike(Protocol):
    rto_seconds: float
    rpo: RpoLike


@dataclass(frozen=True)
class DatabaseSettings:
    multi_az: bool
    backup_retention_days: int
    point_in_time_recovery: bool
    deletion_protection: bool
    skip_final_snapshot: bool
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class ArtifactSettings:
    replicate: bool
    replica_region: str | None
    # S3 Replication Time Control: 99.99% of objects replicated within 15 minutes (SLA).
    replication_time_control: bool


@dataclass(frozen=True)
class ApiSettings:
    replicas: int
    pdb_min_available: int
    spread_across_zones: bool


@dataclass(frozen=True)
class AlarmWindow:
    period_seconds: int
    evaluation_periods: int

    @property
    def detection_seconds(self) -> int:
        return self.period_seconds * self.evaluation_periods


def _restore_point(ro: ObjectiveLike) -> float | None:
    value = getattr(ro, "restore_point_seconds", None)
    if value is None:
        value = getattr(ro.rpo, "restore_point_seconds", None)
    return value


def derive_database_settings(
    ro: ObjectiveLike, cfg: DatabaseConfig, env: Environment
) -> DatabaseSettings:
    """Multi-AZ, backups/PITR, deletion protection from the ``db-primary-loss`` objective."""
    name = "db-primary-loss"
    reasons: list[str] = []
    if ro.rpo.acknowledged_submissions == 0:
        # Only a synchronous standby loses nothing committed when the primary dies.
        reasons.append("RPO 0 acknowledged submissions needs a synchronous standby")
    if ro.rto_seconds < SINGLE_AZ_RECOVERY_SECONDS:
        reasons.append(
            f"RTO {ro.rto_seconds:g}s is below single-AZ recovery time "
            f"({SINGLE_AZ_RECOVERY_SECONDS:g}s)"
        )
    if cfg.multi_az is False and reasons:
        raise ObjectiveConflict(
            name, "database.multiAz", "is false but Multi-AZ is required: " + "; ".join(reasons)
        )
    multi_az = cfg.multi_az if cfg.multi_az is not None else bool(reasons)

    restore_point = _restore_point(ro)
    required_days = getattr(ro, "backup_retention_days", None) or 0
    if restore_point is not None:
        required_days = max(required_days, 1)  # PITR exists only with retention >= 1
        if not multi_az and restore_point < RDS_PITR_GRANULARITY_SECONDS:
            raise ObjectiveConflict(
                name,
                "database.multiAz",
                f"restore point {restore_point:g}s is finer than RDS PITR "
                f"({RDS_PITR_GRANULARITY_SECONDS:g}s) and a single-AZ database has no other recovery",
            )
    if env.protected:
        required_days = max(required_days, 7)
    if cfg.backup_retention_days is not None and cfg.backup_retention_days < required_days:
        raise ObjectiveConflict(
            name,
            "database.backupRetentionDays",
            f"{cfg.backup_retention_days} is below the required {required_days} days",
        )
    if required_days > 35:
        raise ObjectiveConflict(
            name, "backup_retention_days", f"{required_days} days exceeds the RDS maximum of 35"
        )
    retention = cfg.backup_retention_days if cfg.backup_retention_days is not None else max(
        required_days, 1
    )
    deletion_protection = (
        cfg.deletion_protection if cfg.deletion_protection is not None else env.protected
    )
    return DatabaseSettings(
        multi_az=multi_az,
        backup_retention_days=retention,
        point_in_time_recovery=retention >= 1,
        deletion_protection=deletion_protection,
        skip_final_snapshot=not env.protected,
        reasons=tuple(reasons),
    )


def derive_artifact_settings(
    ro: ObjectiveLike, cfg: ArtifactsConfig, primary_region: str
) -> ArtifactSettings:
    """Cross-region replication from the ``artifact-store-unavailable`` objective's scope."""
    name = "artifact-store-unavailable"
    scope = getattr(ro, "scope", None)
    required = scope == "region"
    if required and cfg.replica_region is None:
        raise ObjectiveConflict(
            name,
            "artifacts.replicaRegion",
            "is not set but the objective covers a regional outage (scope: region), "
            "which needs cross-region replication",
        )
    if cfg.replica_region is not None and cfg.replica_region == primary_region:
        raise ObjectiveConflict(
            name, "artifacts.replicaRegion", f"must differ from the primary region {primary_region}"
        )
    replicate = cfg.replica_region is not None
    return ArtifactSettings(
        replicate=replicate,
        replica_region=cfg.replica_region,
        replication_time_control=replicate and ro.rpo.artifacts == 0,
    )


def derive_api_settings(ro: ObjectiveLike, cfg: DeploymentConfig) -> ApiSettings:
    """Replica count and disruption budget from the ``api-replica-loss`` objective."""
    needs_warm_replica = (
        ro.rpo.acknowledged_submissions == 0 or ro.rto_seconds < API_COLD_START_SECONDS
    )
    if needs_warm_replica and cfg.replicas < 2:
        raise ObjectiveConflict(
            "api-replica-loss",
            "controlPlane.api.replicas",
            f"is {cfg.replicas} but RTO {ro.rto_seconds:g}s / RPO "
            f"{ro.rpo.acknowledged_submissions} needs a second ready replica (>= 2)",
        )
    return ApiSettings(
        replicas=cfg.replicas,
        pdb_min_available=max(1, cfg.replicas - 1) if cfg.replicas > 1 else 1,
        spread_across_zones=cfg.replicas > 1,
    )


def check_gpu_interruptions(ro: ObjectiveLike, pool: GpuNodePoolConfig) -> None:
    """Spot GPUs are reclaimed with 2 minutes' notice: allowed only if losing up to one
    checkpoint interval is within the ``node-interruption-checkpoint`` objective."""
    if pool.capacity_type is CapacityType.SPOT and ro.rpo.checkpoint_progress_intervals < 1:
        raise ObjectiveConflict(
            "node-interruption-checkpoint",
            "nodePools.gpu.capacityType",
            f"SPOT can lose one checkpoint interval but the RPO allows "
            f"{ro.rpo.checkpoint_progress_intervals:g}",
        )


def derive_alarm_window(rto_seconds: float) -> AlarmWindow:
    """Detection must take at most half the RTO, leaving the other half for recovery."""
    budget = rto_seconds / 2
    periods = int(budget // CLOUDWATCH_PERIOD_SECONDS)
    if periods < 1:
        # Sub-minute RTOs cannot be detected by standard CloudWatch metrics; fire on the
        # first breaching datapoint and let the in-cluster Prometheus rules carry the rest.
        return AlarmWindow(CLOUDWATCH_PERIOD_SECONDS, 1)
    return AlarmWindow(CLOUDWATCH_PERIOD_SECONDS, min(periods, 5))


def missing_failure_classes(objectives: dict[str, object]) -> list[str]:
    return [fc for fc in REQUIRED_FAILURE_CLASSES if fc not in objectives]


# -- availability objective per data class (the inventory and the `availability-objective`
# tag). Each data class serves the failure classes below; its objective is the strictest
# RTO among them and the strictest restore point (0 where a class allows no restore loss).
DATA_CLASS_FAILURE_CLASSES: dict[DataClass, tuple[str, ...]] = {
    DataClass.PLATFORM: ("api-replica-loss", "agent-connectivity-loss",
                         "node-interruption-checkpoint"),
    DataClass.CONTROL_PLANE_STATE: ("db-primary-loss",),
    DataClass.ARTIFACTS: ("artifact-store-unavailable",),
    DataClass.IMAGES: ("registry-failure",),
    DataClass.TELEMETRY: ("telemetry-loss",),
    DataClass.ENCRYPTION_KEYS: ("db-primary-loss", "artifact-store-unavailable"),
}


def _duration(seconds: float) -> str:
    """30 -> '30s', 120 -> '2m', 5400 -> '90m', 7200 -> '2h'."""
    value = int(seconds)
    if value == 0:
        return "0"
    for unit, size in (("h", 3600), ("m", 60)):
        if value % size == 0:
            return f"{value // size}{unit}"
    return f"{value}s"


def availability_objective(objectives: Mapping[str, ObjectiveLike], data: DataClass) -> str:
    """``rto=<d>/rpo=<d>`` for ``data`` (a valid AWS tag value), from the recovery
    objectives of the failure classes it serves; a missing one is a ConfigError."""
    classes = DATA_CLASS_FAILURE_CLASSES[data]
    missing = [fc for fc in classes if fc not in objectives]
    if missing:
        raise ConfigError(f"no recovery objective for {missing}: the availability objective of "
                          f"data class {data.value!r} is derived from them (slo/specs/recovery)")
    rto = min(objectives[fc].rto_seconds for fc in classes)
    rpo = min(_restore_point(objectives[fc]) or 0.0 for fc in classes)
    return f"rto={_duration(rto)}/rpo={_duration(rpo)}"


def availability_objectives(objectives: Mapping[str, ObjectiveLike]) -> dict[str, str]:
    """Data class value -> availability objective, for every data class."""
    return {d.value: availability_objective(objectives, d) for d in DataClass}

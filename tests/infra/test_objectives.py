"""The objective -> infrastructure mapping, with hand-made objectives (no slo/ needed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from provisioning.config import (
    ArtifactsConfig,
    DatabaseConfig,
    DeploymentConfig,
    Environment,
    GpuNodePoolConfig,
)
from provisioning.objectives import (
    ObjectiveConflict,
    check_gpu_interruptions,
    derive_alarm_window,
    derive_api_settings,
    derive_artifact_settings,
    derive_database_settings,
)


def ro(rto: float = 120, ack: int = 0, ckpt: float = 1, artifacts: int = 0, **extra: object) -> SimpleNamespace:
    rpo = SimpleNamespace(acknowledged_submissions=ack, checkpoint_progress_intervals=ckpt, artifacts=artifacts)
    return SimpleNamespace(rto_seconds=rto, rpo=rpo, **extra)


DB = DatabaseConfig(instance_class="db.r7g.large")


def test_rpo_zero_derives_multi_az_and_retention() -> None:
    s = derive_database_settings(ro(restore_point_seconds=300, backup_retention_days=14), DB, Environment.PROD)
    assert (s.multi_az, s.backup_retention_days, s.point_in_time_recovery) == (True, 14, True)
    assert s.deletion_protection and not s.skip_final_snapshot


def test_prod_rpo_zero_with_single_az_is_refused() -> None:
    with pytest.raises(ObjectiveConflict, match=r"'db-primary-loss': database.multiAz: is false .*RPO 0"):
        derive_database_settings(ro(), DB.model_copy(update={"multi_az": False}), Environment.PROD)


def test_relaxed_objective_allows_single_az_in_dev() -> None:
    s = derive_database_settings(ro(rto=3600, ack=5, restore_point_seconds=900, backup_retention_days=1),
                                 DB, Environment.DEV)
    assert (s.multi_az, s.backup_retention_days, s.skip_final_snapshot, s.deletion_protection) == (False, 1, True, False)


def test_restore_point_finer_than_pitr_needs_multi_az() -> None:
    with pytest.raises(ObjectiveConflict, match="finer than RDS PITR"):
        derive_database_settings(ro(rto=3600, ack=5, restore_point_seconds=60), DB, Environment.DEV)


def test_retention_below_objective_is_refused() -> None:
    cfg = DB.model_copy(update={"backup_retention_days": 3})
    with pytest.raises(ObjectiveConflict, match="backupRetentionDays: 3 is below the required 14"):
        derive_database_settings(ro(backup_retention_days=14), cfg, Environment.PROD)


def test_region_scope_requires_replication() -> None:
    with pytest.raises(ObjectiveConflict, match="artifacts.replicaRegion: is not set"):
        derive_artifact_settings(ro(scope="region"), ArtifactsConfig(), "eu-west-1")
    s = derive_artifact_settings(ro(scope="region"), ArtifactsConfig(replica_region="eu-central-1"), "eu-west-1")
    assert s.replicate and s.replication_time_control
    assert not derive_artifact_settings(ro(scope="zone"), ArtifactsConfig(), "eu-west-1").replicate
    with pytest.raises(ObjectiveConflict, match="must differ"):
        derive_artifact_settings(ro(scope="zone"), ArtifactsConfig(replica_region="eu-west-1"), "eu-west-1")


def test_api_rpo_zero_needs_two_replicas() -> None:
    with pytest.raises(ObjectiveConflict, match="controlPlane.api.replicas: is 1"):
        derive_api_settings(ro(rto=30), DeploymentConfig(replicas=1))
    s = derive_api_settings(ro(rto=30), DeploymentConfig(replicas=3))
    assert (s.replicas, s.pdb_min_available, s.spread_across_zones) == (3, 2, True)


def test_spot_gpu_needs_checkpoint_tolerance() -> None:
    pool = GpuNodePoolConfig(instance_types=["g6.xlarge"], max_size=1, capacity_type="SPOT",
                             accelerator_type="nvidia-l4")
    check_gpu_interruptions(ro(ckpt=1), pool)  # one interval may be lost: fine
    with pytest.raises(ObjectiveConflict, match="nodePools.gpu.capacityType"):
        check_gpu_interruptions(ro(ckpt=0), pool)


@pytest.mark.parametrize(("rto", "periods"), [(30, 1), (120, 1), (300, 2), (3600, 5)])
def test_alarm_window_detects_within_half_rto(rto: float, periods: int) -> None:
    w = derive_alarm_window(rto)
    assert (w.period_seconds, w.evaluation_periods) == (60, periods)
    assert w.detection_seconds <= max(rto / 2, 60)

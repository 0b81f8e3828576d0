"""Broken stack configs fail before any resource is declared, naming key and reason."""

from __future__ import annotations

import pytest

from provisioning.config import ConfigError
from tests.infra.harness import objectives_for, run_program


def _error(stack: str, patch: dict, objectives: object = None) -> str:
    with pytest.raises(ConfigError) as info:
        run_program(stack, patch, objectives=objectives)
    return str(info.value)


def test_unknown_instance_type_field_names_the_key() -> None:
    msg = _error("prod", {"mlplatform:nodePools": {"gpu": {"instanceTyp": ["p5.48xlarge"]}}})
    assert "Pulumi.prod.yaml" in msg
    assert "mlplatform:nodePools.gpu.instanceTyp: unknown key" in msg


def test_unknown_top_level_key_is_refused() -> None:
    assert "unknown key(s) mlplatform:databse" in _error("dev", {"mlplatform:databse": {"x": 1}})


def test_negative_replica_count() -> None:
    msg = _error("staging", {"mlplatform:controlPlane": {"api": {"replicas": -1}}})
    assert "mlplatform:controlPlane.api.replicas: Input should be greater than or equal to 1" in msg


def test_malformed_instance_type() -> None:
    msg = _error("dev", {"mlplatform:nodePools": {"cpu": {"instanceTypes": ["m7i"]}}})
    assert "mlplatform:nodePools.cpu.instanceTypes[0]" in msg


def test_prod_single_az_database_contradicts_rpo_zero() -> None:
    msg = _error("prod", {"mlplatform:database": {"multiAz": False}})
    assert "contradicts objective 'db-primary-loss': database.multiAz: is false" in msg
    assert "RPO 0 acknowledged submissions" in msg


def test_region_scoped_artifacts_without_replica_region() -> None:
    msg = _error("prod", {"mlplatform:artifacts": {"replicaRegion": None}})
    assert "'artifact-store-unavailable': artifacts.replicaRegion: is not set" in msg


def test_contradictory_objective_injected() -> None:
    """A stricter objective (dev spot GPUs may lose no checkpoint progress) refuses dev."""
    objectives = objectives_for("dev", {"node-interruption-checkpoint": {
        "rpo": objectives_for("dev").recovery["node-interruption-checkpoint"].rpo.model_copy(
            update={"checkpoint_progress_intervals": 0.0})}})
    assert "nodePools.gpu.capacityType" in _error("dev", {}, objectives)


def test_spot_control_plane_and_spot_without_permission() -> None:
    assert "never runs on spot" in _error("dev", {"mlplatform:nodePools": {"system": {"capacityType": "SPOT"}}})
    assert "allowSpot is false" in _error("prod", {"mlplatform:nodePools": {"cpu": {"capacityType": "SPOT"}}})


def test_prod_needs_three_zones_and_nat_per_az() -> None:
    msg = _error("prod", {"mlplatform:network": {"availabilityZones": ["eu-west-1a", "eu-west-1b"]}})
    assert "prod needs 3 availabilityZones" in msg


def test_mutable_image_tag_refused() -> None:
    msg = _error("dev", {"mlplatform:controlPlane": {"image": {"repository": "r/cp", "tag": "latest"}}})
    assert "tag 'latest' is mutable" in msg


def test_deploy_runner_needs_a_backend_where_the_endpoint_is_private() -> None:
    # staging's endpoint is private: the runner is on by default and needs the state backend
    msg = _error("staging", {"mlplatform:deployRunner": {"backendUrl": None}})
    assert "mlplatform:deployRunner: Value error, backendUrl is required" in msg
    # a public endpoint: off by default; switched on explicitly it needs one too
    msg = _error("dev", {"mlplatform:cluster": {"endpointPublicAccess": True,
                                                "publicAccessCidrs": ["198.18.7.0/24"]},
                         "mlplatform:deployRunner": {"enabled": True, "backendUrl": None}})
    assert "mlplatform:deployRunner: Value error, backendUrl is required" in msg


def test_deploy_runner_default_follows_the_endpoint() -> None:
    from provisioning.config import parse_stack_config
    from tests.infra.harness import stack_config

    def parsed(stack: str, cluster: dict | None = None) -> object:
        raw = {k.split(":", 1)[1]: v for k, v in stack_config(stack).items()
               if k.startswith("mlplatform:")}
        if cluster is not None:
            raw["cluster"] = {**raw["cluster"], **cluster}
        return parse_stack_config(raw).deploy_runner

    assert parsed("dev").enabled is True  # dev deploys in the VPC too unless told otherwise
    assert parsed("staging").enabled is True
    assert parsed("staging", {"endpointPublicAccess": True,
                              "publicAccessCidrs": ["198.18.7.0/24"]}).enabled is False
    assert parsed("prod").backend_url == "s3://mlplatform-pulumi-state-prod"


def test_deploy_runner_fields_are_checked() -> None:
    msg = _error("staging", {"mlplatform:deployRunner": {"backendUrl": "gs://state"}})
    assert "mlplatform:deployRunner.backendUrl: Value error, 'gs://state' is not a Pulumi backend" in msg
    msg = _error("staging", {"mlplatform:deployRunner": {"timeoutMinutes": 600}})
    assert "mlplatform:deployRunner.timeoutMinutes: Input should be less than or equal to 480" in msg
    msg = _error("prod", {"mlplatform:deployRunner": {"computeTyp": "BUILD_GENERAL1_SMALL"}})
    assert "mlplatform:deployRunner.computeTyp: unknown key" in msg


@pytest.mark.parametrize("cidr", ["203.0.113.0/24", "198.51.100.7/32", "192.0.2.0/28", "2001:db8::/48"])
def test_public_endpoint_placeholder_cidr_is_refused(cidr: str) -> None:
    """A documentation range copied into publicAccessCidrs reaches nobody (issue 49 item 2)."""
    msg = _error("dev", {"mlplatform:cluster": {"endpointPublicAccess": True,
                                                "publicAccessCidrs": [cidr]}})
    assert "Pulumi.dev.yaml" in msg and "mlplatform:cluster.publicAccessCidrs" in msg
    assert "documentation range" in msg and "endpointPublicAccess: false" in msg


def test_public_access_cidr_must_be_a_network() -> None:
    msg = _error("dev", {"mlplatform:cluster": {"endpointPublicAccess": True,
                                                "publicAccessCidrs": ["10.0.0.1/8"]}})
    assert "mlplatform:cluster.publicAccessCidrs" in msg and "is not a CIDR block" in msg


def test_committed_stack_configs_need_no_public_placeholder() -> None:
    from tests.infra.harness import stack_config

    for stack in ("dev", "staging", "prod"):
        cluster = stack_config(stack)["mlplatform:cluster"]
        assert cluster.get("endpointPublicAccess") is not True or cluster.get("publicAccessCidrs")
        assert not any(c.startswith(("203.0.113.", "198.51.100.", "192.0.2."))
                       for c in cluster.get("publicAccessCidrs") or [])

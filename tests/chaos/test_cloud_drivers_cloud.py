"""CloudFaults (Kubernetes + AWS) with stubbed clients: the fake Kubernetes API from recorded
objects and moto's in-process AWS. Prod guard, config validation, routing, and
crash-then-restore_all from the state file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from environments.base import FaultDriver
from environments.cloud.driver import CloudConfigError, CloudFaults, ProdRefused
from tests.chaos.fake_kube import FakeCluster
from tests.chaos.test_cloud_drivers_aws import (
    BUCKET,
    CLUSTER,
    REGION,
    TLS_ONLY,
    make_platform,
    policy,
)
from tests.chaos.test_cloud_drivers_kubernetes import normalized

STACK_OUTPUTS = {  # `pulumi stack output --json -s dev` plus the keys the stack does not export
    "environment": "dev", "region": REGION, "clusterName": CLUSTER,
    "artifactBuckets": [BUCKET, "mlplatform-dev-nopolicy"],
    "controlPlaneNamespace": "mlp-controlplane", "registryCidrs": ["10.10.50.11/32"],
    "waitTimeout": 5, "pollSeconds": 0.01,
}

# A workload pool still on an EKS managed node group (make_platform creates it).
BATCH_GROUP = {"nodeGroups": {"batch": f"{CLUSTER}-batch"}, "agentPools": ["cpu", "gpu"]}


@pytest.fixture
def cloud_env(fake_cluster: FakeCluster) -> Iterator[FakeCluster]:
    with mock_aws():
        make_platform()
        yield fake_cluster


def build(tmp_path: Path, **extra: Any) -> CloudFaults:
    return CloudFaults({**STACK_OUTPUTS, **extra}, tmp_path / "run" / "cloud-faults.json")


def test_cloud_prod_refused_without_allow_prod_stubbed_clients(tmp_path: Path) -> None:
    with pytest.raises(ProdRefused, match="allow_prod=True"):
        build(tmp_path, environment="prod")
    assert build(tmp_path, environment="staging").target.environment == "staging"
    cloud = CloudFaults({**STACK_OUTPUTS, "environment": "prod"}, tmp_path / "s.json",
                        allow_prod=True)
    assert cloud.target.aws.db_instance_id == "mlplatform-prod-controlplane"


@pytest.mark.parametrize(("extra", "message"), [
    ({"environment": "qa"}, "environment 'qa'"),
    ({"region": ""}, "region is required"),
    ({"nodeGroup": {}}, r"unknown key\(s\) \['nodeGroup'\]"),
    ({"poolWithdrawal": "delete"}, "poolWithdrawal 'delete'"),
    ({"nodePools": {"system": "system"}}, "nodePools names the 'system' pool"),
    ({"nodeGroups": {"system": "mlplatform-dev-system"}}, "nodeGroups names the 'system' pool"),
    ({"nodePools": {"cpu": ""}}, "nodePools must map pool names to non-empty names"),
    ({"nodePools": ["cpu"]}, "nodePools must map pool names"),
    ({"nodePools": {"cpu": "cpu"}, "nodeGroups": {"cpu": "mlplatform-dev-cpu"}}, r"pool\(s\) \['cpu'\] are in both nodePools and nodeGroups"),
])
def test_cloud_config_errors_name_the_key_stubbed_clients(tmp_path: Path, extra: dict[str, Any],
                                                          message: str) -> None:
    with pytest.raises(CloudConfigError, match=message):
        build(tmp_path, **extra)


def test_cloud_names_derive_from_stack_like_infra_stubbed_clients(tmp_path: Path) -> None:
    cloud = build(tmp_path, kubeconfig={"apiVersion": "v1", "clusters": []})
    # Karpenter NodePools named after the pool (autoscaling.py); no managed node group is a target.
    assert cloud.target.aws.nodepools == cloud.target.kube.node_pools == {"cpu": "cpu", "gpu": "gpu"}
    assert cloud.target.aws.nodegroups == {}
    # An agent pool still on a managed node group is not taken for a Karpenter NodePool.
    mixed = build(tmp_path, agentPools=["cpu", "batch"], nodeGroups={"batch": "mlplatform-dev-batch"})
    assert (mixed.target.aws.nodepools, mixed.target.aws.nodegroups) == (
        {"cpu": "cpu"}, {"batch": "mlplatform-dev-batch"})
    assert cloud.target.aws.deny_principal_arns == ("arn:aws:iam::*:role/mlplatform-dev-irsa-*",)
    kubeconfig = Path(cloud.target.kube.kubeconfig or "")
    assert kubeconfig.exists() and oct(kubeconfig.stat().st_mode & 0o777) == "0o600"
    assert isinstance(cloud, FaultDriver)


def test_cloud_routes_db_primary_kill_to_rds_failover_stubbed_clients(
        cloud_env: FakeCluster, tmp_path: Path) -> None:
    result = build(tmp_path).kill("db-primary")
    assert result["failover"] is True and cloud_env.writes == []


def test_cloud_crash_then_restore_all_from_state_file_stubbed_clients(
        cloud_env: FakeCluster, tmp_path: Path) -> None:
    eks = boto3.client("eks", region_name=REGION)
    sizes = eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName=f"{CLUSTER}-batch")[
        "nodegroup"]["scalingConfig"]
    k8s_before = normalized(cloud_env)
    first = build(tmp_path, **BATCH_GROUP)
    first.stop("reconciler")
    first.hang("api-2")
    first.partition_agent("gpu")
    first.registry_unreachable()
    first.artifact_store_unreachable()
    first.withdraw_pool("cpu")  # Karpenter pool: mode nodepool by default
    first.withdraw_pool("batch", mode="nodegroup")
    assert len(first.state.active()) == 7
    del first  # the run crashes; only the state file survives

    second = build(tmp_path, **BATCH_GROUP)
    restored = second.restore_all()
    assert sorted(restored) == sorted([
        "stop:controlplane-reconciler", "hang:api-2", "partition_agent:gpu",
        "registry_unreachable", "artifact_store_unreachable", "withdraw_pool:cpu",
        "withdraw_pool:batch"])
    # Everything back except the deleted NodeClaims: Karpenter launches anew when pods pend.
    after = normalized(cloud_env)
    assert after["nodeclaims"] == {} and {**after, "nodeclaims": k8s_before["nodeclaims"]} == k8s_before
    assert policy(BUCKET) == TLS_ONLY and policy("mlplatform-dev-nopolicy") is None
    assert eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName=f"{CLUSTER}-batch")[
        "nodegroup"]["scalingConfig"] == sizes
    assert second.restore_all() == []  # idempotent


def test_cloud_pool_withdrawal_mode_follows_who_owns_the_pool_stubbed_clients(
        cloud_env: FakeCluster, tmp_path: Path) -> None:
    cloud = build(tmp_path, **BATCH_GROUP)
    assert cloud.withdraw_pool("gpu")["mode"] == "nodepool"
    assert cloud.withdraw_pool("batch")["mode"] == "cordon"  # a node group: the old default
    with pytest.raises(CloudConfigError, match="Karpenter owns this pool.*use mode nodepool"):
        cloud.withdraw_pool("cpu", mode="nodegroup")
    with pytest.raises(CloudConfigError, match="unknown pool 'tpu'"):
        cloud.withdraw_pool("tpu")
    with pytest.raises(Exception, match="refusing to withdraw the system pool"):
        cloud.withdraw_pool("system")
    with pytest.raises(Exception, match="refusing a node fault on the system pool"):
        cloud.terminate_node("system")
    assert sorted(cloud.state.active()) == ["withdraw_pool:batch", "withdraw_pool:gpu"]
    assert cloud.restore_pool("gpu")["mode"] == "nodepool"
    assert cloud.restore_pool("batch")["mode"] == "cordon"
    # poolWithdrawal set explicitly applies to every pool.
    assert build(tmp_path, poolWithdrawal="cordon").withdraw_pool("cpu")["mode"] == "cordon"


def test_cloud_crash_mid_fault_is_still_rolled_back_stubbed_clients(
        cloud_env: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = normalized(cloud_env)
    cloud = build(tmp_path)

    def crash(*_a: Any, **_k: Any) -> None:
        raise KeyboardInterrupt  # the process dies after labelling, before the policy

    with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
        patched.setattr(cloud.k8s.isolation, "_create_policy", crash)
        cloud.hang("api-1")
    assert normalized(cloud_env) != before  # the pod carries the fault label
    assert build(tmp_path).restore_all() == ["hang:api-1"]
    assert normalized(cloud_env) == before


def test_cloud_restore_all_keeps_failed_undo_in_state_stubbed_clients(
        cloud_env: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cloud = build(tmp_path)
    cloud.stop("api")
    cloud.artifact_store_unreachable()

    def broken(_key: str) -> None:
        raise RuntimeError("API server unreachable")

    monkeypatch.setattr(cloud.k8s, "undo_stop", broken)
    with pytest.raises(Exception, match="1 fault\\(s\\) not undone.*API server unreachable"):
        cloud.restore_all()
    assert list(cloud.state.active()) == ["stop:controlplane-api"]  # artifact one was undone
    assert policy(BUCKET) == TLS_ONLY

"""AwsFaults against moto's in-process AWS (mock_aws; no network): RDS failover, S3 deny
policy, EC2 node termination (Karpenter pools by Karpenter's instance tags, managed node
groups by theirs) and EKS node-group scaling."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from environments.cloud.aws import DENY_SID, AwsFaultError, AwsFaults, AwsTarget
from environments.cloud.driver import FaultState
from environments.cloud.tags import karpenter_tags

REGION, CLUSTER, BUCKET = "eu-west-1", "mlplatform-dev", "mlplatform-dev-artifacts-bucket-1a2b3c"
TLS_ONLY = json.dumps({"Version": "2012-10-17", "Statement": [{
    "Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
    "Resource": [f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/*"],
    "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}, sort_keys=True)
PRINCIPALS = ("arn:aws:iam::*:role/mlplatform-dev-irsa-*",)


def make_platform(multi_az: bool = True) -> dict[str, Any]:
    """What provisioning/ creates, as far as the AWS faults see it."""
    rds = boto3.client("rds", region_name=REGION)
    rds.create_db_instance(DBInstanceIdentifier="mlplatform-dev-controlplane", Engine="postgres",
                           DBInstanceClass="db.t4g.medium", MultiAZ=multi_az, AllocatedStorage=20,
                           MasterUsername="controlplane", MasterUserPassword="not-a-real-secret")
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.put_bucket_policy(Bucket=BUCKET, Policy=TLS_ONLY)
    s3.create_bucket(Bucket="mlplatform-dev-nopolicy", CreateBucketConfiguration={
        "LocationConstraint": REGION})
    eks = boto3.client("eks", region_name=REGION)
    role = "arn:aws:iam::123456789012:role/node"
    eks.create_cluster(name=CLUSTER, roleArn=role, resourcesVpcConfig={"subnetIds": ["subnet-1"]})
    # system: the one managed node group of the stack; batch: a workload pool still on a
    # managed node group (what nodeGroups / mode nodegroup serve).
    for pool, (lo, hi, want) in {"system": (2, 3, 2), "batch": (1, 4, 2)}.items():
        eks.create_nodegroup(clusterName=CLUSTER, nodegroupName=f"{CLUSTER}-{pool}", nodeRole=role,
                             subnets=["subnet-1"],
                             scalingConfig={"minSize": lo, "maxSize": hi, "desiredSize": want})
    ec2 = boto3.client("ec2", region_name=REGION)

    def launch(count: int, tags: dict[str, str]) -> list[str]:
        run = ec2.run_instances(ImageId="ami-12345678", MinCount=count, MaxCount=count,
                                TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                    {"Key": k, "Value": v} for k, v in tags.items()]}])
        return [i["InstanceId"] for i in run["Instances"]]

    owned = {f"kubernetes.io/cluster/{CLUSTER}": "owned"}
    # What the pool's EC2NodeClass spec.tags add (autoscaling.py): user tags, not proof.
    user = {"platform.gameday/pool": "cpu", "owner": "ml-platform"}
    return {
        # Managed node group instances carry the cluster tag too, never karpenter.sh/nodepool.
        "system": launch(2, {"eks:nodegroup-name": f"{CLUSTER}-system", "eks:cluster-name": CLUSTER,
                             **owned, **user}),
        "batch": launch(2, {"eks:nodegroup-name": f"{CLUSTER}-batch", "eks:cluster-name": CLUSTER,
                            **owned}),
        # As Karpenter tags them (plus the nodeclaim/Name tags its tagging controller adds).
        "cpu": launch(2, {**karpenter_tags(CLUSTER, "cpu"), "karpenter.k8s.aws/ec2nodeclass": "cpu",
                          "karpenter.sh/nodeclaim": "cpu-abcde", **user}),
        "gpu": launch(1, {**karpenter_tags(CLUSTER, "gpu"), "karpenter.k8s.aws/ec2nodeclass": "gpu"}),
        # Another cluster's Karpenter pool of the same name, in the same account and region.
        "other-cluster": launch(1, karpenter_tags("mlplatform-staging", "cpu")),
    }


def target(**extra: Any) -> AwsTarget:
    base: dict[str, Any] = {
        "region": REGION, "cluster_name": CLUSTER, "db_instance_id": "mlplatform-dev-controlplane",
        "buckets": (BUCKET, "mlplatform-dev-nopolicy"),
        "nodegroups": {"batch": f"{CLUSTER}-batch"}, "nodepools": {"cpu": "cpu", "gpu": "gpu"},
        "deny_principal_arns": PRINCIPALS, "wait_timeout": 5, "poll_seconds": 0.01}
    return AwsTarget(**{**base, **extra})


@pytest.fixture
def aws() -> Iterator[None]:
    with mock_aws():
        yield


def policy(bucket: str) -> str | None:
    try:
        return boto3.client("s3", region_name=REGION).get_bucket_policy(Bucket=bucket)["Policy"]
    except ClientError:
        return None


def test_aws_failover_db_forces_failover_on_multi_az_moto_stubbed_aws(aws: None, state: FaultState) -> None:
    make_platform(multi_az=True)
    result = AwsFaults(target(), state).failover_db()
    assert result["target"] == "mlplatform-dev-controlplane" and result["failover"] is True
    status = boto3.client("rds", region_name=REGION).describe_db_instances(
        DBInstanceIdentifier="mlplatform-dev-controlplane")["DBInstances"][0]["DBInstanceStatus"]
    assert status == "available"


def test_aws_failover_db_refuses_single_az_unless_plain_reboot_moto_stubbed_aws(aws: None,
                                                                    state: FaultState) -> None:
    make_platform(multi_az=False)
    faults = AwsFaults(target(), state)
    with pytest.raises(AwsFaultError, match="single-AZ.*plain_reboot=True"):
        faults.failover_db()
    assert faults.failover_db(plain_reboot=True)["failover"] is False


def test_aws_artifact_store_deny_and_exact_restore_idempotent_moto_stubbed_aws(aws: None,
                                                                   state: FaultState) -> None:
    make_platform()
    faults = AwsFaults(target(), state)
    result = faults.artifact_store_unreachable()
    assert result["buckets"] == {BUCKET: TLS_ONLY, "mlplatform-dev-nopolicy": None}
    for bucket in (BUCKET, "mlplatform-dev-nopolicy"):
        statements = json.loads(policy(bucket) or "{}")["Statement"]
        deny = next(s for s in statements if s.get("Sid") == DENY_SID)
        assert deny["Condition"] == {"ArnLike": {"aws:PrincipalArn": list(PRINCIPALS)}}
        assert "s3:PutBucketPolicy" not in deny["Action"]  # the undo stays possible
    assert len(json.loads(policy(BUCKET) or "{}")["Statement"]) == 2  # original kept
    assert faults.artifact_store_unreachable()["already"] is True
    faults.artifact_store_restore()
    assert policy(BUCKET) == TLS_ONLY  # byte-for-byte
    assert policy("mlplatform-dev-nopolicy") is None
    assert faults.artifact_store_restore()["already"] is True
    assert policy(BUCKET) == TLS_ONLY


def test_aws_artifact_store_lost_state_does_not_treat_leftover_deny_as_original_moto_stubbed_aws(
        aws: None, state: FaultState) -> None:
    make_platform()
    AwsFaults(target(), state).artifact_store_unreachable()
    state.path.unlink()  # state file lost, deny statement still on the bucket
    faults = AwsFaults(target(), state)
    assert faults.artifact_store_unreachable()["buckets"][BUCKET] != policy(BUCKET)
    faults.artifact_store_restore()
    assert [s["Sid"] for s in json.loads(policy(BUCKET) or "{}")["Statement"]] == [
        "DenyInsecureTransport"]


def test_aws_artifact_store_refuses_to_deny_everyone_moto_stubbed_aws(aws: None, state: FaultState) -> None:
    make_platform()
    with pytest.raises(AwsFaultError, match="deny everyone"):
        AwsFaults(target(deny_principal_arns=()), state).artifact_store_unreachable()
    assert policy(BUCKET) == TLS_ONLY and state.active() == {}


def states() -> dict[str, str]:
    return {i["InstanceId"]: i["State"]["Name"] for r in boto3.client(
        "ec2", region_name=REGION).describe_instances()["Reservations"] for i in r["Instances"]}


def test_aws_terminate_node_finds_karpenter_instances_by_karpenter_tags_moto_stubbed_aws(
        aws: None, state: FaultState) -> None:
    ids = make_platform()
    faults = AwsFaults(target(), state)
    # Only this cluster's cpu NodePool: not system (user tag platform.gameday/pool=cpu), not
    # gpu, not the other cluster's "cpu" NodePool.
    found = faults.pool_instances("cpu")
    assert sorted(i["InstanceId"] for i in found) == sorted(ids["cpu"])
    oldest = found[0]["InstanceId"]
    result = faults.terminate_node("cpu")
    assert result["nodepool"] == "cpu" and result["instance"] == oldest
    assert result["remaining"] == [i for i in sorted(ids["cpu"], key=lambda i: (
        next(f["LaunchTime"] for f in found if f["InstanceId"] == i), i)) if i != oldest]
    assert [i for i, s in states().items() if s != "running"] == [oldest]
    assert [i["InstanceId"] for i in faults.pool_instances("gpu")] == ids["gpu"]


@pytest.mark.parametrize(("weaker", "wrongly_found"), [
    ({"karpenter.sh/nodepool": "cpu"}, "other-cluster"),  # cluster tags dropped
    ({"platform.gameday/pool": "cpu"}, "system"),  # the NodeClass's user tag instead
])
def test_aws_a_weaker_instance_filter_would_pick_the_wrong_node_moto_stubbed_aws(
        aws: None, state: FaultState, monkeypatch: pytest.MonkeyPatch, weaker: dict[str, str],
        wrongly_found: str) -> None:
    """Mutation kept as a test: with the tag filter broken, the seeded decoys are found."""
    import environments.cloud.aws as aws_module

    ids = make_platform()
    monkeypatch.setattr(aws_module, "karpenter_tags", lambda _cluster, _pool: weaker)
    found = {i["InstanceId"] for i in AwsFaults(target(), state).pool_instances("cpu")}
    assert set(ids[wrongly_found]) <= found


def test_aws_terminate_node_managed_node_group_still_works_moto_stubbed_aws(
        aws: None, state: FaultState) -> None:
    ids = make_platform()
    result = AwsFaults(target(), state).terminate_node("batch")
    assert result["nodegroup"] == f"{CLUSTER}-batch" and result["instance"] in ids["batch"]
    assert [i for i, s in states().items() if s != "running"] == [result["instance"]]


@pytest.mark.parametrize(("pool", "message"), [
    ("system", "refusing a node fault on the system pool"),
    ("tpu", "unknown pool 'tpu'; Karpenter NodePools: cpu, gpu; node groups: system"),
])
def test_aws_terminate_node_refuses_system_and_unknown_pools_moto_stubbed_aws(
        aws: None, state: FaultState, pool: str, message: str) -> None:
    make_platform()
    # Even a target that wrongly names the system node group cannot reach it.
    faults = AwsFaults(target(nodegroups={"system": f"{CLUSTER}-system"}), state)
    with pytest.raises(AwsFaultError, match=message):
        faults.terminate_node(pool)
    assert set(states().values()) == {"running"}


def test_aws_terminate_node_empty_karpenter_pool_names_the_nodepool_moto_stubbed_aws(
        aws: None, state: FaultState) -> None:
    make_platform()
    with pytest.raises(AwsFaultError, match="pool 'gpu' \\(nodepool gpu-empty\\) has no running"):
        AwsFaults(target(nodepools={"gpu": "gpu-empty"}), state).terminate_node("gpu")


def test_aws_withdraw_pool_scales_nodegroup_to_zero_and_back_moto_stubbed_aws(aws: None,
                                                                 state: FaultState) -> None:
    make_platform()
    eks = boto3.client("eks", region_name=REGION)

    def scaling() -> dict[str, int]:
        return eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName=f"{CLUSTER}-batch")[
            "nodegroup"]["scalingConfig"]

    faults = AwsFaults(target(), state)
    assert faults.withdraw_pool("batch")["scaling"] == {"minSize": 1, "maxSize": 4, "desiredSize": 2}
    assert scaling() == {"minSize": 0, "maxSize": 1, "desiredSize": 0}
    assert faults.withdraw_pool("batch")["already"] is True
    faults.restore_pool("batch")
    assert scaling() == {"minSize": 1, "maxSize": 4, "desiredSize": 2}
    assert faults.restore_pool("batch")["already"] is True
    # A Karpenter pool has no node group to scale.
    with pytest.raises(AwsFaultError, match="pool 'cpu' is not a managed node group"):
        faults.withdraw_pool("cpu")

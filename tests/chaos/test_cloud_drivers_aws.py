"""AwsFaults against moto's in-process AWS (mock_aws; no network): RDS failover, S3 deny
policy, EC2 node termination and EKS node-group scaling."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from infra.cloud.aws import DENY_SID, AwsFaultError, AwsFaults, AwsTarget
from infra.cloud.driver import FaultState

REGION, CLUSTER, BUCKET = "eu-west-1", "mlplatform-dev", "mlplatform-dev-artifacts-bucket-1a2b3c"
TLS_ONLY = json.dumps({"Version": "2012-10-17", "Statement": [{
    "Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
    "Resource": [f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/*"],
    "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}, sort_keys=True)
PRINCIPALS = ("arn:aws:iam::*:role/mlplatform-dev-irsa-*",)


def make_platform(multi_az: bool = True) -> dict[str, Any]:
    """What infra/ creates, as far as the AWS faults see it."""
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
    for pool, (lo, hi, want) in {"system": (2, 3, 2), "cpu": (1, 4, 2)}.items():
        eks.create_nodegroup(clusterName=CLUSTER, nodegroupName=f"{CLUSTER}-{pool}", nodeRole=role,
                             subnets=["subnet-1"],
                             scalingConfig={"minSize": lo, "maxSize": hi, "desiredSize": want})
    ec2 = boto3.client("ec2", region_name=REGION)
    ids = {}
    for pool, count in {"system": 2, "cpu": 2}.items():
        tags = [{"Key": "eks:nodegroup-name", "Value": f"{CLUSTER}-{pool}"},
                {"Key": "eks:cluster-name", "Value": CLUSTER}]
        run = ec2.run_instances(ImageId="ami-12345678", MinCount=count, MaxCount=count,
                                TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
        ids[pool] = [i["InstanceId"] for i in run["Instances"]]
    return ids


def target(**extra: Any) -> AwsTarget:
    base: dict[str, Any] = {
        "region": REGION, "cluster_name": CLUSTER, "db_instance_id": "mlplatform-dev-controlplane",
        "buckets": (BUCKET, "mlplatform-dev-nopolicy"),
        "nodegroups": {"system": f"{CLUSTER}-system", "cpu": f"{CLUSTER}-cpu"},
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


def test_aws_terminate_node_terminates_one_instance_of_the_pool_moto_stubbed_aws(aws: None,
                                                                     state: FaultState) -> None:
    ids = make_platform()
    result = AwsFaults(target(), state).terminate_node("cpu")
    assert result["nodegroup"] == f"{CLUSTER}-cpu" and result["instance"] in ids["cpu"]
    states = {i["InstanceId"]: i["State"]["Name"] for r in boto3.client(
        "ec2", region_name=REGION).describe_instances()["Reservations"] for i in r["Instances"]}
    assert [i for i, s in states.items() if s != "running"] == [result["instance"]]
    with pytest.raises(AwsFaultError, match="unknown pool 'tpu'"):
        AwsFaults(target(), state).terminate_node("tpu")


def test_aws_withdraw_pool_scales_nodegroup_to_zero_and_back_moto_stubbed_aws(aws: None,
                                                                 state: FaultState) -> None:
    make_platform()
    eks = boto3.client("eks", region_name=REGION)

    def scaling() -> dict[str, int]:
        return eks.describe_nodegroup(clusterName=CLUSTER, nodegroupName=f"{CLUSTER}-cpu")[
            "nodegroup"]["scalingConfig"]

    faults = AwsFaults(target(), state)
    assert faults.withdraw_pool("cpu")["scaling"] == {"minSize": 1, "maxSize": 4, "desiredSize": 2}
    assert scaling() == {"minSize": 0, "maxSize": 1, "desiredSize": 0}
    assert faults.withdraw_pool("cpu")["already"] is True
    faults.restore_pool("cpu")
    assert scaling() == {"minSize": 1, "maxSize": 4, "desiredSize": 2}
    assert faults.restore_pool("cpu")["already"] is True

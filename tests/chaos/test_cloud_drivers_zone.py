"""zone_outage for the cloud drivers, offline: a deny-all network ACL on the zone's subnets
against moto's in-process AWS (EC2 network ACLs, RDS), cordon + pod deletion by
``topology.kubernetes.io/zone`` against the fake Kubernetes API from recorded objects. Never
run against real AWS or EKS (docs/chaos-cloud.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from environments.cloud.aws import ZONE_ACL_TAG, AwsFaultError, AwsFaults
from environments.cloud.driver import CloudConfigError, CloudFaults, FaultState
from environments.cloud.kubernetes import ZONE_LABEL, KubernetesFaultError, KubernetesFaults
from tests.chaos.fake_kube import FakeCluster
from tests.chaos.test_cloud_drivers_aws import CLUSTER, REGION, make_platform, target
from tests.chaos.test_cloud_drivers_cloud import STACK_OUTPUTS
from tests.chaos.test_cloud_drivers_kubernetes import normalized

ZONE_A, ZONE_B = f"{REGION}a", f"{REGION}b"
CP = "mlp-controlplane"
# the recorded nodes carry no zone label: zone-a gets one system and one cpu node
NODE_ZONES = {"ip-10-10-1-10.eu-west-1.compute.internal": ZONE_A,
              "ip-10-10-3-31.eu-west-1.compute.internal": ZONE_A,
              "ip-10-10-2-20.eu-west-1.compute.internal": ZONE_B,
              "ip-10-10-3-32.eu-west-1.compute.internal": ZONE_B}


def make_subnets() -> dict[str, str]:
    """The cluster's subnets in two zones, and a decoy in zone a of another cluster."""
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.10.0.0/16")["Vpc"]["VpcId"]

    def subnet(cidr: str, zone: str, cluster: str) -> str:
        return ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zone,
                                 TagSpecifications=[{"ResourceType": "subnet", "Tags": [
                                     {"Key": f"kubernetes.io/cluster/{cluster}", "Value": "shared"}]}],
                                 )["Subnet"]["SubnetId"]

    return {"a": subnet("10.10.1.0/24", ZONE_A, CLUSTER), "a2": subnet("10.10.3.0/24", ZONE_A, CLUSTER),
            "b": subnet("10.10.2.0/24", ZONE_B, CLUSTER),
            "decoy": subnet("10.10.9.0/24", ZONE_A, "mlplatform-staging")}


def acl_of(subnet: str) -> dict[str, Any]:
    return boto3.client("ec2", region_name=REGION).describe_network_acls(Filters=[
        {"Name": "association.subnet-id", "Values": [subnet]}])["NetworkAcls"][0]


@pytest.fixture
def aws() -> Iterator[None]:
    with mock_aws():
        yield


def test_aws_zone_outage_puts_the_zones_subnets_behind_deny_all_and_restores_moto_stubbed_aws(
        aws: None, state: FaultState) -> None:
    subnets = make_subnets()
    before = {k: acl_of(s)["NetworkAclId"] for k, s in subnets.items()}
    faults = AwsFaults(target(), state)
    result = faults.zone_outage(ZONE_A)
    assert sorted(result["originals"]) == sorted([subnets["a"], subnets["a2"]])
    deny = result["deny_acl"]
    for key in ("a", "a2"):
        acl = acl_of(subnets[key])
        assert acl["NetworkAclId"] == deny
        assert {"Key": ZONE_ACL_TAG, "Value": ZONE_A} in acl["Tags"]
        rules = {(e["Egress"], e["RuleAction"], e["CidrBlock"], e["Protocol"])
                 for e in acl["Entries"] if e["RuleNumber"] == 1}
        assert rules == {(False, "deny", "0.0.0.0/0", "-1"), (True, "deny", "0.0.0.0/0", "-1")}
    # the other zone and another cluster's subnet in the same zone are untouched
    assert acl_of(subnets["b"])["NetworkAclId"] == before["b"]
    assert acl_of(subnets["decoy"])["NetworkAclId"] == before["decoy"]
    assert faults.zone_outage(ZONE_A)["already"] is True
    faults.undo_zone_outage(f"zone_network_acl:{ZONE_A}")
    assert {k: acl_of(s)["NetworkAclId"] for k, s in subnets.items()} == before
    acls = boto3.client("ec2", region_name=REGION).describe_network_acls()["NetworkAcls"]
    assert deny not in {a["NetworkAclId"] for a in acls} and state.active() == {}


def test_aws_zone_outage_refuses_a_zone_without_subnets_and_foreign_zone_subnets_moto_stubbed_aws(
        aws: None, state: FaultState) -> None:
    subnets = make_subnets()
    with pytest.raises(AwsFaultError, match=f"no subnet of cluster {CLUSTER} in {REGION}c"):
        AwsFaults(target(), state).zone_outage(f"{REGION}c")
    named = AwsFaults(target(zone_subnets={ZONE_A: (subnets["b"],)}), state)
    with pytest.raises(AwsFaultError, match=rf"zoneSubnets.{ZONE_A}: \['{subnets['b']}'\] are not in"):
        named.zone_outage(ZONE_A)
    assert state.active() == {}


@pytest.fixture
def zoned(fake_cluster: FakeCluster) -> FakeCluster:
    for (_, name), node in fake_cluster.objects["nodes"].items():
        node["metadata"]["labels"][ZONE_LABEL] = NODE_ZONES[name]
    return fake_cluster


def test_kubernetes_zone_outage_cordons_the_zone_and_deletes_its_pods_stubbed_client(
        kube: KubernetesFaults, zoned: FakeCluster) -> None:
    nodes_before = normalized(zoned)["nodes"]
    result = kube.zone_outage(ZONE_A)
    assert result["cordoned"] == sorted(n for n, z in NODE_ZONES.items() if z == ZONE_A)
    assert result["deleted_pods"] == [
        f"{CP}/controlplane-api-7d9f-abcde", f"{CP}/controlplane-reconciler-5c6b-klmno",
        "mlp-workloads/train-op-42-attempt-1-z9x8y"]  # not kube-system's DaemonSet pod
    deleted = sorted(ref for verb, kind, ref in zoned.writes if verb == "delete")
    assert deleted == sorted(result["deleted_pods"])
    assert zoned.last_delete_options["gracePeriodSeconds"] == 0
    unschedulable = {name for (_, name), n in zoned.objects["nodes"].items()
                     if n["spec"].get("unschedulable")}
    # zone a's nodes, plus the zone-b node someone else had cordoned before
    assert unschedulable == set(result["cordoned"]) | {"ip-10-10-3-32.eu-west-1.compute.internal"}
    assert kube.zone_outage(ZONE_A)["already"] is True
    kube.undo_zone_outage(f"zone_cordon:{ZONE_A}")
    assert normalized(zoned)["nodes"] == nodes_before


def test_kubernetes_zone_outage_of_an_unknown_zone_touches_nothing_stubbed_client(
        kube: KubernetesFaults, zoned: FakeCluster) -> None:
    with pytest.raises(KubernetesFaultError, match=f"no node labelled {ZONE_LABEL}=nowhere"):
        kube.zone_outage("nowhere")
    assert zoned.writes == [] and kube.state.active() == {}


@pytest.fixture
def cloud_env(zoned: FakeCluster) -> Iterator[tuple[FakeCluster, dict[str, str]]]:
    with mock_aws():
        make_platform()
        yield zoned, make_subnets()


def test_cloud_zone_outage_fails_rds_over_when_its_primary_is_in_the_zone_then_restore_all_stubbed_clients(
        cloud_env: tuple[FakeCluster, dict[str, str]], tmp_path: Path) -> None:
    fake, subnets = cloud_env
    nodes_before = normalized(fake)["nodes"]
    acls_before = {k: acl_of(s)["NetworkAclId"] for k, s in subnets.items()}
    state = tmp_path / "run" / "cloud-faults.json"
    first = CloudFaults(STACK_OUTPUTS, state)
    primary_zone = first.aws.db_zone()
    other = ZONE_B if primary_zone == ZONE_A else ZONE_A
    out = first.zone_outage(other)  # the primary is elsewhere: no failover
    assert out["primary_lost"] is False and out["database"] is None
    out = first.zone_outage(primary_zone)
    assert out["primary_lost"] is True and out["database"]["failover"] is True
    assert sorted(first.state.active()) == sorted(
        f"{kind}:{z}" for kind in ("zone_network_acl", "zone_cordon") for z in (ZONE_A, ZONE_B))
    del first  # the run crashes; only the state file survives
    second = CloudFaults(STACK_OUTPUTS, state)
    assert len(second.restore_all()) == 4
    assert normalized(fake)["nodes"] == nodes_before
    assert {k: acl_of(s)["NetworkAclId"] for k, s in subnets.items()} == acls_before
    assert second.restore_zone(ZONE_A)["already"] is True


def test_cloud_zone_subnets_config_is_validated_stubbed_clients(tmp_path: Path) -> None:
    with pytest.raises(CloudConfigError, match="zoneSubnets must map zones to lists of subnet ids"):
        CloudFaults({**STACK_OUTPUTS, "zoneSubnets": {ZONE_A: "subnet-1"}}, tmp_path / "s.json")
    cloud = CloudFaults({**STACK_OUTPUTS, "zoneSubnets": {ZONE_A: ["subnet-1"]}}, tmp_path / "s.json")
    assert cloud.target.aws.zone_subnets == {ZONE_A: ("subnet-1",)}

"""`gameday infra waste` (operations/waste.py) against a real moto server seeded with waste and
with non-waste next to it: exactly the seeded waste is found, with owner, age and action;
`--apply` deletes only what is tagged lifecycle=temporary; prod is refused. moto sets every
creation time to "now", so the age threshold is tested by moving the scan's clock."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from click.testing import CliRunner, Result

from operations import cli, waste
from provisioning.components.common import REQUIRED_TAGS
from tests.infra.motoserver import fresh_session

REGION = "eu-west-1"
PROJECT, STACK = "mlplatform", "staging"
OWNER = "ml-platform"


def tags(stack: str = STACK, **extra: str) -> list[dict[str, str]]:
    base = {"owner": OWNER, "environment": stack, "project": PROJECT, "cost-center": "ml-1001",
            "stack": stack, "managed-by": "pulumi", "data-class": "platform",
            "availability-objective": "rto=30s/rpo=0",
            "provisioning-source": f"pulumi:{PROJECT}/{stack}", "retirement-condition": "with-stack",
            **extra}
    return [{"Key": k, "Value": v} for k, v in base.items()]


def spec(kind: str, **extra: str) -> list[dict[str, Any]]:
    return [{"ResourceType": kind, "Tags": tags(**extra)}]


@pytest.fixture()
def session(moto: str, monkeypatch: pytest.MonkeyPatch) -> boto3.session.Session:
    return fresh_session(moto, monkeypatch, REGION)


@pytest.fixture()
def seeded(session: boto3.session.Session) -> dict[str, str]:
    """Waste and non-waste of stack staging (plus one stack-dev volume); returns the ids."""
    ec2, elb, logs = session.client("ec2"), session.client("elbv2"), session.client("logs")
    cw, sns, sqs = session.client("cloudwatch"), session.client("sns"), session.client("sqs")
    ids: dict[str, str] = {}
    vpc = ec2.create_vpc(CidrBlock="10.10.0.0/16", TagSpecifications=spec("vpc"))["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.10.{i}.0/24",
                                 AvailabilityZone=f"{REGION}{az}",
                                 TagSpecifications=spec("subnet"))["Subnet"]["SubnetId"]
               for i, az in enumerate("ab")]
    image = ec2.register_image(Name="base-image", RootDeviceName="/dev/sda1")["ImageId"]

    def instance(name: str, eni_tags: list[dict[str, str]]) -> str:
        inst = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, SubnetId=subnets[0],
                                 TagSpecifications=spec("instance", Name=name)
                                 + spec("volume"))["Instances"][0]
        # moto does not apply network-interface TagSpecifications: tag the ENI afterwards
        eni = inst["NetworkInterfaces"][0]["NetworkInterfaceId"]
        ec2.create_tags(Resources=[eni], Tags=eni_tags)
        ids[f"{name}_eni"] = eni
        return inst["InstanceId"]

    # the web instance's ENI lacks only cost-center
    ids["web"] = instance("web", [t for t in tags() if t["Key"] != "cost-center"])
    ids["stopped"] = instance("stopped", tags())
    ec2.stop_instances(InstanceIds=[ids["stopped"]])
    ids["sg_untagged"] = ec2.create_security_group(GroupName="scratch", Description="scratch",
                                                   VpcId=vpc)["GroupId"]
    ec2.create_security_group(GroupName="nodes", Description="nodes", VpcId=vpc,
                              TagSpecifications=spec("security-group"))

    def volume(**extra: str) -> str:
        return ec2.create_volume(Size=10, AvailabilityZone=f"{REGION}a",
                                 TagSpecifications=spec("volume", **extra))["VolumeId"]

    ids["vol_old"] = volume()
    ids["vol_temp"] = volume(lifecycle="temporary")
    ids["vol_attached"] = volume(lifecycle="temporary")  # temporary but in use: not waste
    ec2.attach_volume(VolumeId=ids["vol_attached"], InstanceId=ids["web"], Device="/dev/sdf")
    ids["vol_dev"] = ec2.create_volume(Size=10, AvailabilityZone=f"{REGION}a",
                                       TagSpecifications=[{"ResourceType": "volume",
                                                           "Tags": tags("dev")}])["VolumeId"]
    ids["snap_old"] = ec2.create_snapshot(VolumeId=ids["vol_old"],
                                          TagSpecifications=spec("snapshot"))["SnapshotId"]
    # moto ignores RegisterImage's BlockDeviceMappings and snapshots a volume of its own
    # for each image (untagged): those are the AMI snapshots test_all_stacks_and_scope sees.

    def lb(name: str) -> str:
        return elb.create_load_balancer(Name=name, Subnets=subnets,
                                        Tags=tags())["LoadBalancers"][0]["LoadBalancerArn"]

    def listener(lb_arn: str, tg_name: str) -> str:
        tg = elb.create_target_group(Name=tg_name, Protocol="HTTP", Port=80,
                                     VpcId=vpc)["TargetGroups"][0]["TargetGroupArn"]
        elb.create_listener(LoadBalancerArn=lb_arn, Protocol="HTTP", Port=80,
                            DefaultActions=[{"Type": "forward", "TargetGroupArn": tg}])
        return tg

    ids["lb_nolistener"] = lb("idle")
    ids["lb_notargets"] = lb("empty")
    listener(ids["lb_notargets"], "empty-tg")
    busy = lb("busy")
    elb.register_targets(TargetGroupArn=listener(busy, "busy-tg"), Targets=[{"Id": ids["web"]}])

    plain = {t["Key"]: t["Value"] for t in tags()}
    logs.create_log_group(logGroupName="/mlplatform/staging/app", tags=plain)
    logs.put_retention_policy(logGroupName="/mlplatform/staging/app", retentionInDays=30)
    logs.create_log_group(logGroupName="/mlplatform/staging/debug", tags=plain)
    logs.create_log_group(logGroupName="/mlplatform/staging/scratch",
                          tags={**plain, "lifecycle": "temporary"})

    queue = sqs.create_queue(QueueName="pager")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue,
                                         AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    ids["topic_paging"] = sns.create_topic(Name="paging", Tags=tags())["TopicArn"]
    sns.subscribe(TopicArn=ids["topic_paging"], Protocol="sqs", Endpoint=queue_arn)
    ids["topic_orphan"] = sns.create_topic(Name="orphan", Tags=tags())["TopicArn"]
    alarm = {"MetricName": "m", "Namespace": "mlplatform", "Statistic": "Average", "Period": 60,
             "EvaluationPeriods": 1, "Threshold": 1.0,
             "ComparisonOperator": "GreaterThanThreshold", "Tags": tags()}
    cw.put_metric_alarm(AlarmName="quiet", **alarm)
    cw.put_metric_alarm(AlarmName="paging", AlarmActions=[ids["topic_paging"]], **alarm)
    return ids


def run(*args: str) -> Result:
    return CliRunner().invoke(cli.infra_group, ["waste", *args])


def findings(result: Result) -> list[dict[str, Any]]:
    return json.loads(result.stdout)["findings"]


def expected(ids: dict[str, str]) -> set[tuple[str, str, str, str]]:
    return {
        ("unattached-volume", ids["vol_old"], OWNER, "review"),
        ("unattached-volume", ids["vol_temp"], OWNER, "delete"),
        ("old-snapshot", ids["snap_old"], OWNER, "review"),
        ("stopped-instance", ids["stopped"], OWNER, "review"),
        ("idle-load-balancer", ids["lb_nolistener"], OWNER, "review"),
        ("idle-load-balancer", ids["lb_notargets"], OWNER, "review"),
        ("untagged", ids["sg_untagged"], "untagged", "review"),
        ("untagged", ids["web_eni"], OWNER, "review"),
        ("log-group-no-retention", "/mlplatform/staging/debug", OWNER, "review"),
        ("log-group-no-retention", "/mlplatform/staging/scratch", OWNER, "delete"),
        ("alarm-no-actions", "quiet", OWNER, "review"),
        ("topic-no-subscribers", ids["topic_orphan"], OWNER, "review"),
    }


def test_finds_exactly_the_seeded_waste(seeded: dict[str, str],
                                        session: boto3.session.Session) -> None:
    result = run("--stack", STACK, "--min-age-days", "0", "--json")
    assert result.exit_code == cli.EXIT_DRIFT, result.output
    found = findings(result)
    assert {(f["kind"], f["resource"], f["owner"], f["action"]) for f in found} == \
        expected(seeded)
    by_id = {f["resource"]: f for f in found}
    # ages come from the API's creation times; none is invented where the API gives none
    vol = session.client("ec2").describe_volumes(VolumeIds=[seeded["vol_old"]])["Volumes"][0]
    assert by_id[seeded["vol_old"]]["age_days"] == pytest.approx(
        (datetime.now(UTC) - vol["CreateTime"]).total_seconds() / 86400, abs=0.01)
    assert by_id[seeded["stopped"]]["age_days"] is not None  # from StateTransitionReason
    for unknown in ("quiet", seeded["topic_orphan"], seeded["sg_untagged"]):
        assert by_id[unknown]["age"] == "unknown"
    assert by_id[seeded["sg_untagged"]]["reason"] == (
        f"security group scratch missing tags: {', '.join(REQUIRED_TAGS)}")
    assert by_id[seeded["web_eni"]]["reason"] == (
        "network interface (interface) missing tags: cost-center")
    assert by_id[seeded["lb_notargets"]]["reason"] == "no healthy target in 1 target group(s)"
    assert by_id[seeded["lb_nolistener"]]["reason"] == "no listeners"
    assert json.loads(result.stdout)["deleted"] == []


def test_age_threshold_uses_the_api_creation_time(seeded: dict[str, str],
                                                  session: boto3.session.Session) -> None:
    scope = waste.Scope(PROJECT, STACK, min_age_days=7)
    now = datetime.now(UTC)
    aged = {"unattached-volume", "old-snapshot", "stopped-instance"}
    young = {f.kind.value for f in waste.find_all(session, scope, now=now)}
    assert young.isdisjoint(aged) and young  # everything was created seconds ago
    later = waste.find_all(session, scope, now=now + timedelta(days=10))
    old = [f for f in later if f.kind.value in aged]
    assert {f.resource for f in old} == {seeded["vol_old"], seeded["vol_temp"],
                                         seeded["snap_old"], seeded["stopped"]}
    assert all(10 <= f.age_days < 10.1 for f in old)  # type: ignore[operator]


def test_dry_run_then_apply_deletes_only_the_temporary(seeded: dict[str, str],
                                                       session: boto3.session.Session) -> None:
    ec2, logs = session.client("ec2"), session.client("logs")
    dry = run("--stack", STACK, "--min-age-days", "0")
    assert dry.exit_code == cli.EXIT_DRIFT, dry.output
    assert f"would delete (dry run; --apply to delete): {seeded['vol_temp']}, " \
        "/mlplatform/staging/scratch" in dry.stdout
    assert len(ec2.describe_volumes(VolumeIds=[seeded["vol_temp"]])["Volumes"]) == 1

    applied = run("--stack", STACK, "--min-age-days", "0", "--apply", "--json")
    assert applied.exit_code == cli.EXIT_DRIFT, applied.output
    assert json.loads(applied.stdout)["deleted"] == [seeded["vol_temp"],
                                                     "/mlplatform/staging/scratch"]
    with pytest.raises(ClientError, match="InvalidVolume.NotFound"):
        ec2.describe_volumes(VolumeIds=[seeded["vol_temp"]])
    left = {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}
    assert {seeded["vol_old"], seeded["vol_attached"], seeded["vol_dev"]} <= left
    groups = {g["logGroupName"] for g in logs.describe_log_groups()["logGroups"]}
    assert groups == {"/mlplatform/staging/app", "/mlplatform/staging/debug"}
    assert seeded["snap_old"] in {s["SnapshotId"] for s in
                                  ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]}
    again = run("--stack", STACK, "--min-age-days", "0", "--json")
    assert {f["action"] for f in findings(again)} == {"review"}


def test_prod_is_refused_without_allow_prod(session: boto3.session.Session) -> None:
    ec2 = session.client("ec2")
    vol = ec2.create_volume(Size=1, AvailabilityZone=f"{REGION}a",
                            TagSpecifications=[{"ResourceType": "volume", "Tags": tags(
                                "prod", lifecycle="temporary")}])["VolumeId"]
    refused = run("--stack", "prod", "--min-age-days", "0", "--apply")
    assert refused.exit_code == 1 and "refused: --apply on stack prod" in refused.output
    # --all-stacks: the prod finding itself is refused
    refused = run("--all-stacks", "--min-age-days", "0", "--apply")
    assert refused.exit_code == 1 and f"refused: {vol} belongs to stack prod" in refused.output
    assert len(ec2.describe_volumes(VolumeIds=[vol])["Volumes"]) == 1
    allowed = run("--stack", "prod", "--min-age-days", "0", "--apply", "--allow-prod", "--json")
    assert allowed.exit_code == cli.EXIT_DRIFT, allowed.output
    assert json.loads(allowed.stdout)["deleted"] == [vol]
    assert run("--stack", "prod", "--min-age-days", "0").exit_code == 0  # nothing left


def test_all_stacks_and_scope(seeded: dict[str, str], session: boto3.session.Session) -> None:
    every = findings(run("--all-stacks", "--min-age-days", "0", "--json"))
    assert (seeded["vol_dev"], "dev") in {(f["resource"], f["stack"]) for f in every}
    ec2 = session.client("ec2")
    behind_amis = {b["Ebs"]["SnapshotId"] for i in ec2.describe_images(Owners=["self"])["Images"]
                   for b in i["BlockDeviceMappings"]}
    snapshots = {s["SnapshotId"] for s in ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]}
    assert behind_amis and behind_amis <= snapshots  # untagged, old enough, yet used by AMIs
    assert {f["resource"] for f in every if f["kind"] == "old-snapshot"} == \
        snapshots - behind_amis == {seeded["snap_old"]}
    assert run("--stack", "dev", "--min-age-days", "0", "--json").exit_code == cli.EXIT_DRIFT
    assert [f["resource"] for f in findings(run("--stack", "dev", "--min-age-days", "0",
                                                "--json"))] == [seeded["vol_dev"]]


def test_table_and_usage(seeded: dict[str, str]) -> None:
    table = run("--stack", STACK, "--min-age-days", "0")
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["KIND", "ID", "OWNER", "AGE", "REASON", "ACTION"]
    assert len(lines) == 1 + len(expected(seeded)) + 1
    assert f"stack {STACK} in {REGION}: 12 finding(s), 10 to review, 2 cleanup" in lines[-1]
    assert "unattached volumes ..." in table.stderr
    assert run("--stack", STACK, "--all-stacks").exit_code == 2
    assert run().exit_code == 2


def test_no_waste_exits_zero(session: boto3.session.Session) -> None:
    result = run("--stack", STACK, "--min-age-days", "0")
    assert result.exit_code == 0, result.output
    assert "0 finding(s)" in result.stdout


def test_errors_name_the_call_and_exit_one(session: boto3.session.Session,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard port: refused
    result = run("--stack", STACK)
    assert result.exit_code == 1
    assert "Error: ec2.describe_volumes: Could not connect to the endpoint URL" in result.output
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(waste.WasteError, match="no AWS region"):
        waste.find_all(boto3.session.Session(), waste.Scope(PROJECT, STACK))


"""`gameday infra decommission` (operations/decommission.py) against a real moto server seeded with
two stacks (the real Pulumi.staging.yaml and Pulumi.dev.yaml give their tags and region):
staging is retired, dev must come out untouched. Every test talks to moto only through
`--endpoint-url` (no AWS_ENDPOINT_URL in the environment), so the option is what reaches it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from click.testing import CliRunner, Result

from operations import cli, decommission
from tests.infra.motoserver import fresh_session

REGION = "eu-west-1"  # aws:region of Pulumi.staging.yaml and Pulumi.dev.yaml
RETIRED, OTHER = "staging", "dev"


def tags(stack: str, **extra: str) -> dict[str, str]:
    return {"owner": "ml-platform", "environment": stack, "project": "mlplatform",
            "cost-center": "ml-1001", "stack": stack, "managed-by": "pulumi", **extra}


def kv(stack: str, **extra: str) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags(stack, **extra).items()]


def spec(kind: str, stack: str, **extra: str) -> list[dict[str, Any]]:
    return [{"ResourceType": kind, "Tags": kv(stack, **extra)}]


class Aws:
    """Clients on the moto server (explicit endpoint: the command must be told it too)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.session = boto3.session.Session(region_name=REGION)

    def __getattr__(self, service: str) -> Any:
        return self.session.client(service, endpoint_url=self.endpoint)


@pytest.fixture()
def aws(moto: str, monkeypatch: pytest.MonkeyPatch) -> Aws:
    """The module's moto server (tests/infra/conftest.py), reset; no AWS_ENDPOINT_URL."""
    fresh_session(moto, monkeypatch, REGION, endpoint_env=False)
    return Aws(moto)


ARCHIVE = {  # what scheduled game days archive (slo/archive.py layout: one folder per run)
    "gameday-archive/staging/2026-11-30T06-00-00Z-core/verdict.json": b'{"verdict": "pass"}',
    "gameday-archive/staging/2026-11-30T06-00-00Z-core/report.html": b"<html>report</html>",
    "gameday-archive/staging/2026-11-23T06-00-00Z-core/verdict.json": b'{"verdict": "fail"}',
}


def seed(aws: Aws, stack: str, cidr: str) -> dict[str, str]:
    """One stack's resources; returns their ids by role."""
    ec2, iam, logs, s3, rds = aws.ec2, aws.iam, aws.logs, aws.s3, aws.rds
    ids: dict[str, str] = {}
    vpc = ec2.create_vpc(CidrBlock=f"{cidr}.0.0/16",
                         TagSpecifications=spec("vpc", stack))["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=f"{cidr}.1.0/24",
                               AvailabilityZone=f"{REGION}a")["Subnet"]["SubnetId"]
    ids["igw"] = ec2.create_internet_gateway(
        TagSpecifications=spec("internet-gateway", stack))["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=ids["igw"], VpcId=vpc)
    ids["eip"] = ec2.allocate_address(Domain="vpc", TagSpecifications=spec("elastic-ip", stack))[
        "AllocationId"]
    ids["nat"] = ec2.create_nat_gateway(SubnetId=subnet, AllocationId=ids["eip"],
                                        TagSpecifications=spec("natgateway", stack))[
        "NatGateway"]["NatGatewayId"]
    ids["rt_public"] = ec2.create_route_table(
        VpcId=vpc, TagSpecifications=spec("route-table", stack))["RouteTable"]["RouteTableId"]
    ec2.create_route(RouteTableId=ids["rt_public"], DestinationCidrBlock="0.0.0.0/0",
                     GatewayId=ids["igw"])
    ids["rt_private"] = ec2.create_route_table(
        VpcId=vpc, TagSpecifications=spec("route-table", stack))["RouteTable"]["RouteTableId"]
    ec2.create_route(RouteTableId=ids["rt_private"], DestinationCidrBlock="0.0.0.0/0",
                     NatGatewayId=ids["nat"])
    ids["endpoint"] = ec2.create_vpc_endpoint(
        VpcId=vpc, ServiceName=f"com.amazonaws.{REGION}.ecr.api", VpcEndpointType="Interface",
        SubnetIds=[subnet], TagSpecifications=spec("vpc-endpoint", stack))[
        "VpcEndpoint"]["VpcEndpointId"]
    ids["vpc"] = vpc

    prefix = f"mlplatform-{stack}"
    trust = json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
        "Action": "sts:AssumeRole"}]})
    ids["role"] = iam.create_role(RoleName=f"{prefix}-node", AssumeRolePolicyDocument=trust,
                                  Tags=kv(stack))["Role"]["RoleName"]
    policy = iam.create_policy(PolicyName=f"{prefix}-ecr-pull", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "ecr:BatchGetImage",
                                                 "Resource": "*"}]}))["Policy"]["Arn"]
    iam.attach_role_policy(RoleName=ids["role"], PolicyArn=policy)
    iam.put_role_policy(RoleName=ids["role"], PolicyName="artifacts", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObject",
                                                 "Resource": "*"}]}))
    ids["profile"] = iam.create_instance_profile(
        InstanceProfileName=f"{prefix}-node", Tags=kv(stack))["InstanceProfile"][
        "InstanceProfileName"]
    iam.add_role_to_instance_profile(InstanceProfileName=ids["profile"], RoleName=ids["role"])
    iam.create_user(UserName=f"{prefix}-ci", Tags=kv(stack))
    ids["access_key"] = iam.create_access_key(UserName=f"{prefix}-ci")["AccessKey"][
        "AccessKeyId"]

    plain = tags(stack)
    ids["log_forever"] = f"/mlplatform/{stack}/app"
    logs.create_log_group(logGroupName=ids["log_forever"], tags=plain)
    ids["log_kept"] = f"/mlplatform/{stack}/flow-logs"
    logs.create_log_group(logGroupName=ids["log_kept"], tags=plain)
    logs.put_retention_policy(logGroupName=ids["log_kept"], retentionInDays=7)
    ids["log_temp"] = f"/mlplatform/{stack}/scratch"
    logs.create_log_group(logGroupName=ids["log_temp"], tags={**plain, "lifecycle": "temporary"})

    ids["bucket"] = f"{prefix}-artifacts-bucket-4f2a1b"
    s3.create_bucket(Bucket=ids["bucket"],
                     CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.put_bucket_tagging(Bucket=ids["bucket"], Tagging={"TagSet": kv(
        stack, Name=f"{prefix}-artifacts-bucket")})
    s3.put_bucket_lifecycle_configuration(Bucket=ids["bucket"], LifecycleConfiguration={
        "Rules": [{"ID": "noncurrent", "Status": "Enabled", "Filter": {"Prefix": ""},
                   "NoncurrentVersionExpiration": {"NoncurrentDays": 30}}]})
    for key, body in ARCHIVE.items():
        s3.put_object(Bucket=ids["bucket"], Key=key.replace("/staging/", f"/{stack}/"),
                      Body=body)
    s3.put_object(Bucket=ids["bucket"], Key="checkpoints/run-1/step-10.pt", Body=b"weights")

    ids["vol_temp"] = ec2.create_volume(Size=5, AvailabilityZone=f"{REGION}a",
                                        TagSpecifications=spec("volume", stack,
                                                               lifecycle="temporary"))["VolumeId"]
    ids["snap_temp"] = ec2.create_snapshot(
        VolumeId=ids["vol_temp"], TagSpecifications=spec("snapshot", stack,
                                                         lifecycle="temporary"))["SnapshotId"]

    ids["db"] = f"{prefix}-controlplane"
    rds.create_db_instance(DBInstanceIdentifier=ids["db"], DBInstanceClass="db.t4g.medium",
                           Engine="postgres", AllocatedStorage=20, MasterUsername="controlplane",
                           MasterUserPassword="not-a-secret-1", BackupRetentionPeriod=7,
                           Tags=kv(stack))
    ids["db_snapshot"] = rds.create_db_snapshot(
        DBInstanceIdentifier=ids["db"], DBSnapshotIdentifier=f"{prefix}-before-retire",
        Tags=kv(stack))["DBSnapshot"]["DBSnapshotIdentifier"]
    return ids


def account(aws: Aws) -> dict[str, Any]:
    """Everything the command could change, as comparable data."""
    ec2, iam, logs, s3, rds = aws.ec2, aws.iam, aws.logs, aws.s3, aws.rds
    roles = {}
    for role in iam.list_roles()["Roles"]:
        name = role["RoleName"]
        roles[name] = (sorted(p["PolicyArn"] for p in
                              iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]),
                       sorted(iam.list_role_policies(RoleName=name)["PolicyNames"]))
    buckets = {}
    for b in s3.list_buckets()["Buckets"]:
        name = b["Name"]
        buckets[name] = (s3.get_bucket_lifecycle_configuration(Bucket=name)["Rules"],
                         sorted(o["Key"] for o in s3.list_objects_v2(Bucket=name)["Contents"]))
    return {
        "routes": {t["RouteTableId"]: sorted(json.dumps(r, sort_keys=True) for r in t["Routes"])
                   for t in ec2.describe_route_tables()["RouteTables"]},
        "nats": {n["NatGatewayId"]: n["State"] for n in ec2.describe_nat_gateways()["NatGateways"]},
        "eips": sorted(a["AllocationId"] for a in ec2.describe_addresses()["Addresses"]),
        "igws": {g["InternetGatewayId"]: g["Attachments"]
                 for g in ec2.describe_internet_gateways()["InternetGateways"]},
        "endpoints": {e["VpcEndpointId"]: e["State"]
                      for e in ec2.describe_vpc_endpoints()["VpcEndpoints"]},
        "volumes": sorted(v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]),
        "snapshots": sorted(s["SnapshotId"] for s in
                            ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]),
        "roles": roles,
        "profiles": {p["InstanceProfileName"]: [r["RoleName"] for r in p["Roles"]]
                     for p in iam.list_instance_profiles()["InstanceProfiles"]},
        "keys": {u["UserName"]: sorted(k["AccessKeyId"] for k in iam.list_access_keys(
            UserName=u["UserName"])["AccessKeyMetadata"]) for u in iam.list_users()["Users"]},
        "logs": {g["logGroupName"]: g.get("retentionInDays")
                 for g in logs.describe_log_groups()["logGroups"]},
        "buckets": buckets,
        "db": sorted(i["DBInstanceIdentifier"] for i in rds.describe_db_instances()["DBInstances"]),
        "db_snapshots": sorted(s["DBSnapshotIdentifier"] for s in
                               rds.describe_db_snapshots()["DBSnapshots"]),
    }


def only(state: dict[str, Any], ids: dict[str, str]) -> dict[str, Any]:
    """The part of an account() state that belongs to the seeded ids of one stack."""
    wanted = set(ids.values()) | {f"mlplatform-{OTHER}-ci"}
    return {kind: ({k: v for k, v in items.items() if k in wanted} if isinstance(items, dict)
                   else [i for i in items if i in wanted])
            for kind, items in state.items()}


def run(aws: Aws, *args: str) -> Result:
    return CliRunner().invoke(cli.infra_group, ["decommission", "--endpoint-url", aws.endpoint,
                                                *args])


def report(evidence: Path) -> dict[str, Any]:
    return json.loads((evidence / decommission.REPORT_NAME).read_text())


def changes(rep: dict[str, Any]) -> list[tuple[int, str, str]]:
    return [(s["step"], c["verb"], c["resource"]) for s in rep["steps"] for c in s["changes"]]


@pytest.fixture()
def two_stacks(aws: Aws) -> tuple[dict[str, str], dict[str, str]]:
    return seed(aws, RETIRED, "10.20"), seed(aws, OTHER, "10.10")


def test_dry_run_then_retire_in_order_leaving_the_other_stack_untouched(
        aws: Aws, two_stacks: tuple[dict[str, str], dict[str, str]], tmp_path: Path) -> None:
    ids, other = two_stacks
    before = account(aws)
    dry = run(aws, "--stack", RETIRED, "--evidence-dir", str(tmp_path / "dry"), "--dry-run")
    assert dry.exit_code == cli.EXIT_DRIFT, dry.output
    assert account(aws) == before  # the dry run changed nothing
    assert sorted(p.name for p in (tmp_path / "dry").iterdir()) == [decommission.REPORT_NAME]
    planned = report(tmp_path / "dry")
    assert planned["dry_run"] and {s["status"] for s in planned["steps"]} == {"planned"}
    assert f"would release-address {ids['eip']}" in dry.stdout
    assert f"would delete-role {ids['role']}" in dry.stdout

    evidence = tmp_path / "evidence"
    result = run(aws, "--stack", RETIRED, "--evidence-dir", str(evidence), "--yes")
    # the database is pulumi destroy's: the one survivor, named
    assert result.exit_code == cli.EXIT_DRIFT, result.output
    rep = report(evidence)
    # what the dry run printed is what the run did, change for change, and it predicted the
    # survivors
    assert [s["changes"] for s in planned["steps"]] == [s["changes"] for s in rep["steps"]]
    assert planned["survivors"] == rep["survivors"]
    assert [line.replace("  would ", "  ") for line in dry.stdout.splitlines()
            if line.startswith("  would ")] == [line for line in result.stdout.splitlines()
                                               if line.startswith("  ") and "rds-instance"
                                               not in line]
    assert rep["result"] == "survivors"
    assert [(s["kind"], s["resource"]) for s in rep["survivors"]] == [("rds-instance", ids["db"])]
    assert f"rds-instance                 {ids['db']}" in result.stdout
    assert [s["status"] for s in rep["steps"]] == ["done"] * 5 + ["failed"]

    after = account(aws)
    # (1) evidence: every archived object, byte for byte, with a manifest; restore points
    manifest = json.loads((evidence / "manifest.json").read_text())
    assert manifest["bucket"] == ids["bucket"]
    files = {f["path"]: f for f in manifest["files"]}
    assert set(files) == set(ARCHIVE) | {decommission.RDS_EVIDENCE_NAME}
    for key, body in ARCHIVE.items():
        assert (evidence / key).read_bytes() == body
        assert files[key]["size"] == len(body)
        assert files[key]["sha256"] == hashlib.sha256(body).hexdigest()
    assert not (evidence / "checkpoints").exists()  # only the game-day archive is evidence
    restore = json.loads((evidence / decommission.RDS_EVIDENCE_NAME).read_text())
    assert [i["DBInstanceIdentifier"] for i in restore["instances"]] == [ids["db"]]
    assert restore["instances"][0]["BackupRetentionPeriod"] == 7
    assert ids["db_snapshot"] in {s["DBSnapshotIdentifier"] for s in restore["snapshots"]}
    assert files[decommission.RDS_EVIDENCE_NAME]["sha256"] == hashlib.sha256(
        (evidence / decommission.RDS_EVIDENCE_NAME).read_bytes()).hexdigest()
    # (2) identities
    assert ids["role"] not in after["roles"] and ids["profile"] not in after["profiles"]
    assert after["keys"][f"mlplatform-{RETIRED}-ci"] == []
    # (3) network: no route but the local one, NAT deleted, its address released, no IGW
    # attachment, no endpoint
    for table in (ids["rt_public"], ids["rt_private"]):
        assert [json.loads(r)["GatewayId"] for r in after["routes"][table]] == ["local"]
    assert after["nats"][ids["nat"]] == "deleted"
    assert ids["eip"] not in after["eips"]
    assert after["igws"][ids["igw"]] == []
    assert ids["endpoint"] not in after["endpoints"] or \
        after["endpoints"][ids["endpoint"]] in ("deleted", "deleting")
    # (4) retention: kept log groups have one (an existing one unchanged); the bucket
    # expires, its other rules kept
    assert after["logs"][ids["log_forever"]] == 365 and after["logs"][ids["log_kept"]] == 7
    rules, _ = after["buckets"][ids["bucket"]]
    assert [r["ID"] for r in rules] == ["noncurrent", decommission.LIFECYCLE_RULE_ID]
    assert rules[1]["Expiration"] == {"Days": 365}
    # (5) temporary data: gone; the retained database and its snapshot are not
    assert ids["log_temp"] not in after["logs"]
    assert ids["vol_temp"] not in after["volumes"] and ids["snap_temp"] not in after["snapshots"]
    assert ids["db"] in after["db"] and ids["db_snapshot"] in after["db_snapshots"]
    # the other stack: exactly as before
    assert only(after, other) == only(before, other)
    assert only(before, other)["roles"]  # the comparison compared something

    # the order: evidence, identities, network (endpoints, routes, NAT, address, gateway)...
    done = changes(rep)
    assert [step for step, _, _ in done] == sorted(step for step, _, _ in done)
    network = [verb for step, verb, _ in done if step == 3]
    assert network == ["delete-vpc-endpoint", "delete-route", "delete-route",
                       "delete-nat-gateway", "release-address", "detach-internet-gateway"]

    # after `pulumi destroy` (the database, here by hand): verified retired
    aws.rds.delete_db_instance(DBInstanceIdentifier=ids["db"], SkipFinalSnapshot=True)
    verified = run(aws, "--stack", RETIRED, "--evidence-dir", str(tmp_path / "verify"),
                   "--verify-only")
    assert verified.exit_code == 0, verified.output
    assert report(tmp_path / "verify")["result"] == "retired"
    assert [s["status"] for s in report(tmp_path / "verify")["steps"]] == ["skipped"] * 5 + [
        "done"]


def test_every_billable_survivor_fails_verification_naming_it(aws: Aws, tmp_path: Path) -> None:
    ec2 = aws.ec2
    vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16",
                         TagSpecifications=spec("vpc", RETIRED))["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.20.{i}.0/24",
                                 AvailabilityZone=f"{REGION}{az}")["Subnet"]["SubnetId"]
               for i, az in enumerate("ab")]
    image = ec2.register_image(Name="base", RootDeviceName="/dev/sda1")["ImageId"]
    instance = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, SubnetId=subnets[0],
                                 TagSpecifications=spec("instance", RETIRED))[
        "Instances"][0]["InstanceId"]
    volume = ec2.create_volume(Size=50, AvailabilityZone=f"{REGION}a",
                               TagSpecifications=spec("volume", RETIRED))["VolumeId"]
    snapshot = ec2.create_snapshot(VolumeId=volume,
                                   TagSpecifications=spec("snapshot", RETIRED))["SnapshotId"]
    eip = ec2.allocate_address(Domain="vpc",
                               TagSpecifications=spec("elastic-ip", RETIRED))["AllocationId"]
    # untagged, but in the stack's VPC: still the stack's
    nat = ec2.create_nat_gateway(SubnetId=subnets[0], AllocationId=ec2.allocate_address(
        Domain="vpc")["AllocationId"])["NatGateway"]["NatGatewayId"]
    lb = aws.elbv2.create_load_balancer(Name="forgotten", Subnets=subnets, Tags=kv(RETIRED))[
        "LoadBalancers"][0]["LoadBalancerArn"]
    aws.logs.create_log_group(logGroupName="/mlplatform/staging/forever", tags=tags(RETIRED))
    aws.logs.create_log_group(logGroupName="/mlplatform/staging/kept", tags=tags(RETIRED))
    aws.logs.put_retention_policy(logGroupName="/mlplatform/staging/kept", retentionInDays=30)
    aws.rds.create_db_instance(DBInstanceIdentifier="staging-db", DBInstanceClass="db.t4g.medium",
                               Engine="postgres", AllocatedStorage=20, MasterUsername="cp",
                               MasterUserPassword="not-a-secret-1", Tags=kv(RETIRED))
    aws.eks.create_cluster(name="mlplatform-staging", roleArn="arn:aws:iam::123456789012:role/eks",
                           resourcesVpcConfig={"subnetIds": subnets}, tags=tags(RETIRED))
    aws.eks.create_cluster(name="mlplatform-dev", roleArn="arn:aws:iam::123456789012:role/eks",
                           resourcesVpcConfig={"subnetIds": subnets}, tags=tags(OTHER))
    # the other stack's: never listed
    ec2.create_volume(Size=1, AvailabilityZone=f"{REGION}a", TagSpecifications=spec("volume", OTHER))
    aws.logs.create_log_group(logGroupName="/mlplatform/dev/forever", tags=tags(OTHER))

    result = run(aws, "--stack", RETIRED, "--evidence-dir", str(tmp_path / "e"), "--verify-only")
    assert result.exit_code == cli.EXIT_DRIFT, result.output
    survivors = {(s["kind"], s["resource"]) for s in report(tmp_path / "e")["survivors"]}
    assert survivors == {("ec2-instance", instance), ("ebs-volume", volume),
                         ("ebs-snapshot", snapshot), ("elastic-ip", eip), ("nat-gateway", nat),
                         ("load-balancer", lb), ("eks-cluster", "mlplatform-staging"),
                         ("log-group-without-retention", "/mlplatform/staging/forever"),
                         ("rds-instance", "staging-db")}
    for _, resource in survivors:
        assert resource in result.stdout
    assert "[6/6] verify nothing billable is left: 9 billable resource(s)" in result.stdout


def test_prod_is_refused_without_allow_prod(aws: Aws, tmp_path: Path) -> None:
    refused = run(aws, "--stack", "prod", "--evidence-dir", str(tmp_path / "e"), "--yes")
    assert refused.exit_code == 1
    assert ("refused: stack prod is environment prod (Pulumi.prod.yaml: "
            "mlplatform:environment); give --allow-prod") in refused.output
    assert not (tmp_path / "e").exists()  # refused before anything, even the report
    # allowed: it starts, and stops at step 1 naming what is missing (nothing seeded)
    allowed = run(aws, "--stack", "prod", "--evidence-dir", str(tmp_path / "e"), "--dry-run",
                  "--allow-prod")
    assert allowed.exit_code == 1
    assert "step 1 (export evidence) failed: artifact bucket: 0 bucket(s) tagged " \
        "project=mlplatform, stack=prod, Name=mlplatform-prod-artifacts-bucket" in allowed.output
    assert [s["status"] for s in report(tmp_path / "e")["steps"]] == ["failed"] + ["not-run"] * 5


def test_a_crash_mid_way_keeps_the_record_so_far(aws: Aws, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    ids = seed(aws, RETIRED, "10.20")

    def crash(*_: Any) -> None:
        raise RuntimeError("lost the connection")

    monkeypatch.setattr(decommission, "_wait_nat_deleted", crash)
    result = run(aws, "--stack", RETIRED, "--evidence-dir", str(tmp_path / "e"), "--yes")
    assert result.exit_code == 1 and isinstance(result.exception, RuntimeError)
    rep = report(tmp_path / "e")
    assert [s["status"] for s in rep["steps"]] == ["done", "done", "failed"] + ["not-run"] * 3
    assert rep["steps"][2]["error"] == "RuntimeError: lost the connection"
    # the changes made before the crash are on record; the NAT deletion that crashed is not
    assert [c["verb"] for c in rep["steps"][2]["changes"]] == [
        "delete-vpc-endpoint", "delete-route", "delete-route"]
    assert rep["finished"] and rep["result"] == "error"
    assert (tmp_path / "e" / "manifest.json").is_file()
    assert ids["role"] not in {r["RoleName"] for r in aws.iam.list_roles()["Roles"]}


def test_stack_resolution_and_usage(aws: Aws, tmp_path: Path) -> None:
    app = run(aws, "--stack", "staging-app", "--dry-run")
    assert app.exit_code == 1
    assert "Pulumi.staging-app.yaml: stack staging-app is an application stack" in app.output
    assert "retire its platform stack 'staging' instead" in app.output
    missing = run(aws, "--stack", "qa", "--dry-run")
    assert missing.exit_code == 1 and "Pulumi.qa.yaml: no such stack file; stacks here: " \
        "dev, dev-app, prod, prod-app, staging, staging-app" in missing.output
    (tmp_path / "Pulumi.qa.yaml").write_text(
        "config:\n  aws:region: eu-west-1\n  aws:defaultTags:\n    tags: {project: mlplatform}\n")
    untagged = run(aws, "--stack", "qa", "--dry-run", "--work-dir", str(tmp_path))
    assert "Pulumi.qa.yaml: aws:defaultTags.tags lacks stack, environment" in untagged.output
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    busy = run(aws, "--stack", RETIRED, "--dry-run", "--evidence-dir", str(tmp_path / "full"))
    assert busy.exit_code == 1 and "is not empty" in busy.output
    bad = run(aws, "--stack", RETIRED, "--dry-run", "--retain-days", "10",
              "--evidence-dir", str(tmp_path / "r"))
    assert bad.exit_code == 1 and "--retain-days 10: CloudWatch Logs accepts only" in bad.output
    unconfirmed = run(aws, "--stack", RETIRED, "--evidence-dir", str(tmp_path / "c"))
    assert unconfirmed.exit_code == 1 and "Aborted" in unconfirmed.output
    assert not (tmp_path / "c").exists()
    assert run(aws, "--help").exit_code == 0

"""`gameday infra inventory` (operations/inventory.py, provisioning/render.py, operations/tagged.py).

Declared inventory: the program rendered offline by the product's renderer; each row's
fields are the tags the resource carries, its availability objective the one slo/specs give
its data class. Live comparison: against a real moto server seeded with declared, undeclared,
untagged and Karpenter-launched resources."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from click.testing import CliRunner
from pulumi_policy import PolicyProviderResource, ResourceValidationArgs

from operations import cli, inventory
from provisioning import render
from provisioning.components.common import REQUIRED_TAGS, DataClass
from provisioning.config import PROJECT_ROOT, ConfigError
from provisioning.objectives import DATA_CLASS_FAILURE_CLASSES
from provisioning.policies import required_tags
from slo.specs import load_specs
from tests.infra.harness import run_program, stack_config
from tests.infra.motoserver import fresh_session
from tests.infra.test_policies_and_schema import OPTS

REGION = "eu-west-1"
STACK_FILES = sorted(p.name for p in PROJECT_ROOT.glob("Pulumi.*.yaml"))


@pytest.fixture(scope="module")
def dev() -> render.Rendered:
    return render.render("dev")


@pytest.fixture(scope="module")
def rows(dev: render.Rendered) -> list[inventory.Row]:
    return inventory.declared_rows(dev)


# --- declared inventory ---------------------------------------------------------------------

def test_every_declared_resource_is_listed_once_with_every_field(
        dev: render.Rendered, rows: list[inventory.Row]) -> None:
    expected = [(r.type, r.name, r.stack) for r in dev.resources
                if not r.type.startswith(("pulumi:", "mlplatform:infra:"))]
    assert [(r.type, r.name, r.stack) for r in rows] == expected
    assert {r.stack for r in rows} == {"dev", "dev-app"}
    for row in rows:
        empty = [f for f in inventory.FIELDS if f != "tagged" and not getattr(row, f)]
        assert not empty, f"{row.type} {row.name}: empty {empty}"
        assert row.environment == "dev" and row.region == REGION
        assert row.provisioning_source == f"pulumi:mlplatform/{row.stack}"


def _seconds(text: str) -> float:
    value, unit = re.fullmatch(r"(\d+)([smh]?)", text).groups()  # type: ignore[union-attr]
    return int(value) * {"s": 1, "m": 60, "h": 3600, "": 1}[unit]


def test_availability_objective_comes_from_the_recovery_objectives_of_the_data_class(
        rows: list[inventory.Row]) -> None:
    recovery = load_specs(env="dev").recovery_objectives
    seen = set()
    for row in rows:
        data = DataClass(row.data_class)
        seen.add(data)
        rto, rpo = re.fullmatch(r"rto=(\w+)/rpo=(\w+)", row.availability_objective).groups()  # type: ignore[union-attr]
        served = [recovery[fc] for fc in DATA_CLASS_FAILURE_CLASSES[data]]
        assert _seconds(rto) == min(o.rto_seconds for o in served), row
        assert _seconds(rpo) == min(o.restore_point_seconds or 0 for o in served), row
    # the data stores say what they hold
    by_type = {r.type: r.data_class for r in rows}
    assert by_type["aws:rds/instance:Instance"] == DataClass.CONTROL_PLANE_STATE.value
    # the artifact bucket holds artifacts; the deploy runner's source bucket is platform
    buckets = {r.name: r.data_class for r in rows if r.type == "aws:s3/bucket:Bucket"}
    assert {n: c for n, c in buckets.items() if "-artifacts" in n} == {
        "mlplatform-dev-artifacts-bucket": DataClass.ARTIFACTS.value}
    assert by_type["aws:ecr/repository:Repository"] == DataClass.IMAGES.value
    assert by_type["aws:kms/key:Key"] == DataClass.ENCRYPTION_KEYS.value
    assert {DataClass.PLATFORM, DataClass.TELEMETRY} <= seen
    db = next(r for r in rows if r.type == "aws:rds/instance:Instance")
    assert db.retirement_condition == "after-evidence-export"


def test_resources_without_aws_tags_show_the_stack_defaults(rows: list[inventory.Row]) -> None:
    k8s = [r for r in rows if r.type.startswith("kubernetes:")]
    assert k8s and not any(r.tagged for r in k8s)
    vpc = next(r for r in rows if r.type == "aws:ec2/vpc:Vpc")
    assert vpc.tagged and vpc.owner == stack_config("dev")["mlplatform:owner"]


def test_a_resource_in_another_region_is_listed_in_its_providers_region() -> None:
    # the platform layer alone: the replica bucket and its provider are declared there
    config = render.read_stack_config("prod")
    resources, _ = render.run_stack("prod", config, render.OfflineMocks())
    rows = inventory.declared_rows(render.Rendered("prod", "prod-app", resources,
                                                   configs={"prod": config}))
    replica = stack_config("prod")["mlplatform:artifacts"]["replicaRegion"]
    buckets = {r.name: r.region for r in rows if r.type == "aws:s3/bucket:Bucket"}
    assert {n: r for n, r in buckets.items() if r != "eu-west-1"} == {
        "mlplatform-prod-artifacts-replica": replica}, buckets


def test_unknown_stack_and_bad_config_name_the_file_and_the_key(tmp_path: Path) -> None:
    with pytest.raises(render.RenderError, match=r"unknown stack 'nope': Pulumi.nope.yaml not "
                                                 r"found .*known stacks: dev, prod, staging"):
        render.render("nope")
    for name in ("Pulumi.dev.yaml", "Pulumi.dev-app.yaml"):
        shutil.copy(PROJECT_ROOT / name, tmp_path / name)
    doc = yaml.safe_load((tmp_path / "Pulumi.dev.yaml").read_text())
    doc["config"]["mlplatform:netwrok"] = doc["config"].pop("mlplatform:network")
    (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(render.RenderError, match=r"Pulumi.dev.yaml: unknown key\(s\) "
                                                 r"mlplatform:netwrok"):
        render.render("dev", tmp_path)
    (tmp_path / "Pulumi.dev.yaml").write_text("config: [")
    with pytest.raises(render.RenderError, match=r"Pulumi.dev.yaml: not valid YAML"):
        render.render("dev", tmp_path)


# --- tags: default tags carry the inventory's fields, the policy requires them ---------------

def _policy(provider_props: dict[str, Any]) -> list[str]:
    """required-tags on a child pulumi-eks creates without a tags input (an OIDC provider)."""
    found: list[str] = []
    provider = PolicyProviderResource("pulumi:providers:aws", provider_props, "urn:p", "default")
    args = ResourceValidationArgs("aws:iam/openIdConnectProvider:OpenIdConnectProvider",
                                  {"url": "https://oidc"}, "urn:x", "eks-oidc", OPTS, provider)
    required_tags.validate(args, lambda msg, urn=None: found.append(msg))
    return found


@pytest.mark.parametrize("name", STACK_FILES)
def test_every_stacks_default_tags_satisfy_the_policy(name: str) -> None:
    tags = yaml.safe_load((PROJECT_ROOT / name).read_text())["config"]["aws:defaultTags"]
    assert _policy({"defaultTags": tags}) == []
    assert set(REQUIRED_TAGS) <= set(tags["tags"])
    for dropped in ("data-class", "availability-objective", "provisioning-source",
                    "retirement-condition"):
        partial = {"tags": {k: v for k, v in tags["tags"].items() if k != dropped}}
        assert _policy({"defaultTags": partial}) == [f"missing required tags ['{dropped}']"]


def test_default_tags_that_disagree_with_the_objectives_are_refused() -> None:
    wrong = {"tags": {"availability-objective": "rto=1h/rpo=0"}}
    with pytest.raises(ConfigError, match=r"aws:defaultTags.tags.availability-objective is "
                                          r"'rto=1h/rpo=0', expected 'rto=30s/rpo=0'"):
        run_program("dev", {"aws:defaultTags": wrong}, layers=("platform",))


# --- live: a moto server seeded with what the account may hold --------------------------------

@pytest.fixture()
def session(moto: str, monkeypatch: pytest.MonkeyPatch) -> boto3.session.Session:
    # no AWS_ENDPOINT_URL: the endpoint reaches the code only as --endpoint-url
    return fresh_session(moto, monkeypatch, REGION, endpoint_env=False)


def _tags(**extra: str) -> list[dict[str, str]]:
    base = {**stack_config("dev")["aws:defaultTags"]["tags"], **extra}
    return [{"Key": k, "Value": v} for k, v in base.items()]


@pytest.fixture()
def seeded(session: boto3.session.Session, moto: str, rows: list[inventory.Row]) -> dict[str, str]:
    """Declared: the VPC and one ECR repository. Undeclared but tagged with the stack: a
    bucket, a security group and a queue (the queue only the tagging API finds). Untagged:
    an instance in the stack's VPC. Karpenter-launched: a tagged instance."""
    def client(name: str) -> Any:
        return session.client(name, endpoint_url=moto)

    ec2, s3, ecr, sqs = client("ec2"), client("s3"), client("ecr"), client("sqs")
    ids: dict[str, str] = {}
    vpc_name = next(r.name for r in rows if r.type == "aws:ec2/vpc:Vpc")
    repo_name = next(n for r in rows if r.type == "aws:ecr/repository:Repository"
                     for n in r.names if n.endswith("/controlplane"))
    ids["vpc"] = ec2.create_vpc(CidrBlock="10.10.0.0/16", TagSpecifications=[
        {"ResourceType": "vpc", "Tags": _tags(Name=vpc_name)}])["Vpc"]["VpcId"]
    ids["repo"] = ecr.create_repository(repositoryName=repo_name, tags=_tags(
        Name=repo_name))["repository"]["repositoryArn"]
    s3.create_bucket(Bucket="stray-bucket",
                     CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.put_bucket_tagging(Bucket="stray-bucket", Tagging={"TagSet": _tags()})
    ids["sg"] = ec2.create_security_group(
        GroupName="hand-made", Description="made by hand", VpcId=ids["vpc"],
        TagSpecifications=[{"ResourceType": "security-group", "Tags": _tags(Name="hand-made")}],
    )["GroupId"]
    queue = sqs.create_queue(QueueName="stray-queue",
                             tags={t["Key"]: t["Value"] for t in _tags()})["QueueUrl"]
    ids["queue"] = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    subnet = ec2.create_subnet(VpcId=ids["vpc"], CidrBlock="10.10.1.0/24",
                               AvailabilityZone=f"{REGION}a")["Subnet"]["SubnetId"]
    ids["subnet"] = subnet
    image = ec2.register_image(Name="base", RootDeviceName="/dev/sda1")["ImageId"]
    ids["untagged"] = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1,
                                        SubnetId=subnet)["Instances"][0]["InstanceId"]
    ids["karpenter"] = ec2.run_instances(
        ImageId=image, MinCount=1, MaxCount=1, SubnetId=subnet,
        TagSpecifications=[{"ResourceType": "instance", "Tags": _tags(**{
            "karpenter.sh/nodepool": "gpu", "Name": "gpu-node"})}])["Instances"][0]["InstanceId"]
    return ids


def _compare(session: boto3.session.Session, moto: str,
             rows: list[inventory.Row]) -> inventory.Comparison:
    return inventory.compare(rows, session, "mlplatform", ["dev", "dev-app"], endpoint_url=moto)


def test_live_reports_undeclared_missing_and_untagged(
        session: boto3.session.Session, moto: str, rows: list[inventory.Row],
        seeded: dict[str, str]) -> None:
    found = _compare(session, moto, rows)
    undeclared = {i.arn for i in found.undeclared}
    assert undeclared == {"arn:aws:s3:::stray-bucket", seeded["queue"],
                          f"arn:aws:ec2:{REGION}:123456789012:security-group/{seeded['sg']}"}
    # the declared VPC and repository are matched, not undeclared and not missing
    assert not any(seeded["vpc"] in a or a == seeded["repo"] for a in undeclared)
    missing = {(r.type, r.name) for r in found.missing}
    assert not any(t in ("aws:ec2/vpc:Vpc",) for t, _ in missing)
    assert not any(n.endswith("controlplane") for t, n in missing
                   if t == "aws:ecr/repository:Repository")
    # declared and never created here: every subnet, the cluster, the database
    declared_subnets = {r.name for r in rows if r.type == "aws:ec2/subnet:Subnet"}
    assert declared_subnets <= {n for _, n in missing}
    assert {"eks:index:Cluster", "aws:rds/instance:Instance"} <= {t for t, _ in missing}
    assert found.matched == 2
    # untagged in the stack's VPC: the bare instance (and its disk and interface), and the
    # hand-made subnet is not looked at (subnets are not in untagged_in_vpcs' kinds)
    untagged = {i.arn for i in found.untagged}
    assert seeded["untagged"] in untagged
    assert seeded["karpenter"] not in untagged and seeded["sg"] not in untagged
    # Karpenter's instance carries the stack's tags but is attributed, not undeclared
    assert [i.reason for i in found.attributed] == ["launched for karpenter.sh/nodepool=gpu"]
    assert not found.clean


def test_live_cli_json_and_exit_code(session: boto3.session.Session, moto: str,
                                     dev: render.Rendered, seeded: dict[str, str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(render, "render", lambda stack: dev)  # rendered once per module
    result = CliRunner().invoke(cli.infra_group, [
        "inventory", "--stack", "dev", "--live", "--json", "--endpoint-url", moto,
        "--region", REGION])
    assert result.exit_code == 3, result.output
    doc = json.loads(result.stdout)
    assert doc["stack"] == "dev" and doc["app_stack"] == "dev-app"
    assert len(doc["resources"]) == len(inventory.declared_rows(dev))
    assert set(doc["resources"][0]) >= set(inventory.FIELDS)
    assert "arn:aws:s3:::stray-bucket" in {i["arn"] for i in doc["live"]["undeclared"]}
    assert seeded["untagged"] in {i["arn"] for i in doc["live"]["untagged"]}


def test_cli_table_help_and_errors(dev: render.Rendered, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    help_text = runner.invoke(cli.infra_group, ["inventory", "--help"]).output
    for option in ("--stack", "--json", "--live", "--endpoint-url", "--region"):
        assert option in help_text
    result = runner.invoke(cli.infra_group, ["inventory", "--stack", "nope"])
    assert result.exit_code == 1 and "unknown stack 'nope'" in result.output
    monkeypatch.setattr(render, "render", lambda stack: dev)
    monkeypatch.setenv("COLUMNS", "250")
    result = runner.invoke(cli.infra_group, ["inventory", "--stack", "dev"])
    assert result.exit_code == 0, result.output
    assert f"stack dev: {len(inventory.declared_rows(dev))} declared resources" in result.output
    assert "control-plane-state" in result.output

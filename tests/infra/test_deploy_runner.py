"""The in-VPC deploy runner (provisioning/components/deploy_runner.py) rendered under Pulumi mocks:
its wiring (security groups, subnets, repositories, access entry), the offline deployability
checks and policies on what it declares, and the buildspecs it ships."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pulumi
import pytest
import yaml
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from operations.deploy import DIGEST_VARIABLES
from provisioning import deployability as d
from provisioning.components import deploy_runner as dr
from provisioning.components.common import Naming
from provisioning.components.registry import Registry
from provisioning.config import DeployRunnerConfig, RegistryConfig, parse_stack_config
from provisioning.objectives import availability_objectives
from provisioning.render import merge
from tests.infra.harness import (
    ACCOUNT,
    PROJECT,
    NoRefsMonitor,
    PlatformMocks,
    Resource,
    Run,
    objectives_for,
    stack_config,
)
from tests.infra.test_policies_and_schema import violations

REGION = "eu-west-1"
SUBNETS = ["subnet-private-a", "subnet-private-b"]
CLUSTER_SG = "sg-cluster"
KEY = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/data"
STATE = "s3://mlplatform-pulumi-state-staging/team-a"
EXPORTS: dict[str, Any] = {}


def _program(backend: str, repos: tuple[str, ...]) -> Callable[[], None]:
    def program() -> None:
        naming = Naming(PROJECT, "staging", "staging", "ml-platform", "ml-1001",
                        availability_objectives(objectives_for("staging").recovery))
        registry = Registry("ecr", RegistryConfig(repositories=["controlplane", "gameday",
                                                                "workloads/trainer"]),
                            naming, KEY)
        runner = dr.DeployRunner(
            "runner", DeployRunnerConfig(enabled=True, backend_url=backend, timeout_minutes=90),
            naming, REGION, ACCOUNT, "vpc-1", list(SUBNETS), naming.prefix, CLUSTER_SG,
            {r: registry.repositories[r] for r in repos}, KEY)
        pulumi.Output.all(**dr.deploy_runner_exports(runner)).apply(EXPORTS.update)
    return program


def _stack_program(stack: str, patch: dict[str, Any] | None = None) -> Callable[[], None]:
    """How the platform program wires the runner, from the stack's real config (deep-merged
    with ``patch``; a None value deletes a key)."""
    def program() -> None:
        raw = {k.split(":", 1)[1]: v for k, v in merge(stack_config(stack), patch or {}).items()
               if k.startswith(f"{PROJECT}:")}
        cfg = parse_stack_config(raw, f"Pulumi.{stack}.yaml")
        naming = Naming(PROJECT, stack, cfg.environment.value, cfg.owner, cfg.cost_center,
                        availability_objectives(objectives_for(cfg.environment.value).recovery))
        registry = Registry("ecr", cfg.registry, naming, KEY)
        if cfg.deploy_runner.enabled:
            dr.DeployRunner("runner", cfg.deploy_runner, naming, REGION, ACCOUNT, "vpc-1",
                            list(SUBNETS), naming.prefix, CLUSTER_SG,
                            dr.image_repositories(registry.repositories, cfg), KEY)
    return program


def render(backend: str = STATE, repos: tuple[str, ...] = ("controlplane", "gameday"),
           program: Callable[[], None] | None = None, stack: str = "staging") -> Run:
    """The harness's mock pattern (tests/infra/harness.py) around a small program."""
    asyncio.set_event_loop(asyncio.new_event_loop())
    pulumi.runtime.set_all_config({})
    pulumi.runtime.settings.set_root_resource(None)  # type: ignore[arg-type]
    monitor = NoRefsMonitor(PlatformMocks())
    pulumi.runtime.set_mocks(PlatformMocks(), project=PROJECT, stack=stack, preview=False,
                             monitor=monitor)
    EXPORTS.clear()
    _sync_await(run_pulumi_func(program or _program(backend, repos)))
    return Run(stack, [
        Resource(urn=reg.urn, type=reg.urn.split("::")[2].split("$")[-1],
                 name=reg.urn.split("::")[3], props=dict(reg.state), id=reg.id or "",
                 dependencies=monitor.dependencies.get(reg.urn, ()))
        for reg in monitor.get_registered_resources().values()])


@pytest.fixture(scope="module")
def run() -> Run:
    return render()


def _policy(run: Run, role: str) -> list[dict[str, Any]]:
    doc = run.one("aws:iam/rolePolicy:RolePolicy", f"runner-{role}").props["policy"]
    return json.loads(doc)["Statement"]


def _granted(statements: list[dict[str, Any]], action: str) -> list[str]:
    out: list[str] = []
    for st in statements:
        actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
        if action in actions:
            out += [st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"]
    return out


def test_private_endpoint_reachable_only_from_the_runner(run: Run) -> None:
    rule = run.one("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    runner_sg = run.one("aws:ec2/securityGroup:SecurityGroup", "runner-sg")
    assert rule.props["securityGroupId"] == CLUSTER_SG
    assert rule.props["referencedSecurityGroupId"] == runner_sg.id
    assert (rule.props["ipProtocol"], rule.props["fromPort"], rule.props["toPort"]) == ("tcp", 443, 443)
    assert not runner_sg.props.get("ingress"), "the runner accepts no inbound traffic"


def test_projects_run_in_the_private_subnets_with_the_runner_sg(run: Run) -> None:
    runner_sg = run.one("aws:ec2/securityGroup:SecurityGroup", "runner-sg")
    bucket = run.one("aws:s3/bucket:Bucket", "runner-source")
    logs = run.one("aws:cloudwatch/logGroup:LogGroup")
    for kind, privileged in (("image", True), ("deploy", False)):
        project = run.one("aws:codebuild/project:Project", f"runner-{kind}")
        vpc = project.props["vpcConfig"]
        assert vpc["subnets"] == SUBNETS and vpc["securityGroupIds"] == [runner_sg.id]
        assert project.props["name"] == f"mlplatform-staging-{kind}"
        assert project.props["source"]["type"] == "S3"
        assert project.props["source"]["location"].startswith(f"{bucket.id}/source/")
        assert project.props["logsConfig"]["cloudwatchLogs"]["groupName"] == logs.props["name"]
        assert project.props["buildTimeout"] == 90
        assert bool(project.props["environment"].get("privilegedMode")) is privileged
        role = run.one("aws:iam/role:Role", f"runner-{kind}")
        assert project.props["serviceRole"] == role.props["arn"]


def test_image_role_covers_exactly_the_given_repositories(run: Run) -> None:
    repos = {r.props["name"]: r.props["arn"] for r in run.of_type("aws:ecr/repository:Repository")}
    pushed = _granted(_policy(run, "image"), "ecr:PutImage")
    assert sorted(pushed) == sorted([repos["mlplatform-staging/controlplane"],
                                     repos["mlplatform-staging/gameday"]])
    assert repos["mlplatform-staging/workloads/trainer"] not in str(_policy(run, "image"))
    assert _granted(_policy(run, "deploy"), "ecr:PutImage") == [], "deploy pushes no image"
    only_cp = render(repos=("controlplane",))
    assert _granted(_policy(only_cp, "image"), "ecr:PutImage") == [
        next(r.props["arn"] for r in only_cp.of_type("aws:ecr/repository:Repository")
             if r.props["name"].endswith("/controlplane"))]
    variables = {v["name"] for v in only_cp.one("aws:codebuild/project:Project", "runner-image")
                 .props["environment"]["environmentVariables"]}
    assert "REPOSITORY_GAMEDAY" not in variables and "REPOSITORY_CONTROLPLANE" in variables


def test_deploy_role_scope(run: Run) -> None:
    deploy = _policy(run, "deploy")
    secret = run.one("aws:secretsmanager/secret:Secret")
    assert _granted(deploy, "secretsmanager:GetSecretValue") == [secret.props["arn"]]
    assert _granted(_policy(run, "image"), "secretsmanager:GetSecretValue") == []
    assert _granted(deploy, "eks:DescribeCluster") == [
        f"arn:aws:eks:{REGION}:{ACCOUNT}:cluster/mlplatform-staging"]
    # state backend: the bucket listed only under the prefix, objects only under it
    assert _granted(deploy, "s3:PutObject") == ["arn:aws:s3:::mlplatform-pulumi-state-staging/team-a/*"]
    listing = next(st for st in deploy if st["Action"] == ["s3:ListBucket"])
    assert listing["Condition"]["StringLike"]["s3:prefix"] == ["team-a", "team-a/*"]
    # the application layer declares no AWS resource: no AWS write beyond state and logs
    assert _granted(deploy, "cloudwatch:PutMetricAlarm") == []
    assert _granted(deploy, "sns:CreateTopic") == []
    eni = next(st for st in deploy if st["Action"] == ["ec2:CreateNetworkInterfacePermission"])
    assert eni["Condition"]["StringEquals"]["ec2:Subnet"] == [
        f"arn:aws:ec2:{REGION}:{ACCOUNT}:subnet/{s}" for s in SUBNETS]
    logs = run.one("aws:cloudwatch/logGroup:LogGroup")
    assert _granted(deploy, "logs:PutLogEvents") == [logs.props["arn"] + ":*"]
    trust = json.loads(run.one("aws:iam/role:Role", "runner-deploy").props["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "codebuild.amazonaws.com"}


def test_pulumi_cloud_backend_needs_no_state_bucket_and_uses_the_token() -> None:
    cloud = render(backend="https://api.pulumi.com")
    assert _granted(_policy(cloud, "deploy"), "s3:PutObject") == []
    variables = {v["name"]: v for v in cloud.one("aws:codebuild/project:Project", "runner-deploy")
                 .props["environment"]["environmentVariables"]}
    assert variables["PULUMI_ACCESS_TOKEN"]["type"] == "SECRETS_MANAGER"
    assert "PULUMI_CONFIG_PASSPHRASE" not in variables


def test_secret_is_an_environment_variable_never_a_value(run: Run) -> None:
    secret = run.one("aws:secretsmanager/secret:Secret")
    assert secret.props["name"] == "mlplatform-staging/deploy-runner/pulumi"
    assert secret.props["kmsKeyId"] == KEY
    assert not run.of_type("aws:secretsmanager/secretVersion:SecretVersion"), \
        "the value is the operator's: it must never be in the Pulumi state"
    variables = {v["name"]: v for v in run.one("aws:codebuild/project:Project", "runner-deploy")
                 .props["environment"]["environmentVariables"]}
    assert variables["PULUMI_CONFIG_PASSPHRASE"] == {
        "name": "PULUMI_CONFIG_PASSPHRASE", "value": secret.props["name"], "type": "SECRETS_MANAGER"}
    assert variables["PULUMI_BACKEND_URL"]["value"] == STATE
    assert variables["APP_STACK"]["value"] == "staging-app"
    assert variables["PULUMI_VERSION"]["value"] == dr.PULUMI_VERSION
    deploy_spec = yaml.safe_load(dr._buildspec("deploy"))
    assert "PASSPHRASE" not in json.dumps(deploy_spec["phases"]), "never on a command line"


def test_access_entry_makes_the_deploy_role_cluster_admin(run: Run) -> None:
    entry = run.one("aws:eks/accessEntry:AccessEntry")
    assoc = run.one("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
    role = run.one("aws:iam/role:Role", "runner-deploy")
    assert entry.props["principalArn"] == role.props["arn"] == assoc.props["principalArn"]
    assert entry.props["clusterName"] == assoc.props["clusterName"] == "mlplatform-staging"
    assert assoc.props["policyArn"].endswith("/AmazonEKSClusterAdminPolicy")
    assert assoc.props["accessScope"] == {"type": "cluster"}


def test_offline_checks_and_policies_find_nothing(run: Run) -> None:
    findings = d.check_required(run.resources) + d.check_retention(run.resources)
    assert findings == [], "\n".join(map(str, findings))
    assert violations(run.resources) == []
    bucket = run.one("aws:s3/bucket:Bucket", "runner-source")
    lifecycle = run.one("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    assert lifecycle.props["bucket"] == bucket.id
    assert lifecycle.props["rules"][0]["expiration"]["days"] == dr.SOURCE_EXPIRY_DAYS


def test_exports_name_what_the_cli_reads(run: Run) -> None:
    assert EXPORTS["imageProject"] == "mlplatform-staging-image"
    assert EXPORTS["deployProject"] == "mlplatform-staging-deploy"
    assert EXPORTS["sourceBucket"] == run.one("aws:s3/bucket:Bucket", "runner-source").id
    assert EXPORTS["roleArn"] == run.one("aws:iam/role:Role", "runner-deploy").props["arn"]
    assert EXPORTS["logGroup"] == "/aws/codebuild/mlplatform-staging-deploy-runner"
    assert (EXPORTS["region"], EXPORTS["appStack"]) == (REGION, "staging-app")


def test_buildspecs_parse_and_export_the_digests() -> None:
    image = yaml.safe_load(dr._buildspec("image"))
    deploy = yaml.safe_load(dr._buildspec("deploy"))
    assert image["version"] == deploy["version"] == 0.2
    # what `gameday infra image` reads (operations/deploy.py), one per Dockerfile target; what
    # the buildspecs do with them runs in tests/infra/test_images.py
    assert image["env"]["exported-variables"] == list(DIGEST_VARIABLES.values()) == [
        "IMAGE_DIGEST_CONTROLPLANE", "IMAGE_DIGEST_GAMEDAY", "IMAGE_DIGEST_SERVING",
        "IMAGE_DIGEST_TRACKING"]
    commands = "\n".join(c for phase in deploy["phases"].values() for c in phase["commands"])
    assert "pulumi up --yes --non-interactive --stack \"$APP_STACK\"" in commands
    assert commands.index("config set") < commands.index("pulumi up")
    assert "pulumi==${PULUMI_VERSION}" in commands and "pulumi-v${PULUMI_VERSION}" in commands


def test_refuses_repositories_it_cannot_build() -> None:
    with pytest.raises(Exception, match="subset of"):
        render(repos=("controlplane", "workloads/trainer"))
    with pytest.raises(Exception, match="including 'controlplane'"):
        render(repos=("gameday",))


@pytest.mark.parametrize(("url", "expected"), [
    ("s3://state", [["arn:aws:s3:::state"], ["arn:aws:s3:::state/*"]]),
    ("s3://state/a/b?region=eu-west-1", [["arn:aws:s3:::state"], ["arn:aws:s3:::state/a/b/*"]]),
    ("https://api.pulumi.com", []),
])
def test_backend_statements(url: str, expected: list[list[str]]) -> None:
    assert [st["Resource"] for st in dr.backend_statements(url)] == expected


ALL_REPOSITORIES = {"REPOSITORY_CONTROLPLANE", "REPOSITORY_GAMEDAY", "REPOSITORY_SERVING",
                    "REPOSITORY_TRACKING"}


@pytest.mark.parametrize(("stack", "targets"), [
    ("dev", ALL_REPOSITORIES),  # private endpoint by default; serving and tracking set
    ("staging", ALL_REPOSITORIES),
    ("prod", ALL_REPOSITORIES),
])
def test_stack_configs_wire_the_runner(stack: str, targets: set[str] | None) -> None:
    run = render(program=_stack_program(stack), stack=stack)
    projects = run.of_type("aws:codebuild/project:Project")
    if targets is None:
        assert projects == []
        return
    image = run.one("aws:codebuild/project:Project", "runner-image")
    names = {v["name"] for v in image.props["environment"]["environmentVariables"]}
    assert {n for n in names if n.startswith("REPOSITORY_")} == targets
    deploy = run.one("aws:codebuild/project:Project", "runner-deploy")
    variables = {v["name"]: v["value"] for v in deploy.props["environment"]["environmentVariables"]}
    assert variables["PULUMI_BACKEND_URL"] == f"s3://mlplatform-pulumi-state-{stack}"
    assert variables["APP_STACK"] == f"{stack}-app"
    assert d.check_required(run.resources) + d.check_retention(run.resources) == []


@pytest.mark.parametrize(("patch", "built"), [
    ({}, {"controlplane", "gameday", "serving", "tracking"}),
    # (tracking is treated alike by built_targets; test_deploy_cli.py's --local test drops it)
    ({"mlplatform:serving": None}, {"controlplane", "gameday", "tracking"}),
    # an image from elsewhere: the registry's repository stays, nothing builds into it
    ({"mlplatform:serving": {"image": {"repository": "ghcr.io/x/server", "tag": "1"}}},
     {"controlplane", "gameday", "tracking"}),
])
def test_serving_and_tracking_are_built_only_where_the_stack_runs_them(
        patch: dict[str, Any], built: set[str]) -> None:
    """The image project gets a repository variable, and its role push rights, for exactly
    the targets the stack runs from its registry; and it is created after each of those
    repositories (mocks register in program order: the dependency is what the engine obeys)."""
    run = render(program=_stack_program("staging", patch))
    image = run.one("aws:codebuild/project:Project", "runner-image")
    variables = {v["name"]: v["value"] for v in image.props["environment"]["environmentVariables"]}
    repos = {r.props["name"].split("/", 1)[1]: r for r in run.of_type("aws:ecr/repository:Repository")}
    assert {n for n in variables if n.startswith("REPOSITORY_")} == {
        f"REPOSITORY_{t.upper()}" for t in built}
    for target in built:
        assert variables[f"REPOSITORY_{target.upper()}"] == repos[target].props["repositoryUrl"]
        assert repos[target].urn in image.dependencies, f"{target} repository before the project"
    assert sorted(_granted(_policy(run, "image"), "ecr:PutImage")) == sorted(
        repos[t].props["arn"] for t in built)

"""The in-VPC deploy path: where the cluster endpoint is private, the image build and the
application stack's `pulumi up` run in CodeBuild inside the VPC (docs/infra.md, "Deploy path").

Created by the platform stack. Two projects, each with its own role:

* ``<prefix>-image``: builds the Dockerfile's targets (``controlplane``, and ``gameday``,
  ``serving``, ``tracking`` where the stack has their repositories and runs them) from an uploaded
  source archive, pushes them to ECR and exports the pushed digests
  (``provisioning/buildspecs/image.yml``);
* ``<prefix>-deploy``: runs ``pulumi up --yes --stack <env>-app`` from the same kind of archive
  with the digests as environment overrides (``provisioning/buildspecs/deploy.yml``); only its role
  has a cluster access entry and the Pulumi secret.

The one operator step: set the value of the secret ``<prefix>/deploy-runner/pulumi`` (the
stacks' passphrase for an ``s3://`` backend, a Pulumi access token for ``https://``); the
program creates the secret without a value so it never enters the Pulumi state.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pulumi
import pulumi_aws as aws

from provisioning.components.common import TYPE_PREFIX, DataClass, Naming, child, policy_output
from provisioning.config import DeployRunnerConfig, StackConfig
from provisioning.deploy_contract import IMAGE_TARGETS, SOURCE_PREFIX, built_targets

BUILDSPECS = Path(__file__).resolve().parents[1] / "buildspecs"
# AWS-managed CodeBuild image (Ubuntu 22.04, Docker, AWS CLI, python 3.11 runtime), pinned by
# tag: the build environment changes only when this line does.
BUILD_IMAGE = "aws/codebuild/standard:7.0"
# Pulumi CLI and SDK in the deploy build, pinned together: the engine decides the plan and
# writes the state, so an unannounced CLI release must not change a production deploy; and the
# SDK never runs ahead of the CLI it talks to. Bump deliberately (same version as .venv's SDK).
PULUMI_VERSION = "3.272.0"
SOURCE_EXPIRY_DAYS = 30  # uploaded archives are inputs of one build; a month covers a re-run
LOG_RETENTION_DAYS = 30  # a value CloudWatch Logs accepts (provisioning.deployability)
EKS_ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"


def secret_variable(backend_url: str) -> str:
    """The environment variable the Pulumi CLI reads the secret from, by backend kind."""
    return "PULUMI_ACCESS_TOKEN" if backend_url.startswith("https://") else "PULUMI_CONFIG_PASSPHRASE"


def backend_statements(backend_url: str) -> list[dict[str, Any]]:
    """IAM statements for the state backend: an ``s3://bucket[/prefix]`` backend gets the
    state objects under the prefix; the Pulumi Cloud (``https://``) needs nothing in AWS."""
    parts = urlsplit(backend_url)
    if parts.scheme != "s3":
        return []
    bucket, prefix = parts.netloc, parts.path.strip("/")
    objects = f"arn:aws:s3:::{bucket}/{prefix + '/' if prefix else ''}*"
    listing: dict[str, Any] = {"Effect": "Allow", "Action": ["s3:ListBucket"],
                               "Resource": [f"arn:aws:s3:::{bucket}"]}
    if prefix:
        listing["Condition"] = {"StringLike": {"s3:prefix": [prefix, f"{prefix}/*"]}}
    return [
        listing,
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
         "Resource": [objects]},
    ]


def image_repositories(repositories: Mapping[str, aws.ecr.Repository],
                       cfg: StackConfig) -> dict[str, aws.ecr.Repository]:
    """The registry's repositories the image project pushes to (one per Dockerfile target the
    stack builds, ``built_targets``, and has a repository for): what to pass as
    ``DeployRunner(repositories=...)``."""
    return {t: repositories[t] for t in built_targets(cfg) if t in repositories}


def _buildspec(name: str) -> str:
    return (BUILDSPECS / f"{name}.yml").read_text()


class DeployRunner(pulumi.ComponentResource):
    source_bucket: pulumi.Output[str]
    log_group_name: pulumi.Output[str]
    security_group_id: pulumi.Output[str]
    role_arn: pulumi.Output[str]
    image_role_arn: pulumi.Output[str]
    secret_name: str
    image_project: pulumi.Output[str]
    deploy_project: pulumi.Output[str]
    region: str
    app_stack: str

    def __init__(
        self,
        name: str,
        cfg: DeployRunnerConfig,
        naming: Naming,
        region: str,
        account_id: pulumi.Input[str],
        vpc_id: pulumi.Input[str],
        private_subnet_ids: list[pulumi.Input[str]],
        cluster_name: pulumi.Input[str],
        cluster_security_group_id: pulumi.Input[str],
        repositories: Mapping[str, aws.ecr.Repository],
        kms_key_arn: pulumi.Input[str],
        app_stack: str | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:DeployRunner", name, None, opts)
        if cfg.backend_url is None:
            raise ValueError("DeployRunner needs deployRunner.backendUrl (the Pulumi state backend)")
        unknown = sorted(set(repositories) - set(IMAGE_TARGETS))
        if "controlplane" not in repositories or unknown:
            raise ValueError(f"DeployRunner repositories must be a subset of {IMAGE_TARGETS} "
                             f"including 'controlplane' (Dockerfile targets), got {sorted(repositories)}")
        p = naming.prefix
        self.region, self.app_stack = region, app_stack or f"{naming.stack}-app"

        def scoped(service: str, rest: pulumi.Input[str]) -> pulumi.Output[str]:
            """arn:aws:<service>:<region>:<account>:<rest>"""
            return pulumi.Output.concat(f"arn:aws:{service}:{region}:", account_id, ":", rest)

        # --- source bucket: archives uploaded by `gameday infra image|deploy` ---------------
        # force_destroy: the archives are copies of commits, nothing to keep when it goes
        bucket = aws.s3.Bucket(f"{name}-source", force_destroy=True,
                               tags=naming.tags(f"{name}-source"), opts=child(self))
        aws.s3.BucketPublicAccessBlock(
            f"{name}-source", bucket=bucket.id, block_public_acls=True, block_public_policy=True,
            ignore_public_acls=True, restrict_public_buckets=True, opts=child(self))
        aws.s3.BucketOwnershipControls(
            f"{name}-source", bucket=bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=child(self))
        versioning = aws.s3.BucketVersioning(
            f"{name}-source", bucket=bucket.id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(
                status="Enabled"),
            opts=child(self))
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-source", bucket=bucket.id,
            rules=[aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                    sse_algorithm="aws:kms", kms_master_key_id=kms_key_arn),
                bucket_key_enabled=True,
            )],
            opts=child(self))
        everything = aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix="")
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-source", bucket=bucket.id,
            rules=[aws.s3.BucketLifecycleConfigurationRuleArgs(
                id="expire-source-archives", status="Enabled", filter=everything,
                expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(
                    days=SOURCE_EXPIRY_DAYS),
                noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                    noncurrent_days=1),
                abort_incomplete_multipart_upload=aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
                    days_after_initiation=1),
            )],
            opts=child(self, depends_on=[versioning]))
        aws.s3.BucketPolicy(
            f"{name}-source", bucket=bucket.id,
            policy=policy_output([{
                "Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*",
                "Action": "s3:*",
                "Resource": [bucket.arn, pulumi.Output.concat(bucket.arn, "/*")],
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            }]),
            opts=child(self))

        # --- logs, network, secret --------------------------------------------------------
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-logs", name=f"/aws/codebuild/{p}-deploy-runner",
            retention_in_days=LOG_RETENTION_DAYS, kms_key_id=kms_key_arn,
            tags=naming.tags(f"{name}-logs", DataClass.TELEMETRY), opts=child(self))
        sg = aws.ec2.SecurityGroup(
            f"{name}-sg", vpc_id=vpc_id,
            description="CodeBuild deploy runner: no ingress; egress to ECR, S3, the EKS API, "
                        "PyPI and the Pulumi downloads",
            egress=[aws.ec2.SecurityGroupEgressArgs(
                protocol="-1", from_port=0, to_port=0, cidr_blocks=["0.0.0.0/0"])],
            tags=naming.tags(f"{name}-sg"), opts=child(self))
        # The private EKS endpoint answers only what the cluster security group admits.
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-eks-api", security_group_id=cluster_security_group_id,
            referenced_security_group_id=sg.id, ip_protocol="tcp", from_port=443, to_port=443,
            description="EKS API from the CodeBuild deploy runner",
            tags=naming.tags(f"{name}-eks-api"), opts=child(self))
        self.secret_name = f"{p}/deploy-runner/pulumi"
        secret = aws.secretsmanager.Secret(
            f"{name}-pulumi", name=self.secret_name, kms_key_id=kms_key_arn,
            description=f"{secret_variable(cfg.backend_url)} for the deploy runner; value set "
                        "by the operator (docs/infra.md, Deploy path)",
            recovery_window_in_days=7, tags=naming.tags(self.secret_name), opts=child(self))

        # --- roles ------------------------------------------------------------------------
        trust = policy_output([{
            "Effect": "Allow", "Principal": {"Service": "codebuild.amazonaws.com"},
            "Action": "sts:AssumeRole",
            # only CodeBuild acting for this account (confused deputy)
            "Condition": {"StringEquals": {"aws:SourceAccount": account_id}},
        }])
        subnet_arns = [scoped("ec2", pulumi.Output.concat("subnet/", s)) for s in private_subnet_ids]
        common = [
            # build logs, into this group only
            {"Effect": "Allow", "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
             "Resource": [pulumi.Output.concat(log_group.arn, ":*")]},
            # the uploaded source archives
            {"Effect": "Allow", "Action": ["s3:GetObject", "s3:GetObjectVersion"],
             "Resource": [pulumi.Output.concat(bucket.arn, "/", SOURCE_PREFIX, "*")]},
            {"Effect": "Allow", "Action": ["s3:GetBucketLocation", "s3:GetBucketAcl"],
             "Resource": [bucket.arn]},
            # VPC-attached builds (AWS CodeBuild user guide, "Allow CodeBuild access to AWS
            # services required to create a VPC network interface"): describe calls have no
            # resource-level permissions; the ENI permission is bound to our subnets.
            {"Effect": "Allow", "Action": [
                "ec2:CreateNetworkInterface", "ec2:DescribeDhcpOptions",
                "ec2:DescribeNetworkInterfaces", "ec2:DeleteNetworkInterface",
                "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups", "ec2:DescribeVpcs"],
             "Resource": "*"},
            {"Effect": "Allow", "Action": ["ec2:CreateNetworkInterfacePermission"],
             "Resource": [scoped("ec2", "network-interface/*")],
             "Condition": {"StringEquals": {"ec2:Subnet": subnet_arns,
                                            "ec2:AuthorizedService": "codebuild.amazonaws.com"}}},
            # the data key: source objects (SSE-KMS), secret, build output
            {"Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey"],
             "Resource": [kms_key_arn]},
        ]
        image_statements = [
            *common,
            # GetAuthorizationToken has no resource-level permissions; it grants no image access.
            {"Effect": "Allow", "Action": ["ecr:GetAuthorizationToken"], "Resource": "*"},
            {"Effect": "Allow", "Action": [
                "ecr:BatchCheckLayerAvailability", "ecr:InitiateLayerUpload", "ecr:UploadLayerPart",
                "ecr:CompleteLayerUpload", "ecr:PutImage", "ecr:BatchGetImage",
                "ecr:GetDownloadUrlForLayer", "ecr:DescribeImages"],
             "Resource": [r.arn for _, r in sorted(repositories.items())]},
        ]
        cluster_arn = scoped("eks", pulumi.Output.concat("cluster/", cluster_name))
        deploy_statements = [
            *common,
            # the application layer's kubeconfig (endpoint and CA; its token, from `gameday
            # infra kube-token`, needs no permission; the access entry below decides what the
            # role may do inside the cluster)
            {"Effect": "Allow", "Action": ["eks:DescribeCluster"], "Resource": [cluster_arn]},
            {"Effect": "Allow", "Action": ["secretsmanager:GetSecretValue"], "Resource": [secret.arn]},
            # the state of both stacks (the app stack reads the platform's outputs)
            *backend_statements(cfg.backend_url),
            # The application layer declares no AWS resource (provisioning/layers/application.py):
            # nothing else in AWS.
        ]
        roles: dict[str, aws.iam.Role] = {}
        policies: dict[str, aws.iam.RolePolicy] = {}
        for kind, statements in (("image", image_statements), ("deploy", deploy_statements)):
            roles[kind] = aws.iam.Role(f"{name}-{kind}", assume_role_policy=trust,
                                       tags=naming.tags(f"{name}-{kind}"), opts=child(self))
            policies[kind] = aws.iam.RolePolicy(f"{name}-{kind}", role=roles[kind].id,
                                                policy=policy_output(statements), opts=child(self))

        # --- cluster access for the deploy role (authentication mode API) -----------------
        entry = aws.eks.AccessEntry(
            f"{name}-deploy", cluster_name=cluster_name, principal_arn=roles["deploy"].arn,
            type="STANDARD", tags=naming.tags(f"{name}-deploy"), opts=child(self))
        aws.eks.AccessPolicyAssociation(
            f"{name}-deploy", cluster_name=cluster_name, principal_arn=roles["deploy"].arn,
            policy_arn=EKS_ADMIN_POLICY,
            access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
            opts=child(self, depends_on=[entry]))

        # --- projects ---------------------------------------------------------------------
        def variables(values: Mapping[str, pulumi.Input[str]], kind: str = "PLAINTEXT") -> list:
            return [aws.codebuild.ProjectEnvironmentEnvironmentVariableArgs(
                name=k, value=v, type=kind) for k, v in values.items()]

        registry = repositories["controlplane"].repository_url.apply(lambda u: u.split("/")[0])
        image_vars = variables({"REGISTRY": registry, **{
            f"REPOSITORY_{t.upper()}": repositories[t].repository_url
            for t in IMAGE_TARGETS if t in repositories}})
        deploy_vars = variables({"PULUMI_VERSION": PULUMI_VERSION,
                                 "PULUMI_BACKEND_URL": cfg.backend_url, "APP_STACK": self.app_stack})
        deploy_vars += variables({secret_variable(cfg.backend_url): self.secret_name},
                                 "SECRETS_MANAGER")
        projects = {}
        for kind, privileged, env_vars in (("image", True, image_vars),
                                           ("deploy", False, deploy_vars)):
            projects[kind] = aws.codebuild.Project(
                f"{name}-{kind}",
                name=f"{p}-{kind}",
                description=f"{p}: {'build and push the images' if kind == 'image' else 'pulumi up ' + self.app_stack} (in-VPC)",
                service_role=roles[kind].arn,
                build_timeout=cfg.timeout_minutes,
                encryption_key=kms_key_arn,
                source=aws.codebuild.ProjectSourceArgs(
                    type="S3",
                    # replaced per build by `gameday infra` (sourceLocationOverride)
                    location=pulumi.Output.concat(bucket.id, "/", SOURCE_PREFIX, "latest.zip"),
                    buildspec=_buildspec(kind)),
                artifacts=aws.codebuild.ProjectArtifactsArgs(type="NO_ARTIFACTS"),
                environment=aws.codebuild.ProjectEnvironmentArgs(
                    type="LINUX_CONTAINER", compute_type=cfg.compute_type, image=BUILD_IMAGE,
                    image_pull_credentials_type="CODEBUILD",
                    privileged_mode=privileged,  # the Docker daemon needs it; deploy does not
                    environment_variables=env_vars),
                logs_config=aws.codebuild.ProjectLogsConfigArgs(
                    cloudwatch_logs=aws.codebuild.ProjectLogsConfigCloudwatchLogsArgs(
                        status="ENABLED", group_name=log_group.name, stream_name=kind)),
                vpc_config=aws.codebuild.ProjectVpcConfigArgs(
                    vpc_id=vpc_id, subnets=private_subnet_ids, security_group_ids=[sg.id]),
                tags=naming.tags(f"{p}-{kind}"),
                # CodeBuild checks the role's VPC permissions when the project is created
                opts=child(self, depends_on=[policies[kind]]),
            )

        self.source_bucket = bucket.id
        self.log_group_name = log_group.name
        self.security_group_id = sg.id
        self.role_arn = roles["deploy"].arn
        self.image_role_arn = roles["image"].arn
        self.image_project = projects["image"].name
        self.deploy_project = projects["deploy"].name
        self.register_outputs(deploy_runner_exports(self))


def deploy_runner_exports(runner: DeployRunner) -> dict[str, Any]:
    """What `gameday infra image|deploy` read from the platform stack's outputs
    (``pulumi.export("deployRunner", deploy_runner_exports(runner))``)."""
    return {
        "imageProject": runner.image_project,
        "deployProject": runner.deploy_project,
        "sourceBucket": runner.source_bucket,
        "roleArn": runner.role_arn,
        "imageRoleArn": runner.image_role_arn,
        "logGroup": runner.log_group_name,
        "secretName": runner.secret_name,
        "region": runner.region,
        "appStack": runner.app_stack,
    }

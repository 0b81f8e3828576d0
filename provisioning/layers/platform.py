"""Platform layer: everything in AWS (network, cluster, node roles, the system node group,
registries, buckets, database, workload identities, Karpenter's AWS side, alarms).

It talks only to AWS APIs, never to the cluster's endpoint, so it can be deployed from
anywhere with AWS credentials even when the endpoint is private. Every decision that depends
on recovery objectives is made in ``provisioning.objectives`` from the specs in slo/; a stack config
that contradicts them stops here with a clear error.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from provisioning import objectives as obj
from provisioning import slo_source
from provisioning.components.addons import NodeAddons
from provisioning.components.artifacts import ArtifactStore
from provisioning.components.autoscaling import KarpenterAws
from provisioning.components.cluster import Cluster
from provisioning.components.common import Naming
from provisioning.components.database import Database
from provisioning.components.deploy_runner import (
    DeployRunner,
    deploy_runner_exports,
    image_repositories,
)
from provisioning.components.encryption import DataKey
from provisioning.components.gameday import node_pool_names
from provisioning.components.identity import WorkloadIdentity, game_day_identity
from provisioning.components.network import Network
from provisioning.components.nodepools import NodePool
from provisioning.components.observability import Alarms
from provisioning.components.registry import Registry
from provisioning.components.serving import SERVICE_ACCOUNT as SERVING_SA
from provisioning.components.tracking import DB_READER_SA, TRACKING_SA
from provisioning.config import StackConfig, aws_region, check_default_tags, load_stack_config
from provisioning.layers import outputs as out


def delivery_grants(cfg: StackConfig, bucket_arn: pulumi.Input[str], key_arn: pulumi.Input[str],
                    master_secret_arn: pulumi.Input[str]) -> dict[str, tuple[str, str, list]]:
    """IRSA grants of the model server (read its models), the tracking server (its artifact
    prefix) and the tracking namespace's secret reader (the RDS master secret, used once by
    the job that creates the tracking database and role)."""
    def objects(prefix: str) -> pulumi.Output[str]:
        return pulumi.Output.concat(bucket_arn, f"/{prefix}/*")

    def listed(prefix: str) -> dict:
        return {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [bucket_arn],
                "Condition": {"StringLike": {"s3:prefix": [f"{prefix}/*"]}}}

    grants: dict[str, tuple[str, str, list]] = {}
    if cfg.serving is not None:
        grants[out.SERVING_ROLE] = (cfg.serving.namespace, SERVING_SA, [
            listed("models"),
            {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [objects("models")]},
            {"Effect": "Allow", "Action": ["kms:Decrypt"], "Resource": [key_arn]},
        ])
    if cfg.tracking is not None:
        prefix = cfg.tracking.artifact_prefix
        grants[out.TRACKING_ROLE] = (cfg.tracking.namespace, TRACKING_SA, [
            listed(prefix),
            {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject",
                                           "s3:AbortMultipartUpload"],
             "Resource": [objects(prefix)]},
            {"Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
             "Resource": [key_arn]},
        ])
        grants[out.TRACKING_DB_ROLE] = (cfg.tracking.namespace, DB_READER_SA, [
            {"Effect": "Allow",
             "Action": ["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"],
             "Resource": [master_secret_arn]},
            {"Effect": "Allow", "Action": ["kms:Decrypt"], "Resource": [key_arn]},
        ])
    return grants


def build() -> None:
    # --- config and objectives (all validation before any resource is declared) ----------
    cfg = load_stack_config()
    region = aws_region()
    env = cfg.environment
    objectives = slo_source.load_objectives(env.value)
    db_settings = obj.derive_database_settings(objectives["db-primary-loss"], cfg.database, env)
    artifact_settings = obj.derive_artifact_settings(
        objectives["artifact-store-unavailable"], cfg.artifacts, region
    )
    obj.derive_api_settings(objectives["api-replica-loss"], cfg.control_plane.api)
    obj.check_gpu_interruptions(objectives["node-interruption-checkpoint"], cfg.node_pools.gpu)

    naming = Naming(pulumi.get_project(), pulumi.get_stack(), env.value, cfg.owner, cfg.cost_center,
                    availability=obj.availability_objectives(objectives.recovery))
    check_default_tags(naming.tags())
    p = naming.prefix
    account_id = aws.get_caller_identity_output().account_id

    # --- AWS ----------------------------------------------------------------------------
    key = DataKey(f"{p}-data", naming, region, account_id)
    network = Network(f"{p}-net", cfg.network, naming, region, key.arn)
    pools = {"system": cfg.node_pools.system, "cpu": cfg.node_pools.cpu, "gpu": cfg.node_pools.gpu}
    cluster = Cluster(
        f"{p}-cluster", cfg.cluster, naming, network.vpc_id, network.public_subnet_ids,
        network.private_subnet_ids, key.arn, list(pools), deletion_protection=env.protected,
    )
    # Only `system` is a managed node group; cpu and gpu are Karpenter NodePools, declared
    # by the application layer on the AWS side prepared here.
    system_pool = NodePool(f"{p}-pool-system", "system", cfg.node_pools.system, naming,
                           cluster.cluster, cluster.node_roles["system"], network.private_subnet_ids)
    # Add-ons whose pods need a node: after the system pool exists, never inside the cluster.
    NodeAddons(f"{p}-addons", naming, cluster.name, system_pool,
               opts=pulumi.ResourceOptions(depends_on=[cluster.cluster]))
    registry = Registry(f"{p}-ecr", cfg.registry, naming, key.arn)
    artifacts = ArtifactStore(f"{p}-artifacts", cfg.artifacts, artifact_settings, naming, key.arn,
                              account_id)
    database = Database(
        f"{p}-db", cfg.database, db_settings, naming, network.vpc_id, network.database_subnet_ids,
        cluster.security_group_id, key.arn,
    )

    # --- workload identities: each service account gets exactly what it needs ------------
    bucket_arn, objects_arn = artifacts.bucket_arn, pulumi.Output.concat(artifacts.bucket_arn, "/*")
    read_artifacts = [
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [bucket_arn]},
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [objects_arn]},
        {"Effect": "Allow", "Action": ["kms:Decrypt"], "Resource": [key.arn]},
    ]
    write_artifacts = [
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [bucket_arn]},
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"],
         "Resource": [pulumi.Output.concat(bucket_arn, "/checkpoints/*"),
                      pulumi.Output.concat(bucket_arn, "/artifacts/*")]},
        {"Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"], "Resource": [key.arn]},
    ]
    workload_repos = [r.arn for name, r in registry.repositories.items()
                      if name.startswith("workloads/")]
    resolve_images = [
        # GetAuthorizationToken has no resource-level permissions; it grants no image access.
        {"Effect": "Allow", "Action": ["ecr:GetAuthorizationToken"], "Resource": "*"},
        {"Effect": "Allow", "Action": ["ecr:DescribeImages", "ecr:BatchGetImage"],
         "Resource": workload_repos},
    ]
    cp_ns = cfg.control_plane.namespace
    grants: dict[str, tuple[str, str, list]] = {
        "api": (cp_ns, "api", read_artifacts),
        "reconciler": (cp_ns, "reconciler", read_artifacts),
        "external-secrets-db": (cp_ns, "external-secrets-db", [
            {"Effect": "Allow",
             "Action": ["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"],
             "Resource": [database.master_secret_arn]},
            {"Effect": "Allow", "Action": ["kms:Decrypt"], "Resource": [key.arn]},
        ]),
        **{f"agent-{pool}": (cp_ns, f"agent-{pool}", write_artifacts + resolve_images)
           for pool in cfg.control_plane.agents},
        **{f"workload-{ws.name}": (ws.name, "workload", write_artifacts)
           for ws in cfg.control_plane.workload_namespaces},
    }
    grants.update(delivery_grants(cfg, bucket_arn, key.arn, database.master_secret_arn))
    role_arns: dict[str, pulumi.Input[str]] = {
        sa: WorkloadIdentity(f"{p}-irsa-{sa}", naming, ns, name, cluster.oidc_provider_arn,
                             cluster.oidc_provider_url, statements).role_arn
        for sa, (ns, name, statements) in grants.items()
    }
    if cfg.game_day.enabled:  # the scheduled game day's own role (docs/scheduling.md)
        role_arns["gameday"] = game_day_identity(
            f"{p}-gameday", naming, cp_ns, cluster.oidc_provider_arn, cluster.oidc_provider_url,
            region=region, account_id=account_id, cluster_name=cluster.name,
            database_identifier=database.identifier, bucket_names=[artifacts.bucket_name],
            # Karpenter NodePools of the workload pools (autoscaling.py); no managed node group.
            node_pools=sorted(node_pool_names().values()), kms_key_arn=key.arn,
        ).role_arn

    # The application layer annotates exactly these service accounts (outputs.role_names).
    if set(role_arns) != set(out.role_names(cfg)):
        raise AssertionError(f"roleArns {sorted(role_arns)} != {sorted(out.role_names(cfg))}")

    # Karpenter's AWS side: queue, instance profiles, node access, controller role.
    karpenter = KarpenterAws(
        f"{p}-karpenter", naming, region, account_id, cluster.cluster, cluster.name,
        cluster.oidc_provider_arn, cluster.oidc_provider_url, cluster.security_group_id, pools,
        cluster.node_roles, key.arn, opts=pulumi.ResourceOptions(depends_on=[system_pool]),
    )
    alarms = Alarms(
        f"{p}-obs", naming, database.identifier,
        obj.derive_alarm_window(objectives["db-primary-loss"].rto_seconds),
        cfg.database.allocated_storage_gb, artifacts.bucket_name,
        obj.derive_alarm_window(objectives["artifact-store-unavailable"].rto_seconds),
        artifacts.replica_bucket_name, key.arn, cfg.observability.alarm_email,
    )

    # The in-VPC deploy path: image builds and the application stack's `pulumi up` from
    # CodeBuild inside the VPC, for private cluster endpoints (docs/infra.md).
    if cfg.deploy_runner.enabled:
        runner = DeployRunner(
            f"{p}-runner", cfg.deploy_runner, naming, region, account_id, network.vpc_id,
            network.private_subnet_ids, cluster.name, cluster.security_group_id,
            image_repositories(registry.repositories, cfg), key.arn,
            opts=pulumi.ResourceOptions(depends_on=[cluster]),
        )
        pulumi.export("deployRunner", deploy_runner_exports(runner))

    # --- exports: what the application stack reads (provisioning/layers/outputs.py) -------------
    pulumi.export(out.ENVIRONMENT, env.value)
    pulumi.export(out.CLUSTER_NAME, cluster.name)
    pulumi.export(out.ARTIFACT_BUCKET, artifacts.bucket_name)
    pulumi.export(out.DATABASE_ADDRESS, database.address)
    pulumi.export(out.DATABASE_SECRET_ARN, database.master_secret_arn)
    pulumi.export(out.DATABASE_CIDRS, network.database_cidrs)
    pulumi.export(out.REPOSITORIES, {k: r.repository_url for k, r in registry.repositories.items()})
    pulumi.export(out.ROLE_ARNS, role_arns)
    pulumi.export(out.KMS_KEY_ARN, key.arn)
    pulumi.export(out.KARPENTER, {"queueName": karpenter.queue_name,
                                  "controllerRoleArn": karpenter.controller_role_arn,
                                  "instanceProfiles": karpenter.instance_profiles})
    # --- exports for operators and the game-day target -----------------------------------
    pulumi.export("databaseMultiAz", db_settings.multi_az)
    pulumi.export("databaseBackupRetentionDays", db_settings.backup_retention_days)
    pulumi.export("fisStopConditionAlarmArn", alarms.fis_stop_alarm_arn)
    pulumi.export("alarmTopicArn", alarms.alarm_topic_arn)
    pulumi.export("karpenterInterruptionQueue", karpenter.queue_name)

"""The platform stack's outputs the application stack reads (through a StackReference).

One list, so a test can check that every value the application layer requires is one the
platform layer exports (a missing one fails the application's `pulumi up`, not a mock run).
"""

from __future__ import annotations

from provisioning.config import StackConfig

ENVIRONMENT = "environment"
CLUSTER_NAME = "clusterName"
ARTIFACT_BUCKET = "artifactBucket"
DATABASE_ADDRESS = "databaseAddress"
DATABASE_SECRET_ARN = "databaseSecretArn"
DATABASE_CIDRS = "databaseCidrs"
REPOSITORIES = "repositories"
ROLE_ARNS = "roleArns"
KMS_KEY_ARN = "kmsKeyArn"
KARPENTER = "karpenter"  # {queueName, controllerRoleArn, instanceProfiles: {pool: name}}
# roleArns keys of the model server, the tracking server, and the tracking namespace's
# External Secrets reader (the RDS master secret, for the job that creates its role).
SERVING_ROLE, TRACKING_ROLE, TRACKING_DB_ROLE = "serving", "tracking", "tracking-external-secrets-db"

REQUIRED_BY_APPLICATION = (
    ENVIRONMENT, CLUSTER_NAME, ARTIFACT_BUCKET, DATABASE_ADDRESS, DATABASE_SECRET_ARN,
    DATABASE_CIDRS, REPOSITORIES, ROLE_ARNS, KMS_KEY_ARN, KARPENTER,
)


def role_names(cfg: StackConfig) -> list[str]:
    """Keys of the platform's ``roleArns``: one IRSA role per service account that needs AWS
    (platform.py builds them, the application layer annotates the service accounts)."""
    names = ["api", "reconciler", "external-secrets-db",
             *(f"agent-{pool}" for pool in cfg.control_plane.agents),
             *(f"workload-{ws.name}" for ws in cfg.control_plane.workload_namespaces)]
    if cfg.game_day.enabled:
        names.append("gameday")
    if cfg.serving is not None:
        names.append(SERVING_ROLE)
    if cfg.tracking is not None:
        names += [TRACKING_ROLE, TRACKING_DB_ROLE]
    return names

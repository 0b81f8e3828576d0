"""Control-plane database: RDS PostgreSQL with settings derived from the objectives."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from provisioning.components.common import TYPE_PREFIX, DataClass, Naming, child
from provisioning.config import DatabaseConfig
from provisioning.objectives import DatabaseSettings

DB_NAME = "controlplane"
DB_PORT = 5432
LOG_EXPORTS = ("postgresql", "upgrade")


def rds_log_group(identifier: str, export: str) -> str:
    """The log group RDS publishes an export to (RDS user guide, "Publishing PostgreSQL logs
    to Amazon CloudWatch Logs")."""
    return f"/aws/rds/instance/{identifier}/{export}"


class Database(pulumi.ComponentResource):
    address: pulumi.Output[str]
    identifier: str
    master_secret_arn: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        cfg: DatabaseConfig,
        settings: DatabaseSettings,
        naming: Naming,
        vpc_id: pulumi.Input[str],
        subnet_ids: list[pulumi.Input[str]],
        client_security_group_id: pulumi.Input[str],
        kms_key_arn: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:Database", name, None, opts)
        self.identifier = naming.name("controlplane")
        subnets = aws.rds.SubnetGroup(
            f"{name}-subnets", subnet_ids=subnet_ids, tags=naming.tags(f"{name}-subnets"), opts=child(self)
        )
        sg = aws.ec2.SecurityGroup(
            f"{name}-sg",
            vpc_id=vpc_id,
            description="PostgreSQL from EKS nodes only (pods further restricted by NetworkPolicy)",
            ingress=[aws.ec2.SecurityGroupIngressArgs(
                protocol="tcp", from_port=DB_PORT, to_port=DB_PORT,
                security_groups=[client_security_group_id],
            )],
            tags=naming.tags(f"{name}-sg"),
            opts=child(self),
        )
        major = cfg.engine_version.split(".")[0]
        params = aws.rds.ParameterGroup(
            f"{name}-params",
            family=f"postgres{major}",
            parameters=[
                aws.rds.ParameterGroupParameterArgs(name="rds.force_ssl", value="1"),
                aws.rds.ParameterGroupParameterArgs(name="log_min_duration_statement", value="1000"),
            ],
            tags=naming.tags(f"{name}-params"),
            opts=child(self),
        )
        # RDS creates /aws/rds/instance/<id>/<export> itself at the first export (no
        # retention, no KMS, no tags) unless it exists: declared first, one per export.
        log_groups = [
            aws.cloudwatch.LogGroup(
                f"{name}-logs-{export}",
                name=rds_log_group(self.identifier, export),
                retention_in_days=cfg.log_retention_days,
                kms_key_id=kms_key_arn,
                tags=naming.tags(rds_log_group(self.identifier, export), DataClass.TELEMETRY),
                opts=child(self),
            )
            for export in LOG_EXPORTS
        ]
        db = aws.rds.Instance(
            f"{name}-postgres",
            identifier=self.identifier,
            engine="postgres",
            engine_version=cfg.engine_version,
            instance_class=cfg.instance_class,
            allocated_storage=cfg.allocated_storage_gb,
            max_allocated_storage=cfg.max_allocated_storage_gb,
            storage_type="gp3",
            storage_encrypted=True,
            kms_key_id=kms_key_arn,
            db_name=DB_NAME,
            username="controlplane",
            # RDS keeps the master password in Secrets Manager and rotates it; it never
            # enters Pulumi state.
            manage_master_user_password=True,
            master_user_secret_kms_key_id=kms_key_arn,
            db_subnet_group_name=subnets.name,
            vpc_security_group_ids=[sg.id],
            parameter_group_name=params.name,
            publicly_accessible=False,
            multi_az=settings.multi_az,
            backup_retention_period=settings.backup_retention_days,
            backup_window="03:00-04:00",
            maintenance_window="sun:04:30-sun:05:30",
            copy_tags_to_snapshot=True,
            deletion_protection=settings.deletion_protection,
            skip_final_snapshot=settings.skip_final_snapshot,
            final_snapshot_identifier=None if settings.skip_final_snapshot else f"{self.identifier}-final",
            auto_minor_version_upgrade=True,
            performance_insights_enabled=True,
            performance_insights_kms_key_id=kms_key_arn,
            enabled_cloudwatch_logs_exports=list(LOG_EXPORTS),
            iam_database_authentication_enabled=True,
            tags=naming.tags(self.identifier, DataClass.CONTROL_PLANE_STATE),
            opts=child(self, protect=settings.deletion_protection, depends_on=log_groups),
        )
        self.address = db.address
        self.master_secret_arn = db.master_user_secrets.apply(
            lambda secrets: secrets[0].secret_arn if secrets else ""
        )
        self.register_outputs({"address": self.address, "identifier": self.identifier})

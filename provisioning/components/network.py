"""VPC across the configured AZs: public, private (nodes) and isolated database subnets,
NAT per AZ (or one in dev), S3/ECR/STS endpoints and flow logs."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from provisioning.components.common import (
    DISCOVERY_TAG,
    TYPE_PREFIX,
    DataClass,
    Naming,
    child,
    policy_output,
)
from provisioning.config import NetworkConfig


@dataclass(frozen=True)
class SubnetPlan:
    zone: str
    public: str
    private: str
    database: str


def plan_subnets(cidr: str, zones: list[str]) -> list[SubnetPlan]:
    """Carve the VPC CIDR: per zone a /19 private (pods use VPC IPs), a /22 public and a
    /24 database subnet. Database subnets get their own range so NetworkPolicies can
    exclude them by CIDR."""
    vpc = ipaddress.ip_network(cidr)
    if vpc.prefixlen > 16:
        raise ValueError(f"network.cidr {cidr} is too small; use a /16")
    private = list(vpc.subnets(new_prefix=19))[: len(zones)]
    tail = list(vpc.subnets(new_prefix=19))[-1]  # 8,192 addresses for public + database
    public = list(tail.subnets(new_prefix=22))[: len(zones)]
    database = list(list(tail.subnets(new_prefix=20))[1].subnets(new_prefix=24))[: len(zones)]
    return [
        SubnetPlan(z, str(pub), str(prv), str(db))
        for z, pub, prv, db in zip(zones, public, private, database, strict=True)
    ]


class Network(pulumi.ComponentResource):
    vpc_id: pulumi.Output[str]
    public_subnet_ids: list[pulumi.Output[str]]
    private_subnet_ids: list[pulumi.Output[str]]
    database_subnet_ids: list[pulumi.Output[str]]
    database_cidrs: list[str]
    cidr: str

    def __init__(
        self,
        name: str,
        cfg: NetworkConfig,
        naming: Naming,
        region: str,
        kms_key_arn: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{TYPE_PREFIX}:Network", name, None, opts)
        plans = plan_subnets(cfg.cidr, cfg.availability_zones)
        self.cidr = cfg.cidr
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=cfg.cidr,
            enable_dns_hostnames=True,  # required by interface endpoints and EKS
            enable_dns_support=True,
            tags=naming.tags(f"{name}-vpc"),
            opts=child(self),
        )
        igw = aws.ec2.InternetGateway(
            f"{name}-igw", vpc_id=vpc.id, tags=naming.tags(f"{name}-igw"), opts=child(self)
        )
        public_rt = aws.ec2.RouteTable(
            f"{name}-public",
            vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)],
            tags=naming.tags(f"{name}-public"),
            opts=child(self),
        )
        self.public_subnet_ids, self.private_subnet_ids, self.database_subnet_ids = [], [], []
        private_route_tables: list[pulumi.Output[str]] = []
        nats: list[aws.ec2.NatGateway] = []
        db_rt = aws.ec2.RouteTable(
            f"{name}-database", vpc_id=vpc.id, tags=naming.tags(f"{name}-database"), opts=child(self)
        )
        for i, plan in enumerate(plans):
            az = plan.zone
            public = aws.ec2.Subnet(
                f"{name}-public-{az}",
                vpc_id=vpc.id,
                cidr_block=plan.public,
                availability_zone=az,
                map_public_ip_on_launch=False,
                tags=naming.tags(f"{name}-public-{az}", **{"kubernetes.io/role/elb": "1"}),
                opts=child(self),
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-public-{az}", subnet_id=public.id, route_table_id=public_rt.id, opts=child(self)
            )
            if cfg.nat_gateways == "perAz" or i == 0:
                eip = aws.ec2.Eip(
                    f"{name}-nat-{az}", domain="vpc", tags=naming.tags(f"{name}-nat-{az}"), opts=child(self)
                )
                nats.append(
                    aws.ec2.NatGateway(
                        f"{name}-nat-{az}",
                        allocation_id=eip.id,
                        subnet_id=public.id,
                        tags=naming.tags(f"{name}-nat-{az}"),
                        opts=child(self, depends_on=[igw]),
                    )
                )
            private = aws.ec2.Subnet(
                f"{name}-private-{az}",
                vpc_id=vpc.id,
                cidr_block=plan.private,
                availability_zone=az,
                tags=naming.tags(f"{name}-private-{az}", **{
                    "kubernetes.io/role/internal-elb": "1",
                    # Karpenter launches workload nodes into the private subnets only.
                    DISCOVERY_TAG: naming.prefix,
                }),
                opts=child(self),
            )
            rt = aws.ec2.RouteTable(
                f"{name}-private-{az}",
                vpc_id=vpc.id,
                # Each AZ egresses through its own NAT so one AZ's loss does not cut the others.
                routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=nats[-1].id)],
                tags=naming.tags(f"{name}-private-{az}"),
                opts=child(self),
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-private-{az}", subnet_id=private.id, route_table_id=rt.id, opts=child(self)
            )
            database = aws.ec2.Subnet(
                f"{name}-database-{az}",
                vpc_id=vpc.id,
                cidr_block=plan.database,
                availability_zone=az,
                tags=naming.tags(f"{name}-database-{az}"),
                opts=child(self),
            )
            # Database subnets have no route to the internet at all.
            aws.ec2.RouteTableAssociation(
                f"{name}-database-{az}", subnet_id=database.id, route_table_id=db_rt.id, opts=child(self)
            )
            self.public_subnet_ids.append(public.id)
            self.private_subnet_ids.append(private.id)
            self.database_subnet_ids.append(database.id)
            private_route_tables.append(rt.id)
        self.database_cidrs = [p.database for p in plans]

        # Gateway endpoint: S3 traffic (checkpoints, artifacts, ECR layers) skips the NAT.
        aws.ec2.VpcEndpoint(
            f"{name}-s3",
            vpc_id=vpc.id,
            service_name=f"com.amazonaws.{region}.s3",
            vpc_endpoint_type="Gateway",
            route_table_ids=private_route_tables,
            tags=naming.tags(f"{name}-s3"),
            opts=child(self),
        )
        endpoint_sg = aws.ec2.SecurityGroup(
            f"{name}-endpoints",
            vpc_id=vpc.id,
            description="HTTPS from inside the VPC to interface endpoints",
            ingress=[aws.ec2.SecurityGroupIngressArgs(
                protocol="tcp", from_port=443, to_port=443, cidr_blocks=[cfg.cidr]
            )],
            tags=naming.tags(f"{name}-endpoints"),
            opts=child(self),
        )
        # Image pulls and IRSA token exchange keep working if the NAT path is impaired.
        for service in ("ecr.api", "ecr.dkr", "sts"):
            aws.ec2.VpcEndpoint(
                f"{name}-{service.replace('.', '-')}",
                vpc_id=vpc.id,
                service_name=f"com.amazonaws.{region}.{service}",
                vpc_endpoint_type="Interface",
                private_dns_enabled=True,
                subnet_ids=self.private_subnet_ids,
                security_group_ids=[endpoint_sg.id],
                tags=naming.tags(f"{name}-{service}"),
                opts=child(self),
            )

        log_group = aws.cloudwatch.LogGroup(
            f"{name}-flow-logs",
            retention_in_days=cfg.flow_log_retention_days,
            kms_key_id=kms_key_arn,
            tags=naming.tags(f"{name}-flow-logs", DataClass.TELEMETRY),
            opts=child(self),
        )
        flow_role = aws.iam.Role(
            f"{name}-flow-logs",
            assume_role_policy=policy_output([{
                "Effect": "Allow",
                "Principal": {"Service": "vpc-flow-logs.amazonaws.com"},
                "Action": "sts:AssumeRole",
            }]),
            tags=naming.tags(f"{name}-flow-logs"),
            opts=child(self),
        )
        aws.iam.RolePolicy(
            f"{name}-flow-logs",
            role=flow_role.id,
            policy=policy_output([{
                "Effect": "Allow",
                "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                "Resource": [log_group.arn, pulumi.Output.concat(log_group.arn, ":*")],
            }]),
            opts=child(self),
        )
        aws.ec2.FlowLog(
            f"{name}-flow-logs",
            vpc_id=vpc.id,
            traffic_type="ALL",
            log_destination_type="cloud-watch-logs",
            log_destination=log_group.arn,
            iam_role_arn=flow_role.arn,
            max_aggregation_interval=60,
            tags=naming.tags(f"{name}-flow-logs"),
            opts=child(self),
        )
        self.vpc_id = vpc.id
        self.register_outputs({
            "vpc_id": self.vpc_id,
            "private_subnet_ids": self.private_subnet_ids,
            "database_subnet_ids": self.database_subnet_ids,
        })

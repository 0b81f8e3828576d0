"""AWS fault primitives (boto3) for the cloud environments.

Targets are what ``provisioning/`` creates: the RDS instance ``<project>-<stack>-controlplane``,
the artifact bucket(s), and the instances of the workload pools. Those are launched by
Karpenter (``provisioning/components/autoscaling.py``) and found by the tags Karpenter v1 itself puts
on every instance it launches (``environments/cloud/tags.py``; ``getTags`` in karpenter-provider-aws
``pkg/cloudprovider/cloudprovider.go``): ``karpenter.sh/nodepool=<NodePool>`` plus the
cluster's ``kubernetes.io/cluster/<cluster>=owned`` and ``eks:eks-cluster-name=<cluster>``.
An EC2NodeClass cannot set or override these keys (Karpenter refuses them in ``spec.tags``),
so a pool's user tags can never make an instance look like another pool's. EKS managed node
groups (``nodeGroups`` in the target; the system pool only, which is never a fault target)
are still found by ``eks:nodegroup-name``. Changes with an inverse (bucket policy, node-group
sizes) are written to the :class:`~environments.cloud.fault_state.FaultState` file before they are made,
so a crashed run can still be rolled back.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from chaoslib.exceptions import ActivityFailed

from environments.cloud.tags import SYSTEM_POOL, karpenter_tags

if TYPE_CHECKING:
    from environments.cloud.fault_state import FaultState

__all__ = ["DENY_SID", "ZONE_ACL_TAG", "AwsFaultError", "AwsFaults", "AwsTarget",
           "deny_statement"]

logger = logging.getLogger("chaostoolkit")

DENY_SID = "GamedayArtifactStoreUnreachable"  # fixed: lets restore find and strip our statement
# Data-plane actions only: the deny can never block Get/Put/DeleteBucketPolicy (the undo).
DENY_ACTIONS = ["s3:GetObject", "s3:GetObjectVersion", "s3:PutObject", "s3:DeleteObject",
                "s3:ListBucket", "s3:ListBucketVersions", "s3:AbortMultipartUpload",
                "s3:ListMultipartUploadParts"]
ZONE_ACL_TAG = "gameday:zone-outage"  # on the deny-all network ACL: the zone it cuts off
# Explicit timeouts: botocore's defaults can hang for minutes (docs/DESIGN.md section 8.7).
BOTO_CONFIG = Config(connect_timeout=10, read_timeout=60,
                     retries={"max_attempts": 5, "mode": "standard"})


class AwsFaultError(ActivityFailed):
    """An AWS fault could not be applied or undone (Chaos Toolkit records it as data)."""


@dataclass(frozen=True)
class AwsTarget:
    region: str
    cluster_name: str
    db_instance_id: str | None = None
    buckets: tuple[str, ...] = ()
    nodegroups: dict[str, str] = field(default_factory=dict)  # pool -> EKS node group name
    nodepools: dict[str, str] = field(default_factory=dict)  # pool -> Karpenter NodePool name
    deny_principal_arns: tuple[str, ...] = ()  # ArnLike patterns for aws:PrincipalArn
    wait_timeout: float = 1800.0
    poll_seconds: float = 15.0
    # zone -> subnet ids (``zoneSubnets``); empty: the subnets of the zone tagged
    # kubernetes.io/cluster/<cluster> (how EKS finds its subnets)
    zone_subnets: dict[str, tuple[str, ...]] = field(default_factory=dict)


def deny_statement(bucket: str, principal_arns: tuple[str, ...]) -> dict[str, Any]:
    return {
        "Sid": DENY_SID, "Effect": "Deny", "Principal": "*", "Action": DENY_ACTIONS,
        "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
        "Condition": {"ArnLike": {"aws:PrincipalArn": list(principal_arns)}},
    }


def _without_deny(policy: str | None) -> str | None:
    """A policy with our statement removed (None when nothing else is left)."""
    if policy is None:
        return None
    doc = json.loads(policy)
    statements = [s for s in doc.get("Statement", []) if s.get("Sid") != DENY_SID]
    if len(statements) == len(doc.get("Statement", [])):
        return policy  # untouched: keep the exact original text
    return json.dumps({**doc, "Statement": statements}) if statements else None


class AwsFaults:
    def __init__(self, target: AwsTarget, state: FaultState,
                 session: boto3.Session | None = None) -> None:
        self.target, self.state = target, state
        self._session = session or boto3.Session(region_name=target.region)
        self._clients: dict[str, Any] = {}

    def _client(self, service: str) -> Any:
        if service not in self._clients:  # building a botocore client costs ~0.1-0.5 s
            self._clients[service] = self._session.client(service, region_name=self.target.region,
                                                          config=BOTO_CONFIG)
        return self._clients[service]

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except ClientError as exc:
            err = exc.response.get("Error", {})
            raise AwsFaultError(f"{what}: {err.get('Code')}: {err.get('Message')}") from exc

    def _wait(self, what: str, done: Any) -> float:
        started = time.monotonic()
        while not done():
            if time.monotonic() - started > self.target.wait_timeout:
                raise AwsFaultError(f"{what}: not done after {self.target.wait_timeout:.0f}s")
            time.sleep(self.target.poll_seconds)
        return round(time.monotonic() - started, 3)

    # -- database ---------------------------------------------------------------------------
    def failover_db(self, plain_reboot: bool = False) -> dict[str, Any]:
        """Multi-AZ: reboot with ForceFailover (the standby is promoted) and wait until the
        instance is ``available``. Single-AZ is refused unless ``plain_reboot``."""
        db_id = self.target.db_instance_id
        if not db_id:
            raise AwsFaultError("failover_db: no RDS instance id in the target config")
        rds = self._client("rds")

        def describe() -> dict[str, Any]:
            return self._call(f"describe {db_id}", rds.describe_db_instances,
                              DBInstanceIdentifier=db_id)["DBInstances"][0]

        before = describe()
        if before["DBInstanceStatus"] != "available":
            raise AwsFaultError(f"{db_id} is {before['DBInstanceStatus']!r}, not available: "
                                "refusing to stack a failover on an unfinished operation")
        multi_az = bool(before.get("MultiAZ"))
        if not multi_az and not plain_reboot:
            raise AwsFaultError(f"{db_id} is single-AZ: there is no standby to fail over to; "
                                "pass plain_reboot=True to reboot it in place (full outage)")
        logger.warning("chaos failover_db: rebooting RDS %s (ForceFailover=%s, AZ %s)", db_id,
                       multi_az, before.get("AvailabilityZone"))
        self._call(f"reboot {db_id}", rds.reboot_db_instance, DBInstanceIdentifier=db_id,
                   ForceFailover=multi_az)
        seconds = self._wait(f"{db_id} available again",
                             lambda: describe()["DBInstanceStatus"] == "available")
        after = describe()
        return {"target": db_id, "failover": multi_az, "seconds": seconds,
                "az_before": before.get("AvailabilityZone"), "az_after": after.get("AvailabilityZone")}

    # -- artifact store ---------------------------------------------------------------------
    def _get_policy(self, s3: Any, bucket: str) -> str | None:
        try:
            return s3.get_bucket_policy(Bucket=bucket)["Policy"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "NoSuchBucketPolicy":
                return None
            raise AwsFaultError(f"get policy of {bucket}: {exc}") from exc

    def artifact_store_unreachable(self) -> dict[str, Any]:
        """Add a Deny statement (Sid ``DENY_SID``) for the platform's roles to each bucket's
        policy; the original policy text is kept in the state file."""
        key = "artifact_store_unreachable"
        if self.state.get(key) is not None:
            return {"target": "artifact-store", "already": True}
        if not self.target.buckets:
            raise AwsFaultError("artifact_store_unreachable: no bucket in the target config")
        if not self.target.deny_principal_arns:
            raise AwsFaultError("artifact_store_unreachable: no deny principals; refusing to "
                                "deny everyone (set denyPrincipalArns)")
        s3 = self._client("s3")
        # A leftover statement from a run whose state file was lost is not "original".
        originals = {b: _without_deny(self._get_policy(s3, b)) for b in self.target.buckets}
        undo = {"buckets": originals, "principals": list(self.target.deny_principal_arns)}
        self.state.put(key, "artifact_store_unreachable", "artifact-store", undo)
        for bucket, original in originals.items():
            doc = json.loads(original) if original else {"Version": "2012-10-17", "Statement": []}
            doc["Statement"] = [*doc.get("Statement", []),
                                deny_statement(bucket, self.target.deny_principal_arns)]
            logger.warning("chaos artifact_store_unreachable: deny %s on s3://%s",
                           self.target.deny_principal_arns, bucket)
            self._call(f"put policy {bucket}", s3.put_bucket_policy, Bucket=bucket,
                       Policy=json.dumps(doc))
        return {"target": "artifact-store", **undo}

    def artifact_store_restore(self) -> dict[str, Any]:
        """Put every bucket policy back exactly as recorded (deleted if there was none)."""
        record = self.state.get("artifact_store_unreachable")
        if record is None:
            return {"target": "artifact-store", "already": True}
        s3 = self._client("s3")
        for bucket, original in record["undo"]["buckets"].items():
            logger.warning("chaos artifact_store_restore: s3://%s policy back to original", bucket)
            if original is None:
                self._call(f"delete policy {bucket}", s3.delete_bucket_policy, Bucket=bucket)
            else:
                self._call(f"put policy {bucket}", s3.put_bucket_policy, Bucket=bucket,
                           Policy=original)
        self.state.pop("artifact_store_unreachable")
        return {"target": "artifact-store", **record["undo"]}

    # -- nodes: Karpenter NodePools and managed node groups ------------------------------
    def _nodegroup(self, pool: str) -> str:
        if pool == SYSTEM_POOL:
            raise AwsFaultError("refusing a node fault on the system pool: the control plane "
                                "and the game day itself run there")
        try:
            return self.target.nodegroups[pool]
        except KeyError:
            raise AwsFaultError(f"pool {pool!r} is not a managed node group; node groups: "
                                f"{', '.join(self.target.nodegroups) or 'none'}") from None

    def _owner(self, pool: str) -> tuple[str, str]:
        """``("nodepool", name)`` or ``("nodegroup", name)``; system and unknown pools refused."""
        if pool == SYSTEM_POOL:
            raise AwsFaultError("refusing a node fault on the system pool: the control plane "
                                "and the game day itself run there")
        if pool in self.target.nodepools:
            return "nodepool", self.target.nodepools[pool]
        if pool in self.target.nodegroups:
            return "nodegroup", self.target.nodegroups[pool]
        raise AwsFaultError(f"unknown pool {pool!r}; Karpenter NodePools: "
                            f"{', '.join(self.target.nodepools) or 'none'}; node groups: "
                            f"{', '.join(self.target.nodegroups) or 'none'}")

    def _instance_filters(self, pool: str) -> list[dict[str, Any]]:
        kind, name = self._owner(pool)
        cluster = self.target.cluster_name
        tags = (karpenter_tags(cluster, name) if kind == "nodepool"
                else {"eks:nodegroup-name": name, "eks:cluster-name": cluster})
        return [*({"Name": f"tag:{k}", "Values": [v]} for k, v in tags.items()),
                {"Name": "instance-state-name", "Values": ["running"]}]

    def pool_instances(self, pool: str) -> list[dict[str, Any]]:
        ec2 = self._client("ec2")
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=self._instance_filters(pool))
        found = [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
        return sorted(found, key=lambda i: (i["LaunchTime"], i["InstanceId"]))

    def terminate_node(self, pool: str, instance_id: str | None = None) -> dict[str, Any]:
        """Terminate one running instance of the pool (oldest first). No inverse: for a
        Karpenter pool, Karpenter removes the lost NodeClaim and launches a node again if
        pods are pending; a node group's Auto Scaling group replaces it."""
        kind, name = self._owner(pool)
        instances = [i["InstanceId"] for i in self.pool_instances(pool)]
        if not instances:
            raise AwsFaultError(f"pool {pool!r} ({kind} {name}) has no running instance")
        if instance_id is not None and instance_id not in instances:
            raise AwsFaultError(f"{instance_id} is not a running instance of pool {pool!r}: "
                                f"{instances}")
        victim = instance_id or instances[0]
        logger.warning("chaos terminate_node: terminating %s of %s %s", victim, kind, name)
        self._call(f"terminate {victim}", self._client("ec2").terminate_instances,
                   InstanceIds=[victim])
        return {"target": pool, kind: name, "instance": victim,
                "remaining": [i for i in instances if i != victim]}

    def _scale(self, pool: str, scaling: dict[str, int]) -> None:
        eks, name = self._client("eks"), self._nodegroup(pool)
        self._call(f"scale {name}", eks.update_nodegroup_config, clusterName=self.target.cluster_name,
                   nodegroupName=name, scalingConfig=scaling)
        self._wait(f"{name} active", lambda: eks.describe_nodegroup(
            clusterName=self.target.cluster_name, nodegroupName=name)["nodegroup"]["status"] == "ACTIVE")

    def withdraw_pool(self, pool: str) -> dict[str, Any]:
        """Scale the node group to min 0 / desired 0 (max 1: EKS allows no lower)."""
        key = f"withdraw_pool:{pool}"
        if self.state.get(key) is not None:
            return {"target": pool, "already": True}
        name = self._nodegroup(pool)
        group = self._call(f"describe {name}", self._client("eks").describe_nodegroup,
                           clusterName=self.target.cluster_name, nodegroupName=name)["nodegroup"]
        scaling = {k: int(group["scalingConfig"][k]) for k in ("minSize", "maxSize", "desiredSize")}
        undo = {"mode": "nodegroup", "pool": pool, "nodegroup": name, "scaling": scaling}
        self.state.put(key, "withdraw_pool", pool, undo)
        logger.warning("chaos withdraw_pool: scaling node group %s from %s to 0", name, scaling)
        self._scale(pool, {"minSize": 0, "maxSize": 1, "desiredSize": 0})
        return {"target": pool, **undo}

    def undo_withdraw(self, key: str) -> dict[str, Any] | None:
        record = self.state.get(key)
        if record is None:
            return None
        undo = record["undo"]
        logger.warning("chaos restore_pool: node group %s back to %s", undo["nodegroup"],
                       undo["scaling"])
        self._scale(undo["pool"], undo["scaling"])
        self.state.pop(key)
        return {"target": record["target"], **undo}

    def restore_pool(self, pool: str) -> dict[str, Any]:
        return self.undo_withdraw(f"withdraw_pool:{pool}") or {"target": pool, "already": True}

    # -- zones: network ACLs ----------------------------------------------------------------
    def zone_subnets(self, zone: str) -> list[dict[str, Any]]:
        """The zone's subnets: those named in ``zoneSubnets``, else the cluster's (tag
        ``kubernetes.io/cluster/<cluster>``) in that availability zone."""
        ec2 = self._client("ec2")
        named = self.target.zone_subnets.get(zone)
        if named:
            found = self._call(f"describe subnets {list(named)}", ec2.describe_subnets,
                               SubnetIds=list(named))["Subnets"]
            wrong = [s["SubnetId"] for s in found if s["AvailabilityZone"] != zone]
            if wrong:
                raise AwsFaultError(f"zoneSubnets.{zone}: {wrong} are not in {zone}")
            return found
        return self._call(f"describe subnets of {zone}", ec2.describe_subnets, Filters=[
            {"Name": "availability-zone", "Values": [zone]},
            {"Name": "tag-key", "Values": [f"kubernetes.io/cluster/{self.target.cluster_name}"]},
        ])["Subnets"]

    def _association(self, subnet: str) -> tuple[str, str]:
        """(association id, network ACL id) of the subnet's current ACL association."""
        acls = self._call(f"describe ACL of {subnet}", self._client("ec2").describe_network_acls,
                          Filters=[{"Name": "association.subnet-id", "Values": [subnet]}])
        for acl in acls["NetworkAcls"]:
            for assoc in acl.get("Associations", []):
                if assoc.get("SubnetId") == subnet:
                    return assoc["NetworkAclAssociationId"], acl["NetworkAclId"]
        raise AwsFaultError(f"subnet {subnet} has no network ACL association")

    def zone_outage(self, zone: str) -> dict[str, Any]:
        """Cut the zone's subnets off: a new network ACL that denies all traffic both ways is
        associated with each subnet in place of its own. The original associations are
        written to the state file before anything changes, so a crashed run can be undone."""
        key = f"zone_network_acl:{zone}"
        if self.state.get(key) is not None:
            return {"target": zone, "already": True}
        subnets = self.zone_subnets(zone)
        if not subnets:
            raise AwsFaultError(f"zone_outage: no subnet of cluster {self.target.cluster_name} in "
                                f"{zone} (set zoneSubnets.{zone} in the cloud target)")
        vpcs = sorted({s["VpcId"] for s in subnets})
        if len(vpcs) != 1:
            raise AwsFaultError(f"zone_outage: the subnets of {zone} span VPCs {vpcs}")
        ec2 = self._client("ec2")
        originals = {}
        for sub in sorted(subnets, key=lambda s: s["SubnetId"]):
            _, acl = self._association(sub["SubnetId"])
            originals[sub["SubnetId"]] = acl
        acl_id = self._call("create network ACL", ec2.create_network_acl, VpcId=vpcs[0],
                            TagSpecifications=[{"ResourceType": "network-acl", "Tags": [
                                {"Key": ZONE_ACL_TAG, "Value": zone},
                                {"Key": "Name", "Value": f"gameday-zone-outage-{zone}"}]}],
                            )["NetworkAcl"]["NetworkAclId"]
        undo = {"zone": zone, "vpc": vpcs[0], "deny_acl": acl_id, "originals": originals}
        self.state.put(key, "zone_network_acl", zone, undo)
        for egress in (False, True):  # explicit, although a new ACL already denies everything
            self._call(f"deny-all entry on {acl_id}", ec2.create_network_acl_entry,
                       NetworkAclId=acl_id, RuleNumber=1, Protocol="-1", RuleAction="deny",
                       Egress=egress, CidrBlock="0.0.0.0/0")
        for subnet in originals:
            assoc, _ = self._association(subnet)
            logger.warning("chaos zone_outage: subnet %s (%s) -> deny-all ACL %s", subnet, zone,
                           acl_id)
            self._call(f"associate {acl_id} with {subnet}", ec2.replace_network_acl_association,
                       AssociationId=assoc, NetworkAclId=acl_id)
        return {"target": zone, **undo}

    def undo_zone_outage(self, key: str) -> dict[str, Any] | None:
        """Put every subnet back on its original ACL, then delete the deny-all ACL."""
        record = self.state.get(key)
        if record is None:
            return None
        undo, ec2 = record["undo"], self._client("ec2")
        for subnet, original in undo["originals"].items():
            assoc, current = self._association(subnet)
            if current != original:
                logger.warning("chaos restore_zone: subnet %s back to ACL %s", subnet, original)
                self._call(f"associate {original} with {subnet}",
                           ec2.replace_network_acl_association, AssociationId=assoc,
                           NetworkAclId=original)
        try:
            ec2.delete_network_acl(NetworkAclId=undo["deny_acl"])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "InvalidNetworkAclID.NotFound":
                raise AwsFaultError(f"delete {undo['deny_acl']}: {exc}") from exc
        self.state.pop(key)
        return {"target": record["target"], **undo}

    def db_zone(self) -> str | None:
        """The availability zone of the RDS primary (None without an instance id)."""
        if not self.target.db_instance_id:
            return None
        return self._call(f"describe {self.target.db_instance_id}",
                          self._client("rds").describe_db_instances,
                          DBInstanceIdentifier=self.target.db_instance_id,
                          )["DBInstances"][0].get("AvailabilityZone")

"""Policies over registered resources, usable offline (tests call ``.validate``) and by
``provisioning/policypack`` for a real ``pulumi preview --policy-pack``.

No PolicyPack is constructed here: constructing one starts a gRPC server that never returns.
Props are the resource inputs in camelCase (what the engine and the mocks both see).
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from provisioning.components.common import (
    ACCELERATOR_LABEL,
    GPU_RESOURCE,
    POOL_LABEL,
    REQUIRED_TAGS,
)
from provisioning.deployability import pod_template

Report = Callable[[str, Any], None]
MANDATORY = EnforcementLevel.MANDATORY
# Data-plane services on which a wildcard action would grant read/write/delete of data.
DATA_SERVICES = ("s3", "kms", "rds", "rds-db", "secretsmanager", "ecr", "dynamodb")
# Actions without resource-level permissions, allowed on "*" because they expose no data.
RESOURCELESS_ACTIONS = {"ecr:GetAuthorizationToken"}




# -- buckets ------------------------------------------------------------------------------
def _bucket_public_access(props: Mapping[str, Any], report: Report) -> None:
    for flag in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"):
        if props.get(flag) is not True:
            report(f"bucket public access block must set {flag}: true", None)


def _bucket_versioning(props: Mapping[str, Any], report: Report) -> None:
    if (props.get("versioningConfiguration") or {}).get("status") != "Enabled":
        report("bucket versioning must be Enabled", None)


def _bucket_encryption(props: Mapping[str, Any], report: Report) -> None:
    for rule in props.get("rules") or [{}]:
        default = rule.get("applyServerSideEncryptionByDefault") or {}
        if default.get("sseAlgorithm") != "aws:kms" or not default.get("kmsMasterKeyId"):
            report("bucket default encryption must be aws:kms with a customer-managed key", None)


def _bucket_ownership(props: Mapping[str, Any], report: Report) -> None:
    if (props.get("rule") or {}).get("objectOwnership") != "BucketOwnerEnforced":
        report("bucket object ownership must be BucketOwnerEnforced (ACLs disabled)", None)


def _bucket_no_acl(props: Mapping[str, Any], report: Report) -> None:
    if props.get("acl") not in (None, "private"):
        report(f"bucket ACL {props.get('acl')!r} is not private", None)


def _dispatch(table: dict[str, Callable[[Mapping[str, Any], Report], None]]) -> Callable:
    def validate(args: ResourceValidationArgs, report: Report) -> None:
        fn = table.get(args.resource_type)
        if fn:
            fn(args.props, report)
    return validate


buckets_private_versioned_encrypted = ResourceValidationPolicy(
    name="buckets-private-versioned-encrypted",
    description="S3 buckets: public access blocked, versioned, KMS-encrypted, owner enforced.",
    enforcement_level=MANDATORY,
    validate=_dispatch({
        "aws:s3/bucket:Bucket": _bucket_no_acl,
        "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": _bucket_public_access,
        "aws:s3/bucketVersioning:BucketVersioning": _bucket_versioning,
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": _bucket_encryption,
        "aws:s3/bucketOwnershipControls:BucketOwnershipControls": _bucket_ownership,
    }),
)


# -- node pools -----------------------------------------------------------------------------
def _node_groups(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type not in ("eks:index:ManagedNodeGroup", "aws:eks/nodeGroup:NodeGroup"):
        return
    props = args.props
    labels = props.get("labels") or {}
    pool = labels.get(POOL_LABEL)
    is_gpu = "NVIDIA" in str(props.get("amiType", "")) or pool == "gpu"
    taints = props.get("taints") or []
    if is_gpu and not any(t.get("key") == GPU_RESOURCE and t.get("effect") == "NO_SCHEDULE" for t in taints):
        report(f"GPU node group must carry the {GPU_RESOURCE} NoSchedule taint", None)
    if is_gpu and (props.get("scalingConfig") or {}).get("minSize", 0) != 0:
        report("GPU node group must scale to zero (minSize 0)", None)
    if pool == "system" and props.get("capacityType", "ON_DEMAND") != "ON_DEMAND":
        report("the system (control-plane) pool must be ON_DEMAND, never SPOT", None)
    if pool is None:
        report(f"node group has no {POOL_LABEL} label", None)


gpu_pools_tainted_and_system_on_demand = ResourceValidationPolicy(
    name="node-pools-isolated",
    description="GPU pools tainted and scale to zero; the system pool is on-demand.",
    enforcement_level=MANDATORY,
    validate=_node_groups,
)


def _karpenter_node_pools(args: ResourceValidationArgs, report: Report) -> None:
    """The same rules for the pools Karpenter provisions, plus a spend limit on each."""
    props = args.props
    if props.get("kind") != "NodePool" or not str(props.get("apiVersion", "")).startswith("karpenter.sh/"):
        return
    template = (props.get("spec") or {}).get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    pool = labels.get(POOL_LABEL)
    if pool is None:
        report(f"NodePool has no {POOL_LABEL} label on its nodes", None)
    spec = template.get("spec") or {}
    tainted = any(t.get("key") == GPU_RESOURCE and t.get("effect") == "NoSchedule"
                  for t in spec.get("taints") or [])
    if (pool == "gpu" or ACCELERATOR_LABEL in labels) and not tainted:
        report(f"GPU NodePool must carry the {GPU_RESOURCE} NoSchedule taint", None)
    if pool == "system":
        capacity = [r.get("values") for r in spec.get("requirements") or []
                    if r.get("key") == "karpenter.sh/capacity-type"]
        if capacity != [["on-demand"]]:
            report("the system (control-plane) pool must be on-demand, never spot", None)
    if not (props.get("spec") or {}).get("limits"):
        report("NodePool has no limits: nothing bounds what it may launch", None)


karpenter_node_pools = ResourceValidationPolicy(
    name="karpenter-node-pools",
    description="Karpenter NodePools: GPU pools tainted, system on-demand, every pool bounded.",
    enforcement_level=MANDATORY,
    validate=_karpenter_node_pools,
)


# -- control plane placement ------------------------------------------------------------------
CONTROL_PLANE_KINDS = {"Deployment", "StatefulSet", "Job", "CronJob"}


def _pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return (pod_template(obj) or {}).get("spec")


def _control_plane_placement(args: ResourceValidationArgs, report: Report) -> None:
    props = args.props
    if not args.resource_type.startswith("kubernetes:") or props.get("kind") not in CONTROL_PLANE_KINDS:
        return
    labels = (props.get("metadata") or {}).get("labels") or {}
    if labels.get("app.kubernetes.io/name") != "controlplane" and not str(
        (props.get("metadata") or {}).get("name", "")).startswith("controlplane"):
        return
    pod = _pod_spec(props) or {}
    if (pod.get("nodeSelector") or {}).get(POOL_LABEL) != "system":
        report(f"control-plane pods must select {POOL_LABEL}=system", None)
    if any(t.get("key") == GPU_RESOURCE for t in pod.get("tolerations") or []):
        report("control-plane pods must not tolerate the GPU taint", None)
    terms = (((pod.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    on_demand = any(
        e.get("key") == "eks.amazonaws.com/capacityType" and e.get("operator") == "In"
        and list(e.get("values") or []) == ["ON_DEMAND"]
        for term in terms for e in term.get("matchExpressions") or []
    )
    if not on_demand or not terms:
        report("control-plane pods must require eks.amazonaws.com/capacityType In [ON_DEMAND]", None)
    for c in pod.get("containers") or []:
        if GPU_RESOURCE in ((c.get("resources") or {}).get("requests") or {}):
            report("control-plane containers must not request GPUs", None)


control_plane_never_on_spot_or_gpu = ResourceValidationPolicy(
    name="control-plane-on-demand-system-nodes",
    description="Control-plane pods run only on on-demand system nodes, never on spot or GPU nodes.",
    enforcement_level=MANDATORY,
    validate=_control_plane_placement,
)


# -- database -----------------------------------------------------------------------------
def _database(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != "aws:rds/instance:Instance":
        return
    p = args.props
    if p.get("storageEncrypted") is not True:
        report("RDS storage must be encrypted", None)
    if p.get("publiclyAccessible"):
        report("RDS must not be publicly accessible", None)
    if (p.get("tags") or {}).get("environment") == "prod":
        if p.get("multiAz") is not True:
            report("prod database must be Multi-AZ", None)
        if p.get("deletionProtection") is not True:
            report("prod database must have deletion protection", None)
        if p.get("skipFinalSnapshot"):
            report("prod database must take a final snapshot", None)


prod_database_ha = ResourceValidationPolicy(
    name="database-encrypted-prod-ha",
    description="RDS encrypted and private; prod is Multi-AZ with deletion protection and a final snapshot.",
    enforcement_level=MANDATORY,
    validate=_database,
)


# -- tags ---------------------------------------------------------------------------------
@cache
def is_taggable(resource_type: str) -> bool:
    """Whether the pulumi-aws resource type accepts ``tags`` (read from its constructor)."""
    pkg, module, _ = (resource_type.split(":") + ["", ""])[:3]
    if pkg != "aws":
        return False
    mod_name, cls_name = module.split("/")[0], resource_type.rsplit(":", 1)[-1]
    try:
        cls = getattr(importlib.import_module(f"pulumi_aws.{mod_name}"), cls_name)
    except (ImportError, AttributeError):
        return False
    return "tags" in inspect.signature(cls._internal_init).parameters


def provider_default_tags(args: ResourceValidationArgs) -> dict[str, Any]:
    """The ``defaultTags`` of the resource's AWS provider: the provider adds them on create,
    so children of other components (pulumi-eks) carry them without a ``tags`` input."""
    return default_tags(getattr(getattr(args, "provider", None), "props", None) or {})


def default_tags(provider_props: Mapping[str, Any]) -> dict[str, Any]:
    """``defaultTags.tags`` of an AWS provider's inputs (a stack's ``aws:defaultTags``)."""
    default = provider_props.get("defaultTags") or {}
    if isinstance(default, str):  # default providers get their config JSON-encoded
        try:
            default = json.loads(default)
        except ValueError:
            return {}
    tags = default.get("tags") if isinstance(default, Mapping) else None
    return dict(tags) if isinstance(tags, Mapping) else {}


# pulumi-eks components that take ``tags`` and pass them to what they create.
TAGGABLE_COMPONENTS = frozenset({"eks:index:Cluster", "eks:index:ManagedNodeGroup"})


def takes_tags(resource_type: str) -> bool:
    return is_taggable(resource_type) or resource_type in TAGGABLE_COMPONENTS


def _tags(args: ResourceValidationArgs, report: Report) -> None:
    if not takes_tags(args.resource_type):
        return
    tags = {**provider_default_tags(args), **(args.props.get("tags") or {})}
    missing = [t for t in REQUIRED_TAGS if not tags.get(t)]
    if missing:
        report(f"missing required tags {missing}", None)


required_tags = ResourceValidationPolicy(
    name="required-tags",
    description=f"Every taggable AWS resource carries {', '.join(REQUIRED_TAGS)}.",
    enforcement_level=MANDATORY,
    validate=_tags,
)


# -- IAM ------------------------------------------------------------------------------------
def wildcard_data_actions(document: Mapping[str, Any] | str) -> list[str]:
    """Allow statements that grant ``*`` / ``<data-service>:*`` actions or data actions on
    ``Resource: "*"``."""
    doc = json.loads(document) if isinstance(document, str) else document
    problems = []
    for st in doc.get("Statement", []):
        if st.get("Effect") != "Allow":
            continue
        actions = st.get("Action", [])
        actions = [actions] if isinstance(actions, str) else actions
        resources = st.get("Resource", [])
        resources = [resources] if isinstance(resources, str) else resources
        for action in actions:
            service = action.split(":")[0]
            if action == "*" or (service in DATA_SERVICES and action.endswith(":*")):
                problems.append(f"wildcard action {action!r}")
            elif service in DATA_SERVICES and "*" in resources and action not in RESOURCELESS_ACTIONS:
                problems.append(f"{action!r} on Resource '*'")
    return problems


def _iam(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type not in ("aws:iam/rolePolicy:RolePolicy", "aws:iam/policy:Policy"):
        return
    doc = args.props.get("policy")
    if not doc:
        return
    for problem in wildcard_data_actions(doc):
        report(f"IAM policy grants {problem} on data", None)


no_wildcard_data_actions = ResourceValidationPolicy(
    name="no-wildcard-iam-on-data",
    description="Identity policies never grant wildcard actions on data services or data actions on '*'.",
    enforcement_level=MANDATORY,
    validate=_iam,
)


# -- stack-level: PDBs --------------------------------------------------------------------
def _selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def unmatched_pdbs(objects: list[Mapping[str, Any]]) -> list[str]:
    """PDBs whose selector matches no Deployment's (or Argo Rollout's) pod template in the
    same namespace."""
    deployments = [o for o in objects if o.get("kind") in ("Deployment", "Rollout")]
    bad = []
    for pdb in (o for o in objects if o.get("kind") == "PodDisruptionBudget"):
        ns = pdb["metadata"].get("namespace")
        selector = ((pdb.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        if not any(
            d["metadata"].get("namespace") == ns
            and _selector_matches(selector, d["spec"]["template"]["metadata"].get("labels") or {})
            for d in deployments
        ):
            bad.append(f"{ns}/{pdb['metadata'].get('name')}")
    return bad


def _pdbs(args: StackValidationArgs, report: Report) -> None:
    objects = [r.props for r in args.resources if r.resource_type.startswith("kubernetes:")]
    for name in unmatched_pdbs(objects):
        report(f"PodDisruptionBudget {name} matches no Deployment or Rollout", None)


pdb_matches_deployment = StackValidationPolicy(
    name="pdb-matches-deployment",
    description="Every PodDisruptionBudget selects the pods of a Deployment in its namespace.",
    enforcement_level=MANDATORY,
    validate=_pdbs,
)

# -- model serving ---------------------------------------------------------------------------
def _serving_ha(args: ResourceValidationArgs, report: Report) -> None:
    """What a real `pulumi preview --policy-pack` can hold one resource at a time (the whole
    picture is the offline `delivery` check, provisioning/deployability.py)."""
    props, kind = args.props, args.props.get("kind")
    api = str(props.get("apiVersion", ""))
    spec = props.get("spec") or {}
    if kind == "ScaledObject" and api.startswith("keda.sh/"):
        if int(spec.get("minReplicaCount") or 0) < 2:
            report("a ScaledObject must keep minReplicaCount >= 2: one lost pod must not stop "
                   "what it scales", None)
    elif kind == "Rollout" and api.startswith("argoproj.io/"):
        canary = (spec.get("strategy") or {}).get("canary")
        if not isinstance(canary, Mapping) or not canary.get("analysis"):
            report("a Rollout must be a canary with a background analysis (automatic rollback)",
                   None)
        for c in (_pod_spec(props) or {}).get("containers") or []:
            if not c.get("readinessProbe"):
                report(f"Rollout container {c.get('name')!r} has no readinessProbe", None)


serving_ha = ResourceValidationPolicy(
    name="serving-ha",
    description="Model serving: at least two replicas, readiness-gated pods, canaries analysed "
                "and rolled back automatically.",
    enforcement_level=MANDATORY,
    validate=_serving_ha,
)


RESOURCE_POLICIES: list[ResourceValidationPolicy] = [
    buckets_private_versioned_encrypted,
    gpu_pools_tainted_and_system_on_demand,
    karpenter_node_pools,
    control_plane_never_on_spot_or_gpu,
    prod_database_ha,
    required_tags,
    no_wildcard_data_actions,
    serving_ha,
]
STACK_POLICIES: list[StackValidationPolicy] = [pdb_matches_deployment]
ALL_POLICIES: list[ResourceValidationPolicy | StackValidationPolicy] = [*RESOURCE_POLICIES, *STACK_POLICIES]

"""Offline policies over the registered resources, and Kubernetes schema validation."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
)

from provisioning.policies import (
    RESOURCE_POLICIES,
    STACK_POLICIES,
    pdb_matches_deployment,
    wildcard_data_actions,
)
from tests.infra.harness import Resource, Run

OPTS = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])
K8S_VERSION = "1.33.0"  # the cluster's pinned kubernetesVersion
# CRDs have no schema in kubernetes-validate; they are checked structurally below instead.
CRD_GROUPS = ("monitoring.coreos.com", "external-secrets.io", "generators.external-secrets.io",
              "karpenter.sh", "karpenter.k8s.aws", "argoproj.io", "keda.sh")
CLUSTER_SCOPED_CRD_GROUPS = ("karpenter.sh", "karpenter.k8s.aws")  # NodePool, EC2NodeClass


def violations(resources: list[Resource]) -> list[str]:
    found: list[str] = []
    for r in resources:
        args = ResourceValidationArgs(r.type, r.props, r.urn, r.name, OPTS, None)
        for policy in RESOURCE_POLICIES:
            policy.validate(args, lambda msg, urn=None, p=policy, r=r: found.append(f"{p.name}: {r.name}: {msg}"))
    stack = StackValidationArgs([PolicyResource(r.type, r.props, r.urn, r.name, OPTS, None, None, [], {})
                                 for r in resources])
    for policy in STACK_POLICIES:
        policy.validate(stack, lambda msg, urn=None, p=policy: found.append(f"{p.name}: {msg}"))
    return found


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_every_stack_passes_every_policy(runs: dict[str, Run], stack: str) -> None:
    assert violations(runs[stack].resources) == []


def _mutate(run: Run, type_: str, fn: Any, name: str = "") -> list[Resource]:
    out = []
    for r in run.resources:
        if r.type == type_ and name in r.name:
            props = copy.deepcopy(r.props)
            fn(props)
            r = Resource(r.urn, r.type, r.name, props)
        out.append(r)
    return out


@pytest.mark.parametrize(("type_", "mutation", "expected"), [
    ("aws:s3/bucketVersioning:BucketVersioning",
     lambda p: p["versioningConfiguration"].update(status="Suspended"), "versioning must be Enabled"),
    ("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
     lambda p: p.update(blockPublicPolicy=False), "blockPublicPolicy"),
    ("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
     lambda p: p["rules"][0]["applyServerSideEncryptionByDefault"].update(sseAlgorithm="AES256"), "aws:kms"),
    # The GPU pool is a Karpenter NodePool now (its taint: tests/infra/test_autoscaling.py);
    # the node-group policy still guards the one managed node group, system.
    ("eks:index:ManagedNodeGroup", lambda p: p.update(capacityType="SPOT"), "must be ON_DEMAND"),
    ("eks:index:ManagedNodeGroup", lambda p: p.update(capacityType="SPOT") if p["labels"].get(
        "platform.gameday/pool") == "system" else None, "never SPOT"),
    ("kubernetes:karpenter.sh/v1:NodePool", lambda p: p["spec"]["template"]["spec"].update(
        taints=[]), "GPU NodePool must carry the nvidia.com/gpu NoSchedule taint"),
    ("kubernetes:karpenter.sh/v1:NodePool", lambda p: p["spec"].pop("limits"),
     "NodePool has no limits"),
    ("kubernetes:karpenter.sh/v1:NodePool", lambda p: (
        p["spec"]["template"]["metadata"]["labels"].update({"platform.gameday/pool": "system"}),
        p["spec"]["template"]["spec"].update(requirements=[
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}])),
     "never spot"),
    ("kubernetes:apps/v1:Deployment", lambda p: p["spec"]["template"]["spec"]["tolerations"].append(
        {"key": "nvidia.com/gpu", "operator": "Exists"}), "must not tolerate the GPU taint"),
    ("kubernetes:apps/v1:Deployment", lambda p: p["spec"]["template"]["spec"].pop("affinity"), "ON_DEMAND"),
    ("aws:rds/instance:Instance", lambda p: p.update(multiAz=False), "prod database must be Multi-AZ"),
    ("aws:rds/instance:Instance", lambda p: p.update(deletionProtection=False), "deletion protection"),
    ("aws:ec2/vpc:Vpc", lambda p: p["tags"].pop("cost-center"), "missing required tags ['cost-center']"),
    ("aws:iam/rolePolicy:RolePolicy",
     lambda p: p.update(policy='{"Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}'),
     "wildcard action 's3:*'"),
    ("kubernetes:policy/v1:PodDisruptionBudget",
     lambda p: p["spec"]["selector"]["matchLabels"].update({"app.kubernetes.io/component": "nothing"}),
     "matches no Deployment"),
    ("kubernetes:keda.sh/v1alpha1:ScaledObject", lambda p: p["spec"].update(minReplicaCount=1),
     "minReplicaCount >= 2"),
    ("kubernetes:argoproj.io/v1alpha1:Rollout",
     lambda p: p["spec"]["strategy"]["canary"].pop("analysis"), "background analysis"),
    ("kubernetes:argoproj.io/v1alpha1:Rollout", lambda p: p["spec"]["template"]["spec"][
        "containers"][0].pop("readinessProbe"), "has no readinessProbe"),
])
def test_policies_catch_violations(runs: dict[str, Run], type_: str, mutation: Any, expected: str) -> None:
    found = violations(_mutate(runs["prod"], type_, mutation))
    assert any(expected in v for v in found), found


def test_wildcard_detection_details() -> None:
    assert wildcard_data_actions({"Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}]})
    assert not wildcard_data_actions({"Statement": [
        {"Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
        {"Effect": "Deny", "Action": "s3:*", "Resource": "*"}]})
    assert pdb_matches_deployment.name == "pdb-matches-deployment"


def _plain(value: Any) -> Any:
    """Mock state carries numbers as floats; Kubernetes wants integers."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def export_manifests(run: Run, directory: Path) -> list[dict[str, Any]]:
    docs = [_plain({k: v for k, v in r.props.items() if k not in ("arn",)}) for r in run.k8s_objects()]
    (directory / f"{run.stack}.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return docs


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_every_kubernetes_object_validates_against_pinned_schema(
    runs: dict[str, Run], stack: str, tmp_path: Path
) -> None:
    docs = export_manifests(runs[stack], tmp_path)
    reloaded = list(yaml.safe_load_all((tmp_path / f"{stack}.yaml").read_text()))
    assert reloaded == docs and len(docs) > 20
    kinds = set()
    for doc in reloaded:
        kinds.add(doc["kind"])
        if doc["apiVersion"].split("/")[0] in CRD_GROUPS:
            # Structural check of the custom resources we declare.
            group = doc["apiVersion"].split("/")[0]
            assert doc["metadata"]["name"] and doc["spec"]
            assert ("namespace" in doc["metadata"]) == (group not in CLUSTER_SCOPED_CRD_GROUPS)
            if doc["kind"] == "PrometheusRule":
                for group in doc["spec"]["groups"]:
                    assert group["name"] and group["rules"]
                    for rule in group["rules"]:
                        assert ("alert" in rule) != ("record" in rule) and isinstance(rule["expr"], str)
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert {"Deployment", "PodDisruptionBudget", "NetworkPolicy", "ResourceQuota", "LimitRange",
            "PriorityClass", "Namespace", "ServiceAccount", "Job", "PrometheusRule"} <= kinds

"""Karpenter, per stack, on the mock-rendered program: the pieces exist *and fit together*
(chart <-> queue, NodeClass selectors <-> tags the subnets/security group really carry,
node role <-> access entry, NodePool labels/taints <-> what agents and their Jobs select).

Each check is a function returning problems, so the mutation tests below break one thing in
a copy of the rendered resources and watch the check report it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from controlplane.runtimes.kubernetes import pool_options
from provisioning.components.autoscaling import CHART, NAMESPACE
from provisioning.components.instance_types import INSTANCE_TYPES
from provisioning.config import ConfigError
from tests.infra.harness import Resource, Run, run_program, stack_config
from tests.infra.test_policies_and_schema import _mutate

STACKS = ("dev", "staging", "prod")
CHART_T = "kubernetes:helm.sh/v4:Chart"
NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
NODECLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
QUEUE = "aws:sqs/queue:Queue"
SUBNET = "aws:ec2/subnet:Subnet"
INTERRUPTION_DETAIL_TYPES = {"AWS Health Event", "EC2 Spot Instance Interruption Warning",
                             "EC2 Instance Rebalance Recommendation",
                             "EC2 Instance State-change Notification"}


# -- helpers -----------------------------------------------------------------------------------
def _karpenter_chart(run: Run) -> Resource:
    charts = [c for c in run.of_type(CHART_T) if c.props.get("chart") == CHART]
    assert len(charts) == 1, f"{run.stack}: expected one Karpenter chart, got {len(charts)}"
    return charts[0]


def _by_meta_name(run: Run, type_: str) -> dict[str, dict[str, Any]]:
    return {r.props["metadata"]["name"]: r.props for r in run.of_type(type_)}


def _statements(run: Run, role_policy_name: str) -> list[dict[str, Any]]:
    policy = next(r for r in run.of_type("aws:iam/rolePolicy:RolePolicy") if r.name == role_policy_name)
    return json.loads(policy.props["policy"])["Statement"]


def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    return any(t.get("key") == taint["key"] and t.get("effect") in (None, "", taint["effect"])
               and (t.get("operator") == "Exists" or t.get("value") == taint.get("value"))
               for t in tolerations)


def _agent_pool_selectors(run: Run) -> dict[str, dict[str, str]]:
    """pool -> the node selector each agent Deployment hands its Jobs (AGENT_K8S_POOL_LABEL)."""
    out = {}
    for d in run.of_type("kubernetes:apps/v1:Deployment"):
        name = d.props["metadata"]["name"]
        if not name.startswith("controlplane-agent-"):
            continue
        env = {e["name"]: e.get("value") for e in d.props["spec"]["template"]["spec"]["containers"][0]["env"]}
        key, _, value = env["AGENT_K8S_POOL_LABEL"].partition("=")
        out[name.removeprefix("controlplane-agent-")] = {key: value}
    return out


# -- checks (each returns problems; [] = fine) -------------------------------------------------
def chart_problems(run: Run) -> list[str]:
    problems = []
    v = _karpenter_chart(run).props
    values = v["values"]
    if not v.get("version") or v.get("skipCrds"):
        problems.append("chart must be pinned and install its CRDs")
    if v.get("namespace") != NAMESPACE or NAMESPACE not in _by_meta_name(run, "kubernetes:core/v1:Namespace"):
        problems.append(f"namespace {v.get('namespace')!r} is not created by the program")
    if values.get("nodeSelector") != {"platform.gameday/pool": "system"}:
        problems.append("controller is not pinned to the system pool")
    if not _tolerates(values.get("tolerations", []), {"key": "CriticalAddonsOnly", "effect": "NoSchedule"}):
        problems.append("controller does not tolerate the system pool's taint")
    cluster = run.one("eks:index:Cluster").props["name"]
    if values["settings"].get("clusterName") != cluster:
        problems.append("settings.clusterName is not the cluster")
    roles = {r.props["arn"]: r for r in run.of_type("aws:iam/role:Role")}
    arn = values["serviceAccount"]["annotations"].get("eks.amazonaws.com/role-arn")
    trust = json.loads(roles[arn].props["assumeRolePolicy"]) if arn in roles else None
    sa = f"system:serviceaccount:{v['namespace']}:{values['serviceAccount']['name']}"
    if trust is None or sa not in trust["Statement"][0]["Condition"]["StringEquals"].values():
        problems.append("service account is not annotated with a role that trusts it")
    return problems


def queue_problems(run: Run) -> list[str]:
    problems = []
    queues = {q.props["name"]: q.props for q in run.of_type(QUEUE) if "karpenter" in q.name}
    named = _karpenter_chart(run).props["values"]["settings"].get("interruptionQueue")
    if named not in queues:
        return [f"settings.interruptionQueue {named!r} names no queue ({sorted(queues)})"]
    queue = queues[named]
    if not (queue.get("sqsManagedSseEnabled") or queue.get("kmsMasterKeyId")):
        problems.append("queue is not encrypted")
    targeted = {t.props["rule"] for t in run.of_type("aws:cloudwatch/eventTarget:EventTarget")
                if t.props["arn"] == queue["arn"]}
    detail_types = {dt for r in run.of_type("aws:cloudwatch/eventRule:EventRule") if r.props["name"] in targeted
                    for dt in json.loads(r.props["eventPattern"])["detail-type"]}
    if detail_types != INTERRUPTION_DETAIL_TYPES:
        problems.append(f"events reaching the queue: {sorted(detail_types)}")
    policies = [json.loads(p.props["policy"]) for p in run.of_type("aws:sqs/queuePolicy:QueuePolicy")]
    senders = {svc for doc in policies for s in doc["Statement"]
               if s["Effect"] == "Allow" and s["Action"] == "sqs:SendMessage" and s["Resource"] == queue["arn"]
               for svc in s["Principal"]["Service"]}
    if not {"events.amazonaws.com", "sqs.amazonaws.com"} <= senders:
        problems.append(f"queue policy lets only {sorted(senders)} send")
    reads = [s for s in _statements(run, f"mlplatform-{run.stack}-karpenter-controller-policy")
             if "sqs:ReceiveMessage" in s["Action"]]
    if not reads or reads[0]["Resource"] != [queue["arn"]]:
        problems.append("controller cannot read the queue")
    return problems


def node_pool_problems(run: Run) -> list[str]:
    problems = []
    cfg = stack_config(run.stack)["mlplatform:nodePools"]
    allow_spot = stack_config(run.stack).get("mlplatform:allowSpot", False)
    pools = _by_meta_name(run, NODEPOOL)
    agents = _agent_pool_selectors(run)
    if set(pools) != {"cpu", "gpu"}:
        return [f"NodePools {sorted(pools)}, expected cpu and gpu"]
    for pool, props in pools.items():
        template = props["spec"]["template"]
        labels, taints = template["metadata"]["labels"], template["spec"]["taints"]
        job = pool_options(pool)
        for who, selector in (("agent env", agents.get(pool, {})), ("Job", dict(job.node_selector))):
            if not selector or not selector.items() <= labels.items():
                problems.append(f"{pool}: {who} selects {selector}, nodes get {labels}")
        job_tolerations = [{"key": t.key, "operator": t.operator, "effect": getattr(t, "effect", None)}
                           for t in job.tolerations]
        untolerated = [t for t in taints if not _tolerates(job_tolerations, t)]
        if untolerated:
            problems.append(f"{pool}: Jobs do not tolerate {untolerated}")
        gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
        if (pool == "gpu") != (gpu_taint in taints):
            problems.append(f"{pool}: nvidia.com/gpu NoSchedule taint {'missing' if pool == 'gpu' else 'present'}")
        if pool == "gpu" and labels.get("platform.gameday/accelerator") != cfg["gpu"]["acceleratorType"]:
            problems.append("gpu: accelerator label differs from config")
        req = {r["key"]: r["values"] for r in template["spec"]["requirements"]}
        if req.get("node.kubernetes.io/instance-type") != cfg[pool]["instanceTypes"]:
            problems.append(f"{pool}: instance types {req.get('node.kubernetes.io/instance-type')}")
        spot = cfg[pool].get("capacityType") == "SPOT"
        if "spot" in req.get("karpenter.sh/capacity-type", []) and not (spot and allow_spot):
            problems.append(f"{pool}: spot allowed although config does not allow it")
        if spot and "spot" not in req.get("karpenter.sh/capacity-type", []):
            problems.append(f"{pool}: config asks for spot, NodePool never uses it")
        caps = [INSTANCE_TYPES[t] for t in cfg[pool]["instanceTypes"]]
        limit_cpu = int(props["spec"]["limits"]["cpu"])
        if limit_cpu != cfg[pool]["maxSize"] * max(c.vcpus for c in caps):
            problems.append(f"{pool}: cpu limit {limit_cpu} is not maxSize x vCPUs")
        policy = props["spec"]["disruption"]["consolidationPolicy"]
        if policy != ("WhenEmpty" if pool == "gpu" else "WhenEmptyOrUnderutilized"):
            problems.append(f"{pool}: consolidation {policy}")
    gpu_limit = pools["gpu"]["spec"]["limits"].get("nvidia.com/gpu")
    if gpu_limit is None or int(gpu_limit) != cfg["gpu"]["maxSize"] * max(
            INSTANCE_TYPES[t].gpus for t in cfg["gpu"]["instanceTypes"]):
        problems.append(f"gpu: nvidia.com/gpu limit {gpu_limit}")
    return problems


def node_class_problems(run: Run) -> list[str]:
    problems = []
    subnets = run.of_type(SUBNET)
    sg_id = run.one("eks:index:Cluster").props["clusterSecurityGroupId"]
    sg_tags = {t.props["key"]: t.props["value"] for t in run.of_type("aws:ec2/tag:Tag")
               if t.props["resourceId"] == sg_id}
    key_arn = run.one("aws:kms/key:Key", "-data-key").props["arn"]
    classes = _by_meta_name(run, NODECLASS)
    pools = {p["metadata"]["name"]: p for p in _by_meta_name(run, NODEPOOL).values()}
    gpu_ami = stack_config(run.stack)["mlplatform:nodePools"]["gpu"]["amiType"]
    for pool, np in pools.items():
        ref = np["spec"]["template"]["spec"]["nodeClassRef"]["name"]
        if ref not in classes:
            problems.append(f"{pool}: nodeClassRef {ref!r} names no EC2NodeClass")
            continue
        spec = classes[ref]["spec"]
        for term in spec["subnetSelectorTerms"]:
            matched = [s.name for s in subnets if term["tags"].items() <= s.props["tags"].items()]
            if not matched or any("-private-" not in n for n in matched):
                problems.append(f"{ref}: subnet selector {term['tags']} matches {matched}")
        for term in spec["securityGroupSelectorTerms"]:
            if not term["tags"].items() <= sg_tags.items():
                problems.append(f"{ref}: security-group selector {term['tags']}, cluster SG carries {sg_tags}")
        if spec["metadataOptions"].get("httpTokens") != "required":
            problems.append(f"{ref}: IMDSv2 not required")
        for bdm in spec["blockDeviceMappings"]:
            if not (bdm["ebs"].get("encrypted") and bdm["ebs"].get("kmsKeyID") == key_arn):
                problems.append(f"{ref}: {bdm['deviceName']} not encrypted with the data key")
        family = spec["amiSelectorTerms"][0]["alias"].split("@")[0]
        want = "bottlerocket" if pool == "gpu" and gpu_ami.startswith("BOTTLEROCKET") else "al2023"
        if family != want:
            problems.append(f"{ref}: AMI family {family}, expected {want}")
        if not {"owner", "cost-center", "environment", "project"} <= set(spec.get("tags", {})):
            problems.append(f"{ref}: instance tags miss the required set")
    return problems


def join_problems(run: Run) -> list[str]:
    """Every node role a NodeClass launches with is allowed to join and to be passed."""
    problems = []
    cluster = run.one("eks:index:Cluster").props["name"]
    profiles = {p.props["name"]: p.props for p in run.of_type("aws:iam/instanceProfile:InstanceProfile")}
    roles = {r.props["name"]: r.props for r in run.of_type("aws:iam/role:Role")}
    entries = {(e.props["principalArn"], e.props["type"], e.props["clusterName"])
               for e in run.of_type("aws:eks/accessEntry:AccessEntry")}
    pass_role = [arn for s in _statements(run, f"mlplatform-{run.stack}-karpenter-controller-policy")
                 if s["Action"] == "iam:PassRole" for arn in s["Resource"]]
    for name, nc in _by_meta_name(run, NODECLASS).items():
        profile = profiles.get(nc["spec"].get("instanceProfile"))
        role = roles.get(profile["role"]) if profile else None
        if role is None:
            problems.append(f"{name}: instance profile/role not created by the program")
            continue
        if (role["arn"], "EC2_LINUX", cluster) not in entries:
            problems.append(f"{name}: node role {role['name']} has no EC2_LINUX access entry")
        if role["arn"] not in pass_role:
            problems.append(f"{name}: controller may not pass node role {role['name']}")
    return problems


CHECKS: dict[str, Callable[[Run], list[str]]] = {
    "chart": chart_problems, "queue": queue_problems, "nodepools": node_pool_problems,
    "nodeclasses": node_class_problems, "join": join_problems,
}


# -- the rendered stacks pass every check ------------------------------------------------------
@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("check", sorted(CHECKS))
def test_karpenter_fits_together(runs: dict[str, Run], stack: str, check: str) -> None:
    assert CHECKS[check](runs[stack]) == []


@pytest.mark.parametrize("stack", STACKS)
def test_only_system_is_a_managed_node_group(runs: dict[str, Run], stack: str) -> None:
    mngs = runs[stack].of_type("eks:index:ManagedNodeGroup")
    assert [m.props["labels"]["platform.gameday/pool"] for m in mngs] == ["system"]
    assert mngs[0].props["capacityType"] == "ON_DEMAND"


def test_interruption_queue_is_exported(runs: dict[str, Run]) -> None:
    # The platform stack exports the component's queue name (queue_problems ties it to the
    # chart's settings.interruptionQueue), and hands it to the application layer's chart.
    run = runs["dev"]
    queue = run.one(QUEUE, "karpenter").props["name"]
    assert run.exports["dev"]["karpenterInterruptionQueue"] == queue
    assert run.exports["dev"]["karpenter"]["queueName"] == queue


# -- mutations: break one thing in a copy, the matching check reports it ------------------------
def _mutated(run: Run, type_: str, fn: Callable[[dict[str, Any]], None], name: str = "") -> Run:
    return Run(run.stack, _mutate(run, type_, fn, name))


def _template(p: dict[str, Any]) -> dict[str, Any]:
    assert p["metadata"]["name"] in ("cpu", "gpu")
    return p["spec"]["template"]


MUTATIONS: list[tuple[str, str, str, Callable[[dict[str, Any]], None], str]] = [
    # (check, type, resource name contains, mutation, expected words in a problem)
    ("nodepools", NODEPOOL, "gpu-nodepool", lambda p: _template(p)["spec"].update(taints=[]),
     "taint missing"),
    ("nodepools", NODEPOOL, "gpu-nodepool",
     lambda p: _template(p)["metadata"]["labels"].update({"platform.gameday/pool": "gpus"}), "selects"),
    ("nodepools", NODEPOOL, "cpu-nodepool",
     lambda p: _template(p)["spec"].update(taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]),
     "do not tolerate"),
    ("nodepools", NODEPOOL, "gpu-nodepool", lambda p: p["spec"]["limits"].pop("nvidia.com/gpu"), "limit"),
    ("nodepools", NODEPOOL, "cpu-nodepool",  # staging's cpu pool is ON_DEMAND
     lambda p: _template(p)["spec"]["requirements"][1].update(values=["spot", "on-demand"]),
     "spot allowed although"),
    ("nodepools", NODEPOOL, "gpu-nodepool",
     lambda p: p["spec"]["disruption"].update(consolidationPolicy="WhenEmptyOrUnderutilized"), "consolidation"),
    ("nodeclasses", NODECLASS, "cpu-nodeclass",
     lambda p: p["spec"]["subnetSelectorTerms"][0]["tags"].update({"karpenter.sh/discovery": "other"}),
     "subnet selector"),
    ("nodeclasses", SUBNET, "-private-", lambda p: p["tags"].pop("karpenter.sh/discovery"), "subnet selector"),
    ("nodeclasses", "aws:ec2/tag:Tag", "cluster-sg-discovery", lambda p: p.update(value="other"),
     "security-group selector"),
    ("nodeclasses", NODECLASS, "gpu-nodeclass",
     lambda p: p["spec"]["metadataOptions"].update(httpTokens="optional"), "IMDSv2"),
    ("nodeclasses", NODECLASS, "cpu-nodeclass",
     lambda p: p["spec"]["blockDeviceMappings"][0]["ebs"].update(encrypted=False), "not encrypted"),
    ("queue", CHART_T, "karpenter-chart",
     lambda p: p["values"]["settings"].update(interruptionQueue="elsewhere"), "names no queue"),
    ("queue", "aws:cloudwatch/eventTarget:EventTarget", "spot-interruption",
     lambda p: p.update(arn="arn:aws:sqs:eu-west-1:1:other"), "events reaching"),
    ("queue", "aws:sqs/queuePolicy:QueuePolicy", "karpenter",
     lambda p: p.update(policy=json.dumps({"Statement": []})), "queue policy"),
    ("join", "aws:eks/accessEntry:AccessEntry", "gpu-access", lambda p: p.update(type="STANDARD"),
     "access entry"),
    ("chart", CHART_T, "karpenter-chart", lambda p: p["values"].update(nodeSelector={}), "system pool"),
    ("chart", CHART_T, "karpenter-chart", lambda p: p.update(skipCrds=True), "CRDs"),
]


@pytest.mark.parametrize("check,type_,name,fn,words", MUTATIONS,
                         ids=[f"{m[0]}-{m[4].replace(' ', '_')}-{i}" for i, m in enumerate(MUTATIONS)])
def test_each_check_catches_its_mutation(runs: dict[str, Run], check: str, type_: str, name: str,
                                         fn: Callable[[dict[str, Any]], None], words: str) -> None:
    run = runs["staging"]  # Bottlerocket GPU + spot: the stack with the most branches
    assert CHECKS[check](run) == []
    problems = CHECKS[check](_mutated(run, type_, fn, name))
    assert any(words in p for p in problems), problems


def test_unknown_instance_type_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"nodePools\.cpu\.instanceTypes: 'm9z\.huge'"):
        run_program("dev", {"mlplatform:nodePools": {"cpu": {"instanceTypes": ["m9z.huge"]}}})


def test_accelerators_per_node_must_match_the_instance_type() -> None:
    with pytest.raises(ConfigError, match=r"nodePools\.gpu\.acceleratorsPerNode is 8"):
        run_program("dev", {"mlplatform:nodePools": {"gpu": {"acceleratorsPerNode": 8}}})


def test_a_minimum_on_a_karpenter_pool_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"cpu\.minSize/desiredSize must be 0 or unset"):
        run_program("dev", {"mlplatform:nodePools": {"cpu": {"minSize": 1}}})

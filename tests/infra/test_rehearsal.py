"""The first deploy rehearsed offline (provisioning/rehearsal.py): it passes for every stack, and each
readiness rule fails on a mutation of the real captured graph that breaks what it guards."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from provisioning.deploy_graph import EKS_ADDON, Graph, GraphError, Node, build, implied_children
from provisioning.placement import Placement, Pool, why_not
from provisioning.rehearsal import rehearse
from tests.infra.harness import Run

STACKS = ("dev", "staging", "prod")


def graph_of(run: Run) -> Graph:
    return build(run.resources, [run.stack, f"{run.stack}-app"])


def mutated(graph: Graph, pick: Callable[[Node], bool], change: Callable[[Node], Node]) -> Graph:
    """A copy of ``graph`` with ``change`` applied to every node ``pick`` selects (at least one)."""
    nodes = {u: replace(n, props=copy.deepcopy(dict(n.props))) for u, n in graph.nodes.items()}
    hit = [u for u, n in nodes.items() if pick(n)]
    assert hit, "the mutation selects nothing: the program changed, update the test"
    for u in hit:
        nodes[u] = change(nodes[u])
    return Graph(nodes=nodes, stacks=graph.stacks)


def props(**changes: Any) -> Callable[[Node], Node]:
    def apply(n: Node) -> Node:
        p = dict(n.props)
        for path, value in changes.items():
            *head, last = path.split("__")
            at = p
            for key in head:
                at = at.setdefault(key, {})
            at[last] = value
        return replace(n, props=p)
    return apply


def drop_deps(*name_parts: str) -> Callable[[Node], Node]:
    return lambda n: replace(n, after=frozenset(
        u for u in n.after if not any(part in u.rsplit("::", 1)[-1] for part in name_parts)))


def named(fragment: str, type_: str = "") -> Callable[[Node], bool]:
    return lambda n: fragment in n.name and type_ in n.type


def checks(graph: Graph) -> set[str]:
    return {f.check for f in rehearse(graph)}


@pytest.fixture(scope="module")
def dev(runs: dict[str, Run]) -> Graph:
    return graph_of(runs["dev"])


@pytest.mark.parametrize("stack", STACKS)
def test_first_deploy_rehearsal_passes(runs: dict[str, Run], stack: str) -> None:
    graph = graph_of(runs[stack])
    assert [str(f) for f in rehearse(graph)] == []
    order = [n.urn for n in graph.order()]
    assert len(order) == len(graph.nodes)
    # the platform stack entirely before its application stack
    stacks = [graph.nodes[u].stack for u in order]
    assert stacks == sorted(stacks, key=graph.stacks.index)


# --- mutations: each must fail the rehearsal with its rule ---------------------------------

def test_mutation_coredns_inside_the_cluster_without_nodes(dev: Graph) -> None:
    """Today's (pre-fix) shape: CoreDNS enabled in eks.Cluster, default node group skipped."""
    inside = mutated(dev, lambda n: n.type == "eks:index:Cluster",
                     props(corednsAddonOptions__enabled=True))
    nodes = {u: n for u, n in inside.nodes.items() if n.type != EKS_ADDON}
    cluster = next(n for n in nodes.values() if n.type == "eks:index:Cluster")
    nodes |= {c.urn: c for c in implied_children(cluster)}
    graph = Graph(nodes=nodes, stacks=inside.stacks)
    findings = rehearse(graph)
    assert [f.check for f in findings] == ["addon-nodes"]
    assert "coredns" in findings[0].resource and "DEGRADED" in findings[0].message


def test_mutation_addon_not_waiting_for_the_node_group(dev: Graph) -> None:
    graph = mutated(dev, named("-addons"), drop_deps("pool-system"))
    assert checks(graph) == {"addon-nodes"}


def test_mutation_system_node_group_scaled_to_zero(dev: Graph) -> None:
    graph = mutated(dev, named("pool-system-mng"), props(scalingConfig__desiredSize=0))
    assert {"addon-nodes", "karpenter-system", "pods-nodes"} <= checks(graph)


def test_mutation_karpenter_controller_off_the_system_pool(dev: Graph) -> None:
    graph = mutated(dev, named("karpenter-chart"),
                    props(values__nodeSelector={"platform.gameday/pool": "cpu"}))
    assert "karpenter-system" in checks(graph)


def test_mutation_karpenter_controller_not_tolerating_the_system_taint(dev: Graph) -> None:
    graph = mutated(dev, named("karpenter-chart"), props(values__tolerations=[]))
    assert "karpenter-system" in checks(graph)


def test_mutation_nodepool_before_karpenter_chart(dev: Graph) -> None:
    graph = mutated(dev, lambda n: "karpenter.sh" in n.type or "karpenter.k8s.aws" in n.type,
                    drop_deps("karpenter-chart"))
    assert checks(graph) == {"crd-first", "karpenter-system"}


def test_mutation_external_secret_objects_before_their_crds(dev: Graph) -> None:
    graph = mutated(dev, lambda n: "external-secrets.io" in n.type,
                    drop_deps("external-secrets"))
    assert checks(graph) == {"crd-first"}


def test_mutation_external_secrets_chart_without_crds(dev: Graph) -> None:
    graph = mutated(dev, named("cp-external-secrets", "helm"), props(values__installCRDs=False))
    assert checks(graph) == {"crd-first"}


def test_mutation_migrate_job_image_by_tag(dev: Graph) -> None:
    graph = mutated(dev, named("cp-migrate"), lambda n: props(spec__template__spec__containers=[
        {**c, "image": c["image"].split("@")[0] + ":latest"}
        for c in n.props["spec"]["template"]["spec"]["containers"]])(n))
    assert checks(graph) == {"job-inputs"}


def test_mutation_migrate_job_not_waiting_for_its_secret(dev: Graph) -> None:
    graph = mutated(dev, named("cp-migrate"), drop_deps("db-secret"))
    findings = [f for f in rehearse(graph)]
    assert [f.check for f in findings] == ["job-inputs"]
    assert "controlplane-db" in findings[0].message


def test_mutation_waiting_release_before_any_pool_its_pods_fit(dev: Graph) -> None:
    """kube-prometheus-stack's operator tolerates no taint: it needs Karpenter's cpu pool,
    which exists only because the release waits (through its parent) for the control plane."""
    graph = mutated(dev, lambda n: n.type == "mlplatform:infra:Observability",
                    lambda n: replace(n, after=frozenset()))
    assert checks(graph) == {"pods-nodes"}


def test_mutation_release_that_does_not_wait_is_not_held_to_it(dev: Graph) -> None:
    graph = mutated(dev, lambda n: n.type == "mlplatform:infra:Observability",
                    lambda n: replace(n, after=frozenset()))
    graph = mutated(graph, named("prometheus-stack"), props(skipAwait=True))
    assert checks(graph) == set()


def test_mutation_dependency_cycle(dev: Graph) -> None:
    chart = next(u for u, n in dev.nodes.items() if "karpenter-chart" in n.name)
    graph = mutated(dev, named("karpenter-ns"), lambda n: replace(n, after=n.after | {chart}))
    with pytest.raises(GraphError, match="cycle"):
        rehearse(graph)


# --- the pure parts -------------------------------------------------------------------------

SYSTEM = Pool("system", {"platform.gameday/pool": frozenset({"system"}),
                         "eks.amazonaws.com/capacityType": frozenset({"ON_DEMAND"})},
              ({"key": "CriticalAddonsOnly", "value": "true", "effect": "NoSchedule"},))


@pytest.mark.parametrize(("placement", "fits"), [
    (Placement(), False),  # the taint
    (Placement(tolerations=[{"key": "CriticalAddonsOnly", "operator": "Exists"}]), True),
    (Placement(tolerations=[{"operator": "Exists"}]), True),  # tolerates everything
    (Placement(tolerations=[{"key": "CriticalAddonsOnly", "value": "false"}]), False),
    (Placement(node_selector={"platform.gameday/pool": "cpu"},
               tolerations=[{"operator": "Exists"}]), False),
    (Placement(tolerations=[{"operator": "Exists"}], affinity_terms=[[
        {"key": "eks.amazonaws.com/capacityType", "operator": "In", "values": ["SPOT"]}]]), False),
    (Placement(tolerations=[{"operator": "Exists"}], affinity_terms=[[
        {"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"}]]), True),
])
def test_placement(placement: Placement, fits: bool) -> None:
    assert (why_not(SYSTEM, placement) is None) is fits


def test_before_is_dependencies_not_registration_order() -> None:
    a = Node("urn:pulumi:s::p::t::a", "t", "a", {}, "s")
    b = Node("urn:pulumi:s::p::t::b", "t", "b", {}, "s")  # registered after a, independent
    c = Node("urn:pulumi:s::p::t::c", "t", "c", {}, "s", parent=a.urn)
    d = Node("urn:pulumi:s::p::t::d", "t", "d", {}, "s", after=frozenset({a.urn}))
    g = Graph(nodes={n.urn: n for n in (a, b, c, d)}, stacks=("s",))
    assert g.before(b) == frozenset()
    assert g.before(d) == {a.urn, c.urn}  # a component dependency means its descendants


def test_mutation_cluster_not_waiting_for_its_log_group(dev: Graph) -> None:
    """Issue 49 item 5: EKS creates /aws/eks/<cluster>/cluster itself when the group is not
    there first; the declared group would then fail as already existing."""
    graph = mutated(dev, lambda n: n.type == "eks:index:Cluster", drop_deps("control-plane-logs"))
    findings = rehearse(graph)
    assert [f.check for f in findings] == ["log-groups-first"]
    assert "/aws/eks/" in findings[0].message and "/cluster" in findings[0].message


def test_mutation_database_not_waiting_for_its_log_groups(dev: Graph) -> None:
    graph = mutated(dev, lambda n: n.type == "aws:rds/instance:Instance",
                    drop_deps("logs-postgresql", "logs-upgrade"))
    findings = rehearse(graph)
    assert sorted(f.message.split()[2].rsplit("/", 1)[-1] for f in findings) == [
        "postgresql", "upgrade"]
    assert {f.check for f in findings} == {"log-groups-first"}


def test_mutation_database_export_without_a_declared_group(dev: Graph) -> None:
    graph = mutated(dev, lambda n: n.type == "aws:rds/instance:Instance",
                    props(enabledCloudwatchLogsExports=["postgresql", "upgrade", "iam-db-auth-error"]))
    findings = rehearse(graph)
    assert [f.check for f in findings] == ["log-groups-first"]
    assert findings[0].message.split()[2].endswith("/iam-db-auth-error")

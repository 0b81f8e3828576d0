"""KubernetesFaults against a stubbed (hand-written fake) Kubernetes API loaded from recorded
cluster objects: the right objects are targeted, inverses restore the exact prior state and
are idempotent."""

from __future__ import annotations

from typing import Any

import pytest

from environments.cloud.driver import FaultState
from environments.cloud.kubernetes import (
    FAULT_LABEL,
    ORIGINAL_LIMITS_ANNOTATION,
    KubernetesFaultError,
    KubernetesFaults,
    KubeTarget,
)
from tests.chaos.fake_kube import FakeCluster

CP = "mlp-controlplane"


def normalized(fake: FakeCluster) -> dict[str, Any]:
    """Cluster state as the API would serve it (model round trip), for exact comparisons."""
    models = {"deployments": "V1Deployment", "pods": "V1Pod", "nodes": "V1Node",
              "networkpolicies": "V1NetworkPolicy"}
    # Karpenter objects have no client model: the API serves them as plain JSON.
    return {kind: {key: fake._ser.sanitize_for_serialization(fake.model(obj, models[kind]))
                   if kind in models else obj for key, obj in objs.items()}
            for kind, objs in fake.snapshot().items()}


def test_kubernetes_kill_deletes_one_api_pod_stubbed_client(kube: KubernetesFaults,
                                                            fake_cluster: FakeCluster) -> None:
    result = kube.kill("api-1")
    assert result["pods"] == ["controlplane-api-7d9f-abcde"]
    assert fake_cluster.writes == [("delete", "pod", f"{CP}/controlplane-api-7d9f-abcde")]
    assert fake_cluster.last_delete_options["gracePeriodSeconds"] == 0


def test_kubernetes_kill_index_picks_a_different_replica_stubbed_client(
        kube: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    assert kube.kill("api-2")["pods"] == ["controlplane-api-7d9f-fghij"]


@pytest.mark.parametrize(("target", "deployment"), [
    ("reconciler", "controlplane-reconciler"),
    ("agent:cpu", "controlplane-agent-cpu"),
    ("agent:cpu-1", "controlplane-agent-cpu"),
    ("agent:mlplatform-dev-gpu", "controlplane-agent-gpu"),
    ("agent-gpu", "controlplane-agent-gpu"),
])
def test_kubernetes_targets_resolve_to_infra_deployments_stubbed_client(
        kube: KubernetesFaults, fake_cluster: FakeCluster, target: str, deployment: str) -> None:
    assert kube.kill(target)["deployment"] == deployment
    (verb, kind, ref), = fake_cluster.writes
    assert (verb, kind) == ("delete", "pod") and ref.startswith(f"{CP}/{deployment}-")


@pytest.mark.parametrize("target", ["db", "agent:tpu", "api-x-y", "prometheus"])
def test_kubernetes_unknown_target_names_the_choices_stubbed_client(
        kube: KubernetesFaults, fake_cluster: FakeCluster, target: str) -> None:
    with pytest.raises(KubernetesFaultError, match="unknown"):
        kube.kill(target)
    assert fake_cluster.writes == []


def test_kubernetes_stop_start_restores_recorded_replicas_stubbed_client(
        kube: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    before = normalized(fake_cluster)
    assert kube.stop("api")["replicas"] == 2
    assert fake_cluster.objects["deployments"][(CP, "controlplane-api")]["spec"]["replicas"] == 0
    assert kube.stop("api-1")["already"] is True  # same deployment: no second record
    kube.start("api")
    assert normalized(fake_cluster) == before
    assert kube.start("api") == {"target": "api", "already": True}
    assert kube.state.active() == {}


def test_kubernetes_hang_isolates_one_pod_and_resume_restores_exactly_stubbed_client(
        kube: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    before = normalized(fake_cluster)
    result = kube.hang("api-1")
    pod = fake_cluster.objects["pods"][(CP, "controlplane-api-7d9f-abcde")]
    other = fake_cluster.objects["pods"][(CP, "controlplane-api-7d9f-fghij")]
    assert pod["metadata"]["labels"][FAULT_LABEL] == "hang-api-1"
    assert FAULT_LABEL not in other["metadata"]["labels"]
    ours = fake_cluster.objects["networkpolicies"][(CP, result["policy"])]
    assert ours["spec"] == {"podSelector": {"matchLabels": {FAULT_LABEL: "hang-api-1"}},
                            "policyTypes": ["Ingress", "Egress"]}
    # Allow policies no longer select the hung pod (policies are a union of allows).
    assert sorted(result["narrowed"]) == ["allow-api-ingress", "allow-metrics-scrape"]
    allow = fake_cluster.objects["networkpolicies"][(CP, "allow-api-ingress")]["spec"]["podSelector"]
    assert {"key": FAULT_LABEL, "operator": "DoesNotExist"} in allow["matchExpressions"]
    assert kube.hang("api-1")["already"] is True
    kube.resume("api-1")
    assert normalized(fake_cluster) == before
    assert kube.resume("api-1")["already"] is True  # idempotent
    assert normalized(fake_cluster) == before


def test_kubernetes_partition_agent_denies_egress_to_api_pods_only_stubbed_client(
        kube: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    before = normalized(fake_cluster)
    result = kube.partition_agent("cpu-1")
    assert result["pods"] == ["controlplane-agent-cpu-6f7a-pqrst"]
    spec = fake_cluster.objects["networkpolicies"][(CP, result["policy"])]["spec"]
    assert spec["policyTypes"] == ["Egress"]
    peers = spec["egress"][0]["to"]
    assert peers[0]["podSelector"]["matchExpressions"] == [
        {"key": "app.kubernetes.io/component", "operator": "NotIn", "values": ["api"]}]
    assert peers[1]["namespaceSelector"]["matchExpressions"][0]["values"] == [CP]
    assert FAULT_LABEL not in fake_cluster.objects["pods"][(CP, "controlplane-agent-gpu-8b9c-uvwxy")][
        "metadata"]["labels"]
    kube.heal_agent("cpu-1")
    kube.heal_agent("cpu-1")
    assert normalized(fake_cluster) == before


def test_kubernetes_registry_unreachable_excludes_registry_cidrs_stubbed_client(
        kube: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    before = normalized(fake_cluster)
    kube.registry_unreachable()
    egress = fake_cluster.objects["networkpolicies"][("mlp-workloads", "workload-isolation")][
        "spec"]["egress"]
    assert egress[1]["to"][0]["ipBlock"]["except"] == [
        "10.10.200.0/24", "10.10.201.0/24", "10.10.50.11/32", "10.10.51.12/32"]
    assert egress[0] == before["networkpolicies"]["mlp-workloads/workload-isolation"]["spec"]["egress"][0]
    assert kube.registry_unreachable()["already"] is True
    kube.registry_restore()
    kube.registry_restore()
    assert normalized(fake_cluster) == before


def test_kubernetes_withdraw_pool_cordons_drains_and_restore_keeps_prior_cordon_stubbed_client(
        kube: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    nodes_before = normalized(fake_cluster)["nodes"]
    result = kube.withdraw_pool("cpu")
    # ip-...-32 was already cordoned by someone else: not ours to uncordon later.
    assert result["cordoned"] == ["ip-10-10-3-31.eu-west-1.compute.internal"]
    assert result["already_cordoned"] == ["ip-10-10-3-32.eu-west-1.compute.internal"]
    nodes = fake_cluster.objects["nodes"]
    assert all(n["spec"].get("unschedulable") for (_, name), n in nodes.items() if "-3-" in name)
    assert not any(n["spec"].get("unschedulable") for (_, name), n in nodes.items() if "-1-" in name)
    evicted = [ref for verb, _, ref in fake_cluster.writes if verb == "evict"]
    assert evicted == ["mlp-workloads/train-op-42-attempt-1-z9x8y"]  # DaemonSet pod stays
    assert kube.withdraw_pool("cpu")["already"] is True
    kube.restore_pool("cpu")
    assert normalized(fake_cluster)["nodes"] == nodes_before
    assert kube.restore_pool("cpu")["already"] is True


def test_kubernetes_withdraw_system_pool_refused_stubbed_client(
        kube: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    with pytest.raises(KubernetesFaultError, match="system pool"):
        kube.withdraw_pool("system")
    assert fake_cluster.writes == []


def test_kubernetes_withdraw_empty_gpu_pool_records_nothing_to_undo_stubbed_client(
        kube: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    assert kube.withdraw_pool("gpu")["cordoned"] == []
    kube.restore_pool("gpu")
    assert fake_cluster.writes == [] and kube.state.active() == {}


@pytest.fixture
def karpenter(fake_cluster: FakeCluster, state: FaultState) -> KubernetesFaults:
    return KubernetesFaults(KubeTarget(agent_name_prefix="mlplatform-dev",
                                       node_pools={"cpu": "cpu", "gpu": "gpu"}), state)


def test_kubernetes_nodepool_withdraw_zeroes_limits_deletes_nodeclaims_and_restores_stubbed_client(
        karpenter: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    before = normalized(fake_cluster)
    result = karpenter.withdraw_nodepool("cpu")
    assert result["limits"] == {"cpu": "64", "memory": "256Gi"}  # the recorded original
    assert result["deleted_nodeclaims"] == ["cpu-7xk2p", "cpu-q9m4w"]
    # Limits first (Karpenter must not replace what we delete), then the pool's NodeClaims.
    assert fake_cluster.writes == [("patch", "nodepool", "cpu"), ("delete", "nodeclaim", "cpu-7xk2p"),
                                   ("delete", "nodeclaim", "cpu-q9m4w")]
    pool = fake_cluster.objects["nodepools"][("", "cpu")]
    assert pool["spec"]["limits"] == {"cpu": "0", "memory": "0"}
    assert pool["metadata"]["annotations"] == {ORIGINAL_LIMITS_ANNOTATION: '{"cpu": "64", "memory": "256Gi"}'}
    assert pool["spec"]["disruption"] == before["nodepools"]["/cpu"]["spec"]["disruption"]
    assert fake_cluster.objects["nodepools"][("", "gpu")] == before["nodepools"]["/gpu"]
    assert karpenter.state.get("withdraw_pool:cpu")["undo"] == {
        "mode": "nodepool", "pool": "cpu", "nodepool": "cpu", "limits": {"cpu": "64", "memory": "256Gi"}}
    assert karpenter.withdraw_nodepool("cpu")["already"] is True
    karpenter.undo_withdraw_nodepool("withdraw_pool:cpu")
    after = normalized(fake_cluster)
    assert after["nodepools"] == before["nodepools"]  # exact: limits back, annotation gone
    assert after["nodeclaims"] == {}  # not recreated: Karpenter launches again for pending pods
    assert karpenter.state.active() == {}
    assert karpenter.undo_withdraw_nodepool("withdraw_pool:cpu") is None


def test_kubernetes_nodepool_withdraw_gpu_zeroes_every_limit_key_stubbed_client(
        karpenter: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    before = normalized(fake_cluster)["nodepools"]
    assert karpenter.withdraw_nodepool("gpu", evict=False)["deleted_nodeclaims"] == []
    pool = fake_cluster.objects["nodepools"][("", "gpu")]
    assert pool["spec"]["limits"] == {"cpu": "0", "memory": "0", "nvidia.com/gpu": "0"}
    assert pool["metadata"]["annotations"]["karpenter.sh/nodepool-hash"]  # theirs kept
    karpenter.undo_withdraw_nodepool("withdraw_pool:gpu")
    assert normalized(fake_cluster)["nodepools"] == before


@pytest.mark.parametrize("original", [None, {"cpu": "64"}])
def test_kubernetes_nodepool_limits_we_added_are_removed_again_stubbed_client(
        karpenter: KubernetesFaults, fake_cluster: FakeCluster, original: dict[str, str] | None) -> None:
    spec = fake_cluster.objects["nodepools"][("", "cpu")]["spec"]
    spec.pop("limits")
    if original is not None:
        spec["limits"] = dict(original)  # the fake patches in place
    before = normalized(fake_cluster)["nodepools"]
    assert karpenter.withdraw_nodepool("cpu", evict=False)["limits"] == original
    assert fake_cluster.objects["nodepools"][("", "cpu")]["spec"]["limits"] == {"cpu": "0", "memory": "0"}
    karpenter.undo_withdraw_nodepool("withdraw_pool:cpu")
    assert normalized(fake_cluster)["nodepools"] == before


def test_kubernetes_nodepool_lost_state_does_not_take_zero_limits_as_original_stubbed_client(
        karpenter: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    before = normalized(fake_cluster)["nodepools"]
    karpenter.withdraw_nodepool("cpu", evict=False)
    karpenter.state.path.unlink()  # state file lost; the NodePool still has zero limits
    assert karpenter.withdraw_nodepool("cpu", evict=False)["limits"] == {"cpu": "64", "memory": "256Gi"}
    karpenter.undo_withdraw_nodepool("withdraw_pool:cpu")
    assert normalized(fake_cluster)["nodepools"] == before


@pytest.mark.parametrize(("pool", "message"), [
    ("system", "refusing to withdraw the system pool"),
    ("tpu", "unknown pool 'tpu' for poolWithdrawal nodepool; Karpenter NodePools \\(nodePools\\): cpu, gpu"),
])
def test_kubernetes_nodepool_withdraw_refuses_system_and_unknown_pools_stubbed_client(
        karpenter: KubernetesFaults, fake_cluster: FakeCluster, pool: str, message: str) -> None:
    with pytest.raises(KubernetesFaultError, match=message):
        karpenter.withdraw_nodepool(pool)
    assert fake_cluster.writes == [] and karpenter.state.active() == {}


def test_kubernetes_names_match_infra_program_stubbed_client() -> None:
    pytest.importorskip("pulumi")
    from environments.cloud import kubernetes as drv
    from provisioning.components.common import POOL_LABEL
    from provisioning.components.controlplane import ControlPlane

    assert drv.POOL_LABEL == POOL_LABEL
    assert ControlPlane._selector(None, "api") == {**drv.APP_SELECTOR,  # type: ignore[arg-type]
                                                   "app.kubernetes.io/component": "api"}


def test_kubernetes_destructive_calls_log_their_target_stubbed_client(
        kube: KubernetesFaults, fake_cluster: FakeCluster, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="chaostoolkit"):
        kube.kill("reconciler")
        kube.stop("agent:gpu")
    text = caplog.text
    assert "controlplane-reconciler-5c6b-klmno" in text and "controlplane-agent-gpu" in text


NODE = "ip-10-10-2-20.eu-west-1.compute.internal"  # api, agent-cpu and agent-gpu pods


def test_kubernetes_drain_node_waits_out_pdb_refusals_and_never_deletes_stubbed_client(
        kube: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    nodes_before = normalized(fake_cluster)["nodes"]
    api = f"{CP}/controlplane-api-7d9f-fghij"
    fake_cluster.pdb_refusals[api] = 2  # the API's PDB allows no disruption, twice
    result = kube.drain_node(NODE, timeout=10, retry_seconds=0.01)
    assert result["refused_by_pdb"] == {api: 2}
    assert sorted(result["evicted"]) == sorted(
        [api, f"{CP}/controlplane-agent-cpu-6f7a-pqrst", f"{CP}/controlplane-agent-gpu-8b9c-uvwxy"])
    assert not [w for w in fake_cluster.writes if w[0] == "delete"]  # evictions only
    assert [w[0] for w in fake_cluster.writes if w[2] == api] == [
        "evict-refused", "evict-refused", "evict"]
    assert fake_cluster.objects["nodes"][("", NODE)]["spec"]["unschedulable"] is True
    assert kube.drain_node(NODE)["already"] is True
    kube.undo_drain(f"drain_node:{NODE}")
    assert normalized(fake_cluster)["nodes"] == nodes_before
    assert kube.undo_drain(f"drain_node:{NODE}") is None


def test_kubernetes_drain_node_gives_up_at_the_deadline_keeping_the_pod_stubbed_client(
        kube: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    api = f"{CP}/controlplane-api-7d9f-fghij"
    fake_cluster.pdb_refusals[api] = 10**6
    with pytest.raises(KubernetesFaultError, match="PodDisruptionBudgets still refuse"):
        kube.drain_node(NODE, timeout=0.05, retry_seconds=0.01)
    assert (CP, "controlplane-api-7d9f-fghij") in fake_cluster.objects["pods"]
    assert kube.state.get(f"drain_node:{NODE}") is not None  # restore_all will uncordon


def test_kubernetes_drain_node_leaves_daemonset_pods_and_prior_cordon_stubbed_client(
        kube: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    cordoned = "ip-10-10-3-32.eu-west-1.compute.internal"  # cordoned by someone else
    assert kube.drain_node(cordoned, timeout=1)["cordoned"] is False
    kube.undo_drain(f"drain_node:{cordoned}")
    assert fake_cluster.objects["nodes"][("", cordoned)]["spec"]["unschedulable"] is True
    result = kube.drain_node("ip-10-10-3-31.eu-west-1.compute.internal", timeout=1)
    assert result["evicted"] == ["mlp-workloads/train-op-42-attempt-1-z9x8y"]  # aws-node stays
    with pytest.raises(KubernetesFaultError, match="no node named"):
        kube.drain_node("no-such-node")

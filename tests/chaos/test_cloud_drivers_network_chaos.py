"""Gray network faults in the cloud: toxics as Chaos Mesh NetworkChaos objects, against the
hand-written fake Kubernetes API loaded from the recorded cluster (no Chaos Mesh, no cluster).
The object targets the agents and the API pods, is recorded before it is created, is deleted by
its inverse and by restore_all, and a toxic without an equivalent is refused before anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import chaos.gray
from environments.cloud.driver import CloudConfigError, CloudFaults, FaultState
from environments.cloud.kubernetes import (
    TOXIC_ANNOTATION,
    KubernetesFaultError,
    KubernetesFaults,
    KubeTarget,
)
from environments.cloud.recorded import RecordedCloudFaults
from environments.timeline import Timeline
from tests.chaos.fake_kube import FakeCluster
from tests.chaos.test_cloud_drivers_kubernetes import normalized

CP = "mlp-controlplane"
SLOW = {"name": "slow-answers", "type": "latency", "stream": "downstream", "toxicity": 1.0,
        "attributes": {"latency": 100, "jitter": 50}}
SILENT = {"name": "all-silent", "type": "timeout", "stream": "upstream", "toxicity": 1.0,
          "attributes": {"timeout": 0}}
EXPERIMENT = Path(__file__).parents[2] / "chaos" / "experiments" / "network-gray.yaml"


@pytest.fixture
def gray(fake_cluster: FakeCluster, state: FaultState) -> KubernetesFaults:
    return KubernetesFaults(KubeTarget(agent_name_prefix="mlplatform-dev",
                                       network_chaos_wait=0.05), state)


def chaos_objects(fake: FakeCluster) -> dict[tuple[str, str], dict[str, Any]]:
    return fake.objects["networkchaos"]


def test_network_chaos_delays_the_api_answers_to_every_agent_stubbed_client(
        gray: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    result = gray.add_network_chaos("agents", SLOW)
    assert result["agent_pods"] == ["controlplane-agent-cpu-6f7a-pqrst",
                                    "controlplane-agent-gpu-8b9c-uvwxy"]
    assert result["api_pods"] == ["controlplane-api-7d9f-abcde", "controlplane-api-7d9f-fghij"]
    assert fake_cluster.writes == [("create", "networkchaos", f"{CP}/gameday-gray-agents-slow-answers")]
    obj = chaos_objects(fake_cluster)[(CP, "gameday-gray-agents-slow-answers")]
    spec = obj["spec"]
    assert (spec["action"], spec["direction"], spec["mode"]) == ("delay", "from", "all")
    assert spec["delay"] == {"latency": "100ms", "jitter": "50ms", "correlation": "0"}
    assert spec["duration"] == "900s"  # the safety net: Chaos Mesh ends it by itself
    assert spec["selector"]["expressionSelectors"][0]["values"] == ["agent-cpu", "agent-gpu"]
    assert spec["target"]["selector"]["labelSelectors"]["app.kubernetes.io/component"] == "api"
    assert "externalTargets" not in spec  # the answers carry the agents' pod IPs
    assert obj["metadata"]["annotations"][TOXIC_ANNOTATION]
    assert gray.state.get("network_gray:agents/slow-answers")["undo"] == {
        "namespace": CP, "name": "gameday-gray-agents-slow-answers",
        "toxic": {**SLOW, "attributes": {"latency": 100.0, "jitter": 50.0}}}


def test_network_chaos_silence_of_one_pool_names_the_api_service_stubbed_client(
        gray: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    result = gray.add_network_chaos("agent:cpu", SILENT)
    assert result["agent_pods"] == ["controlplane-agent-cpu-6f7a-pqrst"]
    spec = chaos_objects(fake_cluster)[(CP, "gameday-gray-agent-cpu-all-silent")]["spec"]
    assert (spec["action"], spec["direction"]) == ("loss", "to")
    assert spec["loss"] == {"loss": "100", "correlation": "0"}
    assert spec["selector"]["expressionSelectors"][0]["values"] == ["agent-cpu"]
    assert spec["externalTargets"] == [f"controlplane-api.{CP}.svc.cluster.local"]


def test_network_chaos_is_recorded_before_it_is_created_stubbed_client(
        gray: KubernetesFaults, fake_cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    create = fake_cluster.create_namespaced_custom_object

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(gray.state.get("network_gray:agents/slow-answers"))
        return create(*args, **kwargs)

    monkeypatch.setattr(fake_cluster, "create_namespaced_custom_object", spy)
    gray.add_network_chaos("agents", SLOW)
    assert seen and seen[0] is not None and seen[0]["fault"] == "network_gray"


def test_network_chaos_remove_deletes_it_and_is_idempotent_stubbed_client(
        gray: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    before = normalized(fake_cluster)
    gray.add_network_chaos("agents", SLOW)
    assert gray.add_network_chaos("agents", SLOW)["already"] is True  # same toxic: no-op
    assert len(fake_cluster.writes) == 1
    gray.remove_network_chaos("agents", "slow-answers")
    assert fake_cluster.writes[-1] == ("delete", "networkchaos", f"{CP}/gameday-gray-agents-slow-answers")
    assert normalized(fake_cluster) == before and gray.state.active() == {}
    assert gray.remove_network_chaos("agents", "slow-answers") == {
        "target": "agents/slow-answers", "already": True}
    assert len(fake_cluster.writes) == 2


def test_network_chaos_other_settings_under_an_active_name_refused_stubbed_client(
        gray: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    gray.add_network_chaos("agents", SLOW)
    with pytest.raises(KubernetesFaultError, match="Chaos Mesh refuses changes to a chaos's spec"):
        gray.add_network_chaos("agents", {**SLOW, "attributes": {"latency": 300}})
    assert len(fake_cluster.writes) == 1


def test_network_chaos_left_by_a_lost_state_file_is_taken_over_stubbed_client(
        gray: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    gray.add_network_chaos("agents", SLOW)
    gray.state.path.unlink()  # state lost; the object is still in the cluster
    assert gray.add_network_chaos("agents", SLOW)["name"] == "gameday-gray-agents-slow-answers"
    gray.remove_network_chaos("agents", "slow-answers")
    assert chaos_objects(fake_cluster) == {}


def test_network_chaos_without_chaos_mesh_says_to_install_it_stubbed_client(
        gray: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    fake_cluster.chaos_mesh_installed = False
    with pytest.raises(KubernetesFaultError) as info:
        gray.add_network_chaos("agents", SLOW)
    message = str(info.value)
    assert message.startswith(f"create NetworkChaos {CP}/gameday-gray-agents-slow-answers: HTTP 404")
    assert "Chaos Mesh (2.8) must be installed in the cluster (helm install chaos-mesh" in message
    assert "kubectl get crd networkchaos.chaos-mesh.org" in message
    assert fake_cluster.writes == [] and gray.state.active() == {}  # refused: nothing to undo


def test_network_chaos_not_injected_in_time_is_deleted_again_stubbed_client(
        gray: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    fake_cluster.chaos_mesh_injects = False  # e.g. chaos-daemon not running on the node
    with pytest.raises(KubernetesFaultError, match="not injected within .* \\(deleted again\\)"):
        gray.add_network_chaos("agents", SLOW)
    assert [w[0] for w in fake_cluster.writes] == ["create", "delete"]
    assert chaos_objects(fake_cluster) == {} and gray.state.active() == {}


def test_network_chaos_held_by_its_finalizer_stays_recorded_stubbed_client(
        gray: KubernetesFaults, fake_cluster: FakeCluster) -> None:
    gray.add_network_chaos("agents", SLOW)
    fake_cluster.chaos_mesh_recovers = False
    with pytest.raises(KubernetesFaultError, match="has not finished recovering"):
        gray.remove_network_chaos("agents", "slow-answers")
    assert gray.state.get("network_gray:agents/slow-answers") is not None  # for restore_all


@pytest.mark.parametrize(("target", "message"), [
    ("api", "unknown agent 'api'"),
    ("agent:cpu-1", "one replica cannot be named"),
    ("agent:tpu", "unknown agent 'tpu'"),
])
def test_network_chaos_targets_agents_or_one_pool_only_stubbed_client(
        gray: KubernetesFaults, fake_cluster: FakeCluster, target: str, message: str) -> None:
    with pytest.raises(KubernetesFaultError, match=message):
        gray.add_network_chaos(target, SLOW)
    assert fake_cluster.writes == [] and gray.state.active() == {}


STACK = {"environment": "dev", "region": "eu-west-1", "controlPlaneNamespace": CP,
         "networkChaosDuration": 120}


def test_cloud_restore_all_deletes_network_chaos_after_a_crash_stubbed_client(
        fake_cluster: FakeCluster, tmp_path: Path) -> None:
    before = normalized(fake_cluster)
    first = CloudFaults(STACK, tmp_path / "cloud-faults.json")
    first.network.add("agents", SLOW)
    first.network.add("agents", SILENT)
    assert chaos_objects(fake_cluster)[(CP, "gameday-gray-agents-all-silent")]["spec"][
        "duration"] == "120s"
    del first  # the run crashes; only the state file survives
    second = CloudFaults(STACK, tmp_path / "cloud-faults.json")
    assert sorted(second.restore_all()) == ["network_gray:agents/all-silent",
                                            "network_gray:agents/slow-answers"]
    assert normalized(fake_cluster) == before
    assert second.restore_all() == []


def experiment_toxics() -> list[list[dict[str, Any]]]:
    doc = yaml.safe_load(EXPERIMENT.read_text())
    return [a["provider"]["arguments"]["toxics"] for a in doc["method"]
            if a["provider"].get("func") == "add_toxics"]


def test_network_gray_experiment_first_toxics_refused_before_anything_stubbed_client(
        fake_cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """network-gray's own toxics: the reset and the one-in-ten silence have no equivalent, so
    its first fault action is refused whole, naming the field, with nothing created."""
    recorded = RecordedCloudFaults(CloudFaults(STACK, tmp_path / "cloud-faults.json"),
                                   Timeline(tmp_path / "faults.jsonl"))
    monkeypatch.setattr(chaos.gray, "_network", lambda _c: recorded.network)
    gray_first, every_silent = experiment_toxics()
    with pytest.raises(KubernetesFaultError, match=r"^toxics\[1\]\.type: a reset_peer toxic"):
        chaos.gray.add_toxics("agents", gray_first)
    assert fake_cluster.writes == [] and recorded.timeline.read() == []
    with pytest.raises(KubernetesFaultError, match=r"^toxics\[0\]\.toxicity: 0.1"):
        chaos.gray.add_toxics("agents", gray_first[2:])
    # the two that map: the slow answers, and the 2 s when every connection goes silent
    chaos.gray.add_toxics("agents", gray_first[:1] + every_silent)
    assert sorted(n for _, n in chaos_objects(fake_cluster)) == [
        "gameday-gray-agents-all-silent", "gameday-gray-agents-slow-answers"]


def test_recorded_network_chaos_opens_and_closes_timeline_windows_stubbed_client(
        fake_cluster: FakeCluster, tmp_path: Path) -> None:
    recorded = RecordedCloudFaults(CloudFaults(STACK, tmp_path / "cloud-faults.json"),
                                   Timeline(tmp_path / "faults.jsonl"))
    reset = {"name": "resets", "type": "reset_peer", "stream": "upstream"}
    for refused in (reset, {**SLOW, "attributes": {"latency": "slow"}}):  # refused: no window
        with pytest.raises(KubernetesFaultError, match="^toxics\\[0\\]"):
            recorded.network.add("agents", refused)
    assert recorded.timeline.read() == []
    recorded.network.add("agents", SLOW)
    assert recorded.network.add("agents", SLOW)["already"] is True  # window still open
    recorded.network.add("agents", SILENT)
    recorded.network.remove("agents", "all-silent")
    recorded.network.remove("agents", "all-silent")  # idempotent: no second end
    assert recorded.open_faults() == [("network_gray", "agents/slow-answers")]
    assert recorded.restore_all() == ["network_gray:agents/slow-answers"]
    rows = [(r["event"], r["fault"], r["target"]) for r in recorded.timeline.read()]
    assert rows == [("fault_start", "network_gray", "agents/slow-answers"),
                    ("fault_start", "network_gray", "agents/all-silent"),
                    ("fault_end", "network_gray", "agents/all-silent"),
                    ("fault_end", "network_gray", "agents/slow-answers")]
    assert recorded.timeline.read()[2]["details"] == {"restored_by": "remove_toxic"}
    assert chaos_objects(fake_cluster) == {}


@pytest.mark.parametrize("value", [0, "900", 86_401, True])
def test_cloud_network_chaos_duration_must_be_whole_seconds_stubbed_client(
        tmp_path: Path, value: Any) -> None:
    with pytest.raises(CloudConfigError, match="networkChaosDuration must be whole seconds"):
        CloudFaults({**STACK, "networkChaosDuration": value}, tmp_path / "cloud-faults.json")

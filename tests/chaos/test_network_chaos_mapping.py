"""The pure mapping of toxics to Chaos Mesh NetworkChaos (environments/cloud/network_chaos.py): what
maps, in which direction, in the CRD's formats, and every toxic without an equivalent refused
with the path of its field."""

from __future__ import annotations

from typing import Any

import pytest

from environments.cloud.network_chaos import Netem, UnmappableToxic, netem_of, network_chaos_body
from environments.local.toxics import parse_toxic


def netem(doc: dict[str, Any]) -> Netem:
    return netem_of(parse_toxic(doc, "toxics[0]"), "toxics[0]")


def test_latency_downstream_is_a_delay_on_the_api_side_offline() -> None:
    got = netem({"type": "latency", "stream": "downstream", "attributes": {"latency": 100,
                                                                          "jitter": 50}})
    assert got == Netem("delay", "from", latency_ms=100, jitter_ms=50)
    assert got.tc_parameters() == {"delay": {"latency": "100ms", "jitter": "50ms",
                                             "correlation": "0"}}


def test_latency_upstream_is_a_delay_on_the_agent_side_offline() -> None:
    got = netem({"type": "latency", "stream": "upstream", "attributes": {"latency": 0.5}})
    assert (got.action, got.direction) == ("delay", "to")
    # no exponent, no trailing zeros: the CRD's pattern is [0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h)
    assert got.tc_parameters()["delay"] == {"latency": "0.5ms", "jitter": "0ms", "correlation": "0"}
    big = netem({"type": "latency", "attributes": {"latency": 86_400_000}})
    assert big.tc_parameters()["delay"]["latency"] == "86400000ms"


def test_silence_is_total_loss_in_the_toxic_direction_offline() -> None:
    got = netem({"name": "all-silent", "type": "timeout", "stream": "upstream", "toxicity": 1.0,
                 "attributes": {"timeout": 0}})
    assert got == Netem("loss", "to", loss_percent=100)
    assert got.tc_parameters() == {"loss": {"loss": "100", "correlation": "0"}}


@pytest.mark.parametrize(("doc", "message"), [
    ({"type": "reset_peer", "stream": "upstream", "attributes": {"timeout": 3000}},
     "toxics[0].type: a reset_peer toxic has no Chaos Mesh NetworkChaos equivalent"),
    ({"type": "timeout", "stream": "upstream", "toxicity": 0.1, "attributes": {"timeout": 0}},
     "toxics[0].toxicity: 0.1 is a share of connections"),
    ({"type": "latency", "toxicity": 0.5, "attributes": {"latency": 10}},
     "toxics[0].toxicity: 0.5 is a share of connections"),
    ({"type": "timeout", "attributes": {"timeout": 2000}},
     "toxics[0].attributes.timeout: 2000 ms closes the connection"),
    ({"type": "bandwidth", "attributes": {"rate": 10}}, "toxics[0].type: a bandwidth toxic"),
    ({"type": "slicer", "attributes": {"average_size": 10}}, "toxics[0].type: a slicer toxic"),
    ({"type": "limit_data", "attributes": {"bytes": 10}}, "toxics[0].type: a limit_data toxic"),
])
def test_toxics_without_an_equivalent_are_refused_naming_the_field_offline(
        doc: dict[str, Any], message: str) -> None:
    with pytest.raises(UnmappableToxic) as info:
        netem(doc)
    assert str(info.value).startswith(message)


def body(direction: str) -> dict[str, Any]:
    return network_chaos_body(
        name="gameday-gray-agents-slow", namespace="ns", netem=Netem("delay", direction, 100, 50),
        source_labels={"app.kubernetes.io/name": "controlplane"},
        source_components=["agent-gpu", "agent-cpu"],
        target_labels={"app.kubernetes.io/name": "controlplane",
                       "app.kubernetes.io/component": "api"},
        service_hosts=["controlplane-api.ns.svc.cluster.local"], duration_seconds=900,
        labels={"app.kubernetes.io/managed-by": "gameday-chaos"}, annotations={"a": "b"})


def test_body_selects_agents_and_api_pods_with_a_duration_offline() -> None:
    got = body("from")
    assert (got["apiVersion"], got["kind"]) == ("chaos-mesh.org/v1alpha1", "NetworkChaos")
    assert got["metadata"] == {"name": "gameday-gray-agents-slow", "namespace": "ns",
                               "labels": {"app.kubernetes.io/managed-by": "gameday-chaos"},
                               "annotations": {"a": "b"}}
    assert got["spec"] == {
        "action": "delay", "mode": "all", "direction": "from", "duration": "900s",
        "selector": {"namespaces": ["ns"], "labelSelectors": {"app.kubernetes.io/name": "controlplane"},
                     "expressionSelectors": [{"key": "app.kubernetes.io/component",
                                              "operator": "In", "values": ["agent-cpu", "agent-gpu"]}]},
        "target": {"mode": "all", "selector": {"namespaces": ["ns"], "labelSelectors": {
            "app.kubernetes.io/name": "controlplane", "app.kubernetes.io/component": "api"}}},
        "delay": {"latency": "100ms", "jitter": "50ms", "correlation": "0"}}


def test_body_names_the_service_only_for_the_agent_side_offline() -> None:
    # Chaos Mesh takes externalTargets with direction "to" only; agents send to the ClusterIP.
    assert body("to")["spec"]["externalTargets"] == ["controlplane-api.ns.svc.cluster.local"]
    assert "externalTargets" not in body("from")["spec"]

"""Toxics (environments/local/toxics.py) as Chaos Mesh ``NetworkChaos`` objects: the pure mapping.

The local environment's gray network faults are Toxiproxy-style toxics on the fault proxy's
routes. In a cluster the nearest equivalent is Chaos Mesh's NetworkChaos (``chaos-mesh.org/
v1alpha1``, schema of Chaos Mesh 2.8: ``api/v1alpha1/networkchaos_types.go``): ``tc netem`` on
the egress of the selected pods' interface, filtered to the target pods' IPs. The two models
differ, and only what maps honestly is mapped; everything else is refused with the path of the
field that has no equivalent (``UnmappableToxic``), never dropped.

=================================  ===============================================================
toxic                              NetworkChaos
=================================  ===============================================================
``latency`` (``latency``,          ``action: delay``, ``delay: {latency, jitter, correlation: "0"}``.
``jitter``), ``toxicity`` 1        Approximated: netem delays every *packet* (the TCP handshake and
                                   ACKs too), Toxiproxy every chunk of data once the connection is
                                   up; netem's jitter is uniform within +-jitter like Toxiproxy's,
                                   but it can reorder packets (TCP puts them back in order).
``timeout`` with ``timeout`` 0,    ``action: loss``, ``loss: {loss: "100", correlation: "0"}``: every
``toxicity`` 1                     packet of that direction dropped, so the agent hears nothing.
                                   Approximated: Toxiproxy accepts a *new* connection and then
                                   drops its data; with netem the handshake is lost too, so a new
                                   connection times out in ``connect`` instead of in ``read``.
``toxicity`` < 1                   refused: a toxic's toxicity is the share of *connections* it
                                   applies to; netem draws per packet (``loss: 10`` is a lossy link
                                   TCP retransmits through, not one connection in ten gone silent)
                                   and Chaos Mesh's ``mode`` draws per pod.
``timeout`` with ``timeout`` > 0   refused: netem cannot close a connection after a while.
``reset_peer``                     refused: nothing in NetworkChaos sends a TCP reset (``partition``
                                   drops packets; no action injects RST).
``bandwidth``, ``slicer``,         refused (not mapped: ``bandwidth`` has an action whose token
``limit_data``                     bucket needs ``limit``/``buffer`` the toxic does not give; the
                                   others have none).
=================================  ===============================================================

Direction. A toxic's ``stream`` is ``upstream`` (client -> server: agent -> API) or
``downstream`` (API -> agent). Chaos Mesh's ``direction: to`` puts netem on the *selected* pods
(the agents) for packets to the target's IPs; ``direction: from`` puts it on the *target* pods
(the API) for packets to the selected pods' IPs. Agents reach the API through its Service: with
kube-proxy the ClusterIP is translated to a pod IP only after the packet leaves the agent's
network namespace, so an agent-side filter on API *pod* IPs would miss every packet. Upstream
toxics therefore also name the Service in ``externalTargets`` (resolved by Chaos Mesh's
controller when the fault is injected; Chaos Mesh takes ``externalTargets`` with ``to`` only).
The API's answers carry the agent's pod IP, so ``from`` needs no such help.

No I/O here: the cloud driver and its tests import this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from environments.local.toxics import Latency, Stream, Timeout, Toxic

__all__ = ["GROUP", "KIND", "PLURAL", "VERSION", "Netem", "UnmappableToxic", "netem_of",
           "network_chaos_body"]

GROUP, VERSION, KIND, PLURAL = "chaos-mesh.org", "v1alpha1", "NetworkChaos", "networkchaos"


class UnmappableToxic(ValueError):
    """A valid toxic that NetworkChaos cannot express; the message starts with the field's
    path (``<where>.<field>: ...``) as ``ToxicError``'s does."""


@dataclass(frozen=True)
class Netem:
    """One NetworkChaos action: ``delay`` (``latency_ms`` +- ``jitter_ms``) or ``loss``
    (``loss_percent``), in ``direction`` ``to`` (agents -> API) or ``from`` (API -> agents)."""

    action: str
    direction: str
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_percent: float = 0.0

    def tc_parameters(self) -> dict[str, Any]:
        if self.action == "delay":
            return {"delay": {"latency": _ms(self.latency_ms), "jitter": _ms(self.jitter_ms),
                              "correlation": "0"}}
        return {"loss": {"loss": _number(self.loss_percent), "correlation": "0"}}


def _number(value: float) -> str:
    """A decimal without exponent (the CRD's patterns take ``[0-9]+(\\.[0-9]+)?`` only)."""
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}".rstrip("0").rstrip(".")


def _ms(value: float) -> str:
    return f"{_number(value)}ms"


def _at(where: str, path: str) -> str:
    return f"{where}.{path}" if where else path


def netem_of(toxic: Toxic, where: str = "") -> Netem:
    """The NetworkChaos action for a parsed toxic; ``UnmappableToxic`` naming the field that
    has no equivalent (see the module docstring for what is approximated)."""
    kind = toxic.type.value
    attrs = toxic.attributes
    if not isinstance(attrs, Latency | Timeout):
        raise UnmappableToxic(
            f"{_at(where, 'type')}: a {kind} toxic has no Chaos Mesh NetworkChaos equivalent "
            "(mapped: latency, and timeout with timeout 0 as 100 % loss)")
    if toxic.toxicity != 1.0:
        raise UnmappableToxic(
            f"{_at(where, 'toxicity')}: {toxic.toxicity:g} is a share of connections; "
            "NetworkChaos draws per packet (netem) or per pod (mode), so only 1 maps")
    direction = "to" if toxic.stream is Stream.UPSTREAM else "from"
    if isinstance(attrs, Latency):
        return Netem("delay", direction, latency_ms=attrs.latency, jitter_ms=attrs.jitter)
    if attrs.timeout != 0:
        raise UnmappableToxic(
            f"{_at(where, 'attributes.timeout')}: {attrs.timeout:g} ms closes the connection "
            "after a while; netem cannot close a connection (only timeout 0, silence, maps)")
    return Netem("loss", direction, loss_percent=100.0)


def network_chaos_body(*, name: str, namespace: str, netem: Netem,
                       source_labels: dict[str, str], source_components: list[str],
                       target_labels: dict[str, str], service_hosts: list[str],
                       duration_seconds: int, labels: dict[str, str],
                       annotations: dict[str, str]) -> dict[str, Any]:
    """The NetworkChaos object: the source pods (``source_labels`` and a component ``In``
    ``source_components``) and the target pods (``target_labels``), both in ``namespace``,
    every pod of each (``mode: all``); ``duration`` is the safety net that ends the fault
    when nobody deletes the object."""
    source = {"namespaces": [namespace], "labelSelectors": dict(source_labels),
              "expressionSelectors": [{"key": "app.kubernetes.io/component", "operator": "In",
                                       "values": sorted(source_components)}]}
    spec: dict[str, Any] = {
        "action": netem.action, "mode": "all", "selector": source,
        "direction": netem.direction,
        "target": {"mode": "all", "selector": {"namespaces": [namespace],
                                               "labelSelectors": dict(target_labels)}},
        "duration": f"{int(duration_seconds)}s",
        **netem.tc_parameters(),
    }
    if netem.direction == "to" and service_hosts:
        spec["externalTargets"] = list(service_hosts)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels),
                         "annotations": dict(annotations)},
            "spec": spec}

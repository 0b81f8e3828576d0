"""The order a first ``pulumi up`` creates things in, as data (docs/infra.md, "First deploy
rehearsed offline").

The engine creates a resource only after everything it depends on: its explicit
``depends_on``, its parent, and the resources its Output inputs came from; independent
resources are created in parallel, so *only* a dependency guarantees that something exists
first. A dependency on a component means all of its descendants. Stacks are deployed one
after another (the platform stack, then its application stack), so everything of an earlier
stack exists before anything of a later one.

Remote components (pulumi-eks's ``eks:index:Cluster``) are opaque under mocks; what they
create inside, as far as readiness is concerned, is added here from ``implied_children``.

Pure: built from any objects with ``urn/type/name/props/parent/dependencies`` (the mock
capture in provisioning/render.py produces them); no Pulumi import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

EKS_CLUSTER = "eks:index:Cluster"
EKS_ADDON = "aws:eks/addon:Addon"
DEFAULT_NODE_GROUP = "eks:index:DefaultNodeGroup"  # implied: pulumi-eks's own node group


class Captured(Protocol):
    @property
    def urn(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def props(self) -> dict[str, Any]: ...
    @property
    def parent(self) -> str: ...
    @property
    def dependencies(self) -> tuple[str, ...]: ...


class GraphError(Exception):
    """The captured resources do not form a creatable graph (a cycle, an unknown URN)."""


@dataclass(frozen=True)
class Node:
    urn: str
    type: str
    name: str
    props: Mapping[str, Any]
    stack: str
    parent: str = ""
    after: frozenset[str] = frozenset()  # direct dependencies (URNs)
    implied: bool = False  # created inside an opaque component, not captured

    @property
    def label(self) -> str:
        return f"{self.type} {self.name}" + (" (inside its component)" if self.implied else "")


@dataclass
class Graph:
    """Nodes in registration order, stacks in deploy order."""

    nodes: dict[str, Node]
    stacks: tuple[str, ...]
    _closure: dict[str, frozenset[str]] = field(default_factory=dict, repr=False)

    def children(self, urn: str) -> list[Node]:
        return [n for n in self.nodes.values() if n.parent == urn]

    def descendants(self, urn: str) -> set[str]:
        out: set[str] = set()
        todo = [urn]
        while todo:
            for c in self.children(todo.pop()):
                if c.urn not in out:
                    out.add(c.urn)
                    todo.append(c.urn)
        return out

    def direct(self, node: Node) -> set[str]:
        """What ``node`` waits for: each dependency and, when that is a component, all of
        its descendants; its parent."""
        deps: set[str] = set()
        for urn in node.after | ({node.parent} if node.parent else set()):
            if urn not in self.nodes:
                continue  # the stack's root or another stack's resource (a StackReference)
            deps.add(urn)
            if urn != node.parent:  # waiting on a parent's children would be a cycle
                deps |= self.descendants(urn)
        deps.discard(node.urn)
        return deps

    def before(self, node: Node) -> frozenset[str]:
        """Every URN guaranteed to exist when ``node`` is created."""
        if node.urn not in self._closure:
            seen: set[str] = set()
            todo = list(self.direct(node))
            while todo:
                urn = todo.pop()
                if urn in seen:
                    continue
                seen.add(urn)
                todo.extend(self.direct(self.nodes[urn]))
            earlier = self.stacks[:self.stacks.index(node.stack)]
            seen |= {n.urn for n in self.nodes.values() if n.stack in earlier}
            self._closure[node.urn] = frozenset(seen)
        return self._closure[node.urn]

    def existing(self, node: Node) -> list[Node]:
        return [self.nodes[u] for u in self.nodes if u in self.before(node)]

    def order(self) -> list[Node]:
        """A creation order the engine could take (stack by stack, then by dependencies,
        ties in registration order); raises on a cycle."""
        out: list[Node] = []
        for stack in self.stacks:
            pending = [n for n in self.nodes.values() if n.stack == stack]
            done = {n.urn for n in out}
            while pending:
                ready = [n for n in pending if self.direct(n) <= done | {n.urn}]
                if not ready:
                    raise GraphError("dependency cycle among: "
                                     + ", ".join(n.name for n in pending[:5]))
                for n in ready:
                    out.append(n)
                    done.add(n.urn)
                pending = [n for n in pending if n.urn not in done]
        return out


def _enabled(options: Any, default: bool = True) -> bool:
    if not isinstance(options, Mapping):
        return default
    return options.get("enabled", default) is not False


def implied_children(node: Node) -> list[Node]:
    """What an opaque pulumi-eks ``Cluster`` creates inside itself that matters to readiness
    (pulumi-eks ``Cluster`` inputs ``skipDefaultNodeGroup`` and ``corednsAddonOptions``;
    pulumi-eks issues #1525 and #1819 show the CoreDNS add-on created inside the component as
    ``eks:index:Cluster$aws:eks/addon:Addon``). The add-on is created after the default node
    group when there is one, otherwise right after the control plane."""
    if node.type != EKS_CLUSTER:
        return []
    out: list[Node] = []
    after = set(node.after)
    if node.props.get("skipDefaultNodeGroup") is not True:
        group = Node(urn=f"{node.urn}$default-node-group", type=DEFAULT_NODE_GROUP,
                     name=f"{node.name}-default", props={"labels": {}, "taints": []},
                     stack=node.stack, parent=node.urn, after=frozenset(after), implied=True)
        out.append(group)
        after.add(group.urn)
    if _enabled(node.props.get("corednsAddonOptions")):
        out.append(Node(urn=f"{node.urn}$coredns", type=EKS_ADDON, name=f"{node.name}-coredns",
                        props={"addonName": "coredns", **(
                            {"configurationValues": node.props["corednsAddonOptions"].get(
                                "configurationValues")}
                            if isinstance(node.props.get("corednsAddonOptions"), Mapping)
                            and node.props["corednsAddonOptions"].get("configurationValues")
                            else {})},
                        stack=node.stack, parent=node.urn, after=frozenset(after), implied=True))
    return out


def stack_of(urn: str) -> str:
    return urn.split("::")[0].removeprefix("urn:pulumi:")


def build(resources: Iterable[Captured], stacks: Iterable[str]) -> Graph:
    """The graph of captured resources; ``stacks`` in the order they are deployed."""
    order = tuple(stacks)
    nodes: dict[str, Node] = {}
    for r in resources:
        stack = stack_of(r.urn)
        if stack not in order:
            raise GraphError(f"{r.urn}: stack {stack!r} is not one of {order}")
        node = Node(urn=r.urn, type=r.type, name=r.name, props=r.props, stack=stack,
                    parent=r.parent, after=frozenset(r.dependencies))
        nodes[node.urn] = node
        for extra in implied_children(node):
            nodes[extra.urn] = extra
    return Graph(nodes=nodes, stacks=order)

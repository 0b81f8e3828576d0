"""Drift: what ``pulumi preview --refresh --expect-no-changes`` found, classified.

A preview after a refresh that still has steps means the account no longer matches the stack.
Each step gets one of three verdicts, the most cautious that applies:

* ``restore``: ``pulumi up`` puts back what the program declares (a setting changed by hand, a
  stateless resource deleted);
* ``import``: a resource with a fixed physical name (bucket, database, repository, cluster,
  role, key alias) is gone from the state but a same-named one probably exists (recreated by
  hand, restored from a backup): ``pulumi import`` it, an ``up`` would fail on the name;
* ``investigate``: a replacement or deletion, a data-bearing resource (database, bucket,
  key, registry, cluster) changed, or a security-relevant property (policy, ingress, public
  access, encryption) changed: someone may have done it on purpose during an incident, and
  ``up`` could destroy data or undo a mitigation.

``classify`` is pure (engine event dicts in, verdicts out); ``run_preview`` drives the Pulumi
Automation API. The Pulumi CLI cannot run on the machine this was written on: the
classification is tested against recorded engine events, ``run_preview`` never ran.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RESTORE, IMPORT, INVESTIGATE = "restore", "import", "investigate"
ORDER = (RESTORE, IMPORT, INVESTIGATE)

# Steps that are not changes: what a clean preview is made of.
NO_CHANGE_OPS = frozenset({"same", "read", "refresh", "discard", "discard-replaced"})

# Types that hold data or identity: a change to one is never restored blindly.
DATA_BEARING = frozenset({
    "aws:rds/instance:Instance", "aws:s3/bucket:Bucket", "aws:kms/key:Key",
    "aws:ecr/repository:Repository", "eks:index:Cluster", "aws:eks/cluster:Cluster",
    "aws:secretsmanager/secret:Secret", "aws:dynamodb/table:Table",
})

# Input that fixes a resource's physical name, per type (a create of one collides).
NAMED_BY = {
    "aws:s3/bucket:Bucket": "bucket", "aws:rds/instance:Instance": "identifier",
    "aws:ecr/repository:Repository": "name", "aws:iam/role:Role": "name",
    "aws:kms/alias:Alias": "name", "aws:eks/cluster:Cluster": "name",
    "aws:cloudwatch/metricAlarm:MetricAlarm": "name", "aws:sns/topic:Topic": "name",
    "aws:cloudwatch/logGroup:LogGroup": "name", "aws:rds/parameterGroup:ParameterGroup": "name",
}

# Property names whose change may be a deliberate mitigation or a breach.
SENSITIVE_PROPERTIES = ("policy", "ingress", "egress", "publicaccess", "blockpublic",
                        "restrictpublic", "encryption", "kms", "assumerolepolicy",
                        "endpointpublicaccess", "publicaccesscidrs", "deletionprotection")


@dataclass(frozen=True)
class DriftItem:
    urn: str
    type: str
    op: str
    verdict: str
    reason: str
    properties: tuple[str, ...] = ()


def _name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def _changed_properties(meta: Mapping[str, Any]) -> tuple[str, ...]:
    detailed = meta.get("detailedDiff") or {}
    return tuple(sorted(set(detailed) | set(meta.get("diffs") or [])))


def classify_step(meta: Mapping[str, Any]) -> DriftItem | None:
    """One step's metadata (``resourcePreEvent.metadata``): None when it is no change."""
    op, urn, typ = str(meta.get("op", "")), str(meta.get("urn", "")), str(meta.get("type", ""))
    if op in NO_CHANGE_OPS or typ.startswith("pulumi:pulumi:Stack"):
        return None
    props = _changed_properties(meta)
    sensitive = [p for p in props if any(s in p.replace("_", "").lower()
                                         for s in SENSITIVE_PROPERTIES)]
    if op in ("replace", "create-replacement", "delete-replaced", "delete"):
        return DriftItem(urn, typ, op, INVESTIGATE, f"{op} of {_name(urn)}: would destroy the "
                         "live resource; check why it differs before any `up`", props)
    if op in ("create", "import"):
        named = NAMED_BY.get(typ)
        if typ in DATA_BEARING:
            return DriftItem(urn, typ, op, INVESTIGATE, f"{_name(urn)} is gone from the account: "
                             "its data may be lost; restore from backup or import the "
                             "recreated one, never recreate it empty", props)
        if named:
            return DriftItem(urn, typ, op, IMPORT, f"{_name(urn)} is missing from the state; "
                             f"a resource with the same {named} likely exists: `pulumi import` "
                             "it (an `up` fails on the name)", props)
        return DriftItem(urn, typ, op, RESTORE, f"{_name(urn)} was deleted outside Pulumi: "
                         "`pulumi up` recreates it", props)
    if op == "update":
        if typ in DATA_BEARING:
            return DriftItem(urn, typ, op, INVESTIGATE, f"{_name(urn)} holds data and changed "
                             f"({', '.join(props) or 'unknown properties'})", props)
        if sensitive:
            return DriftItem(urn, typ, op, INVESTIGATE, "security-relevant change "
                             f"({', '.join(sensitive)}): possibly a deliberate mitigation", props)
        return DriftItem(urn, typ, op, RESTORE, f"changed outside Pulumi "
                         f"({', '.join(props) or 'unknown properties'}): `pulumi up` restores "
                         "it", props)
    return DriftItem(urn, typ, op, INVESTIGATE, f"unexpected step {op!r}", props)


def classify(events: Iterable[Mapping[str, Any]]) -> list[DriftItem]:
    """Verdicts for every change step among engine events (the JSON the engine emits)."""
    out = []
    for event in events:
        pre = event.get("resourcePreEvent")
        if not pre:
            continue
        item = classify_step(pre.get("metadata") or {})
        if item is not None:
            out.append(item)
    return out


def summary(items: list[DriftItem]) -> dict[str, Any]:
    counts = {v: sum(1 for i in items if i.verdict == v) for v in ORDER}
    worst = next((v for v in reversed(ORDER) if counts[v]), None)
    return {"drifted": bool(items), "worst": worst, "counts": counts,
            "items": [asdict(i) for i in items]}


def load_event_log(path: Path) -> list[dict[str, Any]]:
    """Engine events as the engine writes them (one JSON object per line, `--event-log`)."""
    import json

    events = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except ValueError as exc:
            raise ValueError(f"{path}:{n}: not a JSON engine event: {exc}") from exc
    return events


def run_preview(stack: str, work_dir: Path,
                on_event: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """``pulumi preview --refresh --expect-no-changes`` through the Automation API; returns
    the engine events as dicts. Needs the Pulumi CLI and the stack's backend credentials.
    Never run here (no Pulumi CLI on this machine)."""
    from pulumi import automation as auto

    collected: list[dict[str, Any]] = []

    def keep(event: Any) -> None:
        pre = getattr(event, "resource_pre_event", None)
        if pre is None:
            return
        m = pre.metadata
        step = {"resourcePreEvent": {"metadata": {
            "op": m.op.value, "urn": m.urn, "type": m.type, "diffs": m.diffs or [],
            "detailedDiff": {k: {"diffKind": v.diff_kind.value, "inputDiff": v.input_diff}
                             for k, v in (m.detailed_diff or {}).items()}}}}
        collected.append(step)
        if on_event:
            on_event(step)

    selected = auto.select_stack(stack_name=stack, work_dir=str(work_dir))
    try:
        selected.preview(refresh=True, expect_no_changes=True, diff=True, on_event=keep)
    except auto.CommandError:
        # expect_no_changes makes a drifted preview fail; its change steps say what drifted.
        # Any other failure (no credentials, a program error) has none: re-raised.
        if not classify(collected):
            raise
    return collected

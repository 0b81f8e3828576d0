"""Do a stack's SLO rules read only metrics something in that stack exports?

Pure functions over the rule file (slo.rules.generate_rules) and the Kubernetes objects the
program declares (kind, metadata, spec as dicts). A rule that reads a metric nothing scrapes
records nothing, its burn alerts never fire and its SloInputAbsent alert fires for good (the
HAProxy metric in EKS, issue 49 item 4).

What it sees: the metric names in each rule's PromQL, the ServiceMonitors (through the
Services they select to the pods behind them) and PodMonitors, each pod's
``app.kubernetes.io/component`` and named ports, and which component serves which metric
(controlplane.metrics.SERVED_BY). What it cannot see: whether Prometheus selects the monitors
(its monitor selectors), whether the port answers, NetworkPolicies, label values a selector
expects (a ``route`` or ``code`` that never occurs), a chart's own exporters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# series Prometheus makes itself (every target's `up`, the rule engine's ALERTS)
PROMETHEUS_OWN = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE"})
COMPONENT_LABEL = "app.kubernetes.io/component"
_HISTOGRAM_SUFFIX = re.compile(r"_(bucket|count|sum)$")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NAME_MATCHER = re.compile(r'__name__\s*=~?\s*"((?:[^"\\]|\\.)*)"')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on",
                       "ignoring", "group_left", "group_right", "inf", "nan"})
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def series_read(expr: str) -> set[str]:
    """Metric names a PromQL expression reads: bare selectors and ``__name__`` matchers
    (alternatives of a regex of escaped names). Functions and keywords are not names."""
    names = {re.sub(r"\\+(.)", r"\1", alt) for m in _NAME_MATCHER.finditer(expr)
             for alt in m.group(1).split("|")}
    text = _GROUPING.sub(" ", expr)
    text = re.sub(r"\{[^}]*\}", " ", _STRING.sub('""', text))  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    for m in _IDENT.finditer(text):
        rest = text[m.end():].lstrip()
        if rest.startswith("(") or m.group(0).lower() in _KEYWORDS:
            continue
        if m.start() and (text[m.start() - 1].isdigit() or text[m.start() - 1] == "."):
            continue  # the exponent or unit of a number literal
        names.add(m.group(0))
    return names


def rule_inputs(rules: Mapping[str, Any]) -> dict[str, set[str]]:
    """Metric name -> the rules (record or alert names) that read it, leaving out what the file
    records itself and what Prometheus makes."""
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    out: dict[str, set[str]] = {}
    for group in rules["groups"]:
        for rule in group["rules"]:
            for name in series_read(rule["expr"]) - recorded - PROMETHEUS_OWN:
                out.setdefault(name, set()).add(rule.get("record") or rule["alert"])
    return out


def _matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        value, op = labels.get(e["key"]), e["operator"]
        if (op == "In" and value not in e["values"]) or (op == "NotIn" and value in e["values"]) \
                or (op == "Exists" and value is None) or (op == "DoesNotExist" and value is not None):
            return False
    return True


def _pods(objects: Iterable[Mapping[str, Any]]) -> list[tuple[str, dict[str, str], set[str]]]:
    """(namespace, pod labels, named container ports) of every workload's pod template."""
    out = []
    for o in objects:
        if o.get("kind") not in ("Deployment", "StatefulSet", "DaemonSet"):
            continue
        template = (o.get("spec") or {}).get("template") or {}
        ports = {p["name"] for c in (template.get("spec") or {}).get("containers") or []
                 for p in c.get("ports") or [] if p.get("name")}
        out.append(((o.get("metadata") or {}).get("namespace", ""),
                    dict((template.get("metadata") or {}).get("labels") or {}), ports))
    return out


def scraped_components(objects: list[Mapping[str, Any]]) -> set[str]:
    """Components (their pods' COMPONENT_LABEL) some ServiceMonitor or PodMonitor scrapes on a
    port the pod (PodMonitor) or the Service (ServiceMonitor) names."""
    pods = _pods(objects)
    found: set[str] = set()
    for mon in objects:
        kind, spec = mon.get("kind"), mon.get("spec") or {}
        ns = (mon.get("metadata") or {}).get("namespace", "")
        if kind == "PodMonitor":
            wanted = {e.get("port") for e in spec.get("podMetricsEndpoints") or []}
            found |= {labels.get(COMPONENT_LABEL, "") for pns, labels, ports in pods
                      if pns == ns and _matches(spec.get("selector") or {}, labels)
                      and wanted & ports}
        elif kind == "ServiceMonitor":
            wanted = {e.get("port") for e in spec.get("endpoints") or []}
            for svc in objects:
                meta = svc.get("metadata") or {}
                if svc.get("kind") != "Service" or meta.get("namespace", "") != ns:
                    continue
                if not _matches(spec.get("selector") or {}, meta.get("labels") or {}):
                    continue
                sspec = svc.get("spec") or {}
                if not wanted & {p.get("name") for p in sspec.get("ports") or []}:
                    continue
                found |= {labels.get(COMPONENT_LABEL, "") for pns, labels, _ in pods
                          if pns == ns and _matches({"matchLabels": sspec.get("selector") or {}},
                                                    labels)}
    return found - {""}


def unexported(rules: Mapping[str, Any], objects: list[Mapping[str, Any]],
               served_by: Mapping[str, tuple[str, ...]]) -> list[str]:
    """One sentence per metric the rules read that the stack does not export: no component
    serves it, or a component that serves it is scraped by no monitor."""
    scraped = scraped_components(objects)
    problems = []
    for name, readers in sorted(rule_inputs(rules).items()):
        base = _HISTOGRAM_SUFFIX.sub("", name) if name not in served_by else name
        servers = served_by.get(base)
        if servers is None:
            problems.append(f"{name} (read by {', '.join(sorted(readers))}): nothing in the "
                            "stack serves it")
            continue
        missing = [c for c in servers if c not in scraped]
        if missing:
            problems.append(f"{name} (read by {', '.join(sorted(readers))}): served by "
                            f"{', '.join(missing)}, which no ServiceMonitor or PodMonitor "
                            f"scrapes (scraped: {', '.join(sorted(scraped)) or 'nothing'})")
    return problems

"""Prometheus recording rules and multi-window multi-burn-rate alerts from the specs.

A small ordered pipeline in the manner of Sloth: validate -> SLI error-ratio recording rules
(one per alert window) -> SLO metadata rules -> alert rules. Burn-rate windows are data (the
OpenSLO AlertConditions), scaled from the 30d reference to each SLO's window and floored per
environment so a rate() window always spans several scrapes.
"""

from __future__ import annotations

import re
from string import Template
from typing import Any

from slo.budget import scaled_window
from slo.durations import format_duration
from slo.metrics import LABEL_VALUE_KEYS, metric_values
from slo.specs import IndicatorKind, Slo, SpecError, Specs

RULES_VERSION = "gameday-slo-rules/v1"
_BOOL_OP = {"lt": "<", "lte": "<=", "gt": ">", "gte": ">="}


def _num(value: float) -> str:
    """Short PromQL literal: 12 significant digits hide float noise (1 - 0.999)."""
    return f"{float(value):.12g}"


def _render(template: str, slo: Slo, metrics: dict[str, str], **extra: str) -> str:
    values = {**metrics, **extra}
    try:
        text = Template(template).substitute(values)
        # a source's query names its metric and window as placeholders too: one more pass
        return Template(text).substitute(values) if "${" in text else text
    except KeyError as exc:
        raise SpecError(
            f"{slo.source}: SLO {slo.name!r}: query placeholder {exc} has no value"
        ) from None


def _le_matcher(value: float) -> str:
    # Python clients expose le="10.0", Go clients le="10": match both
    text = _num(value)
    return (
        f"{re.escape(text)}(\\\\.0+)?" if "." not in text else re.escape(text).replace("\\", "\\\\")
    )


def error_ratio_expr(slo: Slo, window: str, slice_seconds: float,
                     metrics: dict[str, str]) -> str:
    """`metrics`: every placeholder's value in the environment (slo.metrics.metric_values)."""
    prom = slo.indicator.prometheus
    if prom is None:
        raise SpecError(f"{slo.source}: SLO {slo.name!r} has no Prometheus source")
    if slo.indicator.kind is IndicatorKind.RATIO:
        bad = _render(prom.bad or "", slo, metrics, window=window)
        total = _render(prom.total or "", slo, metrics, window=window)
        return f"({bad})\n/\n({total})"
    obj = slo.objective
    assert obj.value is not None and obj.op is not None  # loader guarantees it for thresholds
    if prom.histogram:
        metric = _render(prom.query or "", slo, metrics, window=window)
        if obj.op not in ("lt", "lte"):
            raise SpecError(f"{slo.source}: SLO {slo.name!r}: histogram thresholds need op lt/lte")
        good = f'sum(rate({metric}_bucket{{le=~"{_le_matcher(obj.value)}"}}[{window}]))'
        return f"1 - (\n  {good}\n  /\n  sum(rate({metric}_count[{window}]))\n)"
    slice_ = format_duration(obj.time_slice_window_seconds or slice_seconds)
    if prom.good_query:
        good = _render(prom.good_query, slo, metrics, window=window, threshold=_num(obj.value))
    else:
        query = _render(prom.query or "", slo, metrics, window=window)
        good = f"({query}) {_BOOL_OP[obj.op]} bool {_num(obj.value)}"
    return f"1 - avg_over_time(({good})[{window}:{slice_}])"


def alert_windows(slo: Slo, specs: Specs) -> list[tuple[str, float, str, str]]:
    """(severity, burn rate, long window, short window) per condition, scaled and floored."""
    floor = specs.rules.min_window_seconds
    out = []
    for policy in slo.alert_policies:
        for cond in policy.conditions:
            long_s = scaled_window(cond.long_window_seconds, slo.window_seconds, floor)
            short_s = scaled_window(cond.short_window_seconds, slo.window_seconds, floor)
            out.append(
                (cond.severity, cond.burn_rate, format_duration(long_s), format_duration(short_s))
            )
    return out


def _record_name(window: str) -> str:
    return f"slo:sli_error:ratio_rate{window}"


def _labels(slo: Slo) -> dict[str, str]:
    return {"slo": slo.name, "service": slo.service}


def sli_rules(slo: Slo, specs: Specs) -> list[dict[str, Any]]:
    windows = sorted(
        {w for _, _, lw, sw in alert_windows(slo, specs) for w in (lw, sw)},
        key=lambda w: (len(w), w),
    )
    return [
        {
            "record": _record_name(w),
            "expr": error_ratio_expr(slo, w, specs.evaluation.time_slice_seconds,
                                     metric_values(specs.rules.api_requests)),
            "labels": _labels(slo),
        }
        for w in windows
    ]


def window_error_ratio_query(slo: Slo, specs: Specs) -> str | None:
    """PromQL for the SLO's error ratio over its whole window, from the recorded series of its
    shortest alert window (Sloth's period error ratio: the average of the short-window ratio
    over the SLO window; each evaluation weighs the same, whatever its traffic). None when the
    rules record nothing for this SLO (evidence-only SLI, or no alert policy)."""
    if slo.indicator.prometheus is None or not slo.alert_policies:
        return None
    floor = specs.rules.min_window_seconds
    shortest = min(scaled_window(s, slo.window_seconds, floor)
                   for p in slo.alert_policies for c in p.conditions
                   for s in (c.short_window_seconds, c.long_window_seconds))
    record = _record_name(format_duration(shortest))
    return (f'avg_over_time({record}{{slo="{slo.name}"}}'
            f"[{format_duration(slo.window_seconds)}])")


def metadata_rules(slo: Slo) -> list[dict[str, Any]]:
    return [
        {
            "record": "slo:objective:ratio",
            "expr": f"vector({_num(slo.objective.target)})",
            "labels": _labels(slo),
        },
        {
            "record": "slo:error_budget:ratio",
            "expr": f"vector({_num(slo.error_budget)})",
            "labels": _labels(slo),
        },
        {
            "record": "slo:time_period:days",
            "expr": f"vector({_num(slo.window_seconds / 86400)})",
            "labels": _labels(slo),
        },
    ]


def alert_rules(slo: Slo, specs: Specs) -> list[dict[str, Any]]:
    by_severity: dict[str, list[str]] = {}
    windows_text: dict[str, list[str]] = {}
    sel = f'{{slo="{slo.name}"}}'
    for severity, rate, long_w, short_w in alert_windows(slo, specs):
        threshold = _num(rate * slo.error_budget)
        long_cmp = f"{_record_name(long_w)}{sel} > {threshold}"
        short_cmp = f"{_record_name(short_w)}{sel} > {threshold}"
        # floored windows can coincide; then one comparison says the same
        by_severity.setdefault(severity, []).append(
            f"({long_cmp})" if long_w == short_w else f"(\n  {long_cmp}\n  and\n  {short_cmp}\n)"
        )
        windows_text.setdefault(severity, []).append(f"{rate:g}x over {long_w}/{short_w}")
    runbook = f"runbooks/{slo.alert_runbook}.md"
    return [
        {
            "alert": slo.alert_name,
            "expr": "\nor\n".join(parts),
            "labels": {**_labels(slo), "severity": severity},
            "annotations": {
                "summary": f"{slo.display_name}: error budget burning too fast ({severity})",
                "description": (
                    f"{slo.display_name} (objective {slo.objective.target:g} over "
                    f"{format_duration(slo.window_seconds)}) burns its error budget at "
                    f"{' or '.join(windows_text[severity])}."
                ),
                "runbook": slo.alert_runbook,
                "runbook_url": runbook,
            },
        }
        for severity, parts in sorted(by_severity.items())
    ]


TELEMETRY_RUNBOOK = "alert-telemetry-loss"
# the SLO's inputs must have been seen this recently, or the SLO has no data
NO_DATA_WINDOW = "15m"
# a scrape job that exported an SLO's inputs this recently is expected to still be scraped
INPUT_JOB_LOOKBACK = "1h"
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def input_metrics(slo: Slo, specs: Specs) -> list[str]:
    """The metric names the SLO's generated rules read in `specs`'s environment (a
    histogram's `_count` series)."""
    prom = slo.indicator.prometheus
    if prom is None:
        return []
    metrics = metric_values(specs.rules.api_requests)
    templates = [prom.bad, prom.total, prom.query, prom.good_query]
    keys = [k for t in templates if t for k in _PLACEHOLDER.findall(t)]
    keys += [k for q in keys if q in metrics for k in _PLACEHOLDER.findall(metrics[q])]
    names = [metrics[k] for k in dict.fromkeys(keys) if k in metrics and k not in LABEL_VALUE_KEYS]
    return [f"{n}_count" if prom.histogram else n for n in names]


def _telemetry_annotations(summary: str, description: str) -> dict[str, str]:
    return {"summary": summary, "description": description, "runbook": TELEMETRY_RUNBOOK,
            "runbook_url": f"runbooks/{TELEMETRY_RUNBOOK}.md"}


def telemetry_rules(specs: Specs) -> list[dict[str, Any]]:
    """Absent-data alerts: per SLO, its inputs have no sample (the SLO has no data, its burn
    alerts cannot fire) or every target of a scrape job that exported them is down; and a
    dead man's switch that always fires, so a receiver notices when Prometheus itself is gone
    (a Prometheus that is down evaluates no rule, including these)."""
    out: list[dict[str, Any]] = [{
        "alert": "TelemetryWatchdog",
        "expr": "vector(1)",
        "labels": {"severity": "none"},
        "annotations": _telemetry_annotations(
            "Always firing: the alert pipeline is alive",
            "Dead man's switch. Its absence at the receiver means Prometheus (or its route to "
            "Alertmanager) is down: every SLO alert is silent, and the gate reports the "
            "alert objectives as no data."),
    }]
    for slo in specs.slos:
        metrics = input_metrics(slo, specs)
        if not metrics or not slo.alert_policies:
            continue
        selector = f'{{__name__=~"{"|".join(re.escape(m) for m in metrics)}"}}'
        names = ", ".join(metrics)
        out.append({
            "alert": "SloInputAbsent",
            "expr": f"absent_over_time({selector}[{NO_DATA_WINDOW}])",
            "for": "5m",
            "labels": {**_labels(slo), "severity": "ticket"},
            "annotations": _telemetry_annotations(
                f"{slo.display_name}: no input data for {NO_DATA_WINDOW}",
                f"None of {names} has a sample in {NO_DATA_WINDOW}: {slo.alert_name} cannot "
                "fire and the SLO's recorded error ratio is empty (not 100 %)."),
        })
        out.append({
            "alert": "SloInputScrapeLost",
            "expr": (f"max by (job) (up) == 0\nand on (job)\n"
                     f"group by (job) (last_over_time({selector}[{INPUT_JOB_LOOKBACK}]))"),
            "for": "2m",
            "labels": {**_labels(slo), "severity": "ticket"},
            "annotations": _telemetry_annotations(
                f"{slo.display_name}: every target of scrape job {{{{ $labels.job }}}} is down",
                f"Job {{{{ $labels.job }}}} exported {names} in the last {INPUT_JOB_LOOKBACK} "
                f"and no target of it answers a scrape: {slo.alert_name} is blind to it."),
        })
    return out


def generate_rules(specs: Specs) -> dict[str, Any]:
    """A Prometheus rule file (dict) for every SLO with a Prometheus source.

    Evidence-only SLIs (durability, terminal-state consistency, time to usable result) are
    audited offline by `gameday evaluate` and get no rules."""
    interval = format_duration(specs.rules.evaluation_interval_seconds)
    groups = []
    for slo in specs.slos:
        if slo.indicator.prometheus is None:
            continue
        groups.append(
            {"name": f"slo-sli-{slo.name}", "interval": interval, "rules": sli_rules(slo, specs)}
        )
        groups.append(
            {"name": f"slo-meta-{slo.name}", "interval": interval, "rules": metadata_rules(slo)}
        )
        if slo.alert_policies:
            groups.append(
                {
                    "name": f"slo-alerts-{slo.name}",
                    "interval": interval,
                    "rules": alert_rules(slo, specs),
                }
            )
    groups.append({"name": "slo-telemetry", "interval": interval,
                   "rules": telemetry_rules(specs)})
    return {"groups": groups}


def dump_rules(rules: dict[str, Any]) -> str:
    import yaml

    class _Literal(str):
        pass

    def literal(dumper: yaml.SafeDumper, data: _Literal) -> yaml.Node:
        return dumper.represent_scalar(
            "tag:yaml.org,2002:str", data, style="|" if "\n" in data else None
        )

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(_Literal, literal)

    def wrap(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: wrap(v) for k, v in node.items()}
        if isinstance(node, list):
            return [wrap(v) for v in node]
        return _Literal(node) if isinstance(node, str) and "\n" in node else node

    header = f"# Generated by `gameday slo rules` ({RULES_VERSION}) from slo/specs. Do not edit.\n"
    return header + yaml.dump(wrap(rules), Dumper=Dumper, sort_keys=False, width=120)

"""Load and validate the spec files: OpenSLO v1 documents, our RecoveryObjective documents
and one EnvironmentOverrides document per environment.

Validation happens here, once, before anything runs; every problem is raised as one
``SpecError`` whose message names the file, the document and the field.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from slo.durations import parse_duration
from slo.invariants import KNOWN_INVARIANTS
from slo.metrics import API_REQUEST_SOURCES, PLACEHOLDER_KEYS
from slo.specs.model import (
    ENVIRONMENTS,
    FAILURE_CLASSES,
    AlertCondition,
    AlertPolicy,
    Budgeting,
    EvaluationSettings,
    GateSettings,
    Indicator,
    IndicatorKind,
    Objective,
    PromSource,
    RecoveryObjective,
    Rpo,
    RuleSettings,
    Slo,
    Specs,
)

SPEC_DIR = Path(__file__).resolve().parent
OPENSLO_API = "openslo/v1"
GAMEDAY_API = "gameday/v1"
# the SLIs the offline evaluator knows how to compute from evidence (slo/sli.py)
KNOWN_SLIS: tuple[str, ...] = (
    "api-availability",
    "submission-durability",
    "queue-age",
    "scheduling-delay",
    "startup-success",
    "active-progress",
    "artifact-write-success",
    "terminal-state-consistency",
    "time-to-usable-result",
)
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TEMPLATE_VARS = {"window", "threshold"}
# the C loader when libyaml is there: specs load on every evaluate and rules call
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

M = TypeVar("M", bound=BaseModel)


class SpecError(ValueError):
    """A spec file is missing, malformed or inconsistent. The message names file, document
    and field, e.g. ``slo/specs/recovery/db.yaml: document 1 (RecoveryObjective
    'db-primary-loss'): field spec.rto: not a duration: 'soon'``."""


@dataclass
class _Doc:
    """One YAML document plus where it came from, so every error can say so."""

    file: str
    index: int
    kind: str
    name: str
    body: dict[str, Any]

    def where(self) -> str:
        return f"{self.file}: document {self.index} ({self.kind} {self.name!r})"

    def error(self, field: str, reason: str) -> SpecError:
        return SpecError(f"{self.where()}: field {field}: {reason}")

    def get(self, path: str, default: Any = None, *, required: bool = False) -> Any:
        node: Any = self.body
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                if required:
                    raise self.error(path, "is required")
                return default
            node = node[part]
        return node

    def mapping(self, path: str, *, required: bool = False) -> dict[str, Any]:
        value = self.get(path, {} if not required else None, required=required)
        if not isinstance(value, dict):
            raise self.error(path, f"must be a mapping, got {type(value).__name__}")
        return value

    def duration(self, path: str, value: Any) -> float:
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise self.error(path, str(exc)) from None

    def only_keys(self, path: str, value: dict[str, Any], allowed: set[str]) -> None:
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.error(
                f"{path}.{unknown[0]}" if path else unknown[0],
                f"unknown field (allowed: {', '.join(sorted(allowed))})",
            )

    def build(self, model: type[M], data: dict[str, Any], fields: dict[str, str]) -> M:
        """Construct a pydantic model; map a validation error back to the YAML field."""
        try:
            return model(**data)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = [str(p) for p in err["loc"]]
            field = fields.get(loc[0], loc[0]) if loc else "?"
            if len(loc) > 1:
                field += "." + ".".join(_camel(p) for p in loc[1:])
            raise self.error(field, err["msg"]) from None


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(p.capitalize() for p in rest)


def _read_docs(path: Path, root: Path) -> list[_Doc]:
    try:
        rel = str(path.relative_to(root.parent))
    except ValueError:
        rel = str(path)
    try:
        raw_docs = list(yaml.load_all(path.read_text(encoding="utf-8"), Loader=_YAML_LOADER))
    except OSError as exc:
        raise SpecError(f"{rel}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{rel}: not valid YAML: {exc}") from None
    docs: list[_Doc] = []
    for i, raw in enumerate(raw_docs, start=1):
        if raw is None:
            continue
        if not isinstance(raw, dict):
            raise SpecError(f"{rel}: document {i}: must be a mapping")
        meta = raw.get("metadata") if isinstance(raw.get("metadata"), dict) else {}
        doc = _Doc(rel, i, str(raw.get("kind", "?")), str(meta.get("name", "?")), raw)
        for key in ("apiVersion", "kind", "metadata.name", "spec"):
            doc.get(key, required=True)
        if not re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", doc.name):
            raise doc.error("metadata.name", "must be lowercase letters, digits and '-'")
        docs.append(doc)
    return docs


def _yaml_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.y*ml") if p.suffix in (".yaml", ".yml"))


# --------------------------------------------------------------------------- OpenSLO


def _check_query(doc: _Doc, field: str, query: Any) -> str:
    if not isinstance(query, str) or not query.strip():
        raise doc.error(field, "must be a non-empty PromQL string")
    for key in _PLACEHOLDER.findall(query):
        if key not in PLACEHOLDER_KEYS and key not in _TEMPLATE_VARS:
            raise doc.error(
                field, f"unknown placeholder ${{{key}}} (not in slo/metrics.py METRICS or "
                       "API_REQUEST_SOURCES)"
            )
    return query


def _metric_source(doc: _Doc, field: str, node: Any) -> dict[str, Any] | None:
    """Prometheus source spec, or None for evidence-only sources (type gameday-evidence)."""
    if not isinstance(node, dict) or not isinstance(node.get("metricSource"), dict):
        raise doc.error(field, "must contain metricSource")
    source = node["metricSource"]
    kind = source.get("type")
    if kind == "gameday-evidence":
        return None
    if kind != "Prometheus":
        raise doc.error(f"{field}.metricSource.type", "must be Prometheus or gameday-evidence")
    spec = source.get("spec")
    if not isinstance(spec, dict):
        raise doc.error(f"{field}.metricSource.spec", "is required")
    return spec


def _parse_sli(doc: _Doc) -> Indicator:
    if doc.name not in KNOWN_SLIS:
        raise doc.error("metadata.name", f"unknown SLI (evaluator knows: {', '.join(KNOWN_SLIS)})")
    spec = doc.mapping("spec", required=True)
    doc.only_keys("spec", spec, {"description", "ratioMetric", "thresholdMetric"})
    if ("ratioMetric" in spec) == ("thresholdMetric" in spec):
        raise doc.error("spec", "needs exactly one of ratioMetric, thresholdMetric")
    prom: PromSource | None
    if "ratioMetric" in spec:
        kind = IndicatorKind.RATIO
        ratio = doc.mapping("spec.ratioMetric")
        doc.only_keys("spec.ratioMetric", ratio, {"counter", "bad", "good", "total"})
        if "good" in ratio:
            raise doc.error("spec.ratioMetric.good", "write the ratio as bad/total")
        bad = _metric_source(doc, "spec.ratioMetric.bad", ratio.get("bad"))
        total = _metric_source(doc, "spec.ratioMetric.total", ratio.get("total"))
        if (bad is None) != (total is None):
            raise doc.error("spec.ratioMetric", "bad and total must use the same source type")
        prom = None
        if bad is not None and total is not None:
            prom = PromSource(
                bad=_check_query(
                    doc, "spec.ratioMetric.bad.metricSource.spec.query", bad.get("query")
                ),
                total=_check_query(
                    doc, "spec.ratioMetric.total.metricSource.spec.query", total.get("query")
                ),
            )
    else:
        kind = IndicatorKind.THRESHOLD
        src = _metric_source(doc, "spec.thresholdMetric", spec["thresholdMetric"])
        prom = None
        if src is not None:
            field = "spec.thresholdMetric.metricSource.spec"
            doc.only_keys(field, src, {"query", "histogram", "goodQuery"})
            if ("query" in src) == ("goodQuery" in src):
                raise doc.error(field, "needs exactly one of query, goodQuery")
            if "goodQuery" in src:
                prom = PromSource(
                    good_query=_check_query(doc, f"{field}.goodQuery", src["goodQuery"])
                )
            else:
                prom = PromSource(
                    query=_check_query(doc, f"{field}.query", src.get("query")),
                    histogram=bool(src.get("histogram", False)),
                )
    meta = doc.mapping("metadata")
    return Indicator(
        name=doc.name,
        display_name=str(meta.get("displayName", doc.name)),
        description=str(spec.get("description", "")),
        kind=kind,
        prometheus=prom,
    )


def _parse_condition(doc: _Doc) -> AlertCondition:
    spec = doc.mapping("spec", required=True)
    doc.only_keys("spec", spec, {"description", "severity", "condition"})
    cond = doc.mapping("spec.condition", required=True)
    doc.only_keys(
        "spec.condition", cond, {"kind", "op", "threshold", "lookbackWindow", "alertAfter"}
    )
    if cond.get("kind") != "burnrate":
        raise doc.error("spec.condition.kind", "only burnrate conditions are supported")
    if cond.get("op", "gte") not in ("gt", "gte"):
        raise doc.error("spec.condition.op", "burn-rate conditions must use gt or gte")
    annotations = doc.mapping("metadata.annotations")
    short = annotations.get("gameday/shortWindow")
    if short is None:
        raise doc.error(
            "metadata.annotations.gameday/shortWindow", "is required (multi-window alert)"
        )
    data = {
        "name": doc.name,
        "severity": spec.get("severity"),
        "burn_rate": cond.get("threshold"),
        "long_window_seconds": doc.duration(
            "spec.condition.lookbackWindow", doc.get("spec.condition.lookbackWindow", required=True)
        ),
        "short_window_seconds": doc.duration("metadata.annotations.gameday/shortWindow", short),
    }
    result = doc.build(
        AlertCondition,
        data,
        {"severity": "spec.severity", "burn_rate": "spec.condition.threshold"},
    )
    if result.short_window_seconds >= result.long_window_seconds:
        raise doc.error(
            "metadata.annotations.gameday/shortWindow", "must be shorter than lookbackWindow"
        )
    return result


def _parse_policy(doc: _Doc, conditions: dict[str, AlertCondition]) -> AlertPolicy:
    spec = doc.mapping("spec", required=True)
    doc.only_keys(
        "spec",
        spec,
        {
            "description",
            "alertWhenNoData",
            "alertWhenResolved",
            "alertWhenBreaching",
            "conditions",
            "notificationTargets",
        },
    )
    refs = spec.get("conditions")
    if not isinstance(refs, list) or not refs:
        raise doc.error("spec.conditions", "must be a non-empty list")
    found = []
    for i, ref in enumerate(refs):
        name = ref.get("conditionRef") if isinstance(ref, dict) else None
        if name not in conditions:
            raise doc.error(
                f"spec.conditions[{i}].conditionRef", f"no AlertCondition named {name!r}"
            )
        found.append(conditions[name])
    return AlertPolicy(
        name=doc.name, description=str(spec.get("description", "")), conditions=tuple(found)
    )


def _parse_slo(
    doc: _Doc,
    indicators: dict[str, Indicator],
    policies: dict[str, AlertPolicy],
) -> Slo:
    spec = doc.mapping("spec", required=True)
    doc.only_keys(
        "spec",
        spec,
        {
            "description",
            "service",
            "indicatorRef",
            "timeWindow",
            "budgetingMethod",
            "objectives",
            "alertPolicies",
        },
    )
    ref = spec.get("indicatorRef")
    if ref not in indicators:
        raise doc.error("spec.indicatorRef", f"no SLI named {ref!r}")
    indicator = indicators[ref]
    windows = spec.get("timeWindow")
    if not isinstance(windows, list) or len(windows) != 1 or not isinstance(windows[0], dict):
        raise doc.error("spec.timeWindow", "must be a list with exactly one window")
    if not windows[0].get("isRolling", False):
        raise doc.error("spec.timeWindow[0].isRolling", "only rolling windows are supported")
    window = doc.duration("spec.timeWindow[0].duration", windows[0].get("duration"))
    objectives = spec.get("objectives")
    if (
        not isinstance(objectives, list)
        or len(objectives) != 1
        or not isinstance(objectives[0], dict)
    ):
        raise doc.error("spec.objectives", "must be a list with exactly one objective")
    raw_obj = objectives[0]
    doc.only_keys(
        "spec.objectives[0]",
        raw_obj,
        {"displayName", "target", "op", "value", "timeSliceTarget", "timeSliceWindow"},
    )
    obj_data: dict[str, Any] = {
        "display_name": raw_obj.get("displayName", indicator.display_name),
        "target": raw_obj.get("target"),
        "op": raw_obj.get("op"),
        "value": raw_obj.get("value"),
        "time_slice_target": raw_obj.get("timeSliceTarget"),
    }
    if "timeSliceWindow" in raw_obj:
        obj_data["time_slice_window_seconds"] = doc.duration(
            "spec.objectives[0].timeSliceWindow", raw_obj["timeSliceWindow"]
        )
    objective = doc.build(
        Objective, obj_data, {k: "spec.objectives[0]." + _camel(k) for k in obj_data}
    )
    if indicator.kind is IndicatorKind.THRESHOLD and (
        objective.op is None or objective.value is None
    ):
        raise doc.error("spec.objectives[0].op", "threshold SLIs need op and value")
    budgeting_raw = spec.get("budgetingMethod")
    try:
        budgeting = Budgeting(budgeting_raw)
    except ValueError:
        raise doc.error("spec.budgetingMethod", "must be Occurrences or Timeslices") from None
    prom = indicator.prometheus
    gauge = prom is not None and indicator.kind is IndicatorKind.THRESHOLD and not prom.histogram
    if gauge and budgeting is not Budgeting.TIMESLICES:
        raise doc.error("spec.budgetingMethod", "a gauge threshold SLI needs Timeslices budgeting")
    found: list[AlertPolicy] = []
    for i, ref_item in enumerate(spec.get("alertPolicies") or []):
        name = ref_item if isinstance(ref_item, str) else (ref_item or {}).get("alertPolicyRef")
        if name not in policies:
            raise doc.error(f"spec.alertPolicies[{i}]", f"no AlertPolicy named {name!r}")
        found.append(policies[name])
    if found and prom is None:
        raise doc.error("spec.alertPolicies", "an evidence-only SLI cannot have Prometheus alerts")
    meta = doc.mapping("metadata")
    return doc.build(
        Slo,
        {
            "name": doc.name,
            "display_name": str(meta.get("displayName", doc.name)),
            "description": str(spec.get("description", "")),
            "service": spec.get("service", "ml-control-plane"),
            "indicator": indicator,
            "window_seconds": window,
            "budgeting": budgeting,
            "objective": objective,
            "alert_policies": tuple(found),
            "source": doc.file,
        },
        {"window_seconds": "spec.timeWindow[0].duration", "service": "spec.service"},
    )


# --------------------------------------------------------------------------- ours


def _parse_recovery(doc: _Doc) -> RecoveryObjective:
    spec = doc.mapping("spec", required=True)
    doc.only_keys(
        "spec",
        spec,
        {
            "failureClass",
            "description",
            "rto",
            "rpo",
            "expectedAlerts",
            "runbook",
            "slos",
            "invariants",
            "backupRetentionDays",
            "scope",
            "recoveredBy",
        },
    )
    fc = spec.get("failureClass")
    if fc not in FAILURE_CLASSES:
        raise doc.error(
            "spec.failureClass",
            f"unknown failure class {fc!r} (known: {', '.join(FAILURE_CLASSES)})",
        )
    if doc.name != fc:
        raise doc.error("metadata.name", f"must equal spec.failureClass ({fc!r})")
    rpo_raw = doc.mapping("spec.rpo", required=True)
    doc.only_keys(
        "spec.rpo",
        rpo_raw,
        {"acknowledgedSubmissions", "checkpointProgressIntervals", "artifacts", "restorePoint"},
    )
    rpo_data: dict[str, Any] = {
        "acknowledged_submissions": rpo_raw.get("acknowledgedSubmissions"),
        "checkpoint_progress_intervals": rpo_raw.get("checkpointProgressIntervals"),
        "artifacts": rpo_raw.get("artifacts"),
    }
    if rpo_raw.get("restorePoint") is not None:
        rpo_data["restore_point_seconds"] = doc.duration(
            "spec.rpo.restorePoint", rpo_raw["restorePoint"]
        )
    rpo = doc.build(Rpo, rpo_data, {k: "spec.rpo." + _camel(k) for k in rpo_data})
    meta = doc.mapping("metadata")
    for list_field in ("expectedAlerts", "slos", "invariants"):
        value = spec.get(list_field, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise doc.error(f"spec.{list_field}", "must be a list of strings")
    for i, name in enumerate(spec.get("invariants", [])):
        if name not in KNOWN_INVARIANTS:
            raise doc.error(
                f"spec.invariants[{i}]",
                f"unknown invariant {name!r} (known: {', '.join(KNOWN_INVARIANTS)})",
            )
    ro = doc.build(
        RecoveryObjective,
        {
            "name": doc.name,
            "failure_class": fc,
            "display_name": str(meta.get("displayName", doc.name)),
            "description": str(spec.get("description", "")),
            "rto_seconds": doc.duration("spec.rto", doc.get("spec.rto", required=True)),
            "rpo": rpo,
            "expected_alerts": list(spec.get("expectedAlerts", [])),
            "runbook": spec.get("runbook", fc),
            "slos": list(spec.get("slos", [])),
            "invariants": list(dict.fromkeys(spec.get("invariants", []))),
            "backup_retention_days": spec.get("backupRetentionDays"),
            "scope": spec.get("scope"),
            "recovered_by": spec.get("recoveredBy", "slis"),
            "source": doc.file,
        },
        {
            "rto_seconds": "spec.rto",
            "recovered_by": "spec.recoveredBy",
            "runbook": "spec.runbook",
            "scope": "spec.scope",
            "backup_retention_days": "spec.backupRetentionDays",
        },
    )
    if fc == "db-primary-loss":
        if ro.rpo.restore_point_seconds is None:
            raise doc.error(
                "spec.rpo.restorePoint", "is required for db-primary-loss (drives backups)"
            )
        if ro.backup_retention_days is None:
            raise doc.error("spec.backupRetentionDays", "is required for db-primary-loss")
    if fc == "artifact-store-unavailable" and ro.scope is None:
        raise doc.error("spec.scope", "is required for artifact-store-unavailable (zone or region)")
    return ro


_SETTINGS_FIELDS: dict[str, tuple[type[BaseModel], dict[str, str]]] = {
    # yaml section -> (model, yaml key -> model field); "*Seconds" keys take durations
    "evaluation": (
        EvaluationSettings,
        {
            "sampleInterval": "sample_interval_seconds",
            "sampleWindow": "sample_window_seconds",
            "recoveryHoldSamples": "recovery_hold_samples",
            "slowRequest": "slow_request_seconds",
            "alertGrace": "alert_grace_seconds",
            "detectionGrace": "detection_grace_seconds",
            "timeSlice": "time_slice_seconds",
        },
    ),
    "gate": (
        GateSettings,
        {
            "passScore": "pass_score",
            "warningScore": "warning_score",
            "keySlis": "key_slis",
            "keyAlerts": "key_alerts",
            "weightSli": "weight_sli",
            "weightRto": "weight_rto",
            "weightRpo": "weight_rpo",
            "weightAlert": "weight_alert",
            "weightInvariant": "weight_invariant",
            "weightExperiment": "weight_experiment",
            "relativeTolerancePercent": "relative_tolerance_percent",
            "baselineTolerancePoints": "baseline_tolerance_points",
            "baselineToleranceSeconds": "baseline_tolerance_seconds",
            "baselineRuns": "baseline_runs",
            "minRemainingBudget": "min_remaining_budget",
        },
    ),
    "rules": (
        RuleSettings,
        {"minWindow": "min_window_seconds", "evaluationInterval": "evaluation_interval_seconds",
         "apiRequests": "api_requests"},
    ),
}


def _parse_settings(doc: _Doc, section: str) -> BaseModel:
    model, keys = _SETTINGS_FIELDS[section]
    raw = doc.mapping(f"spec.{section}")
    doc.only_keys(f"spec.{section}", raw, set(keys))
    data: dict[str, Any] = {}
    for key, value in raw.items():
        field = keys[key]
        if field.endswith("_seconds"):
            value = doc.duration(f"spec.{section}.{key}", value)
        if isinstance(value, list):
            value = tuple(value)
        data[field] = value
    return doc.build(model, data, {v: f"spec.{section}.{k}" for k, v in keys.items()})


def _deep_merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _apply_slo_override(slo_doc: _Doc, patch: dict[str, Any], env_doc: _Doc, field: str) -> None:
    """Env overrides patch the OpenSLO document before validation, so the SLO is validated
    exactly as it will be used; the patch itself is checked against the env file."""
    env_doc.only_keys(field, patch, {"timeWindow", "objective"})
    spec = slo_doc.body.setdefault("spec", {})
    if "timeWindow" in patch:
        env_doc.duration(f"{field}.timeWindow", patch["timeWindow"])
        spec["timeWindow"] = [{"duration": patch["timeWindow"], "isRolling": True}]
    if "objective" in patch:
        obj = patch["objective"]
        if not isinstance(obj, dict):
            raise env_doc.error(f"{field}.objective", "must be a mapping")
        env_doc.only_keys(
            f"{field}.objective",
            obj,
            {"target", "value", "timeSliceTarget", "timeSliceWindow", "displayName"},
        )
        objectives = spec.get("objectives") or [{}]
        objectives[0] = _deep_merge(objectives[0], obj)
        spec["objectives"] = objectives
    slo_doc.file = f"{slo_doc.file} (+ {env_doc.file})"


def load_specs(env: str = "local", spec_dir: str | Path | None = None) -> Specs:
    """Load every spec for `env`, apply its overrides and validate. Raises SpecError."""
    if env not in ENVIRONMENTS:
        raise SpecError(f"unknown environment {env!r} (known: {', '.join(ENVIRONMENTS)})")
    root = Path(spec_dir) if spec_dir is not None else SPEC_DIR
    if not root.is_dir():
        raise SpecError(f"{root}: spec directory does not exist")
    by_kind: dict[str, list[_Doc]] = {}
    for sub in ("openslo", "recovery"):
        for path in _yaml_files(root / sub):
            for doc in _read_docs(path, root):
                expected_api = OPENSLO_API if sub == "openslo" else GAMEDAY_API
                if doc.get("apiVersion") != expected_api:
                    raise doc.error("apiVersion", f"must be {expected_api} in {sub}/")
                by_kind.setdefault(doc.kind, []).append(doc)
    allowed = {"SLI", "SLO", "AlertPolicy", "AlertCondition", "RecoveryObjective"}
    for kind, docs in by_kind.items():
        if kind not in allowed:
            raise docs[0].error(
                "kind", f"unsupported kind (supported: {', '.join(sorted(allowed))})"
            )
        seen: dict[str, _Doc] = {}
        for doc in docs:
            if doc.name in seen:
                raise doc.error(
                    "metadata.name", f"duplicate {kind} (also in {seen[doc.name].file})"
                )
            seen[doc.name] = doc

    env_path = root / "env" / f"{env}.yaml"
    if not env_path.is_file():
        raise SpecError(f"{env_path}: no overrides file for environment {env!r}")
    env_docs = _read_docs(env_path, root)
    if len(env_docs) != 1 or env_docs[0].kind != "EnvironmentOverrides":
        raise SpecError(f"{env_path}: must hold exactly one EnvironmentOverrides document")
    env_doc = env_docs[0]
    if env_doc.name != env:
        raise env_doc.error("metadata.name", f"must be {env!r}")
    env_doc.only_keys(
        "spec",
        env_doc.mapping("spec"),
        {"sloDefaults", "slos", "recoveryObjectives", *_SETTINGS_FIELDS},
    )

    indicators = {d.name: _parse_sli(d) for d in by_kind.get("SLI", [])}
    conditions = {d.name: _parse_condition(d) for d in by_kind.get("AlertCondition", [])}
    policies = {d.name: _parse_policy(d, conditions) for d in by_kind.get("AlertPolicy", [])}
    # base documents are validated as written too, so an override cannot hide a bad value
    slo_docs = {d.name: d for d in by_kind.get("SLO", [])}
    for doc in slo_docs.values():
        _parse_slo(copy.deepcopy(doc), indicators, policies)
    for doc in by_kind.get("RecoveryObjective", []):
        _parse_recovery(copy.deepcopy(doc))
    defaults = env_doc.mapping("spec.sloDefaults")
    env_doc.only_keys("spec.sloDefaults", defaults, {"timeWindow"})
    for doc in slo_docs.values():
        if defaults:
            _apply_slo_override(doc, defaults, env_doc, "spec.sloDefaults")
    for name, patch in env_doc.mapping("spec.slos").items():
        if name not in slo_docs:
            raise env_doc.error(f"spec.slos.{name}", "no SLO with this name")
        if not isinstance(patch, dict):
            raise env_doc.error(f"spec.slos.{name}", "must be a mapping")
        _apply_slo_override(slo_docs[name], patch, env_doc, f"spec.slos.{name}")

    ro_docs = {d.name: d for d in by_kind.get("RecoveryObjective", [])}
    for name, patch in env_doc.mapping("spec.recoveryObjectives").items():
        if name not in ro_docs:
            raise env_doc.error(
                f"spec.recoveryObjectives.{name}", "no RecoveryObjective with this name"
            )
        if not isinstance(patch, dict):
            raise env_doc.error(f"spec.recoveryObjectives.{name}", "must be a mapping")
        doc = ro_docs[name]
        doc.body["spec"] = _deep_merge(doc.body.get("spec") or {}, patch)
        doc.file = f"{doc.file} (+ {env_doc.file})"

    slos = tuple(_parse_slo(d, indicators, policies) for d in slo_docs.values())
    missing = [n for n in KNOWN_SLIS if n not in {s.name for s in slos}]
    if missing:
        raise SpecError(f"{root}: no SLO document for SLI(s): {', '.join(missing)}")
    recovery = {d.name: _parse_recovery(d) for d in ro_docs.values()}
    missing_ro = [fc for fc in FAILURE_CLASSES if fc not in recovery]
    if missing_ro:
        raise SpecError(
            f"{root}: no RecoveryObjective for failure class(es): {', '.join(missing_ro)}"
        )

    slo_names = {s.name for s in slos}
    alert_names = {s.alert_name for s in slos if s.alert_policies}
    for ro in recovery.values():
        doc = ro_docs[ro.name]
        for i, name in enumerate(ro.slos):
            if name not in slo_names:
                raise doc.error(f"spec.slos[{i}]", f"no SLO named {name!r}")
        for i, name in enumerate(ro.expected_alerts):
            if name not in alert_names:
                raise doc.error(
                    f"spec.expectedAlerts[{i}]",
                    f"no generated alert named {name!r} (known: {', '.join(sorted(alert_names))})",
                )

    settings = {section: _parse_settings(env_doc, section) for section in _SETTINGS_FIELDS}
    gate = settings["gate"]
    assert isinstance(gate, GateSettings)
    source = getattr(settings["rules"], "api_requests", None)
    if source not in API_REQUEST_SOURCES:
        raise env_doc.error("spec.rules.apiRequests",
                            f"unknown source {source!r} (known: {', '.join(API_REQUEST_SOURCES)})")
    for i, name in enumerate(gate.key_slis):
        if name not in slo_names:
            raise env_doc.error(f"spec.gate.keySlis[{i}]", f"no SLO named {name!r}")
    for i, name in enumerate(gate.key_alerts):
        if name not in alert_names:
            raise env_doc.error(f"spec.gate.keyAlerts[{i}]",
                                f"no generated alert named {name!r} "
                                f"(known: {', '.join(sorted(alert_names))})")
    if gate.warning_score > gate.pass_score:
        raise env_doc.error("spec.gate.warningScore", "must not exceed passScore")
    return Specs(
        env=env,
        slos=sorted(slos, key=lambda s: KNOWN_SLIS.index(s.name)),
        recovery_objectives={fc: recovery[fc] for fc in FAILURE_CLASSES},
        alert_policies=policies,
        evaluation=settings["evaluation"],  # type: ignore[arg-type]
        gate=gate,
        rules=settings["rules"],  # type: ignore[arg-type]
    )

"""Pipeline invariants and SLIs (pure), judged offline on the store snapshot's pipeline records
(snapshot/{pipelines,pipeline_steps,pipeline_events,side_effects}.jsonl, docs/EVIDENCE.md).

Each invariant returns how many subjects it judged and the violations; evidence that is
missing, or an experiment that never exercised the promise, is ``no_data``, never a pass:

* ``stale-cache-reuse`` (must be 0): a reused step consumed exactly the input digests of the
  result it reused (the source's completion manifest lists the digests it consumed);
* ``cache-hit-when-unchanged``: a step whose cache key equals one whose result was already
  accepted (nothing that matters changed) is reused, not run again;
* ``side-effect-once`` (duplicates must be 0): one recorded side effect per step operation and
  kind, however many retries (a retry after a lost response gets the first receipt);
* ``partial-failure-visibility``: every candidate an aggregation step did not get is named in
  its report with a reason, and listed among the candidates;
* ``release-after-checks``: a release step never runs when an upstream check failed;
* ``sources-accounted`` (data at start): a step that declared a source policy never completes
  on fewer sources, or other bytes, than it declared unless it names each source it left out
  with a reason, which only policy ``degrade`` allows; a source the experiment made
  unavailable or corrupt is named (as excluded, or in the failed step's reason), and a
  pipeline that succeeded degraded says so in its report.

:func:`usable_result_seconds` reports the time to a usable result per phase (no objective).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from slo.evidence import FaultRecord, PipelineRecord, PipelineStepRecord, SideEffectRecord
from slo.invariant_result import InvariantResult
from slo.sli import ts

PIPELINE_INVARIANTS = ("stale-cache-reuse", "cache-hit-when-unchanged", "side-effect-once",
                       "partial-failure-visibility", "release-after-checks",
                       "sources-accounted")
# the fault chaos/actions.py break_data_source records: details.source, uri, mode
SOURCE_FAULT = "data_source_unavailable"
OK_STEP = frozenset({"succeeded", "reused"})
RAN = frozenset({"running", "succeeded", "failed"})
MISSING = "snapshot/{} is missing from the evidence (not collected for this platform)"


def _in(t: Any, start: float, end: float) -> bool:
    return t is not None and start <= ts(t) <= end


def _spec_steps(p: PipelineRecord) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in p.spec.get("steps", []) if isinstance(s, dict) and "name" in s}


def stale_cache_reuse(steps: Sequence[PipelineStepRecord] | None, start: float, end: float,
                      ) -> InvariantResult:
    """Every step reused in [start, end] was given exactly the input digests the reused result
    consumed (its manifest's ``inputs``): same name with other bytes must never be a hit."""
    name = "stale-cache-reuse"
    if steps is None:
        return InvariantResult(name, 0, no_data=MISSING.format("pipeline_steps.jsonl"))
    reused = [s for s in steps if s.state == "reused" and _in(s.started_at, start, end)]
    if not reused:
        return InvariantResult(name, 0, no_data="no pipeline step was reused in the window "
                               "(the cache was never exercised)")
    violations, unmeasured = [], []
    for s in reused:
        given = (s.inputs or {}).get("digests")
        consumed = (s.manifest or {}).get("inputs")
        if not isinstance(given, list) or not isinstance(consumed, list):
            unmeasured.append(f"{s.pipeline_id}/{s.name}")
            continue
        if sorted(given) != sorted(consumed):
            src = (s.manifest or {}).get("reused_from") or {}
            changed = sorted(set(given) ^ set(consumed))
            violations.append(
                f"pipeline {s.pipeline_id} step {s.name}: reused the result of step "
                f"{src.get('source_step', '?')} of pipeline {src.get('source_pipeline_id', '?')}"
                f" although its inputs differ ({len(changed)} digest(s): "
                f"{', '.join(d[:12] for d in changed[:3])})")
    no_data = (f"{len(unmeasured)} reused step(s) carry no input digests to compare: "
               f"{', '.join(unmeasured[:3])}") if unmeasured else None
    return InvariantResult(name, len(reused) - len(unmeasured), tuple(violations), no_data)


def cache_hit_when_unchanged(steps: Sequence[PipelineStepRecord] | None, start: float,
                             end: float) -> InvariantResult:
    """A step started in [start, end] whose cache key is the key of a result accepted before it
    started (a succeeded step with that key) must have reused it. Judged: the steps that could
    hit; none at all is no data (the experiment never resubmitted unchanged work)."""
    name = "cache-hit-when-unchanged"
    if steps is None:
        return InvariantResult(name, 0, no_data=MISSING.format("pipeline_steps.jsonl"))
    accepted: dict[str, list[PipelineStepRecord]] = {}
    for s in steps:
        if s.state == "succeeded" and s.cache_key and s.finished_at is not None:
            accepted.setdefault(s.cache_key, []).append(s)
    judged, violations = 0, []
    for s in steps:
        if not s.cache_key or not _in(s.started_at, start, end):
            continue
        assert s.started_at is not None
        earlier = [a for a in accepted.get(s.cache_key, ()) if a is not s
                   and a.finished_at is not None and a.finished_at < s.started_at]
        if not earlier:
            continue
        judged += 1
        if s.state != "reused":
            src = earlier[0]
            violations.append(
                f"pipeline {s.pipeline_id} step {s.name}: ran again ({s.state}) although step "
                f"{src.name} of pipeline {src.pipeline_id} had an accepted result for the same "
                f"cache key {s.cache_key[:19]}")
    if not judged:
        return InvariantResult(name, 0, no_data="no step in the window had an earlier accepted "
                               "result with its cache key (nothing was resubmitted unchanged)")
    return InvariantResult(name, judged, tuple(violations))


def side_effect_once(side_effects: Sequence[SideEffectRecord] | None, start: float, end: float,
                     ) -> InvariantResult:
    """At most one recorded side effect per operation and kind (a step's action): duplicates
    must be 0. Judged: the actions with a record created in [start, end]."""
    name = "side-effect-once"
    if side_effects is None:
        return InvariantResult(name, 0, no_data=MISSING.format("side_effects.jsonl"))
    by_action: dict[tuple[str, str], list[SideEffectRecord]] = {}
    for e in side_effects:
        by_action.setdefault((e.operation_id, e.kind), []).append(e)
    judged = {k: v for k, v in by_action.items()
              if any(_in(e.created_at, start, end) for e in v)}
    if not judged:
        return InvariantResult(name, 0, no_data="no side effect was recorded in the window")
    violations = [f"operation {op} recorded {kind} {len(v)} times (action ids "
                  f"{', '.join(sorted(e.action_id for e in v)[:3])})"
                  for (op, kind), v in sorted(judged.items()) if len(v) > 1]
    return InvariantResult(name, len(judged), tuple(violations))


def _pipelines_in(pipelines: Iterable[PipelineRecord], start: float, end: float,
                  ) -> list[PipelineRecord]:
    """Pipelines that lived in [start, end]: created by its end, last changed after its start
    (a pipeline submitted just before the fault it is meant to meet counts)."""
    return [p for p in pipelines if ts(p.created_at) <= end
            and ts(p.updated_at or p.created_at) >= start]


def partial_failure_visibility(pipelines: Sequence[PipelineRecord] | None,
                               steps: Sequence[PipelineStepRecord] | None, start: float,
                               end: float) -> InvariantResult:
    """Every aggregation step (of a pipeline that lived in [start, end]) that was decided while a
    candidate had not succeeded names every candidate in its report, and each one it did not
    get under ``excluded`` with a reason; a pipeline that succeeded incomplete names them in
    its own report too. Judged: aggregation steps with at least one such candidate."""
    name = "partial-failure-visibility"
    if pipelines is None or steps is None:
        return InvariantResult(name, 0, no_data=MISSING.format(
            "pipelines.jsonl" if pipelines is None else "pipeline_steps.jsonl"))
    rows = {(s.pipeline_id, s.name): s for s in steps}
    judged, violations = 0, []
    for p in _pipelines_in(pipelines, start, end):
        for sname, spec in _spec_steps(p).items():
            if spec.get("role") != "aggregate":
                continue
            me = rows.get((p.id, sname))
            ups = {n: rows.get((p.id, n)) for n in spec.get("needs", [])}
            missing = {n: r.state if r else "absent" for n, r in ups.items()
                       if r is None or r.state not in OK_STEP}
            if me is None or me.state in ("waiting", "skipped") or not missing:
                continue
            judged += 1
            report = me.report or {}
            excluded = report.get("excluded") or {}
            named = set(report.get("candidates") or [])
            for cand, state in sorted(missing.items()):
                why = excluded.get(cand)
                if not isinstance(why, str) or not why.strip():
                    violations.append(f"pipeline {p.id} step {sname}: candidate {cand} "
                                      f"({state}) is not named as excluded with a reason")
                elif cand not in named:
                    violations.append(f"pipeline {p.id} step {sname}: candidate {cand} is "
                                      "missing from the report's candidates")
                elif (p.state == "succeeded" and cand not in
                      ((p.report or {}).get("excluded") or {})):
                    violations.append(f"pipeline {p.id}: succeeded without naming the "
                                      f"excluded candidate {cand} in its report")
    if not judged:
        return InvariantResult(name, 0, no_data="no aggregation step in the window was decided "
                               "with a candidate missing (no partial failure was exercised)")
    return InvariantResult(name, judged, tuple(violations))


def _failed_checks(m: dict[str, Any] | None) -> list[str]:
    checks = (m or {}).get("checks") or {}
    return sorted(n for n, c in checks.items() if not (isinstance(c, dict) and c.get("passed")))


def release_after_checks(pipelines: Sequence[PipelineRecord] | None,
                         steps: Sequence[PipelineStepRecord] | None, start: float, end: float,
                         ) -> InvariantResult:
    """A release step (of a pipeline that lived in [start, end]) whose upstream manifests carry a
    failed check, or no check at all, never runs (never gets an operation). Judged: the release
    steps that faced a failed or missing check; none is no data (the refusal was not
    exercised)."""
    name = "release-after-checks"
    if pipelines is None or steps is None:
        return InvariantResult(name, 0, no_data=MISSING.format(
            "pipelines.jsonl" if pipelines is None else "pipeline_steps.jsonl"))
    rows = {(s.pipeline_id, s.name): s for s in steps}
    judged, violations = 0, []
    for p in _pipelines_in(pipelines, start, end):
        for sname, spec in _spec_steps(p).items():
            me = rows.get((p.id, sname))
            if spec.get("role") != "release" or me is None or me.state in ("waiting", "skipped"):
                continue
            ups = [rows.get((p.id, n)) for n in spec.get("needs", [])]
            if any(u is None or u.state not in OK_STEP for u in ups):
                continue  # refused for its upstream's state, not for a check
            failed = {u.name: _failed_checks(u.manifest) for u in ups if u is not None}
            without = [n for n, u in zip(spec.get("needs", []), ups, strict=True)
                       if u is not None and not (u.manifest or {}).get("checks")]
            bad = {n: f for n, f in failed.items() if f}
            if not bad and len(without) < len(ups):
                continue  # every check passed: a release may run
            judged += 1
            if me.operation_id is not None or me.state in RAN - {"failed"}:
                what = (", ".join(f"{n}: {', '.join(f)}" for n, f in sorted(bad.items()))
                        or "no upstream check published")
                violations.append(f"pipeline {p.id} step {sname}: release ran ({me.state}) "
                                  f"although upstream checks failed ({what})")
    if not judged:
        return InvariantResult(name, 0, no_data="no release step in the window faced a failed "
                               "check (the refusal was not exercised)")
    return InvariantResult(name, judged, tuple(violations))


def _source_faults(faults: Sequence[FaultRecord], start: float, end: float,
                   ) -> list[tuple[float, float, dict[str, Any]]]:
    """(start, end, details) of each data-source fault that began in [start, end]; a fault never
    ended lasts to ``end``."""
    spans = []
    for f in faults:
        if f.event != "fault_start" or f.fault != SOURCE_FAULT or not _in(f.time, start, end):
            continue
        t0 = ts(f.time)
        ends = [ts(g.time) for g in faults if g.event == "fault_end" and g.fault == f.fault
                and g.target == f.target and ts(g.time) >= t0]
        spans.append((t0, min(ends) if ends else end, f.details))
    return spans


def _judge_sources(p: PipelineRecord, s: PipelineStepRecord, policy: dict[str, Any],
                   faulted: dict[str, str]) -> list[str]:
    """The violations of one step that declared a source policy (``faulted``: its sources
    broken while it started -> how)."""
    where = f"pipeline {p.id} step {s.name}"
    declared = {d["name"]: d["sha256"] for d in (s.inputs or {}).get("datasets") or []
                if isinstance(d, dict) and d.get("uri")}
    pol = policy.get("policy")
    if s.state == "failed":
        reason = s.state_reason or ""
        out = [f"{where}: failed without naming the source {n} ({how})"
               for n, how in sorted(faulted.items()) if n not in reason]
        floor = policy.get("min_sources") or len(declared)
        if pol == "degrade" and faulted and len(declared) - len(faulted) >= floor:
            out.append(f"{where}: failed although its policy degrade allows running on "
                       f"{len(declared) - len(faulted)} of {len(declared)} sources "
                       f"(min_sources {floor}): {reason[:160]}")
        return out
    m = s.manifest or {}
    acc = m.get("sources")
    if not isinstance(acc, dict):
        return [f"{where}: succeeded with no account of its {len(declared)} sources"]
    read, excluded = acc.get("read") or {}, acc.get("excluded") or {}
    out = []
    for name, digest in sorted(declared.items()):
        if name in excluded:
            why = excluded[name]
            if not (isinstance(why, str) and why.strip()):
                out.append(f"{where}: left out source {name} without a reason")
            elif pol != "degrade":
                out.append(f"{where}: left out source {name} under policy {pol}")
        elif name not in read:
            out.append(f"{where}: completed without source {name} and without naming it as "
                       "excluded (silently on fewer sources)")
        elif read[name] != digest:
            out.append(f"{where}: ran on source {name} with other bytes than declared (read "
                       f"{str(read[name])[:12]}, declared {digest[:12]})")
        if name in faulted and name not in excluded:
            out.append(f"{where}: completed while source {name} was {faulted[name]} without "
                       "naming it as excluded")
    consumed = set(m.get("inputs") or [])
    used = [n for n, d in declared.items() if d in consumed]
    if len(used) < len(declared) - len(excluded):
        out.append(f"{where}: consumed {len(used)} of {len(declared)} declared sources, "
                   f"naming {len(excluded)} excluded")
    named = ((p.report or {}).get("excluded_sources") or {}).get(s.name) or {}
    if p.state == "succeeded" and set(excluded) - set(named):
        out.append(f"{where}: the pipeline succeeded without naming the sources left out "
                   f"({', '.join(sorted(set(excluded) - set(named)))}) in its report")
    return out


def sources_accounted(pipelines: Sequence[PipelineRecord] | None,
                      steps: Sequence[PipelineStepRecord] | None,
                      faults: Sequence[FaultRecord], start: float, end: float,
                      ) -> InvariantResult:
    """Every step that declared a source policy (``on_source_unavailable``), of a pipeline that
    lived in [start, end], and ended: when it succeeded, each declared source was read with
    its declared sha256 or is named as excluded with a reason (policy degrade only), it
    consumed no fewer sources than that, every source broken (``data_source_unavailable``
    fault) while it started is named as excluded, and a succeeded pipeline's report names the
    sources left out; when it failed, its reason names each broken source, and policy degrade
    did not fail a step it allowed to run. Judged: those steps; none, or no source fault in
    the window, is no data (the promise was not exercised)."""
    name = "sources-accounted"
    if pipelines is None or steps is None:
        return InvariantResult(name, 0, no_data=MISSING.format(
            "pipelines.jsonl" if pipelines is None else "pipeline_steps.jsonl"))
    spans = _source_faults(faults, start, end)
    if not spans:
        return InvariantResult(name, 0, no_data="no data source was made unavailable or "
                               f"corrupt in the window (no {SOURCE_FAULT} fault)")
    rows = {(s.pipeline_id, s.name): s for s in steps}
    judged, violations = 0, []
    for p in _pipelines_in(pipelines, start, end):
        for sname, spec in _spec_steps(p).items():
            policy = spec.get("on_source_unavailable")
            me = rows.get((p.id, sname))
            if not isinstance(policy, dict) or me is None or me.state not in (
                    "succeeded", "failed") or me.started_at is None:
                continue
            judged += 1
            t = ts(me.started_at)
            uris = {d.get("uri"): d.get("name") for d in (me.inputs or {}).get("datasets") or []
                    if isinstance(d, dict)}
            faulted = {str(uris[d.get("uri")]): str(d.get("mode", "unavailable"))
                       for t0, t1, d in spans if t0 <= t <= t1 and d.get("uri") in uris}
            violations += _judge_sources(p, me, policy, faulted)
    if not judged:
        return InvariantResult(name, 0, no_data="no step with a declared source policy ended "
                               "in the window")
    return InvariantResult(name, judged, tuple(violations))


def usable_result_seconds(pipelines: Sequence[PipelineRecord] | None,
                          steps: Sequence[PipelineStepRecord] | None, start: float, end: float,
                          ) -> dict[str, dict[str, float | None]] | None:
    """Per pipeline that lived in [start, end]: seconds from its submission to a usable result of
    each phase (the last step of that phase succeeded or reused); None for a phase that never
    produced one. None when the pipeline records are missing."""
    if pipelines is None or steps is None:
        return None
    out: dict[str, dict[str, float | None]] = {}
    for p in _pipelines_in(pipelines, start, end):
        phases: dict[str, list[PipelineStepRecord]] = {}
        specs = _spec_steps(p)
        for s in steps:
            if s.pipeline_id == p.id:
                phases.setdefault(str(specs.get(s.name, {}).get("phase", "other")), []).append(s)
        t0 = ts(p.created_at)
        row: dict[str, float | None] = {}
        for phase, members in phases.items():
            done = [s for s in members if s.state in OK_STEP and s.finished_at is not None]
            row[phase] = (round(max(ts(s.finished_at) for s in done) - t0, 3)  # type: ignore[arg-type]
                          if done else None)
        out[p.id] = row
    return out

"""Render verdict.json, junit.xml, report.md and a self-contained report.html into a run dir.

Files are written to a temporary name and renamed, so a reader never sees half a report;
raw evidence files are never touched."""

from __future__ import annotations

import os
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape

from slo.baseline import INTERVAL_SLACK
from slo.charts import goodput_text, legend_items, load_svg, timeline_svg
from slo.cost import POOL_HEADER, pool_rows, source_line, summary_rows
from slo.durations import format_duration
from slo.junit import junit_xml
from slo.serving_charts import legend_items as serving_legend
from slo.serving_charts import serving_summary, serving_svg
from slo.serving_report import ServingSection, serving_section
from slo.specs import Specs, load_specs
from slo.verdict import Check, Demonstration, ObjectiveComparison, SliSummary, Verdict

OUTPUTS = ("verdict.json", "junit.xml", "report.md", "report.html")
_TEMPLATES = Path(__file__).resolve().parent / "templates"


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_pct(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v * 100:.6g}%" if v < 10 else f"{v * 100:,.0f}%"


def fmt_secs(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f}s"


def _num(v: float | None, fmt: str = "g") -> str:
    return "n/a" if v is None else format(v, fmt)


def experiment_status(verdict: Verdict, name: str) -> str:
    """pass / warning / fail from the experiment's checks (its own outcome is one of them);
    not_measured when it did not run as designed: its objectives were never tested."""
    exp = next(e for e in verdict.experiments if e.name == name)
    if not exp.measured:
        return "not_measured"
    checks = [c.status for c in verdict.checks if c.experiment == name]
    if "fail" in checks or not exp.experiment_ok:
        return "fail"
    return "warning" if "warning" in checks else "pass"


def status_label(status: str | None) -> str:
    return (status or "no_data").replace("_", " ")


def demonstration_text(s: SliSummary) -> str:
    """The SLI's demonstration cell: what its events show about its target at 95 %."""
    if s.demonstration is not None:
        return s.demonstration.text
    return "n/a (time slices)" if s.budgeting == "Timeslices" and s.total else "n/a"


DEMONSTRATION_NOTE = (
    "Demonstration: the one-sided 95 % lower confidence bound of an event ratio's success "
    "ratio (Clopper-Pearson) against its target. \"Consistent, not demonstrated\": the measured "
    "ratio meets the objective but too few events were seen to show it; scored as a pass.")


EXCUSED_NOTE = (
    "Fault impact windows: outcomes of a non-key SLI that an experiment declares, from its "
    "fault's start until its RTO has passed, are judged by that experiment's RTO and shown as "
    "\"+N in fault windows\"; good / total counts the rest of the run. Key SLIs are never left out.")


def _excused_cell(s: SliSummary) -> str:
    return f" (+{s.excused} in fault windows, {s.excused_bad} bad)" if s.excused else ""


def not_demonstrated(verdict: Verdict) -> list[tuple[Check, Demonstration]]:
    """Passing objectives whose events do not demonstrate them (slo/confidence.py)."""
    return [(c, c.demonstration) for c in verdict.checks
            if c.status == "pass" and c.demonstration is not None
            and c.demonstration.classification == "consistent"]


def demonstration_lines(verdict: Verdict) -> list[str]:
    """What the gate prints under its verdict table: one line per passing ratio objective its
    events do not demonstrate, so no such pass is read as a bare one."""
    return [f"{c.id}: pass, {d.text}" for c, d in not_demonstrated(verdict)]


def score_text(verdict: Verdict) -> str:
    if verdict.score is None:
        return "no score (nothing measured)"
    return f"score {verdict.score:.1f} over {verdict.scored_checks} measured checks"


def headline(verdict: Verdict) -> str:
    """The one-line summary every output shows: the result always matches the exit code."""
    return (f"{verdict.result.upper()} {score_text(verdict)}: {verdict.reason} "
            f"(exit {verdict.exit_code})")


def dropped_text(verdict: Verdict) -> str:
    if verdict.evidence_dropped is None:
        return "not known (verdict written before v2)"
    by_agent = ", ".join(f"{a} {n}" for a, n in verdict.evidence_dropped_by_agent.items())
    return f"{verdict.evidence_dropped} events" + (f" ({by_agent})" if by_agent else "")


def _baseline_value(kind: str, v: float | None) -> str:
    if v is None:
        return "n/a"
    if kind == "ratio":
        return fmt_pct(v)
    if kind == "duration":
        return fmt_secs(v)
    return "unbounded" if v == float("inf") else f"{v:g}"


def baseline_summary(verdict: Verdict) -> str | None:
    """One sentence on the comparison with the last passing run (None: not compared)."""
    b = verdict.baseline
    if b is None:
        return None
    n = Counter(o.result for o in b.objectives)
    counts = ", ".join(f"{n[r]} {r}" for r in ("regressed", "better", "same", "no baseline",
                                               "not measured") if n[r])
    head = ("No baseline" if b.run_id is None
            else f"Compared with run {b.run_id}" if len(b.run_ids) <= 1
            else f"Compared with the last {len(b.run_ids)} passing runs, newest {b.run_id}, "
                 "each objective against the worst of them")
    seconds = f" or {b.tolerance_seconds:g} s" if b.tolerance_seconds else ""
    return (f"{head} ({b.note}; durations within +/-{b.tolerance_percent:g}%{seconds}, "
            f"ratios within {b.tolerance_points:g} points, checkpoint progress within "
            f"{INTERVAL_SLACK:g} interval count as the same; archive {b.archive}): "
            f"{counts or 'no objectives'}.")


def baseline_rows(verdict: Verdict) -> list[tuple[ObjectiveComparison, str, str]]:
    """(row, baseline value, current value) for the baseline table of both reports."""
    if verdict.baseline is None:
        return []
    def status(s: str | None) -> str:
        return "n/a" if s is None else status_label(s)

    return [(o, status(o.baseline_status), status(o.current_status)) if o.kind == "outcome"
            else (o, _baseline_value(o.kind, o.baseline), _baseline_value(o.kind, o.current))
            for o in verdict.baseline.objectives]


def budget_text(verdict: Verdict) -> str | None:
    """One sentence on the budget check before the run; says so when the run was forced."""
    b = verdict.budget_check
    if b is None:
        return None
    head = "FORCED: " if b.forced and b.blocking else ""
    return head + b.reason + f" (floor: gate.minRemainingBudget {b.floor:.0%})."


def _left(remaining: float | None) -> str:
    return "no data" if remaining is None else f"{remaining:.1%}"


def serving_markdown(serving: ServingSection | None) -> list[str]:
    """The Serving section: none for a run without inference records."""
    if serving is None:
        return []
    text = (serving_summary(serving.view) if serving.view is not None
            else f"Serving chart not drawn: {serving.problem}.")
    return ["", "## Serving over the run", "", text]


def render_markdown(verdict: Verdict, serving: ServingSection | None = None) -> str:
    lines = [
        f"# Game day {verdict.run_id}: {verdict.result.upper()}",
        "",
        f"**{headline(verdict)}**",
        "",
        (
            f"env `{verdict.env}`, suite `{verdict.suite}`, platform `{verdict.platform}`, "
            f"{_when(verdict.started_at)} to {_when(verdict.ended_at)}. "
            f"Dropped evidence: {dropped_text(verdict)}."
        ),
        "",
    ]
    if verdict.findings:
        lines += ["## Findings", ""] + [f"- {f}" for f in verdict.findings] + [""]
    if verdict.not_applicable:
        lines += [f"## Not applicable to {verdict.platform}", ""] + [
            f"- {name}: {why}" for name, why in sorted(verdict.not_applicable.items())] + [""]
    if verdict.budget_check is not None:
        b = verdict.budget_check
        lines += ["## Error budget before the run", "", budget_text(verdict) or "", "",
                  "| SLO | remaining | status | detail |", "| --- | ---: | --- | --- |"]
        lines += [f"| {x.slo} | {_left(x.remaining)} | {x.status.value} | {x.detail} |"
                  for x in b.budgets] + [""]
    summary = baseline_summary(verdict)
    if summary is not None:
        lines += ["## Baseline: last passing run of this suite and env", "", summary, "",
                  "| objective | baseline | current | change | verdict |",
                  "| --- | ---: | ---: | --- | --- |"]
        for o, base, cur in baseline_rows(verdict):
            result = f"**{o.result}**" if o.result == "regressed" else o.result
            lines.append(f"| {o.id} | {base} | {cur} | {o.change} | {result} |")
        lines.append("")
    lines += [
        "## SLIs over the run",
        "",
        ("| SLI | status | demonstration (95 %) | measured | objective | good / total "
         "| burn rate | window budget used |"),
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    by_id = {c.id: c for c in verdict.checks}
    for s in verdict.slis:
        c = by_id.get(f"sli.{s.name}")
        burn = f"{s.burn_rate:.2f}x" if s.burn_rate is not None else "n/a"
        lines.append(
            f"| {s.display_name}{' (key)' if s.key else ''} | {status_label(c.status if c else None)} | "
            f"{demonstration_text(s)} | "
            f"{fmt_pct(s.value)} | {fmt_pct(s.target)} | {s.good} / {s.total}{_excused_cell(s)} | {burn} | {fmt_pct(s.budget_consumed)} |"
        )
    if any(s.excused for s in verdict.slis):
        lines += ["", EXCUSED_NOTE]
    if any(s.demonstration is not None for s in verdict.slis):
        lines += ["", DEMONSTRATION_NOTE]
    dropped = by_id.get("evidence.dropped")
    if dropped is not None:
        lines += ["", f"Dropped evidence: {dropped.message} ({status_label(dropped.status)})."]
    lines += serving_markdown(serving)
    lines += cost_markdown(verdict)
    for e in verdict.experiments:
        lines += ["", f"## {e.name}: {status_label(experiment_status(verdict, e.name))}", ""]
        runbook = (f" Runbook: [runbooks/{e.runbook}.md](runbooks/{e.runbook}.md)."
                   if e.runbook else "")
        if not e.measured:
            # a missing journal's reason already quotes the runner
            journal = (f" Journal {e.journal_status}{', deviated' if e.deviated else ''}."
                       if e.journal_present else "")
            runner = (f" Runner: {e.runner_status}."
                      if e.runner_status and e.journal_present else "")
            lines += [f"**Not measured: {e.not_measured_reason}.**{journal}{runner}{runbook}", ""]
        else:
            assert e.fault_start is not None and e.fault_end is not None
            lines += [(
                f"{e.title}. Fault `{e.fault_name}` at {_when(e.fault_start)} "
                f"for {e.fault_end - e.fault_start:.0f}s. Journal {e.journal_status}"
                f"{', deviated' if e.deviated else ''}.{runbook}"
            ), ""]
        lines += ["| objective | measured | status |", "| --- | --- | --- |"]
        for c in _exp_checks(verdict, e.name):
            lines.append(
                f"| {c.objective}{' (key)' if c.key else ''} | {c.message} | {status_label(c.status)} |"
            )
        if not e.measured:
            continue
        auto = (
            ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(e.automation.items()) if n)
            or "none recorded"
        )
        lines += [
            "",
            f"- detection: {fmt_secs(e.detection_seconds)}"
            + (f" ({e.detected_by})" if e.detected_by else ""),
            f"- recovery: {fmt_secs(e.recovery_seconds)} (RTO {fmt_secs(e.rto_seconds)})",
            f"- load: {goodput_text(e)}",
            f"- user-visible effect: {e.failed_requests} failed, {e.slow_requests} slow of {e.requests} requests",
            f"- automation taken: {auto}",
            f"- manual decisions: {'; '.join(e.manual_decisions) or 'none'}",
            (
                f"- data lost: {e.acknowledged_lost} acknowledged submissions, "
                f"{e.acknowledged_duplicated} duplicated, "
                f"{e.acknowledged_matched_by_key_only or 0} answering under a new operation id, "
                f"{_num(e.checkpoint_steps_recomputed)} checkpoint steps recomputed, "
                f"{e.artifacts_missing} artifacts missing, "
                f"{e.torn_checkpoints_used} torn checkpoints used"
            ),
            f"- time to accepted result: {fmt_secs(e.time_to_accepted_result_seconds)} ({e.accepted_result_basis})",
        ]
        for pid, phases in (e.pipeline_usable_result_seconds or {}).items():
            lines.append(f"- pipeline {pid}: time to usable result per phase: " + ", ".join(
                f"{ph} {fmt_secs(v) if v is not None else 'none'}"
                for ph, v in phases.items()))
        for a in e.alerts:
            lines.append(
                f"- alert {a.name}: "
                + (f"fired after {fmt_secs(a.fired_after_seconds)}" if a.fired
                   else f"**no data** ({a.no_data})" if a.no_data is not None
                   else "**silent**" if a.required else f"silent, correctly ({a.note})")
            )
        for inv in e.invariants:
            lines.append(
                f"- invariant {inv.name}: "
                + (f"**no data** ({inv.no_data})" if inv.no_data is not None
                   else f"{len(inv.violations)} violation(s) in {inv.judged} judged")
            )
    return "\n".join(lines) + "\n"


def cost_markdown(verdict: Verdict) -> list[str]:
    """The Cost section (slo/cost.py): informational, never part of the gate."""
    lines = ["", "## Cost", ""]
    c = verdict.cost
    if c is None:
        return lines + [verdict.cost_error or "Cost: not computed (verdict from an older version)."]
    lines += [source_line(c), "", "| figure | value |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in summary_rows(c)]
    lines += ["", "| " + " | ".join(POOL_HEADER) + " |",
              "| " + " | ".join("---" for _ in POOL_HEADER) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in pool_rows(c)]
    if c.unpriced or c.notes:
        lines.append("")
    lines += [f"- unpriced: {u}" for u in c.unpriced] + [f"- note: {n}" for n in c.notes]
    return lines


def _exp_checks(verdict: Verdict, name: str) -> list[Check]:
    return [c for c in verdict.checks if c.experiment == name]


def render_html(verdict: Verdict, specs: Specs, serving: ServingSection | None = None) -> str:
    env = Environment(
        loader=FileSystemLoader(_TEMPLATES), autoescape=select_autoescape(["html", "j2"])
    )
    statuses = [c.status for c in verdict.checks if c.status]
    scored = [st for st in statuses if st in ("pass", "warning", "fail")]
    windows = sorted({format_duration(s.window_seconds) for s in verdict.slis})

    def badge(status: str | None) -> str:
        from markupsafe import Markup

        return Markup(f'<span class="badge {status or "none"}">{status_label(status)}</span>')

    return env.get_template("report.html.j2").render(
        v=verdict,
        when=_when,
        pct=fmt_pct,
        secs=fmt_secs,
        badge=badge,
        pass_score=f"{specs.gate.pass_score:g}",
        counts={"pass": scored.count("pass"), "scored": len(scored),
                "not_measured": statuses.count("not_measured"),
                "no_data": statuses.count("no_data")},
        headline=headline(verdict),
        baseline_summary=baseline_summary(verdict),
        budget_text=budget_text(verdict),
        budget_left=_left,
        baseline_rows=baseline_rows(verdict),
        score_text=score_text(verdict),
        dropped=dropped_text(verdict),
        cost_source=source_line(verdict.cost) if verdict.cost else None,
        cost_rows=summary_rows(verdict.cost) if verdict.cost else [],
        pool_header=POOL_HEADER,
        pool_rows=pool_rows(verdict.cost) if verdict.cost else [],
        check_by_id={c.id: c for c in verdict.checks},
        demonstration=demonstration_text,
        demonstration_note=(DEMONSTRATION_NOTE if any(s.demonstration is not None
                                                      for s in verdict.slis) else None),
        excused_cell=_excused_cell,
        excused_note=EXCUSED_NOTE if any(s.excused for s in verdict.slis) else None,
        checks_by_exp={e.name: _exp_checks(verdict, e.name) for e in verdict.experiments},
        exp_status={e.name: experiment_status(verdict, e.name) for e in verdict.experiments},
        # no fault window, no timeline: a chart of a not-measured experiment would invent one
        charts={e.name: timeline_svg(e) for e in verdict.experiments if e.measured},
        load_charts={e.name: load_svg(e) for e in verdict.experiments if e.measured},
        legends={e.name: legend_items(e) for e in verdict.experiments if e.measured},
        serving=serving,
        serving_chart=serving_svg(serving.view) if serving and serving.view else None,
        serving_text=serving_summary(serving.view) if serving and serving.view else None,
        serving_legend=serving_legend(serving.view) if serving and serving.view else [],
        window_text=", ".join(windows),
        sample_window=format_duration(specs.evaluation.sample_window_seconds),
        sample_step=format_duration(specs.evaluation.sample_interval_seconds),
    )


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_reports(
    verdict: Verdict, run_dir: str | Path, specs: Specs | None = None
) -> dict[str, Path]:
    """Write the four outputs into `run_dir`; returns name -> path."""
    root = Path(run_dir)
    specs = specs or load_specs(verdict.env)
    serving = serving_section(verdict, root)
    rendered = {
        "verdict.json": verdict.to_json() + "\n",
        "junit.xml": junit_xml(verdict),
        "report.md": render_markdown(verdict, serving),
        "report.html": render_html(verdict, specs, serving),
    }
    out = {}
    for name, text in rendered.items():
        _write_atomic(root / name, text)
        out[name] = root / name
    return out

"""Render verdict.json, junit.xml, report.md and a self-contained report.html into a run dir.

Files are written to a temporary name and renamed, so a reader never sees half a report;
raw evidence files are never touched."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape

from slo.charts import legend_items, timeline_svg
from slo.durations import format_duration
from slo.junit import junit_xml
from slo.specs import Specs, load_specs
from slo.verdict import Check, Verdict

OUTPUTS = ("verdict.json", "junit.xml", "report.md", "report.html")
_TEMPLATES = Path(__file__).resolve().parent / "templates"


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _pct(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v * 100:.6g}%" if v < 10 else f"{v * 100:,.0f}%"


def _secs(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f}s"


def experiment_status(verdict: Verdict, name: str) -> str:
    checks = [c.status for c in verdict.checks if c.experiment == name]
    exp = next(e for e in verdict.experiments if e.name == name)
    if "fail" in checks or not exp.experiment_ok:
        return "fail"
    return "warning" if "warning" in checks else "pass"


def render_markdown(verdict: Verdict) -> str:
    lines = [
        f"# Game day {verdict.run_id}: {verdict.result.upper()}",
        "",
        f"{verdict.reason}. Score {verdict.score:.1f}, exit code {verdict.exit_code}."
        if verdict.score is not None
        else f"{verdict.reason}. Exit code {verdict.exit_code}.",
        "",
        (
            f"env `{verdict.env}`, suite `{verdict.suite}`, platform `{verdict.platform}`, "
            f"{_when(verdict.started_at)} to {_when(verdict.ended_at)}."
        ),
        "",
    ]
    if verdict.findings:
        lines += ["## Findings", ""] + [f"- {f}" for f in verdict.findings] + [""]
    if verdict.not_applicable:
        lines += [f"## Not applicable to {verdict.platform}", ""] + [
            f"- {name}: {why}" for name, why in sorted(verdict.not_applicable.items())] + [""]
    lines += [
        "## SLIs over the run",
        "",
        "| SLI | status | measured | objective | good / total | burn rate | window budget used |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    by_id = {c.id: c for c in verdict.checks}
    for s in verdict.slis:
        c = by_id.get(f"sli.{s.name}")
        burn = f"{s.burn_rate:.2f}x" if s.burn_rate is not None else "n/a"
        lines.append(
            f"| {s.display_name}{' (key)' if s.key else ''} | {c.status if c and c.status else 'n/a'} | "
            f"{_pct(s.value)} | {_pct(s.target)} | {s.good} / {s.total} | {burn} | {_pct(s.budget_consumed)} |"
        )
    for e in verdict.experiments:
        lines += [
            "",
            f"## {e.name}: {experiment_status(verdict, e.name)}",
            "",
            (
                f"{e.title}. Fault `{e.fault_name}` at {_when(e.fault_start)} "
                f"for {e.fault_end - e.fault_start:.0f}s. Journal {e.journal_status}"
                f"{', deviated' if e.deviated else ''}. Runbook: [runbooks/{e.runbook}.md](runbooks/{e.runbook}.md)."
            ),
            "",
            "| objective | measured | status |",
            "| --- | --- | --- |",
        ]
        for c in _exp_checks(verdict, e.name):
            lines.append(
                f"| {c.objective}{' (key)' if c.key else ''} | {c.message} | {c.status or 'n/a'} |"
            )
        auto = (
            ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(e.automation.items()) if n)
            or "none recorded"
        )
        lines += [
            "",
            f"- detection: {_secs(e.detection_seconds)}"
            + (f" ({e.detected_by})" if e.detected_by else ""),
            f"- recovery: {_secs(e.recovery_seconds)} (RTO {_secs(e.rto_seconds)})",
            f"- user-visible effect: {e.failed_requests} failed, {e.slow_requests} slow of {e.requests} requests",
            f"- automation taken: {auto}",
            f"- manual decisions: {'; '.join(e.manual_decisions) or 'none'}",
            (
                f"- data lost: {e.acknowledged_lost} acknowledged submissions, {e.checkpoint_steps_recomputed:g} "
                f"checkpoint steps recomputed, {e.artifacts_missing} artifacts missing, "
                f"{e.torn_checkpoints_used} torn checkpoints used"
            ),
            f"- time to accepted result: {_secs(e.time_to_accepted_result_seconds)} ({e.accepted_result_basis})",
        ]
        for a in e.alerts:
            lines.append(
                f"- alert {a.name}: "
                + (f"fired after {_secs(a.fired_after_seconds)}" if a.fired
                   else "**silent**" if a.required else f"silent, correctly ({a.note})")
            )
    return "\n".join(lines) + "\n"


def _exp_checks(verdict: Verdict, name: str) -> list[Check]:
    return [c for c in verdict.checks if c.experiment == name]


def render_html(verdict: Verdict, specs: Specs) -> str:
    env = Environment(
        loader=FileSystemLoader(_TEMPLATES), autoescape=select_autoescape(["html", "j2"])
    )
    statuses = [c.status for c in verdict.checks if c.status]
    windows = sorted({format_duration(s.window_seconds) for s in verdict.slis})

    def badge(status: str | None) -> str:
        from markupsafe import Markup

        return Markup(f'<span class="badge {status or "none"}">{status or "no data"}</span>')

    return env.get_template("report.html.j2").render(
        v=verdict,
        when=_when,
        pct=_pct,
        secs=_secs,
        badge=badge,
        pass_score=f"{specs.gate.pass_score:g}",
        counts={"pass": statuses.count("pass"), "total": len(statuses)},
        check_by_id={c.id: c for c in verdict.checks},
        checks_by_exp={e.name: _exp_checks(verdict, e.name) for e in verdict.experiments},
        exp_status={e.name: experiment_status(verdict, e.name) for e in verdict.experiments},
        charts={e.name: timeline_svg(e) for e in verdict.experiments},
        legends={e.name: legend_items(e) for e in verdict.experiments},
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
    rendered = {
        "verdict.json": verdict.to_json() + "\n",
        "junit.xml": junit_xml(verdict),
        "report.md": render_markdown(verdict),
        "report.html": render_html(verdict, specs),
    }
    out = {}
    for name, text in rendered.items():
        _write_atomic(root / name, text)
        out[name] = root / name
    return out

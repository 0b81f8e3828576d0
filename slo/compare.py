"""Side by side: the verdicts of several game-day runs (e.g. the same suite against two
platforms), one row per SLI and per experiment. Reads only each run's verdict.json."""

from __future__ import annotations

import html
from pathlib import Path

from slo.report import experiment_status, fmt_pct, fmt_secs
from slo.verdict import Verdict


class CompareError(Exception):
    pass


def load_verdicts(run_dirs: list[Path]) -> list[Verdict]:
    out = []
    for d in run_dirs:
        path = d / "verdict.json"
        if not path.exists():
            raise CompareError(f"{path}: missing (run `gameday evaluate {d}` first)")
        out.append(Verdict.model_validate_json(path.read_text()))
    return out


def _label(v: Verdict) -> str:
    return f"{v.platform} ({v.run_id})"


def comparison_rows(verdicts: list[Verdict]) -> list[tuple[str, list[str]]]:
    """(row name, one cell per run): SLIs, then experiments (each followed by its invariants
    when two or more runs judged them), then the gate (pure)."""
    rows: list[tuple[str, list[str]]] = []
    sli_names = list(dict.fromkeys(s.name for v in verdicts for s in v.slis))
    for name in sli_names:
        cells = []
        for v in verdicts:
            s = next((x for x in v.slis if x.name == name), None)
            if s is None or s.value is None:
                cells.append("no data")
            else:
                met = "met" if s.objective_met else "missed"
                # what the events demonstrate: two platforms' "100 %" over 120 and over 300,000
                # events are not the same evidence
                shown = f"; {s.demonstration.text}" if s.demonstration is not None else ""
                cells.append(f"{fmt_pct(s.value)} ({met}, target {fmt_pct(s.target)}{shown})")
        rows.append((f"SLI {name}", cells))
    exp_names = list(dict.fromkeys(
        [e.name for v in verdicts for e in v.experiments]
        + [n for v in verdicts for n in v.not_applicable]))
    for name in exp_names:
        cells = []
        for v in verdicts:
            e = next((x for x in v.experiments if x.name == name), None)
            if e is not None and not e.measured:
                cells.append(f"not measured: {e.not_measured_reason}")
            elif e is not None and e.requests is None and e.rto_seconds is None:
                # a measurement without load or RTO (e.g. `gameday bench tracking-peer`): its
                # invariants' rows say what it judged
                cells.append(f"{experiment_status(v, name)} (no load, no RTO: "
                             f"{e.fault_name or 'faults'} measured directly)")
            elif e is not None:
                cells.append(f"{experiment_status(v, name)}: recovery {fmt_secs(e.recovery_seconds)}"
                             f" / RTO {fmt_secs(e.rto_seconds)}, {e.failed_requests} failed requests,"
                             f" {e.acknowledged_lost} acks lost")
            elif name in v.not_applicable:
                cells.append(f"not applicable: {v.not_applicable[name]}")
            else:
                cells.append("not run")
        rows.append((f"experiment {name}", cells))
        rows += _invariant_rows(verdicts, name)
    rows.append(("gate", [f"{v.result} (score {v.score:.1f}, exit {v.exit_code})"
                          if v.score is not None else f"{v.result} (exit {v.exit_code})"
                          for v in verdicts]))
    return rows


def _invariant_cell(v: Verdict, experiment: str, invariant: str) -> str:
    e = next((x for x in v.experiments if x.name == experiment), None)
    i = next((x for x in (e.invariants if e else []) if x.name == invariant), None)
    if i is None:
        return "not judged"
    if i.no_data:
        return f"no data: {i.no_data}"
    if not i.violations:
        return f"0 violations (judged {i.judged})"
    first = i.violations[0]
    return (f"{len(i.violations)} violation(s) (judged {i.judged}): "
            f"{first[:200] + '...' if len(first) > 200 else first}")


def _invariant_rows(verdicts: list[Verdict], experiment: str) -> list[tuple[str, list[str]]]:
    """One row per invariant of ``experiment`` when two or more runs judged it: the same
    promise side by side (e.g. a pipeline invariant on two platforms)."""
    judged_in = [v for v in verdicts if any(x.name == experiment and x.invariants
                                             for x in v.experiments)]
    if len(judged_in) < 2:
        return []
    names = list(dict.fromkeys(i.name for v in judged_in for x in v.experiments
                               if x.name == experiment for i in x.invariants))
    return [(f"experiment {experiment} invariant {n}",
             [_invariant_cell(v, experiment, n) for v in verdicts]) for n in names]


def render_markdown(verdicts: list[Verdict]) -> str:
    heads = [_label(v) for v in verdicts]
    lines = ["# Game days side by side", "",
             "| | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for name, cells in comparison_rows(verdicts):
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Findings", ""]
    for v in verdicts:
        lines += [f"### {_label(v)}", ""] + ([f"- {f}" for f in v.findings] or ["- none"]) + [""]
    return "\n".join(lines)


def render_html(verdicts: list[Verdict]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(_label(v))}</th>" for v in verdicts)
    body = "".join(
        f"<tr><th>{e(name)}</th>" + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>"
        for name, cells in comparison_rows(verdicts))
    findings = "".join(
        f"<h3>{e(_label(v))}</h3><ul>" + "".join(f"<li>{e(f)}</li>" for f in v.findings)
        + "</ul>" for v in verdicts)
    return ("<!doctype html><meta charset=utf-8><title>Game days side by side</title><style>"
            "body{font:14px system-ui,sans-serif;margin:2em}table{border-collapse:collapse}"
            "th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}"
            "</style><h1>Game days side by side</h1>"
            f"<table><tr><th></th>{head}</tr>{body}</table><h2>Findings</h2>{findings}")

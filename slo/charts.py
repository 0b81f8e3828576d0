"""Inline SVG timeline charts (no JavaScript, no CDN: the HTML report is self-contained)."""

from __future__ import annotations

from html import escape

from slo.verdict import ExperimentResult

PALETTE = ("#2563eb", "#9333ea", "#0d9488", "#db2777", "#ca8a04", "#4b5563")
W, H = 860, 300
PAD_L, PAD_R, PAD_T, PAD_B = 64, 16, 52, 40


def _fmt_pct(v: float) -> str:
    return f"{v * 100:.6g}%"


def timeline_svg(exp: ExperimentResult) -> str:
    """SLIs (rolling good ratio) over the experiment, fault shaded, objectives dashed,
    detection / recovery / RTO deadline marked. X axis: seconds from fault start."""
    t0, t1 = (
        exp.start,
        max(exp.end, *(t for s in exp.slis for t, _ in s.series[-1:]), exp.start + 1),
    )
    values = [v for s in exp.slis for _, v in s.series if v is not None] + [
        s.target for s in exp.slis
    ]
    lo = min(values, default=0.0)
    lo = max(0.0, lo - (1.0 - lo) * 0.15) if lo < 1.0 else 0.99
    hi = 1.0 + (1.0 - lo) * 0.04

    def x(t: float) -> float:
        return PAD_L + (t - t0) / (t1 - t0) * (W - PAD_L - PAD_R)

    def y(v: float) -> float:
        return PAD_T + (hi - v) / (hi - lo) * (H - PAD_T - PAD_B)

    out = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="100%" role="img" '
            f'aria-label="SLI timeline for {escape(exp.name)}" font-family="system-ui,sans-serif" font-size="11">'
        )
    ]
    out.append(f'<rect x="0" y="0" width="{W}" height="{H}" fill="#ffffff"/>')
    fs, fe = x(exp.fault_start), x(min(exp.fault_end, t1))
    out.append(
        f'<rect x="{fs:.1f}" y="{PAD_T}" width="{max(fe - fs, 1):.1f}" height="{H - PAD_T - PAD_B}" '
        f'fill="#fecaca" opacity="0.55"><title>fault {escape(exp.fault_name or "")}</title></rect>'
    )
    out.append(f'<text x="{fs + 4:.1f}" y="{H - PAD_B - 6}" fill="#b91c1c">fault</text>')
    # y grid
    for i in range(5):
        v = lo + (1.0 - lo) * i / 4  # gridlines stop at 100%; the headroom is for the line
        out.append(
            f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#e5e7eb"/>'
        )
        out.append(
            f'<text x="{PAD_L - 6}" y="{y(v) + 4:.1f}" text-anchor="end" fill="#6b7280">{_fmt_pct(v)}</text>'
        )
    # x ticks every "nice" step, labelled relative to fault start
    span = t1 - t0
    step = next(
        s for s in (5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 86400) if span / s <= 10
    )
    k = int((t0 - exp.fault_start) // step)
    while exp.fault_start + k * step <= t1:
        t = exp.fault_start + k * step
        if t >= t0:
            out.append(
                f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{H - PAD_B}" y2="{H - PAD_B + 4}" stroke="#9ca3af"/>'
            )
            out.append(
                f'<text x="{x(t):.1f}" y="{H - PAD_B + 16}" text-anchor="middle" fill="#6b7280">{k * step:+g}s</text>'
            )
        k += 1
    out.append(
        f'<text x="{(W + PAD_L) / 2:.0f}" y="{H - 6}" text-anchor="middle" fill="#374151">'
        "seconds from fault start</text>"
    )
    out.append(f'<line x1="{PAD_L}" x2="{PAD_L}" y1="{PAD_T}" y2="{H - PAD_B}" stroke="#9ca3af"/>')
    out.append(
        f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{H - PAD_B}" y2="{H - PAD_B}" stroke="#9ca3af"/>'
    )

    def vline(t: float, color: str, label: str, row: int, dash: str = "") -> None:
        # one label row per marker so close markers never print over each other
        if t0 <= t <= t1:
            extra = f' stroke-dasharray="{dash}"' if dash else ""
            out.append(
                f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{PAD_T}" y2="{H - PAD_B}" stroke="{color}" '
                f'stroke-width="2"{extra}><title>{escape(label)}</title></line>'
            )
            out.append(
                f'<text x="{x(t) + 3:.1f}" y="{PAD_T - 6 - 14 * row}" fill="{color}" '
                f'font-weight="600">{escape(label)}</text>'
            )

    vline(exp.fault_start + exp.rto_seconds, "#dc2626", f"RTO {exp.rto_seconds:g}s", 0, "2 3")
    if exp.detection_seconds is not None:
        vline(
            exp.fault_start + exp.detection_seconds,
            "#ea580c",
            f"detected {exp.detection_seconds:.0f}s",
            1,
        )
    if exp.recovery_seconds is not None and exp.recovery_seconds > 0:
        vline(
            exp.fault_start + exp.recovery_seconds,
            "#16a34a",
            f"recovered {exp.recovery_seconds:.0f}s",
            2,
        )

    for i, s in enumerate(exp.slis):
        color = PALETTE[i % len(PALETTE)]
        out.append(
            f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y(s.target):.1f}" y2="{y(s.target):.1f}" '
            f'stroke="{color}" stroke-dasharray="6 4" opacity="0.7"><title>{escape(s.display_name)} objective '
            f"{_fmt_pct(s.target)}</title></line>"
        )
        segments: list[list[str]] = [[]]
        for t, v in s.series:
            if v is None:
                segments.append([])
            else:
                segments[-1].append(f"{x(t):.1f},{y(v):.1f}")
        for seg in segments:
            if len(seg) == 1:
                cx, cy = seg[0].split(",")
                out.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{color}"/>')
            elif seg:
                out.append(
                    f'<polyline points="{" ".join(seg)}" fill="none" stroke="{color}" stroke-width="2"/>'
                )
    out.append("</svg>")
    return "".join(out)


def legend_items(exp: ExperimentResult) -> list[tuple[str, str]]:
    """(colour, label) per SLI line, in chart order; rendered as HTML next to the chart."""
    return [
        (PALETTE[i % len(PALETTE)], f"{s.display_name} (objective {_fmt_pct(s.target)})")
        for i, s in enumerate(exp.slis)
    ]


def goodput_text(exp: ExperimentResult) -> str:
    """One line on the load around the fault: goodput before, during, and how long after the
    fault ended it was back to 95 % of before."""
    if not exp.load:
        return "no load evidence around the fault"
    if not exp.goodput_before:
        return "no submission acknowledged in the 20 s before the fault: no goodput to compare"
    back = ("never back to 95 % of it within the evidence"
            if exp.goodput_recovery_seconds is None else
            f"back to 95 % of it {exp.goodput_recovery_seconds:.0f}s after the fault ended")
    during = "n/a" if exp.goodput_during is None else f"{exp.goodput_during:.2f}/s"
    return f"goodput {exp.goodput_before:.2f}/s before the fault, {during} during it, {back}"


def load_svg(exp: ExperimentResult) -> str:
    """Offered load and goodput (requests/s, left) and p99 of answered requests (ms, right)
    around the fault, the fault window shaded. X axis: seconds from fault start."""
    if not exp.load or exp.fault_start is None or exp.fault_end is None:
        return ""
    h = 220
    t0, t1 = exp.load[0][0], exp.load[-1][0] + 1e-9
    top = max([1.0] + [max(o, g) for _, o, g, _ in exp.load]) * 1.1
    p99s = [p for *_, p in exp.load if p is not None]
    ptop = max([1.0, *p99s]) * 1.1

    def x(t: float) -> float:
        return PAD_L + (t - t0) / max(t1 - t0, 1e-9) * (W - PAD_L - PAD_R - 40)

    def y(v: float, scale: float) -> float:
        return PAD_T + (1 - v / scale) * (h - PAD_T - PAD_B)

    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {h}" width="100%" '
            f'role="img" aria-label="load around {escape(exp.name)}" '
            'font-family="system-ui,sans-serif" font-size="11">'),
           f'<rect x="0" y="0" width="{W}" height="{h}" fill="#ffffff"/>']
    fs, fe = x(max(exp.fault_start, t0)), x(min(exp.fault_end, t1))
    out.append(f'<rect x="{fs:.1f}" y="{PAD_T}" width="{max(fe - fs, 1):.1f}" '
               f'height="{h - PAD_T - PAD_B}" fill="#fecaca" opacity="0.55"><title>fault '
               f'{escape(exp.fault_name or "")}</title></rect>')
    for i in range(5):
        v = top * i / 4
        out.append(f'<line x1="{PAD_L}" x2="{W - PAD_R - 40}" y1="{y(v, top):.1f}" '
                   f'y2="{y(v, top):.1f}" stroke="#e5e7eb"/>')
        out.append(f'<text x="{PAD_L - 6}" y="{y(v, top) + 4:.1f}" text-anchor="end" '
                   f'fill="#6b7280">{v:.3g}/s</text>')
        out.append(f'<text x="{W - PAD_R - 36}" y="{y(v, top) + 4:.1f}" fill="#b45309">'
                   f'{ptop * i / 4:.0f}ms</text>')
    for label, k, color, scale in (("offered", 1, "#6b7280", top), ("goodput", 2, "#16a34a", top),
                                   ("p99", 3, "#b45309", ptop)):
        pts = [f"{x(row[0]):.1f},{y(row[k], scale):.1f}" for row in exp.load
               if row[k] is not None]
        if pts:
            out.append(f'<polyline points="{" ".join(pts)}" fill="none" stroke="{color}" '
                       f'stroke-width="2"><title>{label}</title></polyline>')
    out.append(f'<text x="{PAD_L}" y="{PAD_T - 10}" fill="#374151">'
               f'{escape(goodput_text(exp))}</text>')
    out.append(f'<text x="{(W + PAD_L) / 2:.0f}" y="{h - 8}" text-anchor="middle" '
               f'fill="#374151">offered (grey), goodput (green), p99 (amber, right axis); '
               f'{exp.load[0][0] - exp.fault_start:+.0f}s to '
               f'{exp.load[-1][0] - exp.fault_start:+.0f}s from fault start</text>')
    out.append("</svg>")
    return "".join(out)

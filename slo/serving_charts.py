"""Model serving over the run, as the report shows it: prediction latency (p50, p99) and the
share of answers per model version in time buckets, the share the rollout controller declared
for the version it rolls out, and the experiments' fault windows (docs/serving.md, "Serving
in the report").

Pure functions from records to numbers and to SVG text (the style of slo/charts.py); reading
``inference.jsonl`` and ``faults.jsonl`` is the report writer's job.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape

from slo.charts import PAD_B, PAD_L, PAD_R, PAD_T, W
from slo.evidence import FaultRecord
from slo.inference_ledger import InferenceRecord
from slo.sli import latency_quantile

# a bucket wide enough to hold a few requests of the Inferrer users (2 users, 5 requests/s
# each), narrow enough that a rollout step of 3 s still shows: at most this many per chart
MAX_BUCKETS = 120
_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600)
UNKNOWN = "(no version)"
# the versions' colours leave out the latency lines' teal (p50) and amber (p99)
VERSION_COLORS = ("#2563eb", "#9333ea", "#db2777", "#4b5563", "#16a34a", "#0891b2")
P50, P99 = "#0d9488", "#b45309"


@dataclass(frozen=True)
class ServingBucket:
    start: float  # epoch seconds; the bucket is [start, start + width)
    requests: int
    failed: int  # transport error or 5xx
    p50_ms: float | None  # of answered requests; None when none was answered
    p99_ms: float | None
    by_version: dict[str, int]  # answered requests per version that answered


@dataclass(frozen=True)
class DeclaredShare:
    """From ``time`` on, the controller declared ``share`` percent of the traffic for
    ``version`` (the version being rolled out)."""

    time: float
    version: str
    share: float


@dataclass(frozen=True)
class Rollout:
    version: str
    stable: str | None
    start: float
    end: float | None = None  # None: no rollout_end in the evidence
    outcome: str | None = None
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class FaultWindow:
    start: float
    end: float
    name: str


@dataclass(frozen=True)
class ServingView:
    t0: float
    t1: float
    width: float  # bucket width, seconds
    buckets: tuple[ServingBucket, ...]
    declared: tuple[DeclaredShare, ...]
    rollouts: tuple[Rollout, ...]
    windows: tuple[FaultWindow, ...]
    requests: int
    failed: int
    p50_ms: float | None
    p99_ms: float | None
    by_version: dict[str, int]

    @property
    def versions(self) -> list[str]:
        """Every version that answered, most answers first (the colour order)."""
        return [v for v, _ in sorted(self.by_version.items(), key=lambda kv: (-kv[1], kv[0]))]


def bucket_width(span: float) -> float:
    """The smallest round width that cuts ``span`` seconds into at most MAX_BUCKETS."""
    return next((s for s in _STEPS if span / s <= MAX_BUCKETS), _STEPS[-1])


def done_at(r: InferenceRecord) -> float:
    """When the client had its answer: a request counts where its latency was felt."""
    return r.time.timestamp() + r.latency_ms / 1000.0


def serving_buckets(records: Iterable[InferenceRecord], t0: float, t1: float,
                    width: float) -> list[ServingBucket]:
    """One bucket per ``width`` seconds from ``t0`` to ``t1`` (empty ones included, so a gap
    in serving shows as one); a record belongs to the bucket of its answer."""
    n = max(1, math.ceil((t1 - t0) / width))
    slots: list[list[InferenceRecord]] = [[] for _ in range(n)]
    for r in records:
        i = int((done_at(r) - t0) // width)
        if 0 <= i < n:
            slots[i].append(r)
    return [ServingBucket(start=t0 + i * width, requests=len(rs),
                          failed=sum(1 for r in rs if not r.answered),
                          p50_ms=latency_quantile(rs, 0.50), p99_ms=latency_quantile(rs, 0.99),
                          by_version=dict(Counter(r.version or UNKNOWN
                                                  for r in rs if r.answered)))
            for i, rs in enumerate(slots)]


def declared_shares(notes: Iterable[FaultRecord]) -> list[DeclaredShare]:
    """The new version's declared share through each rollout, from the controller's timeline
    notes (environments/local/serving_rollout.py): ``rollout_start`` names the version and
    the stable one it replaces; each ``rollout_share`` gives the canary replica's share and
    version, the stable replica taking the rest; a ``rollout_step`` deciding ``done`` puts the
    new version on the stable replica too (it is redeployed next, before the last share).
    Share notes outside a rollout (the environment's reset to even weights) declare nothing
    about a new version; after ``rollout_end`` the last share stands."""
    out: list[DeclaredShare] = []
    version: str | None = None
    stable: str | None = None
    for n in sorted(notes, key=lambda n: n.time):
        if n.event != "note":
            continue
        at, d = n.time.timestamp(), n.details
        if n.fault == "rollout_start" and isinstance(d.get("version"), str):
            version, stable = d["version"], d.get("from")
            out.append(DeclaredShare(at, version, 0.0))
        elif version is None:
            continue
        elif n.fault == "rollout_share":
            share = float(d.get("share", 0))
            ours = (share if d.get("version") == version else 0.0) + (
                100.0 - share if stable == version else 0.0)
            out.append(DeclaredShare(at, version, ours))
        elif n.fault == "rollout_step" and d.get("decision") == "done":
            stable = version
        elif n.fault == "rollout_end":
            version = stable = None
    return out


def rollouts(notes: Iterable[FaultRecord]) -> list[Rollout]:
    """Each rollout the controller noted: its version, the stable one, when, how it ended."""
    out: list[Rollout] = []
    for n in sorted(notes, key=lambda n: n.time):
        d = n.details
        if n.event != "note":
            continue
        if n.fault == "rollout_start" and isinstance(d.get("version"), str):
            out.append(Rollout(d["version"], d.get("from"), n.time.timestamp()))
        elif n.fault == "rollout_end" and out and out[-1].end is None:
            last = out[-1]
            out[-1] = Rollout(last.version, last.stable, last.start, n.time.timestamp(),
                              str(d.get("outcome")), tuple(map(str, d.get("reasons") or ())))
    return out


def serving_view(records: Sequence[InferenceRecord], notes: Sequence[FaultRecord],
                 windows: Iterable[FaultWindow], t0: float, t1: float) -> ServingView | None:
    """Everything the chart and the summary line show; None without inference records (a run
    without serving gets no serving section at all). The axis spans the run and every record."""
    if not records:
        return None
    t0 = min(t0, *(r.time.timestamp() for r in records))
    t1 = max(t1, *(done_at(r) for r in records), t0 + 1)
    width = bucket_width(t1 - t0)
    return ServingView(
        t0=t0, t1=t1, width=width, buckets=tuple(serving_buckets(records, t0, t1, width)),
        declared=tuple(declared_shares(notes)), rollouts=tuple(rollouts(notes)),
        windows=tuple(w for w in windows if w.end >= t0 and w.start <= t1),
        requests=len(records), failed=sum(1 for r in records if not r.answered),
        p50_ms=latency_quantile(records, 0.50), p99_ms=latency_quantile(records, 0.99),
        by_version=dict(Counter(r.version or UNKNOWN for r in records if r.answered)))


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f} ms"


def serving_summary(view: ServingView) -> str:
    """One sentence for both reports: requests, failures, latency, who answered, rollouts."""
    answered = sum(view.by_version.values())
    split = ", ".join(f"{v} {view.by_version[v] / answered:.1%}"
                      for v in view.versions) if answered else "none"
    text = (f"{view.requests} prediction requests, {view.failed} failed; latency of the answered "
            f"p50 {_ms(view.p50_ms)}, p99 {_ms(view.p99_ms)}; answered by {split}")
    done = [f"{r.version} (from {r.stable or '?'}) at {r.start - view.t0:+.0f}s: "
            + (f"{r.outcome} at {r.end - view.t0:+.0f}s" if r.end is not None
               else "no end recorded")
            + (f" ({'; '.join(r.reasons)})" if r.reasons else "") for r in view.rollouts]
    label = "rollouts" if len(done) > 1 else "rollout"
    return text + (f"; {label}: {', '.join(done)}" if done else "") + "."


def version_colors(view: ServingView) -> dict[str, str]:
    return {v: VERSION_COLORS[i % len(VERSION_COLORS)] for i, v in enumerate(view.versions)}


def legend_items(view: ServingView) -> list[tuple[str, str]]:
    """(colour, label) per line of the share panel, for the HTML legend."""
    colors = version_colors(view)
    items = [(c, f"answered by {v}") for v, c in colors.items()]
    items += [(colors.get(v, "#111827"), f"{v}: share declared by the rollout (dashed)")
              for v in dict.fromkeys(d.version for d in view.declared)]
    return items


PANEL_H = 150  # each of the two panels
GAP = 34
H = PAD_T + PANEL_H + GAP + PANEL_H + PAD_B


def serving_svg(view: ServingView) -> str:
    """Two panels over the run's time: latency p50 / p99 of the answered requests (ms), and
    each version's share of the answers (solid) with the declared share of the version being
    rolled out (dashed steps); fault windows shaded across both. X: seconds from run start."""
    right = W - PAD_R - 40
    top1, top2 = PAD_T, PAD_T + PANEL_H + GAP

    def x(t: float) -> float:
        return PAD_L + (t - view.t0) / (view.t1 - view.t0) * (right - PAD_L)

    lat = [v for b in view.buckets for v in (b.p50_ms, b.p99_ms) if v is not None]
    ltop = max([1.0, *lat]) * 1.1

    def y_ms(v: float) -> float:
        return top1 + (1 - v / ltop) * PANEL_H

    def y_share(v: float) -> float:  # v in 0..1
        return top2 + (1 - v) * PANEL_H

    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="100%" '
            'role="img" aria-label="serving latency and traffic split over the run" '
            'font-family="system-ui,sans-serif" font-size="11">'),
           f'<rect x="0" y="0" width="{W}" height="{H}" fill="#ffffff"/>']
    for w in view.windows:
        fs, fe = x(max(w.start, view.t0)), x(min(w.end, view.t1))
        for top in (top1, top2):
            out.append(f'<rect class="fault" x="{fs:.1f}" y="{top}" width="{max(fe - fs, 1):.1f}" '
                       f'height="{PANEL_H}" fill="#fecaca" opacity="0.55"><title>fault '
                       f'{escape(w.name)}</title></rect>')
        out.append(f'<text x="{fs + 3:.1f}" y="{top1 + 12}" fill="#b91c1c">{escape(w.name)}</text>')
    for i in range(5):
        v = ltop * i / 4
        out.append(f'<line x1="{PAD_L}" x2="{right}" y1="{y_ms(v):.1f}" y2="{y_ms(v):.1f}" '
                   'stroke="#e5e7eb"/>')
        out.append(f'<text x="{PAD_L - 6}" y="{y_ms(v) + 4:.1f}" text-anchor="end" '
                   f'fill="#6b7280">{v:.0f}ms</text>')
        s = i / 4
        out.append(f'<line x1="{PAD_L}" x2="{right}" y1="{y_share(s):.1f}" '
                   f'y2="{y_share(s):.1f}" stroke="#e5e7eb"/>')
        out.append(f'<text x="{PAD_L - 6}" y="{y_share(s) + 4:.1f}" text-anchor="end" '
                   f'fill="#6b7280">{s:.0%}</text>')
    out.append(f'<text x="{PAD_L}" y="{top1 - 8}" fill="#374151">prediction latency of the '
               'answered requests: p50 (teal), p99 (amber); red ticks: failed requests</text>')
    out.append(f'<text x="{PAD_L}" y="{top2 - 8}" fill="#374151">share of the answers per model '
               'version (solid); share declared for the version rolled out (dashed)</text>')
    for label, attr, color in (("p50", "p50_ms", P50), ("p99", "p99_ms", P99)):
        _polylines(out, label, color, [
            (x(b.start + view.width / 2), None if getattr(b, attr) is None
             else y_ms(getattr(b, attr))) for b in view.buckets])
    for b in view.buckets:
        if b.failed:
            out.append(f'<line class="failed" x1="{x(b.start + view.width / 2):.1f}" '
                       f'x2="{x(b.start + view.width / 2):.1f}" y1="{top1 + PANEL_H}" '
                       f'y2="{top1 + PANEL_H - 8}" stroke="#dc2626" stroke-width="2">'
                       f'<title>{b.failed} of {b.requests} failed</title></line>')
    colors = version_colors(view)
    for version, color in colors.items():
        pts = []
        for b in view.buckets:
            answered = sum(b.by_version.values())
            pts.append((x(b.start + view.width / 2),
                        y_share(b.by_version.get(version, 0) / answered) if answered else None))
        _polylines(out, f"answered by {version}", color, pts)
    for version in dict.fromkeys(d.version for d in view.declared):
        steps = [d for d in view.declared if d.version == version]
        pts = []
        for d, nxt in zip(steps, [*steps[1:], None]):
            until = nxt.time if nxt is not None else view.t1
            pts += [f"{x(d.time):.1f},{y_share(d.share / 100):.1f}",
                    f"{x(until):.1f},{y_share(d.share / 100):.1f}"]
        shares = ", ".join(f"{d.share:g}%" for d in steps)
        out.append(f'<polyline class="declared" points="{" ".join(pts)}" fill="none" '
                   f'stroke="{colors.get(version, "#111827")}" stroke-width="2" '
                   f'stroke-dasharray="6 4"><title>{escape(version)} declared: {shares}'
                   '</title></polyline>')
    for top in (top1, top2):
        out.append(f'<line x1="{PAD_L}" x2="{PAD_L}" y1="{top}" y2="{top + PANEL_H}" '
                   'stroke="#9ca3af"/>')
        out.append(f'<line x1="{PAD_L}" x2="{right}" y1="{top + PANEL_H}" y2="{top + PANEL_H}" '
                   'stroke="#9ca3af"/>')
    span = view.t1 - view.t0
    step = next((s for s in _STEPS if span / s <= 10), _STEPS[-1])
    k = 0
    while k * step <= span:
        tx = x(view.t0 + k * step)
        out.append(f'<text x="{tx:.1f}" y="{top2 + PANEL_H + 16}" text-anchor="middle" '
                   f'fill="#6b7280">{k * step:+g}s</text>')
        k += 1
    out.append(f'<text x="{(W + PAD_L) / 2:.0f}" y="{H - 6}" text-anchor="middle" '
               f'fill="#374151">seconds from run start; buckets of {view.width:g}s</text>')
    out.append("</svg>")
    return "".join(out)


def _polylines(out: list[str], label: str, color: str,
               pts: list[tuple[float, float | None]]) -> None:
    """One polyline per run of points with a value (an empty bucket breaks the line)."""
    segments: list[list[str]] = [[]]
    for px, py in pts:
        if py is None:
            segments.append([])
        else:
            segments[-1].append(f"{px:.1f},{py:.1f}")
    for seg in segments:
        if len(seg) == 1:
            cx, cy = seg[0].split(",")
            out.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{color}">'
                       f'<title>{escape(label)}</title></circle>')
        elif seg:
            out.append(f'<polyline class="series" points="{" ".join(seg)}" fill="none" '
                       f'stroke="{color}" stroke-width="2"><title>{escape(label)}</title>'
                       '</polyline>')

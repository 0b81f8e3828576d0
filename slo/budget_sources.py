"""Where the remaining error budget of the SLOs a game day touches comes from (the I/O of
budget-aware scheduling; the judging is slo/budget_gate.py, the math slo/budget.py).

prometheus  the recorded error ratio of the SLO's shortest alert window (slo/rules.py),
            averaged over the SLO window (`avg_over_time(...[<window>])`, Sloth's period error
            ratio), through the HTTP API `/api/v1/query`. An empty result (the series is
            absent: rules not loaded, nothing scraped), a NaN (no traffic in the window) or an
            unreachable Prometheus is **no data** for that SLO, never a full budget. Evidence-
            only SLIs (no Prometheus source) have no series: "not tracked".
archive     the archived runs (slo/archive.py) of the same environment that started within the
            SLO window: each run's run-level SLI value (`sli.<name>` in its index entry) held
            for the run's duration spends `burn rate x duration / window` of the budget; the
            time between game days is assumed to spend nothing. That is the archive's whole
            knowledge: it sees game days, not production traffic, so it is optimistic about the
            window and exact only about what the game days themselves spent. No archived run
            that measured the SLO in the window: no data.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence

from slo.baseline import IndexEntry
from slo.budget import remaining_after_runs, remaining_budget
from slo.budget_gate import SloBudget, judge
from slo.durations import format_duration
from slo.rules import window_error_ratio_query
from slo.specs import Specs

MEASURED = ("pass", "warning", "fail")


def query_prometheus(url: str, query: str, at: float, timeout: float = 10.0) -> list[float]:
    """Values of an instant query (one per series). Raises OSError/ValueError on failure."""
    params = urllib.parse.urlencode({"query": query, "time": f"{at:.3f}"})
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query?{params}",
                                timeout=timeout) as resp:
        body = json.loads(resp.read())
    if body.get("status") != "success":
        raise ValueError(f"Prometheus answered {body.get('status')!r}: {body.get('error', '')}")
    data = body.get("data") or {}
    if data.get("resultType") != "vector":
        raise ValueError(f"expected a vector, got {data.get('resultType')!r}")
    return [float(r["value"][1]) for r in data.get("result", [])]


def prometheus_budgets(url: str, specs: Specs, touched: Mapping[str, Sequence[str]],
                       floor: float, at: float, timeout: float = 10.0) -> list[SloBudget]:
    out = []
    for name, experiments in touched.items():
        slo = specs.slo(name)
        query = window_error_ratio_query(slo, specs)
        if query is None:
            out.append(judge(name, experiments, None, floor, tracked=False,
                             detail="evidence-only SLI: no Prometheus series; judged by each "
                                    "run's gate"))
            continue
        try:
            values = query_prometheus(url, query, at, timeout)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            out.append(judge(name, experiments, None, floor,
                             detail=f"query failed: {type(exc).__name__}: {exc}"))
            continue
        values = [v for v in values if not math.isnan(v)]
        if not values:
            out.append(judge(name, experiments, None, floor,
                             detail=f"no series for {query}"))
            continue
        err = max(0.0, max(values))  # several series: the worst one
        out.append(judge(name, experiments, remaining_budget(err, slo.objective.target), floor,
                         detail=f"error ratio {err:.6g} over "
                                f"{format_duration(slo.window_seconds)}"))
    return out


def archive_budgets(entries: Iterable[IndexEntry], specs: Specs, env: str,
                    touched: Mapping[str, Sequence[str]], floor: float,
                    at: float) -> list[SloBudget]:
    """Pure over the archive's index entries (read them with `Archive.entries()`)."""
    runs = [e for e in entries if e.env == env and e.started_at <= at]
    out = []
    for name, experiments in touched.items():
        slo = specs.slo(name)
        since = at - slo.window_seconds
        samples = []
        for e in runs:
            if e.started_at < since:
                continue
            o = next((o for o in e.objectives if o.id == f"sli.{name}"), None)
            if o is None or o.measured is None or o.status not in MEASURED:
                continue
            samples.append((o.measured, max(0.0, e.ended_at - e.started_at)))
        window = format_duration(slo.window_seconds)
        if not samples:
            out.append(judge(name, experiments, None, floor,
                             detail=f"no archived run of env {env} in the last {window} "
                                    f"measured sli.{name}"))
            continue
        remaining = remaining_after_runs(samples, slo.objective.target, slo.window_seconds)
        out.append(judge(name, experiments, remaining, floor,
                         detail=f"{len(samples)} archived run(s) in the last {window}"))
    return out

"""Evidence the platform itself says it dropped (pure): agents that could not deliver events
before their buffer overflowed report how many they threw away, so SLIs computed from the
events may look better than what happened.

Two sources count the same drops: `evidence_dropped` events (`data.count`) and, when
collected, the counter `controlplane_agent_events_dropped_total` per agent
(prometheus/evidence_dropped.json). Per agent the larger of the two is taken, so a drop seen
by both is counted once and a drop seen by only one is still counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from slo.evidence import Event, PromQuery

EVENT_KIND = "evidence_dropped"
PROM_QUERY = "evidence_dropped"  # prometheus/<name>.json
_UNKNOWN = "?"


@dataclass(frozen=True)
class DroppedEvidence:
    total: int
    by_agent: dict[str, int]
    from_events: int
    from_prometheus: int | None  # None: the query was not collected


def counter_increase(values: Iterable[float]) -> float:
    """Increase of a counter over its samples; a drop in value is a restart (counts from 0)."""
    total, prev = 0.0, None
    for v in values:
        if prev is not None:
            total += v - prev if v >= prev else v
        prev = v
    return total


def _agent_of(e: Event) -> str:
    agent = e.data.get("agent")
    if isinstance(agent, str) and agent:
        return agent
    actor = e.actor or ""
    return actor.removeprefix("agent:") if actor.startswith("agent:") else _UNKNOWN


def dropped_evidence(events: Iterable[Event], query: PromQuery | None) -> DroppedEvidence:
    from_events: dict[str, int] = {}
    for e in events:
        if e.kind != EVENT_KIND:
            continue
        count = e.data.get("count", 1)
        n = int(count) if isinstance(count, (int, float)) and count > 0 else 0
        from_events[_agent_of(e)] = from_events.get(_agent_of(e), 0) + n
    from_prom: dict[str, int] = {}
    if query is not None:
        for s in query.series:
            agent = s.metric.get("agent") or _UNKNOWN
            n = round(counter_increase(v for _, v in s.values))
            from_prom[agent] = max(from_prom.get(agent, 0), n)
    by_agent = {
        a: max(from_events.get(a, 0), from_prom.get(a, 0))
        for a in sorted(from_events.keys() | from_prom.keys())
    }
    return DroppedEvidence(
        total=sum(by_agent.values()),
        by_agent={a: n for a, n in by_agent.items() if n},
        from_events=sum(from_events.values()),
        from_prometheus=None if query is None else sum(from_prom.values()),
    )

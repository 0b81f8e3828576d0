"""Routing: hard eligibility first, then ranking. Pure functions over plain data.

The rule this module exists for: work is never placed on a destination that the operation's
rules forbid. Eligibility does not look at liveness or load; those only decide *whether it can
go now* (wait, or blocked when every eligible destination is down), never *where it may go*.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from controlplane import defects

# Pools that never run user workloads (the control plane's own nodes).
RESERVED_POOLS = frozenset({"system"})


@dataclass(frozen=True)
class Requirement:
    cpu: int = 1
    accelerator_type: str | None = None
    accelerator_count: int = 0
    regions: tuple[str, ...] | None = None
    dataset: str | None = None
    registry: str | None = None  # host[:port] of the workload image, None for a bare name


@dataclass(frozen=True)
class Destination:
    agent_id: str
    name: str
    pool: str
    zone: str
    region: str
    cpu_slots: int
    accelerator_type: str | None
    accelerator_count: int
    datasets: tuple[str, ...]
    registries: tuple[str, ...]  # empty = not restricted
    alive: bool = True
    breaker_open: bool = False
    used_cpu: int = 0
    used_accelerators: int = 0
    waiting: int = 0  # dispatched but not yet running here: a proxy for expected wait
    recent_failures: int = 0

    @property
    def free_cpu(self) -> int:
        return self.cpu_slots - self.used_cpu

    @property
    def free_accelerators(self) -> int:
        return self.accelerator_count - self.used_accelerators


class Outcome(StrEnum):
    DISPATCH = "dispatch"
    WAIT = "wait"  # eligible destinations exist and are up, but full
    BLOCKED = "blocked"


class PendingReason(StrEnum):
    NO_ELIGIBLE_DESTINATION = "no_eligible_destination"
    ELIGIBLE_DESTINATIONS_UNAVAILABLE = "eligible_destinations_unavailable"
    CAPACITY = "capacity"
    QUEUE_CONCURRENCY = "queue_concurrency"
    BACKOFF = "backoff"


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    destination: Destination | None
    pending_reason: PendingReason | None
    reason: str
    rejected: dict[str, str] = field(default_factory=dict)  # agent name -> why ineligible


def image_registry(image: str) -> str | None:
    """Registry host of an image reference, like Docker's rule: first part with '.' or ':'."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return None


def ineligibility(req: Requirement, dest: Destination) -> str | None:
    """Why ``dest`` may never run this work, or None when it may. Hard rules only."""
    if dest.pool in RESERVED_POOLS:
        return f"pool {dest.pool} is reserved for the control plane"
    if req.accelerator_count > 0:
        if dest.accelerator_type != req.accelerator_type:
            return f"accelerator {dest.accelerator_type or 'none'} != {req.accelerator_type}"
        if dest.accelerator_count < req.accelerator_count:
            return f"has {dest.accelerator_count} accelerators, needs {req.accelerator_count}"
    elif dest.accelerator_count > 0:
        # accelerator nodes are tainted: CPU-only work must not occupy them
        return "accelerator pool does not take CPU-only work"
    if dest.cpu_slots < req.cpu:
        return f"has {dest.cpu_slots} cpu slots, needs {req.cpu}"
    if req.regions is not None and dest.region not in req.regions:
        return f"region {dest.region} not in allowed {list(req.regions)}"
    if req.dataset is not None and req.dataset not in dest.datasets:
        return f"dataset {req.dataset} not present"
    if req.registry is not None and dest.registries and req.registry not in dest.registries \
            and "*" not in dest.registries:
        return f"registry {req.registry} not reachable"
    return None


def fits(req: Requirement, dest: Destination) -> bool:
    return dest.free_cpu >= req.cpu and dest.free_accelerators >= req.accelerator_count


def rank_key(req: Requirement, dest: Destination) -> tuple[float, ...]:
    """Lower sorts first: healthiest, shortest expected wait, most free capacity, stable name."""
    return (dest.recent_failures, dest.waiting, -dest.free_cpu, -dest.free_accelerators)


def route(req: Requirement, destinations: list[Destination],
          pinned: str | None = None) -> Decision:
    """Decide where (or whether) an operation goes now."""
    rejected: dict[str, str] = {}
    eligible: list[Destination] = []
    for d in destinations:
        why = ineligibility(req, d)
        if why is None:
            eligible.append(d)
        else:
            rejected[d.name] = why
    if not [d for d in eligible if d.alive and not d.breaker_open] and pinned is None \
            and defects.enabled("ineligible-fallback"):
        # SEEDED DEFECT: "anything beats waiting" - place the work wherever it fits
        fallback = [d for d in destinations if d.alive and not d.breaker_open and fits(req, d)
                    and d.pool not in RESERVED_POOLS]
        if fallback:
            best = min(fallback, key=lambda d: (*rank_key(req, d), d.name))
            return Decision(Outcome.DISPATCH, best, None, f"fallback to {best.name}", rejected)
    if pinned is not None:
        eligible = [d for d in eligible if d.name == pinned]
        if not eligible:
            why = rejected.get(pinned, "unknown agent")
            return Decision(Outcome.BLOCKED, None, PendingReason.NO_ELIGIBLE_DESTINATION,
                            f"pinned agent {pinned} is not eligible: {why}", rejected)
    if not eligible:
        detail = "; ".join(f"{n}: {w}" for n, w in sorted(rejected.items())) or "no agents"
        return Decision(Outcome.BLOCKED, None, PendingReason.NO_ELIGIBLE_DESTINATION,
                        f"no eligible destination ({detail})", rejected)
    up = [d for d in eligible if d.alive and not d.breaker_open]
    if not up:
        down = ", ".join(
            f"{d.name} ({'circuit open' if d.breaker_open else 'not heartbeating'})"
            for d in sorted(eligible, key=lambda d: d.name))
        return Decision(Outcome.BLOCKED, None, PendingReason.ELIGIBLE_DESTINATIONS_UNAVAILABLE,
                        f"all eligible destinations unavailable: {down}", rejected)
    free = [d for d in up if fits(req, d)]
    if not free:
        names = ", ".join(sorted(d.name for d in up))
        return Decision(Outcome.WAIT, None, PendingReason.CAPACITY,
                        f"waiting for capacity on {len(up)} eligible destination(s): {names}",
                        rejected)
    best = min(free, key=lambda d: (*rank_key(req, d), d.name))
    return Decision(Outcome.DISPATCH, best, None,
                    f"routed to {best.name} ({best.pool}/{best.zone}/{best.region}); "
                    f"{len(free)} eligible with capacity", rejected)

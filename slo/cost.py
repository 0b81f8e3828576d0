"""Cost of the work a control plane ran: pure math over attempts, agents and a declared price
table (no I/O; docs/cost.md has the same formulas with examples).

Inputs (measured, from the control plane's store or a game day's snapshot of it):

- every attempt of the operations in a window: operation, number, outcome (succeeded, failed,
  lost = its lease expired because the agent or its node went away, which is how a spot
  interruption shows, canceled; dispatched/running = no end yet), the agent's pool, the
  operation's resource request (vCPUs, accelerators), dispatched at (the attempt's creation:
  the scheduler books its slots then), started at, ended at, last progress (the last
  ``progress`` event of the attempt);
- every agent (one agent stands for one node): pool, vCPU slots, accelerators;
- the window: [start, end] (a game day: run start to the store snapshot).

Declared (slo/specs/prices.yaml): per pool a price per node-hour, vCPUs and accelerators per
node, capacity type. Never measured.

Formulas, per attempt ``a`` on pool ``p`` with price ``P`` per node-hour:

- share(a) = max(cpus(a) / vcpus_per_node(p), accelerators(a) / accelerators_per_node(p))
  (dominant share: the fraction of a node the attempt reserves)
- held(a) = end(a) - dispatched(a), hours; an attempt without an end (running at the end of the
  window) is held until the window's end for allocation vs activity, and gets no cost
- progress(a) = end(a) - started(a) for a succeeded attempt, else last_progress(a) - started(a)
  (0 without a progress event): the time the attempt was seen making progress
- cost(a) = held(a) * share(a) * P

Per operation ``o`` that completed (succeeded): cost(o) = sum of cost(a) over all its attempts,
the failed and lost ones included; retry cost = the part from attempts that did not succeed.

- cost per completed operation = sum cost(o) / completed operations
- retry share = sum retry cost / sum cost(o) (what failures and interruptions added)
- lost cost = sum cost(a) over lost attempts of any operation (interrupted capacity)
- cost of work that did not complete = sum cost(a) over attempts of failed/canceled operations
- allocated(p) = sum over agents of p of share(agent capacity) * window hours (node-hours)
- allocated cost = allocated(p) * P; all-in cost per completed operation = total allocated
  cost / completed operations (includes idle capacity and the control plane's own pool)
- accelerator-hours: allocated = accelerators of the pool's agents * window hours;
  held = sum accelerators(a) * held(a); progress = sum accelerators(a) * progress(a);
  idle = allocated - progress (of which held without progress = held - progress)
- activity(p) = held node-hours / allocated node-hours; productive(p) = progress / allocated
- cost per productive accelerator-hour = allocated cost of pools with accelerators / progress
  accelerator-hours of those pools

Missing data is never zero: an attempt whose pool has no price, whose agent is unknown or whose
operation has no resource request is *unpriced*; it is listed and no total that would include it
is claimed (None). Pipelines: the control plane has none (operations are independent), so there
is no per-pipeline figure; the summary says so.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from slo.evidence import AgentRecord, Attempt, Event, Evidence, Operation
from slo.prices import PoolPrice, PriceTable

SUCCEEDED = "succeeded"
LOST = "lost"
FINISHED = frozenset({"succeeded", "failed", "lost", "canceled"})
COMPLETED_OPERATION = "succeeded"
NOT_COMPLETED_OPERATION = frozenset({"failed", "canceled"})
PIPELINES = ("not applicable: the control plane has no pipelines (every operation is "
             "independent), so no cost per pipeline is computed")
_HOUR = 3600.0


@dataclass(frozen=True)
class AttemptUsage:
    """One attempt, times in epoch seconds. None = not recorded (never read as 0)."""

    operation_id: str
    attempt_id: str
    number: int
    outcome: str  # the attempt's state: succeeded, failed, lost, canceled, dispatched, running
    pool: str | None  # None: the attempt's agent is unknown
    cpus: float | None  # the operation's request; None: unknown
    accelerators: int | None
    dispatched_at: float
    started_at: float | None
    ended_at: float | None  # None: no end yet (running at the window's end)
    last_progress_at: float | None = None


@dataclass(frozen=True)
class AgentCapacity:
    """One agent = one node of a pool."""

    name: str
    pool: str | None
    cpus: int | None  # None: not recorded (older snapshots)
    accelerators: int


@dataclass(frozen=True)
class CostInputs:
    window_start: float
    window_end: float
    attempts: tuple[AttemptUsage, ...]
    operation_states: Mapping[str, str]  # operation id -> state
    agents: tuple[AgentCapacity, ...] | None  # None: agents were not recorded
    notes: tuple[str, ...] = ()


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolCost(_M):
    pool: str
    priced: bool
    instance_type: str | None
    capacity_type: str | None
    price_per_hour: float | None
    agents: int
    accelerators: int
    attempts: int
    running_attempts: int
    lost_attempts: int
    allocated_node_hours: float | None
    held_node_hours: float | None
    progress_node_hours: float | None
    activity: float | None  # held / allocated node-hours
    productive: float | None  # progress / allocated node-hours
    allocated_cost: float | None
    attempt_cost: float | None  # finished attempts only
    lost_cost: float | None
    allocated_accelerator_hours: float | None
    held_accelerator_hours: float
    progress_accelerator_hours: float
    idle_accelerator_hours: float | None


class CostSummary(_M):
    """The `cost` object of verdict.json and `gameday cost report --json` (docs/cost.md).
    It never affects the gate."""

    currency: str
    price_source: str
    price_table: str
    window_start: float
    window_end: float
    complete: bool  # every finished attempt and every agent was priced
    operations_completed: int
    operations_not_completed: int
    operations_in_flight: int
    attempts_by_outcome: dict[str, int]
    running_attempts: int  # no end: running or unknown, in no cost total
    attempt_cost: float | None
    completed_cost: float | None
    cost_per_completed_operation: float | None
    retry_cost: float | None
    retry_share: float | None
    lost_cost: float | None
    not_completed_cost: float | None
    allocated_cost: float | None
    all_in_cost_per_completed_operation: float | None
    allocated_accelerator_hours: float | None
    held_accelerator_hours: float
    progress_accelerator_hours: float
    idle_accelerator_hours: float | None
    held_without_progress_accelerator_hours: float
    cost_per_progress_accelerator_hour: float | None
    per_pipeline: str = PIPELINES
    pools: list[PoolCost]
    unpriced: list[str]
    notes: list[str]


# --------------------------------------------------------------------------- per attempt


def held_hours(a: AttemptUsage, window_end: float) -> float:
    end = a.ended_at if a.ended_at is not None else window_end
    return max(end - a.dispatched_at, 0.0) / _HOUR


def progress_hours(a: AttemptUsage, window_end: float) -> float:
    if a.started_at is None:
        return 0.0
    end = a.ended_at if a.ended_at is not None else window_end
    mark = end if a.outcome == SUCCEEDED else a.last_progress_at
    if mark is None:
        return 0.0
    return max(min(mark, end) - a.started_at, 0.0) / _HOUR


def why_unpriced(a: AttemptUsage, prices: PriceTable) -> str | None:
    if a.pool is None:
        return "its agent is not in the agents record (pool unknown)"
    if a.pool not in prices.pools:
        return f"pool {a.pool!r} is not in the price table"
    if a.cpus is None or a.accelerators is None:
        return "its operation has no resource request"
    return None


def attempt_cost(a: AttemptUsage, price: PoolPrice, window_end: float) -> float:
    assert a.cpus is not None and a.accelerators is not None
    return held_hours(a, window_end) * price.node_share(a.cpus, a.accelerators) \
        * price.price_per_hour


# --------------------------------------------------------------------------- summary


def _sum(values: Iterable[float | None]) -> float | None:
    """A total only when every part is known."""
    total = 0.0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den <= 0 else num / den


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 6)


def summarize(inputs: CostInputs, prices: PriceTable) -> CostSummary:
    end = inputs.window_end
    window_h = max(end - inputs.window_start, 0.0) / _HOUR
    notes = list(inputs.notes)
    unpriced: list[str] = []
    cost: dict[str, float | None] = {}  # finished attempts only
    for a in inputs.attempts:
        why = why_unpriced(a, prices)
        if why is not None:
            if a.outcome in FINISHED:
                cost[a.attempt_id] = None
            unpriced.append(f"attempt {a.number} of operation {a.operation_id}: {why}")
            continue
        if a.outcome in FINISHED:
            cost[a.attempt_id] = attempt_cost(a, prices.pools[a.pool or ""], end)

    by_op: dict[str, list[AttemptUsage]] = defaultdict(list)
    for a in inputs.attempts:
        by_op[a.operation_id].append(a)
    states = inputs.operation_states
    completed = [o for o, s in states.items() if s == COMPLETED_OPERATION]
    not_completed = [o for o, s in states.items() if s in NOT_COMPLETED_OPERATION]
    finished = [a for a in inputs.attempts if a.outcome in FINISHED]
    running = [a for a in inputs.attempts if a.outcome not in FINISHED]
    if running:
        notes.append(f"{len(running)} attempt(s) had no end at the window's end (running or "
                     "unknown): in allocation vs activity up to the window's end, in no cost")

    completed_cost = _sum(cost[a.attempt_id] for o in completed for a in by_op[o]
                          if a.attempt_id in cost)
    retry_cost = _sum(cost[a.attempt_id] for o in completed for a in by_op[o]
                      if a.attempt_id in cost and a.outcome != SUCCEEDED)
    if not completed:
        notes.append("no operation completed in the window: no cost per completed operation")

    pools = _pools(inputs, prices, cost, window_h, notes, unpriced)
    allocated_cost = None if inputs.agents is None else _sum(p.allocated_cost for p in pools)
    acc_pools = [p for p in pools if p.accelerators or p.held_accelerator_hours]
    acc_alloc = _sum(p.allocated_accelerator_hours for p in pools) \
        if inputs.agents is not None else None
    held_acc = sum(p.held_accelerator_hours for p in pools)
    progress_acc = sum(p.progress_accelerator_hours for p in pools)
    acc_cost = _sum(p.allocated_cost for p in acc_pools) if acc_pools else None
    return CostSummary(
        currency=prices.currency,
        price_source=prices.source,
        price_table=prices.path,
        window_start=inputs.window_start,
        window_end=end,
        complete=not unpriced and all(c is not None for c in cost.values())
        and allocated_cost is not None,
        operations_completed=len(completed),
        operations_not_completed=len(not_completed),
        operations_in_flight=len(states) - len(completed) - len(not_completed),
        attempts_by_outcome=dict(sorted(Counter(a.outcome for a in inputs.attempts).items())),
        running_attempts=len(running),
        attempt_cost=_r(_sum(cost[a.attempt_id] for a in finished)),
        completed_cost=_r(completed_cost),
        cost_per_completed_operation=_r(_ratio(completed_cost, len(completed))),
        retry_cost=_r(retry_cost),
        retry_share=_r(_ratio(retry_cost, completed_cost)),
        lost_cost=_r(_sum(cost[a.attempt_id] for a in finished if a.outcome == LOST)),
        not_completed_cost=_r(_sum(cost[a.attempt_id] for o in not_completed for a in by_op[o]
                                   if a.attempt_id in cost)),
        allocated_cost=_r(allocated_cost),
        all_in_cost_per_completed_operation=_r(_ratio(allocated_cost, len(completed))),
        allocated_accelerator_hours=_r(acc_alloc),
        held_accelerator_hours=round(held_acc, 6),
        progress_accelerator_hours=round(progress_acc, 6),
        idle_accelerator_hours=_r(None if acc_alloc is None else acc_alloc - progress_acc),
        held_without_progress_accelerator_hours=round(held_acc - progress_acc, 6),
        cost_per_progress_accelerator_hour=_r(_ratio(acc_cost, progress_acc)),
        pools=pools,
        unpriced=unpriced,
        notes=notes,
    )


def _pools(inputs: CostInputs, prices: PriceTable, cost: Mapping[str, float | None],
           window_h: float, notes: list[str], unpriced: list[str]) -> list[PoolCost]:
    agents = inputs.agents or ()
    if inputs.agents is None:
        notes.append("agents were not recorded: no allocation, idle or all-in figures")
    names = sorted({a.pool for a in agents if a.pool} | {a.pool for a in inputs.attempts
                                                          if a.pool})
    out = []
    for name in names:
        price = prices.pools.get(name)
        members = [g for g in agents if g.pool == name]
        work = [a for a in inputs.attempts if a.pool == name]
        lost = [a for a in work if a.outcome == LOST]
        if price is None and members:
            unpriced.append(f"pool {name!r} ({len(members)} agent(s)) is not in the price "
                            "table: its allocation is not priced")
        alloc_nh: float | None = None
        if inputs.agents is not None and price is not None:
            shares = [None if g.cpus is None else price.node_share(g.cpus, g.accelerators)
                      for g in members]
            alloc_nh = _sum(None if s is None else s * window_h for s in shares)
            if alloc_nh is None:
                notes.append(f"pool {name!r}: an agent's vCPU slots were not recorded: its "
                             "allocation is unknown")

        def node_hours(hours_of, work=work, price=price) -> float | None:
            if price is None or any(a.cpus is None or a.accelerators is None for a in work):
                return None
            return sum(hours_of(a) * price.node_share(a.cpus, a.accelerators) for a in work)

        held_nh = node_hours(lambda a: held_hours(a, inputs.window_end))
        prog_nh = node_hours(lambda a: progress_hours(a, inputs.window_end))
        acc_alloc = None if inputs.agents is None else \
            float(sum(g.accelerators for g in members)) * window_h
        held_acc = sum((a.accelerators or 0) * held_hours(a, inputs.window_end) for a in work)
        prog_acc = sum((a.accelerators or 0) * progress_hours(a, inputs.window_end)
                       for a in work)
        finished = [a for a in work if a.attempt_id in cost]
        out.append(PoolCost(
            pool=name,
            priced=price is not None,
            instance_type=price.instance_type if price else None,
            capacity_type=price.capacity_type.value if price else None,
            price_per_hour=price.price_per_hour if price else None,
            agents=len(members),
            accelerators=sum(g.accelerators for g in members),
            attempts=len(work),
            running_attempts=sum(1 for a in work if a.outcome not in FINISHED),
            lost_attempts=len(lost),
            allocated_node_hours=_r(alloc_nh),
            held_node_hours=_r(held_nh),
            progress_node_hours=_r(prog_nh),
            activity=_r(_ratio(held_nh, alloc_nh)),
            productive=_r(_ratio(prog_nh, alloc_nh)),
            allocated_cost=_r(None if alloc_nh is None or price is None
                              else alloc_nh * price.price_per_hour),
            attempt_cost=_r(_sum(cost[a.attempt_id] for a in finished)),
            lost_cost=_r(_sum(cost[a.attempt_id] for a in lost if a.attempt_id in cost)),
            allocated_accelerator_hours=_r(acc_alloc),
            held_accelerator_hours=round(held_acc, 6),
            progress_accelerator_hours=round(prog_acc, 6),
            idle_accelerator_hours=_r(None if acc_alloc is None else acc_alloc - prog_acc),
        ))
    return out


# --------------------------------------------------------------------------- from records


def inputs_from_records(operations: Iterable[Operation], attempts: Iterable[Attempt],
                        events: Iterable[Event], agents: Iterable[AgentRecord] | None,
                        window_start: float, window_end: float) -> CostInputs:
    """The control plane's records (a game day's snapshot, or the same rows read from a live
    store) as cost inputs. Last progress = the last ``progress`` event of the attempt."""
    ops = {o.id: o for o in operations}
    last: dict[str, float] = {}
    for e in events:
        if e.attempt_id and e.kind == "progress":
            t = e.time.timestamp()
            last[e.attempt_id] = max(t, last.get(e.attempt_id, t))
    pool_of = None if agents is None else {g.name: g.pool for g in agents}
    usage = []
    for t in attempts:
        op = ops.get(t.operation_id)
        res = op.resources if op is not None else None
        cpus = res.cpu if res is not None else None
        accs = None if res is None else (res.accelerator.count if res.accelerator else 0)
        usage.append(AttemptUsage(
            operation_id=t.operation_id, attempt_id=t.id, number=t.number, outcome=t.state,
            pool=None if pool_of is None or t.agent_name is None
            else pool_of.get(t.agent_name),
            cpus=cpus, accelerators=accs, dispatched_at=t.created_at.timestamp(),
            started_at=t.started_at.timestamp() if t.started_at else None,
            ended_at=t.finished_at.timestamp() if t.finished_at else None,
            last_progress_at=last.get(t.id)))
    capacity = None if agents is None else tuple(
        AgentCapacity(g.name, g.pool, g.cpu_slots, g.accelerator_count) for g in agents)
    return CostInputs(window_start=window_start, window_end=window_end,
                      attempts=tuple(usage), operation_states={o: v.state for o, v in ops.items()},
                      agents=capacity)


def inputs_from_evidence(evidence: Evidence) -> CostInputs:
    """A game day's window: the run's start to the store snapshot."""
    return inputs_from_records(evidence.operations, evidence.attempts, evidence.events,
                               evidence.agents, evidence.run.started_at.timestamp(),
                               evidence.snapshot_time.timestamp())

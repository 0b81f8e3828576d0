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
- allocated(p) = sum over agents g of p of share(capacity of g) * hours(g), node-hours, where
  hours(g) runs from the later of the window's start and g's registration to the window's end
  (the store records no node stop: an upper bound for nodes that went away)
- allocated cost = allocated(p) * P; all-in cost per completed operation = total allocated
  cost / completed operations (includes idle capacity and the control plane's own pool)
- accelerator-hours: allocated = sum accelerators(g) * hours(g);
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
    since: float | None = None  # registered at; None: allocated from the window's start

    def hours(self, window_start: float, window_end: float) -> float:
        start = max(window_start, self.since) if self.since is not None else window_start
        return max(window_end - start, 0.0) / _HOUR


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
    return None if v is None else round(v, 9)


def summarize(inputs: CostInputs, prices: PriceTable) -> CostSummary:
    end = inputs.window_end
    notes = list(inputs.notes)
    reasons: Counter[str] = Counter()
    cost: dict[str, float | None] = {}  # finished attempts only
    for a in inputs.attempts:
        why = why_unpriced(a, prices)
        if why is not None:
            if a.outcome in FINISHED:
                cost[a.attempt_id] = None
            reasons[why] += 1
            continue
        if a.outcome in FINISHED:
            cost[a.attempt_id] = attempt_cost(a, prices.pools[a.pool or ""], end)

    unpriced = [f"{n} attempt(s): {why}" for why, n in sorted(reasons.items())]
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

    pools = _pools(inputs, prices, cost, notes, unpriced)
    allocated_cost = None if inputs.agents is None else _sum(p.allocated_cost for p in pools)
    acc_pools = [p for p in pools if p.accelerators or p.held_accelerator_hours]
    acc_alloc = _sum(p.allocated_accelerator_hours for p in pools) \
        if inputs.agents is not None else None
    # over every attempt, whatever its pool: an accelerator request is known without a price
    held_acc = sum((a.accelerators or 0) * held_hours(a, end) for a in inputs.attempts)
    progress_acc = sum((a.accelerators or 0) * progress_hours(a, end) for a in inputs.attempts)
    if any(a.accelerators is None for a in inputs.attempts):
        notes.append("an operation had no resource request: its accelerators are not counted")
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
        held_accelerator_hours=round(held_acc, 9),
        progress_accelerator_hours=round(progress_acc, 9),
        idle_accelerator_hours=_r(None if acc_alloc is None else acc_alloc - progress_acc),
        held_without_progress_accelerator_hours=round(held_acc - progress_acc, 9),
        cost_per_progress_accelerator_hour=_r(_ratio(acc_cost, progress_acc)),
        pools=pools,
        unpriced=unpriced,
        notes=notes,
    )


def _pools(inputs: CostInputs, prices: PriceTable, cost: Mapping[str, float | None],
           notes: list[str], unpriced: list[str]) -> list[PoolCost]:
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
            alloc_nh = _sum(None if g.cpus is None else price.node_share(
                g.cpus, g.accelerators) * g.hours(inputs.window_start, inputs.window_end)
                for g in members)
            if alloc_nh is None:
                notes.append(f"pool {name!r}: an agent's vCPU slots were not recorded: its "
                             "allocation is unknown")

        def node_hours(hours_of, work=work, price=price) -> float | None:
            if price is None or any(a.cpus is None or a.accelerators is None for a in work):
                return None
            return sum(hours_of(a) * price.node_share(a.cpus, a.accelerators) for a in work)

        held_nh = node_hours(lambda a: held_hours(a, inputs.window_end))
        if held_nh is not None and alloc_nh is not None and held_nh > alloc_nh * (1 + 1e-9):
            notes.append(f"pool {name!r}: attempts held more than its agents' declared capacity "
                         "over the window (activity above 100 %): the agents record understates "
                         "the pool, or attempts overlapped on the same slots")
        prog_nh = node_hours(lambda a: progress_hours(a, inputs.window_end))
        acc_alloc = None if inputs.agents is None else \
            sum(g.accelerators * g.hours(inputs.window_start, inputs.window_end)
                for g in members)
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
            held_accelerator_hours=round(held_acc, 9),
            progress_accelerator_hours=round(prog_acc, 9),
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
        AgentCapacity(g.name, g.pool, g.cpu_slots, g.accelerator_count,
                      g.registered_at.timestamp() if g.registered_at else None)
        for g in agents)
    return CostInputs(window_start=window_start, window_end=window_end,
                      attempts=tuple(usage), operation_states={o: v.state for o, v in ops.items()},
                      agents=capacity)


def inputs_from_evidence(evidence: Evidence) -> CostInputs:
    """A game day's window: the run's start to the store snapshot."""
    return inputs_from_records(evidence.operations, evidence.attempts, evidence.events,
                               evidence.agents, evidence.run.started_at.timestamp(),
                               evidence.snapshot_time.timestamp())


# --------------------------------------------------------------------------- rendering
# One set of rows for report.md, report.html and `gameday cost report`, so they say the same.

GATE_NOTE = "declared prices x measured attempt times; informational, never affects the gate"
POOL_HEADER = ("pool", "capacity", "price/node-h", "agents", "accelerators", "attempts (lost)",
               "allocated node-h", "activity", "productive", "allocated cost", "attempt cost",
               "lost cost", "idle accelerator-h")


def money(v: float | None, currency: str) -> str:
    return "not claimed (unpriced)" if v is None else f"{v:,.6f} {currency}"


def _num(v: float | None, unit: str = "") -> str:
    return "unknown" if v is None else f"{v:,.4f}{unit}"


def _share(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f} %"


def summary_rows(s: CostSummary) -> list[tuple[str, str]]:
    c = s.currency
    per_op = money(s.cost_per_completed_operation, c) if s.operations_completed \
        else "none completed"
    all_in = money(s.all_in_cost_per_completed_operation, c) if s.operations_completed \
        else "none completed"
    outcomes = ", ".join(f"{n} {k}" for k, n in s.attempts_by_outcome.items()) or "none"
    return [
        ("operations", (f"{s.operations_completed} completed, {s.operations_not_completed} "
                       f"failed or canceled, {s.operations_in_flight} in flight")),
        ("attempts", outcomes),
        ("cost per completed operation (its attempts, retries included)", per_op),
        ("retry cost of completed operations (failed and lost attempts)",
         f"{money(s.retry_cost, c)} ({_share(s.retry_share)} of their cost)"),
        ("lost attempts (lease expired: node or agent gone, e.g. a spot interruption)",
         money(s.lost_cost, c)),
        ("cost of operations that did not complete", money(s.not_completed_cost, c)),
        ("all finished attempts", money(s.attempt_cost, c)),
        ("allocated (every agent over the window)", money(s.allocated_cost, c)),
        ("all-in cost per completed operation (allocated / completed)", all_in),
        ("accelerator-hours allocated / held / with progress",
         (f"{_num(s.allocated_accelerator_hours)} / {_num(s.held_accelerator_hours)} / "
         f"{_num(s.progress_accelerator_hours)}")),
        ("idle accelerator-hours (allocated without progress)",
         (f"{_num(s.idle_accelerator_hours)} (of which held by attempts without progress: "
         f"{_num(s.held_without_progress_accelerator_hours)})")),
        ("cost per accelerator-hour with progress",
         money(s.cost_per_progress_accelerator_hour, c)
         if s.progress_accelerator_hours else "no accelerator progress"),
        ("attempts with no end (running or unknown, in no cost)", str(s.running_attempts)),
        ("per pipeline", s.per_pipeline),
    ]


def pool_rows(s: CostSummary) -> list[tuple[str, ...]]:
    c = s.currency
    return [(
        p.pool,
        p.capacity_type or "unpriced",
        "unpriced" if p.price_per_hour is None else f"{p.price_per_hour:g} {c}",
        str(p.agents),
        str(p.accelerators),
        f"{p.attempts} ({p.lost_attempts})",
        _num(p.allocated_node_hours),
        _share(p.activity),
        _share(p.productive),
        money(p.allocated_cost, c),
        money(p.attempt_cost, c),
        money(p.lost_cost, c),
        _num(p.idle_accelerator_hours),
    ) for p in s.pools]


def source_line(s: CostSummary) -> str:
    return (f"Prices: {s.price_table} ({s.price_source}), {s.currency}, declared, not "
            f"measured; {GATE_NOTE}.")

"""Seeded run directories with known answers, for tests and for anyone building against the
evidence format (docs/EVIDENCE.md). Everything is derived from the parameters, so a test can
state its expectation from the same parameters instead of from magic numbers.

    run = build_run(tmp_path / "run", FixtureSpec(lost_acks=3))
    # 3 of 1,000 acknowledged submissions missing -> durability 0.997, exit 2

Fixtures can also leave things OUT (a journal, the fault, the steady state, every write
report): a fixture that always contains everything hides the paths where evidence is missing.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

T0 = datetime(2025, 1, 6, 10, 0, 0, tzinfo=UTC)
LEAD_SECONDS = 30.0
EXPERIMENT_SECONDS = 120.0
GAP_SECONDS = 30.0
FAULT_OFFSET = 20.0  # fault starts this long after the experiment starts
FAULT_SECONDS = 30.0
OP_SECONDS = 5.0  # each normal operation: queued -> succeeded
REQUEST_EVERY = 0.25
AGENT = "agent-cpu-1"
REGION = "local"
# failure classes whose fault takes agents away, and their liveness timeout
LOSES_AGENTS = frozenset({"node-pool-exhausted", "zone-outage"})
LIVENESS_TIMEOUT = 5.0


@dataclass(frozen=True)
class ExperimentFixture:
    name: str  # failure-class id
    api_error_seconds: float = 0.0  # requests fail (503) for this long from fault start
    alerts: dict[str, float] = field(default_factory=dict)  # alert -> seconds after fault start
    expected_alerts: tuple[str, ...] = ()
    lost_acks: int = 0  # acknowledged during this experiment, missing from the store
    deviated: bool = False
    interrupted_at_step: int | None = None  # one training op loses its attempt at this step
    resume_from_step: int | None = None
    torn_resume: bool = False  # resume point has no manifest
    # the interrupted attempt's agent reports after its lease expired and is refused (fencing)
    stale_report: bool = False
    # --- evidence left out on purpose (each has a documented exit code, docs/EVIDENCE.md)
    journal: bool = True  # False: listed in run.json, no journal (runner refused or crashed)
    runner_status: str | None = None  # run.json experiment_status; default from the journal
    steady_state_before: bool = True  # False: Chaos Toolkit skips the method, no fault
    record_fault: bool = True  # False: the method ran but faults.jsonl has no fault_start
    # API requests fail (503) from this long after the fault ended until the run ends:
    # the system is stuck for good after the fault
    stuck_after_fault: float | None = None
    # Prometheus was down from the fault start to the journal end: no scrape and no ALERTS
    # sample in that stretch (prometheus/scrapes.json has a gap; slo/telemetry.py)
    telemetry_lost: bool = False


@dataclass(frozen=True)
class FixtureSpec:
    seed: int = 7
    env: str = "local"
    submissions: int = 1000
    lost_acks: int = 0  # outside any experiment's fault
    experiments: tuple[ExperimentFixture, ...] = (ExperimentFixture("api-replica-loss"),)
    checkpoint_every: int = 20
    max_retries: int | None = 3  # per operation; None: the snapshot does not record it
    agents: bool = True  # write snapshot/agents.jsonl
    report_writes: bool = True  # False: no checkpoint/artifact write reported (a key SLI, no data)
    list_experiments: bool = True  # run.json carries `experiments` and `experiment_status`
    scrapes: bool = True  # write prometheus/scrapes.json (Prometheus's own liveness)
    # prometheus/<name>.json recorded as failed by the collector (Prometheus unreachable)
    failed_queries: tuple[str, ...] = ()


@dataclass
class FixtureRun:
    path: Path
    spec: FixtureSpec
    fault_starts: dict[str, float]
    lost_keys: list[str]


def _injected(x: ExperimentFixture) -> bool:
    """The fault really happened (its effects are in the evidence), recorded or not."""
    return x.journal and x.steady_state_before


def _runner_status(x: ExperimentFixture) -> str:
    # the strings gameday/run.py writes into run.json experiment_status
    if x.runner_status is not None:
        return x.runner_status
    if not x.journal:
        return "no journal (chaos exited 1)"
    if not x.steady_state_before:
        return "refused: steady state not met before the method"
    return "deviated" if x.deviated else "completed"


def _iso(t: float, naive: bool = False) -> str:
    dt = T0 + timedelta(seconds=t)
    if naive:  # Chaos Toolkit writes naive UTC
        return dt.replace(tzinfo=None).isoformat()
    return dt.isoformat().replace("+00:00", "Z")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class _Writer:
    def __init__(self, spec: FixtureSpec) -> None:
        self.spec = spec
        self.operations: list[dict[str, Any]] = []
        self.attempts: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.objects: list[dict[str, Any]] = []
        self._n = 0

    def _id(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}-{self._n:06d}"

    def event(
        self,
        op: str,
        attempt: str | None,
        t: float,
        kind: str,
        frm: str | None = None,
        to: str | None = None,
        actor: str = "fixture",
        **data: Any,
    ) -> None:
        self.events.append(
            {
                "id": self._id("ev"),
                "operation_id": op,
                "attempt_id": attempt,
                "time": _iso(t),
                "actor": actor,
                "kind": kind,
                "from_state": frm,
                "to_state": to,
                "reason": None,
                "data": data,
            }
        )

    def write_set(self, prefix: str, files: list[str], manifest: str | None) -> None:
        digests = {}
        for name in files:
            digest = _sha(prefix + name)
            digests[name] = digest
            self.objects.append({"key": f"{prefix}/{name}", "size": 128, "sha256": digest})
        if manifest:
            self.objects.append(
                {
                    "key": f"{prefix}/{manifest}",
                    "size": 64,
                    "sha256": _sha(prefix),
                    "content": {"files": digests},
                }
            )

    def attempt(
        self,
        op: str,
        number: int,
        t0: float,
        t_end: float,
        state: str,
        steps: list[int],
        ckpt_every: int,
        resume: int | None = None,
        torn_at: int | None = None,
    ) -> str:
        a = self._id("att")
        self.attempts.append(
            {
                "id": a,
                "operation_id": op,
                "number": number,
                "state": state,
                "agent_name": AGENT,
                "created_at": _iso(t0),
                "started_at": _iso(t0 + 0.5),
                "finished_at": _iso(t_end),
                "error": None if state == "succeeded" else {"kind": "transient", "message": "lost"},
            }
        )
        agent = f"agent:{AGENT}"  # what the agent reports carries its actor (fencing)
        self.event(op, a, t0, "state_change", "queued", "dispatched")
        self.event(op, a, t0 + 0.5, "state_change", "dispatched", "running", actor=agent)
        if resume is not None:
            self.event(op, a, t0 + 0.6, "resumed", actor=agent, from_step=resume)
        span = max(t_end - t0 - 1.0, 0.1)
        for i, step in enumerate(steps):
            t = t0 + 0.7 + span * (i + 1) / (len(steps) + 1)
            self.event(op, a, t, "progress", actor=agent, step=step, total=steps[-1])
            if step % ckpt_every == 0:
                prefix = f"checkpoints/{op}/attempt-{number}/step-{step:08d}"
                torn = step == torn_at
                self.write_set(
                    prefix,
                    ["weights.npy", "optimizer.npz", "state.json"],
                    None if torn else "MANIFEST.json",
                )
                if not torn and self.spec.report_writes:
                    self.event(op, a, t + 0.01, "checkpoint_written", actor=agent, step=step,
                               prefix=prefix)
        if state == "succeeded":
            prefix = f"artifacts/{op}/attempt-{number}"
            self.write_set(prefix, ["model.npy", "metrics.json"], "COMPLETE.json")
            if self.spec.report_writes:
                self.event(op, a, t_end - 0.01, "artifact_written", actor=agent, prefix=prefix)
        return a

    def operation(
        self,
        key: str,
        created: float,
        *,
        ckpt_every: int,
        interrupted: tuple[int, int | None, bool] | None = None,
        interrupt_at: float | None = None,
        stale_report: bool = False,
    ) -> str:
        op = self._id("op")
        row: dict[str, Any] = {
            "id": op,
            "project": "team-a",
            "state": "succeeded",
            "idempotency_key": key,
            "created_at": _iso(created),
            "updated_at": _iso(created + OP_SECONDS),
            "queue": "default",
            "pending_reason": None,
            "workload": {
                "kind": "train",
                "params": {"steps": 2 * ckpt_every, "checkpoint_every": ckpt_every},
            },
            "resources": {"cpu": 1, "accelerator": None},
            "placement": {"regions": [REGION], "dataset": None},
        }
        if self.spec.max_retries is not None:
            row["max_retries"] = self.spec.max_retries
        self.operations.append(row)
        self.event(op, None, created, "state_change", None, "accepted")
        self.event(op, None, created + 0.01, "state_change", "accepted", "queued")
        if interrupted is None or interrupt_at is None:
            self.attempt(
                op,
                1,
                created + 0.5,
                created + OP_SECONDS,
                "succeeded",
                [ckpt_every, 2 * ckpt_every],
                ckpt_every,
            )
            self.event(op, None, created + OP_SECONDS, "state_change", "running", "succeeded")
            return op
        at_step, resume, torn = interrupted
        steps = list(range(ckpt_every // 2, at_step + 1, ckpt_every // 2))
        if not steps or steps[-1] != at_step:
            steps.append(at_step)  # the highest step reached is exactly the one interrupted
        lost = self.attempt(
            op,
            1,
            created + 0.5,
            interrupt_at,
            "lost",
            steps,
            ckpt_every,
            torn_at=resume if torn else None,
        )
        self.event(op, lost, interrupt_at, "lease_expired", actor="reconciler", agent=AGENT)
        if stale_report:  # the cut-off agent comes back and is refused: fencing works
            self.event(op, lost, interrupt_at + 5.0, "stale_report_refused",
                       actor=f"agent:{AGENT}")
        self.event(op, None, interrupt_at + 0.01, "state_change", "running", "retrying")
        self.event(op, None, interrupt_at + 0.02, "state_change", "retrying", "queued")
        start = resume or 0
        rest = list(range(start + ckpt_every // 2, at_step + 2 * ckpt_every, ckpt_every // 2))
        done = interrupt_at + 10.0
        self.attempt(op, 2, interrupt_at + 1.0, done, "succeeded", rest, ckpt_every, resume=resume)
        self.event(op, None, done, "state_change", "running", "succeeded")
        self.operations[-1]["updated_at"] = _iso(done)
        return op


def build_run(path: str | Path, spec: FixtureSpec = FixtureSpec()) -> FixtureRun:
    """Write a complete run directory under `path` and return what it should evaluate to."""
    rng = random.Random(spec.seed)
    root = Path(path)
    (root / "snapshot").mkdir(parents=True, exist_ok=True)
    (root / "prometheus").mkdir(exist_ok=True)
    w = _Writer(spec)
    n_exp = len(spec.experiments)
    run_end = LEAD_SECONDS + n_exp * (EXPERIMENT_SECONDS + GAP_SECONDS) + OP_SECONDS * 2
    windows = []
    for i, x in enumerate(spec.experiments):
        start = LEAD_SECONDS + i * (EXPERIMENT_SECONDS + GAP_SECONDS)
        windows.append((x, start, start + EXPERIMENT_SECONDS, start + FAULT_OFFSET))

    # acknowledged submissions spread evenly; the lost ones are chosen by seed
    last_ack = run_end - 2 * OP_SECONDS
    ack_times = [
        1.0 + (last_ack - 1.0) * k / max(spec.submissions - 1, 1) for k in range(spec.submissions)
    ]
    ledger, lost_keys = [], []
    keys = [f"key-{k:05d}" for k in range(spec.submissions)]
    lost_idx: set[int] = set()
    for x, start, end, fault in windows:
        inside = [k for k, t in enumerate(ack_times) if fault <= t <= fault + FAULT_SECONDS]
        lost_idx |= set(rng.sample(inside, min(x.lost_acks, len(inside))))
    outside = [
        k
        for k in range(spec.submissions)
        if k not in lost_idx and not any(s <= ack_times[k] <= e for _, s, e, _ in windows)
    ]
    lost_idx |= set(rng.sample(outside, min(spec.lost_acks, len(outside))))

    interrupts = {
        x.name: x for x, *_ in windows if x.interrupted_at_step is not None and _injected(x)
    }
    for k, t in enumerate(ack_times):
        op_id = f"pending-{k}"
        if k in lost_idx:
            lost_keys.append(keys[k])
        else:
            op_id = w.operation(keys[k], t - 0.01, ckpt_every=spec.checkpoint_every)
        ledger.append(
            {
                "operation_id": op_id,
                "idempotency_key": keys[k],
                "acked_at": _iso(t),
                "project": "team-a",
                "status": 201,
            }
        )
    for x, start, end, fault in windows:
        if x.name in interrupts:
            w.operation(
                f"train-{x.name}",
                fault - 15.0,
                ckpt_every=spec.checkpoint_every,
                interrupted=(x.interrupted_at_step or 0, x.resume_from_step, x.torn_resume),
                interrupt_at=fault,
                stale_report=x.stale_report,
            )

    requests = []
    t = 0.0
    while t < run_end:
        failing = any(
            fault <= t < fault + x.api_error_seconds
            or (x.stuck_after_fault is not None
                and t >= fault + FAULT_SECONDS + x.stuck_after_fault)
            for x, _, _, fault in windows
            if _injected(x)
        )
        requests.append(
            {
                "time": _iso(t),
                "method": "GET",
                "route": "get_operation",
                "status": 503 if failing else 200,
                "error": None,
                "latency_ms": 20.0,
            }
        )
        t += REQUEST_EVERY

    faults, alert_series = [], []
    for x, start, end, fault in windows:
        if not x.journal:
            continue  # never ran: no fault, no alert, no journal
        if _injected(x) and x.record_fault:
            faults.append(
                {
                    "time": _iso(fault),
                    "event": "fault_start",
                    "fault": x.name,
                    "target": "fixture",
                    "details": {},
                }
            )
            faults.append(
                {
                    "time": _iso(fault + FAULT_SECONDS),
                    "event": "fault_end",
                    "fault": x.name,
                    "target": "fixture",
                    "details": {},
                }
            )
        for alert, delay in x.alerts.items() if _injected(x) else ():
            first = T0.timestamp() + fault + delay
            values = [[first + 5 * i, "1"] for i in range(int((FAULT_SECONDS + 30) / 5))]
            if x.telemetry_lost:  # Prometheus was down: it evaluated no rule
                values = [v for v in values if not fault <= v[0] - T0.timestamp() <= end]
            alert_series.append(
                {
                    "metric": {
                        "__name__": "ALERTS",
                        "alertname": alert,
                        "alertstate": "firing",
                        "severity": "page",
                    },
                    "values": values,
                }
            )
        exp_dir = root / "experiments" / x.name
        exp_dir.mkdir(parents=True, exist_ok=True)
        journal = {
            "chaoslib-version": "1.44.0",
            "platform": "Linux-fixture",
            "node": "fixture",
            "experiment": {
                "version": "1.0.0",
                "title": f"{x.name} under load",
                "description": "fixture",
                "x-gameday": {
                    "recovery_objective": x.name,
                    "slos": [],
                    "expected_alerts": list(x.expected_alerts),
                    "runbook": x.name,
                    "blast_radius": "one component",
                },
                "method": [
                    {"type": "action", "name": f"inject-{x.name}", "provider": {"type": "python"}}
                ],
            },
            "start": _iso(start, naive=True),
            "end": _iso(end, naive=True),
            "duration": end - start,
            "status": "completed",
            "deviated": x.deviated,
            "steady_states": {
                "before": {"steady_state_met": x.steady_state_before, "probes": []},
                # Chaos Toolkit skips the method and the after-check when before is not met
                "after": {"steady_state_met": not x.deviated, "probes": []}
                if x.steady_state_before
                else None,
                "during": [],
            },
            "run": [
                {
                    "activity": {"type": "action", "name": f"inject-{x.name}"},
                    "status": "succeeded",
                    "start": _iso(fault, naive=True),
                    "end": _iso(fault + 0.1, naive=True),
                    "duration": 0.1,
                    "output": None,
                }
            ]
            if x.steady_state_before
            else [],
            "rollbacks": [],
        }
        (exp_dir / "journal.json").write_text(json.dumps(journal, indent=1))

    def jsonl(rel: str, rows: list[dict[str, Any]]) -> None:
        (root / rel).write_text("".join(json.dumps(r) + "\n" for r in rows))

    jsonl("ledger.jsonl", ledger)
    jsonl("requests.jsonl", requests)
    jsonl("faults.jsonl", faults)
    jsonl("snapshot/operations.jsonl", w.operations)
    jsonl("snapshot/attempts.jsonl", w.attempts)
    jsonl("snapshot/events.jsonl", sorted(w.events, key=lambda e: e["time"]))
    jsonl("snapshot/objects.jsonl", w.objects)
    if spec.agents:
        # the classes that take agents away: each lost agent is heard again when the fault
        # ends (routed-to-live-agents judges the dispatches against it; none went there)
        jsonl("snapshot/agent_liveness.jsonl", [{
            "agent": f"lost-{x.name}", "time": _iso(fault + FAULT_SECONDS),
            "silent_since": _iso(fault - LIVENESS_TIMEOUT), "timeout_seconds": LIVENESS_TIMEOUT,
        } for x, _, _, fault in windows if _injected(x) and x.name in LOSES_AGENTS])
        jsonl("snapshot/agents.jsonl", [{
            "name": AGENT, "pool": "cpu", "zone": f"{REGION}-a", "region": REGION,
            "datasets": [], "accelerator_type": None, "accelerator_count": 0,
            "cpu_slots": 4,
        }])
    (root / "load_stats.json").write_text(
        json.dumps(
            [
                {
                    "name": "get_operation",
                    "method": "GET",
                    "num_requests": len(requests),
                    "num_failures": sum(r["status"] >= 500 for r in requests),
                }
            ]
        )
    )
    (root / "prometheus" / "alerts.json").write_text(
        json.dumps(
            {
                "query": "ALERTS",
                "start": T0.timestamp(),
                "end": T0.timestamp() + run_end,
                "step": 5,
                "response": {
                    "status": "success",
                    "data": {"resultType": "matrix", "result": alert_series},
                },
            }
        )
    )
    down = [(fault, end) for x, _, end, fault in windows if x.telemetry_lost and _injected(x)]
    if spec.scrapes:
        points = [[T0.timestamp() + k * 5.0, "8"] for k in range(int(run_end / 5.0) + 1)
                  if not any(a <= k * 5.0 <= b for a, b in down)]
        _prom_file(root, "scrapes", "count(count_over_time(up[1m]))", run_end,
                   {"status": "success", "data": {"resultType": "matrix", "result": [
                       {"metric": {}, "values": points}]}})
    for name in spec.failed_queries:
        _prom_file(root, name, name, run_end, {"status": "error", "error": (
            "All connection attempts failed")})
    info: dict[str, Any] = {
        "run_id": f"fixture-{spec.seed}",
        "env": spec.env,
        "suite": "fixture",
        "platform": "fixture",
        "started_at": _iso(0),
        "ended_at": _iso(run_end),
        "snapshot_at": _iso(run_end),
        "versions": {"harness": "0.1.0"},
    }
    if spec.list_experiments:
        info["experiments"] = [x.name for x in spec.experiments]
        info["experiment_status"] = {
            x.name: {"status": _runner_status(x), "seconds": EXPERIMENT_SECONDS if x.journal
                     else 0.0, "detail": ""}
            for x in spec.experiments
        }
    (root / "run.json").write_text(json.dumps(info))
    return FixtureRun(root, spec, {x.name: T0.timestamp() + f for x, _, _, f in windows}, lost_keys)


def _prom_file(root: Path, name: str, query: str, run_end: float,
               response: dict[str, Any]) -> None:
    """prometheus/<name>.json as gameday/collect.py writes it (a failed query too)."""
    (root / "prometheus" / f"{name}.json").write_text(json.dumps({
        "query": query, "start": T0.timestamp(), "end": T0.timestamp() + run_end, "step": 5,
        "response": response}))


def example_experiments() -> tuple[ExperimentFixture, ...]:
    """A small suite that exercises every part of the report (used by `gameday slo fixture`)."""
    return (
        ExperimentFixture("api-replica-loss", api_error_seconds=5),
        ExperimentFixture(
            "db-primary-loss",
            api_error_seconds=20,
            alerts={"ApiAvailabilityBurnRate": 12},
            expected_alerts=("ApiAvailabilityBurnRate",),
        ),
        ExperimentFixture(
            "node-interruption-checkpoint",
            interrupted_at_step=50,
            resume_from_step=40,
            alerts={"ActiveProgressBurnRate": 25},
        ),
        ExperimentFixture("node-pool-exhausted"),
        # the invariants: fencing (a refused stale report), bounded retries, eligible placement
        ExperimentFixture(
            "agent-connectivity-loss",
            interrupted_at_step=50,
            resume_from_step=40,
            stale_report=True,
            alerts={"ActiveProgressBurnRate": 25},
        ),
        ExperimentFixture("registry-failure"),
        ExperimentFixture("ineligible-fallback-region"),
    )

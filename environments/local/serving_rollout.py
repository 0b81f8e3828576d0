"""The rollout controller of the local environment's model serving: a new version goes to the
canary replica (``model-2``) at share 0, then its share of requests is stepped through HAProxy's
weights; each step is analysed (the canary's 5xx ratio from HAProxy's own counters, its p99
and the golden set from probes sent to it directly) and judged by
controlplane/serving/rollout.py ``decide``: next step, hold, done (the new version on every
replica) or roll back (share 0, the stable version redeployed on the canary).

Every step, share and decision goes on the environment's timeline as a ``note``
(``rollout_*``), so a run's evidence shows the canary's traffic split over time.
docs/serving.md, "Rollouts".

Two seeded defects (controlplane/defects.py; test only) live here, read from the defects the
environment was switched to (``env.json`` ``defects``, as the schema step reads its own): the
controller is no process of its own to restart with them. ``rollback-off`` turns the policy's
rollback off (the decision path), ``canary-weight-ignored`` gives the canary the weight of a
full share whatever the step (the traffic path).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from controlplane import defects
from controlplane.serving.artifact import golden_correct, infer_request
from controlplane.serving.catalog import GOLDEN, GOOD, MODEL_NAME, VERSIONS
from controlplane.serving.rollout import Action, Analysis, Decision, Policy, decide, weights
from environments.local import haproxy_admin, serving
from environments.local.processes import Processes
from environments.local.state import EnvState

STABLE, CANARY = "model-1", "model-2"


@dataclass
class RolloutResult:
    version: str
    outcome: Action  # DONE or ROLLBACK (or HOLD when the steps ran out while holding)
    steps: list[dict[str, Any]] = field(default_factory=list)
    reasons: tuple[str, ...] = ()


class RolloutController:
    def __init__(self, state: EnvState, processes: Processes,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.state, self.processes, self.clock = state, processes, clock
        self.socket = state.endpoints["haproxy_socket"]

    def deployed(self, replica: str) -> str:
        return self.state.components[replica].labels["version"]

    def deploy(self, replica: str, version: str, timeout: float = 60.0) -> None:
        """Restart ``replica`` on ``version`` (its argv names the version and its digest) and
        wait until its model is loaded."""
        self.record(replica, version)
        self.processes.restart([replica], timeout=timeout)

    def record(self, replica: str, version: str) -> None:
        """Point ``replica``'s record (env.json: argv and labels) at ``version``; the running
        process is not touched (its next start serves it)."""
        if version not in VERSIONS:
            raise ValueError(f"unknown model version {version!r} (known: {', '.join(VERSIONS)})")
        spec = self.state.components[replica]
        store = spec.argv[spec.argv.index("--store") + 1]
        fresh = serving.component(self.state.dir, replica, spec.ports["http"], store, version)
        self.state.components[replica] = dataclasses.replace(spec, argv=fresh.argv,
                                                             labels=fresh.labels)
        self.state.save()

    def defect(self, name: str) -> bool:
        """Is the seeded defect ``name`` on in this environment (``gameday selftest``)?"""
        return name in defects.parse(",".join(self.state.info.get("defects", [])))

    def set_share(self, share: int) -> None:
        stable, canary = weights(share)
        if share and self.defect("canary-weight-ignored"):
            canary = weights(100)[1]  # the step's share ignored: the weight of a full share
        haproxy_admin.set_weight(self.socket, serving.BACKEND, STABLE, stable)
        haproxy_admin.set_weight(self.socket, serving.BACKEND, CANARY, canary)
        self.state.note("rollout_share", {"canary": CANARY, "share": share,
                                          "version": self.deployed(CANARY)})

    def analyse(self, seconds: float) -> Analysis:
        """The canary over ``seconds``: what HAProxy sent it (its own counters) plus golden
        probes sent to it directly (latency, errors, correctness)."""
        url = self.state.components[CANARY].labels["url"]
        before = haproxy_admin.counters(self.socket, serving.BACKEND)[CANARY]
        probes: list[tuple[float, int | None, bool | None]] = []
        end = self.clock() + seconds
        with httpx.Client(timeout=5.0) as client:
            while self.clock() < end:
                row = list(GOLDEN.inputs[len(probes) % len(GOLDEN.inputs)])
                probes.append(_probe(client, url, row))
                time.sleep(0.1)
        after = haproxy_admin.counters(self.socket, serving.BACKEND)[CANARY]
        latencies = sorted(ms for ms, status, _ in probes if status == 200)
        p99 = latencies[max(0, -(-99 * len(latencies) // 100) - 1)] if latencies else None
        failed = sum(1 for _, status, _ in probes if status is None or status >= 500)
        return Analysis(requests=after["stot"] - before["stot"] + len(probes),
                        errors=after["hrsp_5xx"] - before["hrsp_5xx"] + failed, p99_ms=p99,
                        golden_total=sum(1 for _, _, ok in probes if ok is not None),
                        golden_wrong=sum(1 for _, _, ok in probes if ok is False))

    def run(self, version: str, policy: Policy, step_seconds: float = 5.0,
            max_holds: int = 3, expect: str | None = None) -> RolloutResult:
        """Roll ``version`` out under ``policy``; ``expect`` (``rollback`` or ``done``) is what
        the caller declared should happen, noted for the objectives that judge the rollout
        (slo/rollout_invariants.py), never used to decide."""
        if self.defect("rollback-off"):
            policy = dataclasses.replace(policy, rollback=False)
        stable_version = self.deployed(STABLE)
        result = RolloutResult(version, Action.HOLD)
        self.state.note("rollout_start", {"version": version, "from": stable_version,
                                          "steps": list(policy.steps),
                                          "step_seconds": step_seconds,
                                          "rollback": policy.rollback,
                                          **({"expect": expect} if expect else {})})
        self.set_share(0)
        self.deploy(CANARY, version)
        step, holds = 0, 0
        self.set_share(policy.steps[0])
        while True:
            analysis = self.analyse(step_seconds)
            decision = decide(policy, step, analysis)
            self._record(result, step, policy.steps[step], analysis, decision)
            if decision.action is Action.STEP:
                step, holds = step + 1, 0
                self.set_share(decision.share)
                continue
            if decision.action is Action.HOLD:
                holds += 1
                if holds <= max_holds:
                    continue
                result.reasons = decision.reasons
                break
            result.outcome, result.reasons = decision.action, decision.reasons
            if decision.action is Action.ROLLBACK:
                self.set_share(0)
                self.deploy(CANARY, stable_version)
                self.set_share(50)  # both replicas on the stable version again: even weights
            else:  # DONE: the new version on the stable replica too, then even weights
                self.deploy(STABLE, version)
                self.set_share(50)
            break
        self.state.note("rollout_end", {"version": version, "outcome": result.outcome.value,
                                        "reasons": list(result.reasons)})
        return result

    def _record(self, result: RolloutResult, step: int, share: int, analysis: Analysis,
                decision: Decision) -> None:
        entry = {"step": step, "share": share, "requests": analysis.requests,
                 "errors": analysis.errors, "p99_ms": analysis.p99_ms,
                 "golden_total": analysis.golden_total, "golden_wrong": analysis.golden_wrong,
                 "decision": decision.action.value, "next_share": decision.share,
                 "reasons": list(decision.reasons)}
        result.steps.append(entry)
        self.state.note("rollout_step", {"version": result.version, **entry})


def _probe(client: httpx.Client, url: str, row: list[float]) -> tuple[float, int | None, bool | None]:
    """(latency ms, HTTP status or None, golden answer right?) of one golden row sent to
    ``url``; right is None when no answer came back (the error ratio judges that)."""
    body = infer_request(row)
    started = time.monotonic()
    try:
        answer = client.post(f"{url}/v2/models/{MODEL_NAME}/infer", json=body)
    except httpx.HTTPError:
        return (time.monotonic() - started) * 1000.0, None, None
    latency = (time.monotonic() - started) * 1000.0
    if answer.status_code != 200:
        return latency, answer.status_code, None
    try:
        output = float(answer.json()["outputs"][0]["data"][0])
    except (ValueError, KeyError, IndexError, TypeError):
        return latency, answer.status_code, False
    return latency, answer.status_code, bool(golden_correct(GOLDEN, row, output))


def reset(state: EnvState, processes: Processes) -> None:
    """Both replicas back on the good version at even weights (after a test or a game day)."""
    controller = RolloutController(state, processes)
    for replica in (CANARY, STABLE):
        if controller.deployed(replica) != GOOD:
            controller.deploy(replica, GOOD)
    controller.set_share(50)

"""A bad model rollout as a fault of the local environment: a new version rolled out to the
canary replica by the rollout controller (environments/local/serving_rollout.py), recorded on
the fault timeline from its start until the canary no longer serves it (rolled back, or done).

A rollout the controller left holding a failing canary (rollback off) stays an active fault:
``restore`` puts both replicas back on the good version at even weights, as ``restore_all``
does for every other fault; ``close`` (the environment going down) only points the canary's
record back at the stable version, so the next ``up`` does not start it on the bad one.
docs/serving.md, "bad-model-rollout".
"""

from __future__ import annotations

from typing import Any

from controlplane.serving.rollout import Action, Policy
from environments.local.fault_ledger import FaultLedger
from environments.local.processes import Processes
from environments.local.serving_rollout import CANARY, STABLE, RolloutController, reset
from environments.local.state import EnvState

KIND = "rollout"
EXPECTATIONS = ("rollback", "done")


class Rollouts:
    KINDS = (KIND,)

    def __init__(self, state: EnvState, processes: Processes, ledger: FaultLedger) -> None:
        self.state, self.processes, self.ledger = state, processes, ledger

    def rollout(self, version: str, policy: Policy, step_seconds: float,
                expect: str | None = None) -> dict[str, Any]:
        """Roll ``version`` out to the canary under ``policy`` and return how it ended (the
        controller's steps and reasons). ``expect``: what the experiment declares should happen
        (``rollback`` for a bad version), noted for the objectives, never used to decide."""
        if CANARY not in self.state.components:
            raise ValueError("this environment serves no model: start it with "
                             "`gameday env up --serving`")
        if expect is not None and expect not in EXPECTATIONS:
            raise ValueError(f"rollout expect {expect!r}: one of {', '.join(EXPECTATIONS)}")
        if self.ledger.is_active(KIND, CANARY):  # an earlier rollout left holding its canary
            self.ledger.end(KIND, CANARY, {"superseded_by": version})
        self.ledger.begin(KIND, CANARY, {"version": version, "expect": expect,
                                         "steps": list(policy.steps)})
        result = RolloutController(self.state, self.processes).run(
            version, policy, step_seconds, expect=expect)
        out = {"version": version, "outcome": result.outcome.value,
               "reasons": list(result.reasons), "steps": result.steps}
        if result.outcome is not Action.HOLD:  # the canary serves the bad version no more
            self.ledger.end(KIND, CANARY, {"version": version, "outcome": result.outcome.value})
        return out

    def restore(self, fault: dict[str, Any]) -> None:
        reset(self.state, self.processes)
        self.ledger.end(fault["fault"], fault["target"], {"restored_by": "restore_all"})

    def close(self, fault: dict[str, Any]) -> None:
        # the processes go down with the environment; `up` must start the canary on the
        # stable version, not on the one it was left holding
        controller = RolloutController(self.state, self.processes)
        controller.record(CANARY, controller.deployed(STABLE))

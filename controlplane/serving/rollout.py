"""The rollout controller's decision: given the canary's analysis for its current step, go to
the next canary share, hold, finish, or roll back. Pure; the I/O (weights, redeploys, probes,
counters) is environments/local/serving_rollout.py. docs/serving.md, "Rollouts".

A step is judged on three signals of the canary alone: its error ratio (5xx of the requests the
load balancer sent it), its p99 latency and the golden set (every golden row answered right).
Too few requests to judge is a hold, never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Action(str, Enum):
    STEP = "step"          # the canary passed: next share
    HOLD = "hold"          # not enough evidence yet, or failing with rollback off: same share
    ROLLBACK = "rollback"  # the canary failed: share 0, the stable version back on it
    DONE = "done"          # the last step passed: the new version everywhere


@dataclass(frozen=True)
class Policy:
    steps: tuple[int, ...] = (10, 25, 50, 100)  # the canary's share of requests, percent
    max_error_ratio: float = 0.02
    max_p99_ms: float = 250.0
    min_requests: int = 20  # requests the canary must have answered in a step before judging
    rollback: bool = True

    def __post_init__(self) -> None:
        if not self.steps or any(not 0 < s <= 100 for s in self.steps) \
                or list(self.steps) != sorted(set(self.steps)):
            raise ValueError(f"rollout steps {self.steps}: strictly increasing percents in 1..100")
        if not 0 <= self.max_error_ratio <= 1:
            raise ValueError(f"rollout max_error_ratio {self.max_error_ratio}: within 0..1")


@dataclass(frozen=True)
class Analysis:
    """What the canary did during one step."""

    requests: int       # answered or failed, as the load balancer counted them
    errors: int         # of which 5xx
    p99_ms: float | None
    golden_total: int   # golden rows sent to the canary
    golden_wrong: int   # of which answered wrong (or not at all)

    @property
    def error_ratio(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class Decision:
    action: Action
    share: int  # the canary's share after the decision, percent
    reasons: tuple[str, ...] = ()


def failures(policy: Policy, analysis: Analysis) -> list[str]:
    """Why the canary fails this step (empty: it passes)."""
    out = []
    if analysis.error_ratio > policy.max_error_ratio:
        out.append(f"error ratio {analysis.error_ratio:.3f} above {policy.max_error_ratio} "
                   f"({analysis.errors} of {analysis.requests})")
    if analysis.p99_ms is not None and analysis.p99_ms > policy.max_p99_ms:
        out.append(f"p99 {analysis.p99_ms:.0f} ms above {policy.max_p99_ms:.0f} ms")
    if analysis.golden_wrong:
        out.append(f"{analysis.golden_wrong} of {analysis.golden_total} golden answers wrong")
    return out


def decide(policy: Policy, step: int, analysis: Analysis) -> Decision:
    """The decision after ``analysis`` of step number ``step`` (index into ``policy.steps``)."""
    share = policy.steps[step]
    bad = failures(policy, analysis)
    if bad:
        if policy.rollback:
            return Decision(Action.ROLLBACK, 0, tuple(bad))
        return Decision(Action.HOLD, share, (*bad, "rollback is off"))
    if analysis.requests < policy.min_requests or analysis.golden_total == 0:
        why = (f"{analysis.requests} requests and {analysis.golden_total} golden probes: "
               f"too few to judge (at least {policy.min_requests} and 1)")
        return Decision(Action.HOLD, share, (why,))
    if step + 1 >= len(policy.steps):
        return Decision(Action.DONE, 100)
    return Decision(Action.STEP, policy.steps[step + 1])


def weights(share: int) -> tuple[int, int]:
    """HAProxy weights (stable, canary) giving the canary ``share`` percent of requests."""
    if not 0 <= share <= 100:
        raise ValueError(f"canary share {share}: within 0..100")
    return 100 - share, share

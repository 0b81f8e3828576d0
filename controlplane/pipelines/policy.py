"""An aggregation step's partial-failure policy, declared at submit time and applied when
every upstream step has ended."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Decision:
    run: bool  # start the aggregation step (with ``included`` only)
    included: list[str]
    excluded: dict[str, str]  # candidate -> why it was left out
    reason: str
    report: dict[str, object] = field(default_factory=dict)


def decide(policy: str, min_successful: int | None, outcomes: dict[str, tuple[bool, str]],
           ) -> Decision:
    """``outcomes``: upstream step -> (succeeded, why not). Every candidate is named in the
    report, included or excluded with its reason."""
    included = sorted(n for n, (ok, _) in outcomes.items() if ok)
    excluded = {n: why for n, (ok, why) in sorted(outcomes.items()) if not ok}
    report: dict[str, object] = {"policy": policy, "candidates": sorted(outcomes),
                                 "included": included, "excluded": excluded,
                                 "min_successful": min_successful}
    n, total = len(included), len(outcomes)
    if not excluded:
        return Decision(True, included, {}, f"all {total} candidates succeeded", report)
    if policy == "fail":
        return Decision(False, included, excluded,
                        f"policy fail: {len(excluded)} of {total} candidates failed", report)
    if policy == "accept-subset":
        assert min_successful is not None
        if n >= min_successful:
            return Decision(True, included, excluded, f"policy accept-subset: {n} of {total} "
                            f"candidates succeeded (minimum {min_successful})", report)
        return Decision(False, included, excluded, f"policy accept-subset: {n} of {total} "
                        f"candidates succeeded, fewer than the minimum {min_successful}", report)
    if policy == "continue-incomplete":
        if n == 0:
            return Decision(False, included, excluded,
                            f"policy continue-incomplete: none of {total} candidates succeeded",
                            report)
        return Decision(True, included, excluded, f"policy continue-incomplete: {n} of {total} "
                        f"candidates, {len(excluded)} excluded", report)
    raise ValueError(f"unknown policy {policy!r}")

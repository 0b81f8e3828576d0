"""Budget-aware scheduling (pure): which SLOs a game day touches, how much error budget each
has left, and whether the game day may spend more of it.

Which SLOs an experiment touches is read from what the evaluator already judges it against
(slo/experiment.py `declared`): the SLOs its `x-gameday` extension names plus those of its
recovery objective. A game day touches the union over its experiments.

Per touched SLO the remaining budget (share of one SLO window's error budget left, 1.0 =
untouched) comes from a source (slo/budget_sources.py: Prometheus or the run archive) and is
judged against the environment's floor `gate.minRemainingBudget`:

  ok            remaining >= floor
  below floor   remaining < floor: the game day skips (unless forced)
  no data       the source has nothing for this SLO: the game day skips (unless forced);
                missing data is never read as a full budget
  not tracked   the source cannot see this SLO by design (an evidence-only SLI has no
                Prometheus series); it does not block, and is listed as such

A skipped game day measured nothing: it has no verdict, only its record (`skipped.json`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from slo.specs import SpecError, Specs

SCHEMA = "gameday.budget-check/v1"
BUDGET_CHECK_FILE = "budget-check.json"  # a run that went ahead: read into its verdict
SKIPPED_FILE = "skipped.json"  # a skipped run: its only record, no verdict
EXIT_SKIPPED = 5  # not started: an SLO it touches is below the budget floor or has no data


class BudgetStatus(str, Enum):
    OK = "ok"
    BELOW_FLOOR = "below floor"
    NO_DATA = "no data"
    NOT_TRACKED = "not tracked"


BLOCKING = (BudgetStatus.BELOW_FLOOR, BudgetStatus.NO_DATA)


def experiment_slos(specs: Specs, recovery_objective: str, slos: Sequence[str],
                    where: str) -> list[str]:
    """The SLOs one experiment is judged against: its own `slos` then its recovery
    objective's, each once (the rule of slo/experiment.py `declared`)."""
    ro = specs.recovery_objectives.get(recovery_objective)
    if ro is None:
        raise SpecError(f"{where}: field recovery_objective: unknown {recovery_objective!r} "
                        f"(known: {', '.join(specs.recovery_objectives)})")
    names = ro.judged_slos(slos)
    for name in names:
        if name not in specs.slo_names:
            raise SpecError(f"{where}: field slos: unknown SLO {name!r}")
    return names


def touched_slos(specs: Specs,
                 experiments: Mapping[str, tuple[str, Sequence[str]]]) -> dict[str, list[str]]:
    """SLO name -> the experiments that touch it, in the specs' SLO order.
    `experiments`: name -> (recovery objective, SLOs named by its x-gameday extension)."""
    touched: dict[str, list[str]] = {}
    for exp, (ro, slos) in experiments.items():
        for name in experiment_slos(specs, ro, slos, f"experiment {exp}"):
            touched.setdefault(name, []).append(exp)
    return {n: touched[n] for n in specs.slo_names if n in touched}


class SloBudget(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    slo: str
    experiments: list[str] = Field(default_factory=list)
    remaining: float | None  # share of the window's budget left; None: no value
    status: BudgetStatus
    detail: str = ""


def judge(slo: str, experiments: Sequence[str], remaining: float | None, floor: float,
          detail: str = "", tracked: bool = True) -> SloBudget:
    if not tracked:
        status = BudgetStatus.NOT_TRACKED
    elif remaining is None:
        status = BudgetStatus.NO_DATA
    else:
        status = BudgetStatus.OK if remaining >= floor else BudgetStatus.BELOW_FLOOR
    return SloBudget(slo=slo, experiments=list(experiments), remaining=remaining,
                     status=status, detail=detail)


class BudgetCheck(BaseModel):
    """What the budget check saw before a game day: `skipped.json` of a skipped run,
    `budget-check.json` of a run that went ahead (forced or not), read into its verdict."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: str = Field(default=SCHEMA, alias="schema")
    env: str
    suite: str
    source: str  # "prometheus <url>" or "archive <location>"
    floor: float
    checked_at: float
    budgets: list[SloBudget]
    forced: bool = False

    @property
    def blocking(self) -> list[SloBudget]:
        return [b for b in self.budgets if b.status in BLOCKING]

    @property
    def skip(self) -> bool:
        """Skip the game day: some SLO it touches is below the floor or has no data."""
        return bool(self.blocking) and not self.forced

    @property
    def reason(self) -> str:
        if not self.blocking:
            return (f"every SLO touched has at least {self.floor:.0%} of its error budget left "
                    f"({self.source})")
        parts = [f"{b.slo} {_left(b)}" for b in self.blocking]
        head = "forced (--force) although the " if self.forced else ""
        return (f"{head}error budget is below the floor of {self.floor:.0%} or unknown: "
                + "; ".join(parts) + f" ({self.source})")


def _left(b: SloBudget) -> str:
    if b.status is BudgetStatus.NO_DATA:
        return f"no data ({b.detail})" if b.detail else "no data"
    assert b.remaining is not None
    return f"{b.remaining:.0%} left"

"""The report's serving section: reads the run's ``inference.jsonl`` (slo/inference_ledger.py)
and the rollout notes of ``faults.jsonl``, takes the fault windows from the verdict, and hands
them to the pure chart functions (slo/serving_charts.py).

A run without ``inference.jsonl`` has no serving section (its reports stay as they were). A
file that cannot be read gives a section saying which file, line and field, not a chart; the
verdict and its exit code are the evaluator's and do not change here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slo import inference_ledger
from slo.evidence import EvidenceError, FaultRecord, read_jsonl
from slo.serving_charts import FaultWindow, ServingView, serving_view
from slo.verdict import Verdict

FAULTS = "faults.jsonl"


@dataclass(frozen=True)
class ServingSection:
    view: ServingView | None = None
    problem: str | None = None  # why there is no chart although the run served predictions


def serving_section(verdict: Verdict, run_dir: Path) -> ServingSection | None:
    """None when the run has no inference records; else the view, or why it cannot be drawn."""
    path = run_dir / inference_ledger.FILE
    try:
        records = inference_ledger.read(path)
    except inference_ledger.InferenceLedgerError as exc:
        return ServingSection(problem=str(exc).replace(str(run_dir) + "/", ""))
    if not records:
        return None
    try:  # read as the evaluator reads it (slo/evidence.py)
        notes = read_jsonl(run_dir / FAULTS, run_dir, FaultRecord, required=False)
    except EvidenceError as exc:
        return ServingSection(problem=str(exc))
    windows = [FaultWindow(e.fault_start, e.fault_end, e.name) for e in verdict.experiments
               if e.measured and e.fault_start is not None and e.fault_end is not None]
    return ServingSection(view=serving_view(records, notes, windows,
                                            verdict.started_at, verdict.ended_at))

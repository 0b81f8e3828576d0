"""A ratio SLI's pass and what its events demonstrate (slo/confidence.py), wired through the
verdict, every output and the gate: shown next to the status, never scored."""

from __future__ import annotations

import html
import json
import xml.etree.ElementTree as ET
from pathlib import Path

from click.testing import CliRunner
from rich.console import Console

from slo.checks import sli_checks
from slo.compare import comparison_rows, load_verdicts
from slo.evaluate import EXIT_OBJECTIVE, EXIT_PASS, compute_outcomes, evaluate_run, summarize_slis
from slo.evidence import load_evidence
from slo.junit import junit_xml
from slo.report import demonstration_lines, render_html, render_markdown, write_reports
from slo.run_index import RunIndex
from slo.sli import Outcome
from slo.specs import load_specs
from slo.verdict import Verdict

LOCAL = load_specs("local")
TSC = "terminal-state-consistency"  # target 0.9999: one terminal operation per submission
PHRASE = ("consistent, not demonstrated (n=120, 95 % lower bound 97.53 %; "
          "needs >= 29,956 events)")
SHOWN = "demonstrated (n=30,000, 95 % lower bound 99.99 %)"


def _sli(verdict: Verdict, name: str):
    return next(s for s in verdict.slis if s.name == name)


def _check(verdict: Verdict, check_id: str):
    return next(c for c in verdict.checks if c.id == check_id)


def _small(make_run, **kwargs) -> tuple[Path, Verdict]:
    run = make_run(submissions=120, **kwargs)
    return run.path, evaluate_run(run.path)


def _with_clean_events(path: Path, name: str, n: int) -> Verdict:
    """The small run's verdict with SLI `name` recomputed over `n` good events: the evaluator
    needs minutes for a 30,000-submission fixture, the SLI math does not."""
    evidence = load_evidence(path)
    run = RunIndex.of(evidence, LOCAL)
    outcomes = compute_outcomes(run)
    outcomes[name] = [Outcome(run.start + i * 1e-3, True, f"e{i}") for i in range(n)]
    slis = summarize_slis(run, outcomes)
    base = evaluate_run(path)
    rest = [c for c in base.checks if not c.id.startswith("sli.")]
    return base.model_copy(update={"slis": slis, "checks": sli_checks(LOCAL, slis, {}) + rest})


def test_a_small_run_passes_consistent_not_demonstrated(make_run) -> None:
    _, verdict = _small(make_run)
    # the gate is what it was: every check a pass, score 100, exit 0
    assert (verdict.result, verdict.exit_code, verdict.score) == ("pass", EXIT_PASS, 100.0)
    assert all(c.status == "pass" for c in verdict.checks)
    s, c = _sli(verdict, TSC), _check(verdict, f"sli.{TSC}")
    assert s.total == 120 and s.demonstration is not None and s.demonstration == c.demonstration
    assert s.demonstration.classification == "consistent" and s.demonstration.text == PHRASE
    assert s.demonstration.events_needed == 29_956
    # 120 clean events do show 95 %; time slices are not independent events
    assert _sli(verdict, "time-to-usable-result").demonstration.classification == "demonstrated"
    assert _sli(verdict, "queue-age").demonstration is None
    assert _check(verdict, "sli.active-progress").demonstration is None
    assert f"sli.{TSC}: pass, {PHRASE}" in demonstration_lines(verdict)
    assert not any("time-to-usable-result" in line for line in demonstration_lines(verdict))


def test_thirty_thousand_clean_events_demonstrate_four_nines(make_run) -> None:
    path, _ = _small(make_run)
    verdict = _with_clean_events(path, TSC, 30_000)
    s = _sli(verdict, TSC)
    assert (s.total, s.demonstration.classification, s.demonstration.text) == (
        30_000, "demonstrated", SHOWN)
    assert _check(verdict, f"sli.{TSC}").status == "pass"
    assert not any(TSC in line for line in demonstration_lines(verdict))
    md = render_markdown(verdict)
    assert SHOWN in md and PHRASE not in md
    case = next(c for c in ET.fromstring(junit_xml(verdict)).iter("testcase")
                if c.get("name") == f"sli.{TSC}")
    assert case.find("system-out") is None and case.find("failure") is None
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["demonstration"] == "demonstrated" and props["events"] == "30000"


def test_every_output_says_consistent_not_demonstrated(make_run, tmp_path: Path) -> None:
    path, verdict = _small(make_run)
    paths = write_reports(verdict, path, LOCAL)
    # verdict.json: the new fields, on the SLI and on its check
    data = json.loads(paths["verdict.json"].read_text())
    sli = next(s for s in data["slis"] if s["name"] == TSC)
    assert sli["demonstration"]["text"] == PHRASE
    assert sli["demonstration"]["classification"] == "consistent"
    assert next(c for c in data["checks"] if c["id"] == f"sli.{TSC}")["demonstration"] == (
        sli["demonstration"])
    assert Verdict.model_validate(data) == verdict
    # junit.xml: the case passes, and says it
    root = ET.parse(paths["junit.xml"]).getroot()
    case = next(c for c in root.iter("testcase") if c.get("name") == f"sli.{TSC}")
    assert all(case.find(x) is None for x in ("failure", "error", "skipped"))
    assert case.find("system-out").text.startswith(PHRASE)
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props == {"demonstration": "consistent", "events": "120",
                     "lower_bound": repr(0.05 ** (1 / 120)), "events_needed": "29956"}
    assert root.get("failures") == "0" and root.get("exit_code") == "0"
    # report.md and report.html: next to the status, in the SLI's row
    md = paths["report.md"].read_text()
    assert f"| Terminal-state consistency (key) | pass | {PHRASE} |" in md
    page = html.unescape(paths["report.html"].read_text())
    assert f'<td class="notdemonstrated">{PHRASE}</td>' in page
    # gameday slo compare
    rows = dict(comparison_rows(load_verdicts([path])))
    assert rows[f"SLI {TSC}"] == [f"100% (met, target 99.99%; {PHRASE})"]
    from slo.cli import slo_group

    out = CliRunner().invoke(slo_group, ["compare", str(path)])
    assert out.exit_code == 0 and PHRASE in out.output


def test_the_gate_prints_it_and_keeps_exit_0(make_run) -> None:
    from gameday.run import evaluate

    run = make_run(submissions=120)
    console = Console(record=True, width=250)
    assert evaluate(run.path, console, None) == EXIT_PASS
    text = console.export_text()
    assert f"sli.{TSC}: pass, {PHRASE}" in text
    assert "PASS score 100.0" in text


def test_a_missed_ratio_still_fails_as_before_and_says_what_it_shows(make_run) -> None:
    _, verdict = _small(make_run, lost_acks=1)
    c = _check(verdict, "sli.submission-durability")
    assert c.status == "fail" and verdict.exit_code == EXIT_OBJECTIVE
    assert c.demonstration.classification == "violated" and c.demonstration.events_needed is None
    case = next(x for x in ET.fromstring(junit_xml(verdict)).iter("testcase")
                if x.get("name") == c.id)
    assert "demonstration: violated (n=120, 95 % lower bound " in case.find("failure").text
    assert not any("submission-durability" in line for line in demonstration_lines(verdict))


def test_verdicts_written_before_still_load_and_render(make_run) -> None:
    path, verdict = _small(make_run)
    data = json.loads(verdict.to_json())
    for item in data["slis"] + data["checks"]:
        del item["demonstration"]
    old = Verdict.model_validate(data)
    assert all(s.demonstration is None for s in old.slis)
    assert (old.result, old.exit_code, old.score) == (verdict.result, verdict.exit_code,
                                                      verdict.score)
    assert demonstration_lines(old) == []
    md = render_markdown(old)
    assert "| Terminal-state consistency (key) | pass | n/a |" in md
    assert "consistent" not in md and "consistent" not in junit_xml(old)
    assert "consistent" not in render_html(old, LOCAL)
    (path / "verdict.json").write_text(json.dumps(data))
    assert dict(comparison_rows(load_verdicts([path])))[f"SLI {TSC}"] == [
        "100% (met, target 99.99%)"]


def test_offline_recompute_from_the_run_directory(make_run) -> None:
    """`gameday evaluate RUN_DIR` recomputes it from the raw evidence; `gameday slo report`
    re-renders the same report from verdict.json."""
    from slo.cli import evaluate_cmd, slo_group

    path, _ = _small(make_run)
    result = CliRunner().invoke(evaluate_cmd, [str(path)], env={"COLUMNS": "250"})
    assert result.exit_code == EXIT_PASS, result.output
    data = json.loads((path / "verdict.json").read_text())
    assert next(s for s in data["slis"] if s["name"] == TSC)["demonstration"]["text"] == PHRASE
    before = (path / "report.md").read_text()
    (path / "report.md").unlink()
    assert CliRunner().invoke(slo_group, ["report", str(path)]).exit_code == 0
    assert (path / "report.md").read_text() == before and PHRASE in before

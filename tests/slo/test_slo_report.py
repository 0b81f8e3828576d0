"""Outputs: JUnit (one case per objective per experiment), Markdown, self-contained HTML."""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from slo.evaluate import evaluate_run
from slo.fixtures import example_experiments
from slo.report import write_reports
from slo.specs import load_specs

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
STEP = load_specs("local").evaluation.sample_interval_seconds


@pytest.fixture
def reported(make_run):
    run = make_run(*example_experiments(), lost_acks=1)
    verdict = evaluate_run(run.path)
    paths = write_reports(verdict, run.path)
    return verdict, paths


def test_junit_has_one_case_per_objective_per_experiment(reported) -> None:
    verdict, paths = reported
    root = ET.parse(paths["junit.xml"]).getroot()
    cases = root.findall(".//testcase")
    # every check, the experiment's own outcome ("<name>.experiment") being one of them
    assert len(cases) == len(verdict.checks)
    assert {f"{e.name}.experiment" for e in verdict.experiments} <= {c.get("name") for c in cases}
    assert int(root.get("tests")) == len(cases)
    failed = {c.get("name") for c in cases if c.find("failure") is not None}
    expected = {c.id for c in verdict.checks if c.status == "fail"}
    assert failed == expected and failed
    assert root.get("result") == verdict.result and root.get("exit_code") == str(verdict.exit_code)
    suites = {s.get("name") for s in root.findall("testsuite")}
    assert suites == {"slis", *(e.name for e in verdict.experiments)}


def test_markdown_report_covers_every_experiment(reported) -> None:
    verdict, paths = reported
    text = paths["report.md"].read_text()
    assert text.startswith(f"# Game day {verdict.run_id}: {verdict.result.upper()}")
    for e in verdict.experiments:
        assert f"## {e.name}:" in text
        assert f"runbooks/{e.runbook}.md" in text
    for s in verdict.slis:
        assert s.display_name in text


def test_html_report_is_self_contained(reported) -> None:
    verdict, paths = reported
    html = paths["report.html"].read_text()
    assert "<script" not in html
    assert not re.search(r'(src|href)="(https?:)?//', html), "no remote resources"
    # per experiment its SLI timeline and, measured, the load around its fault
    assert html.count('aria-label="SLI timeline') == len(verdict.experiments)
    assert html.count('aria-label="load around') == sum(
        1 for e in verdict.experiments if e.measured and e.load)
    assert html.count("<svg") == html.count('aria-label="SLI timeline') + html.count(
        'aria-label="load around')
    for e in verdict.experiments:
        assert f'href="runbooks/{e.runbook}.md"' in html
        assert f"RTO {e.rto_seconds:g}s" in html  # the RTO deadline marker


def _screenshot(url: str, png: Path, profile: Path) -> None:
    proc = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            f"--screenshot={png}",
            "--window-size=1280,2000",
            url,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert png.is_file(), proc.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")
def test_html_renders_in_headless_chromium(reported, tmp_path: Path) -> None:
    _, paths = reported
    blank = tmp_path / "blank.html"
    blank.write_text("<!doctype html><title>blank</title>")
    _screenshot(paths["report.html"].resolve().as_uri(), tmp_path / "report.png", tmp_path / "p1")
    _screenshot(blank.resolve().as_uri(), tmp_path / "blank.png", tmp_path / "p2")
    # PNG size tracks visual content: charts, tables and text compress far worse than a blank
    # page (an error page or unstyled dump would be close to blank)
    report, empty = (
        (tmp_path / "report.png").stat().st_size,
        (tmp_path / "blank.png").stat().st_size,
    )
    assert report > 10 * empty


def test_reports_can_be_rerendered_from_verdict_json(reported) -> None:
    from click.testing import CliRunner

    from slo.cli import slo_group

    _verdict, paths = reported
    before = paths["report.md"].read_text()
    paths["report.md"].unlink()
    result = CliRunner().invoke(slo_group, ["report", str(paths["verdict.json"].parent)])
    assert result.exit_code == 0, result.output
    assert paths["report.md"].read_text() == before


def test_all_five_outputs_agree_for_a_not_measured_run(make_run, tmp_path: Path) -> None:
    """CLI headline, verdict.json, junit.xml, report.md and report.html of a run whose only
    experiment never injected its fault: none may say PASS, all carry exit code 1."""
    import html as html_lib
    import json

    from click.testing import CliRunner

    from slo.cli import evaluate_cmd
    from slo.fixtures import ExperimentFixture
    from slo.report import headline

    run = make_run(ExperimentFixture("api-replica-loss", steady_state_before=False))
    result = CliRunner().invoke(evaluate_cmd, [str(run.path)], env={"COLUMNS": "250"})
    verdict_json = json.loads((run.path / "verdict.json").read_text())
    from slo.verdict import Verdict

    verdict = Verdict.model_validate(verdict_json)
    code = verdict.exit_code
    assert code == result.exit_code == 1
    assert verdict.result == "fail" and verdict_json["result"] == "fail"
    line = headline(verdict)
    assert line.startswith("FAIL ") and line.endswith("(exit 1)")
    assert "not measured: api-replica-loss (steady state not met before the method)" in line

    cli = " ".join(result.output.split())
    junit = ET.parse(run.path / "junit.xml").getroot()
    md = (run.path / "report.md").read_text()
    page = html_lib.unescape((run.path / "report.html").read_text())
    for name, text in (("cli", cli), ("junit", ET.tostring(junit, encoding="unicode")),
                       ("report.md", md), ("report.html", page)):
        assert "PASS" not in text, name
    assert line in cli and line in md and line in page
    assert md.splitlines()[0].endswith(": FAIL")
    assert "<title>Game day fixture-7: FAIL</title>" in page
    assert junit.get("result") == "fail" and junit.get("exit_code") == "1"
    # every objective of the experiment is an <error> (not measured), none a pass
    errors = {c.get("name") for c in junit.iter("testcase") if c.find("error") is not None}
    assert errors == {c.id for c in verdict.checks if c.experiment == "api-replica-loss"}
    assert int(junit.get("errors")) == len(errors)


def test_v1_verdicts_read_back_never_say_pass_above_a_non_zero_exit(reported) -> None:
    import json

    from slo.report import headline
    from slo.verdict import Verdict

    verdict, paths = reported
    v1 = json.loads(paths["verdict.json"].read_text())
    v1.update(schema="gameday.verdict/v1", result="pass", exit_code=1)
    del v1["scored_checks"]
    old = Verdict.model_validate(v1)
    assert old.result == "fail" and old.scored_checks == verdict.scored_checks > 0
    assert headline(old).startswith("FAIL ")
    v1.update(result="warning", exit_code=3)
    assert Verdict.model_validate(v1).result == "error"

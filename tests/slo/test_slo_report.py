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
    # every check, plus one "experiment completed" case per experiment
    assert len(cases) == len(verdict.checks) + len(verdict.experiments)
    assert int(root.get("tests")) == len(cases)
    failed = {c.get("name") for c in cases if c.find("failure") is not None}
    expected = {c.id for c in verdict.checks if c.status == "fail"}
    expected |= {f"{e.name}.experiment" for e in verdict.experiments if not e.experiment_ok}
    assert failed == expected and failed
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
    assert html.count("<svg") == len(verdict.experiments)
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

"""A run directory's verdict: evaluate it (slo/), write its reports, print the verdict, and
archive it beside the runs it is compared with."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from gameday.output import say
from slo.archive import Archive, ArchiveError, open_archive
from slo.cli import print_verdict
from slo.evaluate import EXIT_EVIDENCE, evaluate_run
from slo.evidence import EvidenceError
from slo.report import write_reports
from slo.specs import SpecError


def evaluate(run_dir: Path, console: Console, archive_at: str | None = None) -> int:
    """Evaluate the run; with `archive_at`, compare it with the last passing run of the same
    suite and env there, then archive it (evidence, verdict and reports). A run that cannot be
    archived is said in red; the exit code stays the verdict's (the evidence is in run_dir)."""
    archive: Archive | None = None
    if archive_at is not None:
        try:
            archive = open_archive(archive_at)
        except ArchiveError as exc:
            say(console, f"[bold red]archive unusable[/]: {exc}: the run is not compared "
                         "with a baseline nor archived")
    try:
        verdict = evaluate_run(run_dir, baseline_archive=archive)
    except (EvidenceError, SpecError) as exc:
        say(console, f"[bold red]evidence unusable[/]: {exc}")
        return EXIT_EVIDENCE
    paths = write_reports(verdict, run_dir)
    print_verdict(verdict, console)
    say(console, f"report: {paths['report.html']}\njunit: {paths['junit.xml']}")
    if archive is not None:
        try:
            entry = archive.put(run_dir, verdict)
            say(console, f"archived: {entry.location}")
        except (ArchiveError, OSError, ValueError) as exc:
            say(console, f"[bold red]not archived[/]: {exc}")
    return verdict.exit_code

"""JUnit XML: one test case per objective per experiment, plus the run-level SLIs and each
experiment's own status, so CI shows exactly which promise broke."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from slo.verdict import Check, Verdict


def _case(
    suite: ET.Element, classname: str, name: str, status: str | None, message: str, detail: str
) -> None:
    case = ET.SubElement(suite, "testcase", classname=classname, name=name, time="0")
    if status == "fail":
        ET.SubElement(case, "failure", message=message, type="ObjectiveMissed").text = detail
    elif status is None:
        ET.SubElement(case, "skipped", message=f"no data: {message}")
    elif status == "warning":
        ET.SubElement(case, "system-out").text = f"WARNING: {message}\n{detail}"


def _detail(c: Check) -> str:
    lines = [
        f"objective: {c.objective}",
        f"measured: {c.measured}",
        f"criteria: {c.expected}",
        f"weight: {c.weight:g}{' (key)' if c.key else ''}",
    ]
    if c.baseline is not None:
        lines.append(f"baseline (last passing runs): {c.baseline:g}")
    return "\n".join(lines)


def junit_xml(verdict: Verdict) -> str:
    root = ET.Element("testsuites", name=f"gameday {verdict.run_id}")
    run_suite = ET.SubElement(root, "testsuite", name="slis")
    for c in verdict.checks:
        if c.experiment is None:
            _case(run_suite, "gameday.slis", c.id, c.status, c.message, _detail(c))
    for e in verdict.experiments:
        suite = ET.SubElement(root, "testsuite", name=e.name)
        status = "pass" if e.experiment_ok else "fail"
        msg = f"journal status {e.journal_status}" + (", deviated" if e.deviated else "")
        _case(
            suite,
            f"gameday.{e.name}",
            f"{e.name}.experiment",
            status,
            msg,
            f"steady state before met: {e.steady_state_before_met}",
        )
        for c in verdict.checks:
            if c.experiment == e.name:
                _case(suite, f"gameday.{e.name}", c.id, c.status, c.message, _detail(c))
    for name, why in sorted(verdict.not_applicable.items()):
        suite = ET.SubElement(root, "testsuite", name=name)
        case = ET.SubElement(suite, "testcase", classname=f"gameday.{name}",
                             name=f"{name}.experiment")
        ET.SubElement(case, "skipped", message=f"not applicable to {verdict.platform}: {why}")
    total_failures = 0
    for suite in root:
        cases = suite.findall("testcase")
        failures = sum(1 for c in cases if c.find("failure") is not None)
        total_failures += failures
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(failures))
        suite.set("errors", "0")
        suite.set("skipped", str(sum(1 for c in cases if c.find("skipped") is not None)))
    root.set("tests", str(sum(int(s.get("tests", "0")) for s in root)))
    root.set("failures", str(total_failures))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"

"""JUnit XML: one test case per check (the run-level SLIs, and per experiment its own outcome
and every objective), so CI shows exactly which promise broke.

fail -> <failure>; not_measured -> <error> (the experiment did not run as designed, so the
objective was never tested; message = the reason); no_data (non-key SLI) -> <skipped>;
warning -> passes with a note. The root carries the verdict's result and exit code.

An event-ratio SLI's case carries what its events demonstrate (slo/confidence.py) as
properties (demonstration, events, lower_bound, events_needed); a pass its events do not
demonstrate still passes, with "consistent, not demonstrated (...)" in its system-out.

With a baseline (slo/baseline.py), a `baseline` suite holds one case per objective: regressed
passes with a WARNING note (a regression turns the gate into a warning, never a failure),
"no baseline" and "not measured" are skipped with the reason."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from slo.verdict import Check, Demonstration, Verdict


def _properties(case: ET.Element, d: Demonstration) -> None:
    props = ET.SubElement(case, "properties")
    for name, value in (("demonstration", d.classification), ("events", d.events),
                        ("lower_bound", repr(d.lower_bound)),
                        ("events_needed", "" if d.events_needed is None else d.events_needed)):
        ET.SubElement(props, "property", name=name, value=str(value))


def _case(
    suite: ET.Element, classname: str, name: str, status: str | None, message: str, detail: str,
    demonstration: Demonstration | None = None,
) -> None:
    case = ET.SubElement(suite, "testcase", classname=classname, name=name, time="0")
    if demonstration is not None:
        _properties(case, demonstration)
        if status == "pass" and demonstration.classification == "consistent":
            # still a pass; said where CI shows a passing case's output
            ET.SubElement(case, "system-out").text = f"{demonstration.text}\n{detail}"
            return
        detail += f"\ndemonstration: {demonstration.text}"
    if status == "fail":
        ET.SubElement(case, "failure", message=message, type="ObjectiveMissed").text = detail
    elif status == "not_measured":
        ET.SubElement(case, "error", message=message, type="NotMeasured").text = detail
    elif status in ("no_data", None):
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
    root.set("result", verdict.result)
    root.set("exit_code", str(verdict.exit_code))
    root.set("reason", verdict.reason)
    run_suite = ET.SubElement(root, "testsuite", name="slis")
    for c in verdict.checks:
        if c.experiment is None:
            _case(run_suite, "gameday.slis", c.id, c.status, c.message, _detail(c),
                  c.demonstration)
    for e in verdict.experiments:
        suite = ET.SubElement(root, "testsuite", name=e.name)
        for c in verdict.checks:
            if c.experiment == e.name:
                _case(suite, f"gameday.{e.name}", c.id, c.status, c.message, _detail(c))
    for name, why in sorted(verdict.not_applicable.items()):
        suite = ET.SubElement(root, "testsuite", name=name)
        case = ET.SubElement(suite, "testcase", classname=f"gameday.{name}",
                             name=f"{name}.experiment")
        ET.SubElement(case, "skipped", message=f"not applicable to {verdict.platform}: {why}")
    if verdict.baseline is not None:
        b = verdict.baseline
        root.set("baseline_run", b.run_id or "")
        suite = ET.SubElement(root, "testsuite", name="baseline")
        for o in b.objectives:
            case = ET.SubElement(suite, "testcase", classname="gameday.baseline",
                                 name=f"{o.id}.baseline", time="0")
            runs = f" (worst of {', '.join(b.run_ids)})" if len(b.run_ids) > 1 else ""
            detail = (f"baseline run: {b.run_id or 'none'}{runs}\nbaseline: {o.baseline}\n"
                      f"current: {o.current}\nchange: {o.change}")
            if o.result in ("no baseline", "not measured"):
                ET.SubElement(case, "skipped", message=f"{o.result}: {o.change}")
            elif o.result == "regressed":
                ET.SubElement(case, "system-out").text = (
                    f"WARNING: regressed against run {b.run_id}: {o.change}\n{detail}")
            else:
                ET.SubElement(case, "system-out").text = f"{o.result}: {o.change}\n{detail}"
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in root:
        cases = suite.findall("testcase")
        counts = {
            "tests": len(cases),
            "failures": sum(1 for c in cases if c.find("failure") is not None),
            "errors": sum(1 for c in cases if c.find("error") is not None),
            "skipped": sum(1 for c in cases if c.find("skipped") is not None),
        }
        for key, n in counts.items():
            suite.set(key, str(n))
            totals[key] += n
    for key, n in totals.items():
        root.set(key, str(n))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"

"""Runbooks (``runbooks/<id>.md``): load, validate, and check who references whom.

A runbook is Markdown with YAML front matter between two ``---`` lines::

    ---
    id: db-primary-loss                 # equals the file name without .md
    title: Control-plane DB primary loss
    kind: failure-class                 # or: alert
    alerts: [ApiAvailabilityBurnRate]   # alert names it covers
    slos: [api-availability]            # SLO names (slo/specs/openslo)
    experiment: chaos/experiments/db-primary-loss.yaml   # failure classes only
    related: [alert-api-availability-burn]               # other runbook ids
    ---

and the level-2 sections of :data:`SECTIONS`, ``## Recover`` holding the level-3
subsections of :data:`RECOVER_SUBSECTIONS`. Validation is its own step: :func:`load_runbooks`
either returns every runbook or raises one :class:`RunbookError` listing each problem as
``<file>: <field or section>: <reason>``. :func:`check_references` then compares the runbooks
with what points at them (generated alerts, recovery objectives, experiments) and returns
problems as data.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "FRONT_MATTER_FIELDS",
    "RECOVER_SUBSECTIONS",
    "RUNBOOK_DIR",
    "SECTIONS",
    "Kind",
    "Runbook",
    "RunbookError",
    "alert_runbook_refs",
    "check_references",
    "experiment_runbook_refs",
    "load_runbooks",
    "objective_runbook_refs",
]

RUNBOOK_DIR = Path(__file__).resolve().parent.parent / "runbooks"
SECTIONS: tuple[str, ...] = ("Symptoms", "Confirm", "Decide", "Recover", "Verify", "Rehearse")
RECOVER_SUBSECTIONS: tuple[str, ...] = ("Local environment", "AWS / Kubernetes")
FRONT_MATTER_FIELDS: tuple[str, ...] = (
    "id",
    "title",
    "kind",
    "alerts",
    "slos",
    "experiment",
    "related",
)
_LIST_FIELDS = ("alerts", "slos", "related")
_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FAIL_CLOSED = re.compile(r"fail(s|ing)?[ -]closed", re.IGNORECASE)


class Kind(StrEnum):
    FAILURE_CLASS = "failure-class"
    ALERT = "alert"


class RunbookError(ValueError):
    """One or more runbooks are invalid; ``problems`` holds one message per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid runbooks:\n  " + "\n  ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Runbook:
    id: str
    title: str
    kind: Kind
    alerts: tuple[str, ...]
    slos: tuple[str, ...]
    related: tuple[str, ...]
    experiment: str | None
    path: Path
    sections: Mapping[str, str]  # level-2 heading -> body (subsections included)
    recover: Mapping[str, str]  # level-3 heading under "Recover" -> body

    def code_lines(self, subsection: str) -> list[str]:
        """Lines inside fenced code blocks of one Recover subsection (continuations joined)."""
        return _code_lines(self.recover.get(subsection, ""))

    def gameday_commands(self, subsection: str = "Local environment") -> list[str]:
        """Every ``gameday ...`` command in the code blocks of a Recover subsection."""
        out = []
        for line in self.code_lines(subsection):
            for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*|\$\(", line):
                part = part.strip()
                if part.startswith("gameday "):
                    out.append(part)
        return out


# --- parsing ----------------------------------------------------------------------------


def _split_front_matter(text: str) -> tuple[str, str] | None:
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        return None
    for i in range(1, len(lines)):
        if lines[i].strip() == "---":
            return "".join(lines[1:i]), "".join(lines[i + 1 :])
    return None


def _headings(body: str, level: int) -> dict[str, str]:
    """Heading text -> content up to the next heading of the same or a higher level.

    Lines inside fenced code blocks are never headings (a ``# comment`` in a shell block)."""
    out: dict[str, str] = {}
    current: str | None = None
    buf: list[str] = []
    in_fence = False
    for line in body.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
        match = None if in_fence else _HEADING.match(line)
        if match and len(match.group(1)) <= level:
            if current is not None:
                out[current] = "\n".join(buf).strip()
            current = match.group(2) if len(match.group(1)) == level else None
            buf = []
            continue
        buf.append(line)
    if current is not None:
        out[current] = "\n".join(buf).strip()
    return out


def _code_lines(text: str) -> list[str]:
    lines: list[str] = []
    in_fence = False
    pending = ""
    for raw in text.splitlines():
        if _FENCE.match(raw):
            in_fence = not in_fence
            continue
        if not in_fence:
            continue
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line = (pending + line.strip()).strip()
        pending = ""
        if line:
            lines.append(line)
    return lines


def _str_list(
    data: Mapping[str, Any], key: str, where: str, problems: list[str]
) -> tuple[str, ...]:
    value = data.get(key, [])
    if value is None:
        value = []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        problems.append(f"{where}: {key}: must be a list of non-empty strings, got {value!r}")
        return ()
    return tuple(value)


def _parse(path: Path, problems: list[str]) -> Runbook | None:
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{where}: cannot read: {exc}")
        return None
    split = _split_front_matter(text)
    if split is None:
        problems.append(
            f"{where}: front matter: missing (the file must start with a '---' line "
            "and the YAML must end with another '---' line)"
        )
        return None
    raw, body = split
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        problems.append(f"{where}: front matter: not valid YAML: {exc}")
        return None
    if not isinstance(data, dict):
        problems.append(f"{where}: front matter: expected a mapping, got {type(data).__name__}")
        return None
    before = len(problems)
    unknown = sorted(set(map(str, data)) - set(FRONT_MATTER_FIELDS))
    if unknown:
        problems.append(
            f"{where}: front matter: unknown field(s) {unknown} "
            f"(known: {', '.join(FRONT_MATTER_FIELDS)})"
        )
    for key in ("id", "title", "kind", "alerts", "slos", "related"):
        if key not in data:
            problems.append(f"{where}: {key}: required field is missing")
    rb_id = data.get("id")
    if "id" in data and (not isinstance(rb_id, str) or not _ID.match(rb_id)):
        problems.append(f"{where}: id: must be lower-case words joined by '-', got {rb_id!r}")
    elif isinstance(rb_id, str) and rb_id != path.stem:
        problems.append(f"{where}: id: {rb_id!r} differs from the file name {path.stem!r}")
    title = data.get("title")
    if "title" in data and (not isinstance(title, str) or not title.strip()):
        problems.append(f"{where}: title: must be a non-empty string")
    kind: Kind | None = None
    if "kind" in data:
        try:
            kind = Kind(data["kind"])
        except ValueError:
            problems.append(
                f"{where}: kind: {data['kind']!r} is not one of {', '.join(k.value for k in Kind)}"
            )
    lists = {key: _str_list(data, key, where, problems) for key in _LIST_FIELDS}
    experiment = data.get("experiment")
    if kind is Kind.FAILURE_CLASS:
        expected = f"chaos/experiments/{path.stem}.yaml"
        if experiment != expected:
            problems.append(
                f"{where}: experiment: a failure-class runbook must name "
                f"{expected!r}, got {experiment!r}"
            )
    elif kind is Kind.ALERT and experiment is not None:
        problems.append(
            f"{where}: experiment: only failure-class runbooks name an experiment "
            "(link the rehearsing experiments in the Rehearse section)"
        )
    if kind is Kind.ALERT and not lists["alerts"]:
        problems.append(f"{where}: alerts: an alert runbook must name the alert(s) it covers")

    sections = _headings(body, 2)
    for name in SECTIONS:
        if name not in sections:
            problems.append(f"{where}: section '## {name}': missing")
        elif not sections[name]:
            problems.append(f"{where}: section '## {name}': empty")
    order = [s for s in sections if s in SECTIONS]
    if len(order) == len(SECTIONS) and order != list(SECTIONS):
        problems.append(
            f"{where}: sections: expected the order {', '.join(SECTIONS)}, got {', '.join(order)}"
        )
    recover = _headings(sections.get("Recover", ""), 3)
    for name in RECOVER_SUBSECTIONS:
        if "Recover" not in sections:
            break
        if name not in recover:
            problems.append(f"{where}: section '## Recover': subsection '### {name}' missing")
        elif not _code_lines(recover[name]):
            problems.append(
                f"{where}: section '## Recover' / '### {name}': no commands "
                "(expected at least one fenced code block)"
            )
    decide = sections.get("Decide", "")
    if decide and not _FAIL_CLOSED.search(decide):
        problems.append(
            f"{where}: section '## Decide': names no fail-closed point (say when to fail closed)"
        )
    rehearse = sections.get("Rehearse", "")
    if kind is Kind.FAILURE_CLASS and rehearse and isinstance(rb_id, str):
        for needle in (f"chaos/experiments/{rb_id}.yaml", f"gameday run --experiment {rb_id}"):
            if needle not in rehearse:
                problems.append(f"{where}: section '## Rehearse': must contain {needle!r}")
    if len(problems) > before or kind is None or not isinstance(rb_id, str):
        return None
    return Runbook(
        id=rb_id,
        title=str(title).strip(),
        kind=kind,
        alerts=lists["alerts"],
        slos=lists["slos"],
        related=lists["related"],
        experiment=experiment if isinstance(experiment, str) else None,
        path=path,
        sections=sections,
        recover=recover,
    )


def load_runbooks(directory: Path | str = RUNBOOK_DIR) -> dict[str, Runbook]:
    """Every ``<directory>/*.md`` except README.md, validated; :class:`RunbookError` if not."""
    directory = Path(directory)
    if not directory.is_dir():
        raise RunbookError([f"{directory}: not a directory"])
    problems: list[str] = []
    runbooks: dict[str, Runbook] = {}
    for path in sorted(directory.glob("*.md")):
        if path.name.lower() == "readme.md":
            continue
        rb = _parse(path, problems)
        if rb is not None:
            runbooks[rb.id] = rb
    if problems:
        raise RunbookError(problems)
    return runbooks


# --- references ---------------------------------------------------------------------------


def alert_runbook_refs(envs: Iterable[str] | None = None) -> dict[str, set[str]]:
    """Runbook id -> alert names, from the ``runbook`` annotation of the rules generated for
    every environment (``slo.rules.generate_rules(load_specs(env))``)."""
    from slo.rules import generate_rules
    from slo.specs import ENVIRONMENTS, load_specs

    refs: dict[str, set[str]] = {}
    for env in envs or ENVIRONMENTS:
        for group in generate_rules(load_specs(env))["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    refs.setdefault(rule["annotations"]["runbook"], set()).add(rule["alert"])
    return refs


def objective_runbook_refs(envs: Iterable[str] | None = None) -> dict[str, set[str]]:
    """Runbook id -> recovery objectives naming it, over every environment."""
    from slo.specs import ENVIRONMENTS, load_specs

    refs: dict[str, set[str]] = {}
    for env in envs or ENVIRONMENTS:
        for name, obj in load_specs(env).recovery_objectives.items():
            refs.setdefault(obj.runbook, set()).add(name)
    return refs


def _find_runbook_values(node: Any) -> list[str]:
    if isinstance(node, Mapping):
        found = [v for k, v in node.items() if k == "runbook" and isinstance(v, str)]
        for v in node.values():
            found += _find_runbook_values(v)
        return found
    if isinstance(node, list):
        return [x for item in node for x in _find_runbook_values(item)]
    return []


def _runbook_id(value: str) -> str:
    """``runbooks/x.md``, ``x.md`` or ``x`` -> ``x``."""
    return Path(value).name.removesuffix(".md")


def experiment_runbook_refs(directory: Path | str) -> dict[str, set[str]]:
    """Runbook id -> experiment files referencing it.

    The ``runbook:`` keys inside an experiment (at any depth) name its runbooks; one without
    any references the failure-class runbook ``<id>`` of its file name ``<id>.yaml``. (A second
    rehearsal of a class, e.g. ``db-restore-from-backup``, names its class's runbook.)"""
    refs: dict[str, set[str]] = {}
    for path in sorted(Path(directory).glob("*.y*ml")):
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            doc = None  # the experiment loader reports broken experiments; here only names count
        named = [_runbook_id(v) for v in _find_runbook_values(doc)] if doc is not None else []
        for rid in named or [path.stem]:
            refs.setdefault(rid, set()).add(path.name)
    return refs


def check_references(
    runbooks: Mapping[str, Runbook],
    alert_runbook_ids: Mapping[str, Iterable[str]] | Iterable[str],
    experiment_runbook_ids: Mapping[str, Iterable[str]] | Iterable[str],
    objective_runbook_ids: Mapping[str, Iterable[str]] | Iterable[str] = (),
) -> list[str]:
    """Problems (empty = consistent) between the runbooks and what references them.

    * every alert annotation resolves to a runbook of kind ``alert`` (and, when a mapping
      id -> alert names is given, that runbook lists those alerts in ``alerts``);
    * every experiment / recovery-objective reference resolves to a ``failure-class`` runbook;
    * every runbook is referenced by an alert, an objective or an experiment;
    * every ``related`` id exists.
    """
    problems: list[str] = []

    def ids(refs: Mapping[str, Iterable[str]] | Iterable[str]) -> dict[str, set[str]]:
        if isinstance(refs, Mapping):
            return {k: set(v) for k, v in refs.items()}
        return {k: set() for k in refs}

    alerts, experiments, objectives = (
        ids(alert_runbook_ids),
        ids(experiment_runbook_ids),
        ids(objective_runbook_ids),
    )
    for rb_id, names in sorted(alerts.items()):
        rb = runbooks.get(rb_id)
        if rb is None:
            problems.append(
                f"alert runbook annotation {rb_id!r} (alerts: "
                f"{', '.join(sorted(names)) or '?'}): no runbooks/{rb_id}.md"
            )
            continue
        if rb.kind is not Kind.ALERT:
            problems.append(
                f"{rb.path}: kind: alerts link it, so it must be 'alert', not {rb.kind.value!r}"
            )
        missing = sorted(names - set(rb.alerts))
        if missing:
            problems.append(
                f"{rb.path}: alerts: does not list {missing}, whose runbook annotation names it"
            )
    for label, refs in (("experiment", experiments), ("recovery objective", objectives)):
        for rb_id, sources in sorted(refs.items()):
            rb = runbooks.get(rb_id)
            where = f" ({', '.join(sorted(sources))})" if sources else ""
            if rb is None:
                problems.append(f"{label} reference {rb_id!r}{where}: no runbooks/{rb_id}.md")
            elif rb.kind is not Kind.FAILURE_CLASS:
                problems.append(
                    f"{rb.path}: kind: referenced by {label}{where}, so it must be "
                    f"'failure-class', not {rb.kind.value!r}"
                )
    referenced = set(alerts) | set(experiments) | set(objectives)
    for rb_id, rb in sorted(runbooks.items()):
        if rb_id not in referenced:
            problems.append(
                f"{rb.path}: not referenced by any alert, recovery objective or experiment"
            )
        for other in rb.related:
            if other not in runbooks:
                problems.append(f"{rb.path}: related: {other!r} is not a runbook id")
    return problems

"""Is an experiment runnable? Every problem `gameday run` would otherwise meet mid game day
(after the environment and the load are up), found from the file alone.

One problem per string, ``<file>: <field path>: <reason>``, all of them at once (Chaos Toolkit's
own validation stops at the first):

- the YAML parses (the line of the error) into a mapping;
- Chaos Toolkit's ``ensure_experiment_is_valid`` passes (its message kept);
- every python provider (steady-state probes, method, rollbacks): the module imports, the
  function exists, and the ``arguments`` bind to its signature with the ``configuration`` and
  ``secrets`` keywords Chaos Toolkit adds; where the module has ``argument_problems(func,
  arguments)`` (chaos/gray.py), the values are checked too (a toxic's fields, a rate's range);
- the ``x-gameday`` extension names a recovery_objective of slo/specs, a runbook of runbooks/
  and declares its blast_radius.

Nothing here touches an environment; importing the providers' modules is all it runs.
"""

from __future__ import annotations

import copy
import difflib
import importlib
import inspect
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from slo.runbooks import RUNBOOK_DIR

ROOT = Path(__file__).resolve().parent.parent
GAMEDAY_EXTENSION = "x-gameday"
GAMEDAY_REQUIRED = ("recovery_objective", "runbook", "blast_radius")
# Chaos Toolkit passes these two itself; an experiment must not.
INJECTED = ("configuration", "secrets")


def shown(path: Path) -> str:
    """``chaos/experiments/x.yaml`` for a file of this repository, else the path as given."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def validate_experiments(paths: Iterable[Path], env: str = "local") -> list[str]:
    """Every problem of every experiment; the specs of ``env`` are loaded once."""
    objectives, problems = recovery_objectives(env)
    for path in paths:
        problems += experiment_problems(Path(path), objectives)
    return problems


def validate_experiment(path: Path, env: str = "local") -> list[str]:
    """Every problem of one experiment file (empty: runnable, as far as a file can tell), its
    recovery objective judged against ``env``'s specs."""
    objectives, problems = recovery_objectives(env)
    return problems + experiment_problems(Path(path), objectives)


def _names_problems(field: str, ext: Mapping[str, Any], key: str, known: set[str],
                    what: str) -> list[str]:
    """An unknown name in a list the evaluator reads (a typo would silently judge less)."""
    names = ext.get(key) or []
    if not isinstance(names, list):
        return [f"{field}.{key}: a list of names, not {type(names).__name__}"]
    return [f"{field}.{key}[{i}]: no {what} {n!r} (known: {', '.join(sorted(known))})"
            for i, n in enumerate(names) if n not in known]


def known_slos() -> set[str]:
    from slo.specs import KNOWN_SLIS

    return set(KNOWN_SLIS)


def known_invariants() -> set[str]:
    from slo.invariants import KNOWN_INVARIANTS

    return set(KNOWN_INVARIANTS)


def recovery_objectives(env: str) -> tuple[set[str] | None, list[str]]:
    """The RecoveryObjective names of ``env``'s specs, or None and why they cannot be read."""
    from slo.specs import SpecError, load_specs

    try:
        return set(load_specs(env).recovery_objectives), []
    except SpecError as exc:
        why = f"cannot load the specs of env {env!r} to check recovery objectives: {exc}"
        return None, [f"slo/specs: {why}"]


def experiment_problems(path: Path, objectives: set[str] | None) -> list[str]:
    """``objectives`` None: the specs could not be read (reported once by the caller)."""
    name = shown(path)
    doc, problems = parse(path)
    if doc is not None:
        problems += chaostoolkit_problems(doc)
        for field, activity in activities(doc):
            problems += activity_problems(field, activity)
        problems += gameday_problems(doc, objectives, RUNBOOK_DIR)
    return [f"{name}: {p}" for p in problems]


def parse(path: Path) -> tuple[dict[str, Any] | None, list[str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, [f"cannot read the experiment: {exc}"]
    try:
        doc = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark, start = exc.problem_mark or exc.context_mark, exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(YAML)"
        context = exc.context and (f"{exc.context} at line {start.line + 1}" if start
                                   else exc.context)
        why = ": ".join(x for x in (context, exc.problem) if x)
        return None, [f"{where}: invalid YAML: {why or exc}"]
    except yaml.YAMLError as exc:
        return None, [f"invalid YAML: {exc}"]
    if not isinstance(doc, dict):
        return None, [f"(top level): an experiment is a mapping, not {type(doc).__name__}"]
    return doc, []


def chaostoolkit_problems(doc: dict[str, Any]) -> list[str]:
    """Chaos Toolkit's own validation, the one `chaos run` starts with (first problem only)."""
    from chaoslib.exceptions import ChaosException
    from chaoslib.experiment import ensure_experiment_is_valid

    try:
        ensure_experiment_is_valid(copy.deepcopy(doc))
    except ChaosException as exc:
        return [f"(chaostoolkit): {exc}"]
    except Exception as exc:  # noqa: BLE001 - a malformed document breaks its checks anywhere
        return [f"(chaostoolkit): validation crashed on this document: {type(exc).__name__}: {exc}"]
    return []


def activities(doc: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(field path, activity) of every activity Chaos Toolkit would run."""
    hypothesis = doc.get("steady-state-hypothesis")
    if isinstance(hypothesis, Mapping) and isinstance(hypothesis.get("probes"), list):
        for i, act in enumerate(hypothesis["probes"]):
            yield f"steady-state-hypothesis.probes[{i}]", act
    for block in ("method", "rollbacks"):
        if isinstance(doc.get(block), list):
            for i, act in enumerate(doc[block]):
                yield f"{block}[{i}]", act


def activity_problems(field: str, activity: Any) -> list[str]:
    """The python provider of one activity: module, function, arguments."""
    if not isinstance(activity, Mapping):
        return [f"{field}: an activity is a mapping, not {type(activity).__name__}"]
    provider = activity.get("provider")
    if "ref" in activity and provider is None:
        return []  # a reference to an activity defined elsewhere, checked there
    if not isinstance(provider, Mapping):
        return [f"{field}.provider: missing (a mapping with type, module, func)"]
    if provider.get("type") != "python":
        return []  # only python providers call our code
    field = f"{field}.provider"
    module_name, func_name = provider.get("module"), provider.get("func")
    if not isinstance(module_name, str) or not module_name:
        return [f"{field}.module: missing (a dotted module path such as chaos.actions)"]
    if not isinstance(func_name, str) or not func_name:
        return [f"{field}.func: missing (a function of {module_name})"]
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure makes the provider unusable
        return [f"{field}.module: cannot import {module_name!r}: {type(exc).__name__}: {exc}"]
    func = getattr(module, func_name, None)
    if not inspect.isfunction(func):
        known = [n for n, _ in inspect.getmembers(module, inspect.isfunction)
                 if not n.startswith("_")]
        near = difflib.get_close_matches(func_name, known, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        return [f"{field}.func: {module_name} has no function {func_name!r}{hint}"]
    arguments = provider.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        return [f"{field}.arguments: a mapping of argument names, not {type(arguments).__name__}"]
    qualname = f"{module_name}.{func_name}"
    problems = binding_problems(inspect.signature(func), arguments, qualname)
    if not problems:
        # a provider module may check its parameters' values too (chaos/gray.py: toxics)
        check = getattr(module, "argument_problems", None)
        problems = check(func_name, arguments) if callable(check) else []
    return [f"{field}.arguments{'.' + arg if arg else ''}: {reason}" for arg, reason in problems]


def binding_problems(sig: inspect.Signature, arguments: Mapping[str, Any],
                     qualname: str) -> list[tuple[str, str]]:
    """(argument name or "", reason) for every way ``arguments`` fails to bind to ``sig`` the
    way Chaos Toolkit calls a provider: ``f(**arguments, configuration=..., secrets=...)``."""
    passed = [a for a in INJECTED if a in arguments]
    if passed:
        return [(a, "Chaos Toolkit passes this itself; remove it from arguments")
                for a in passed]
    try:
        sig.bind(**arguments, configuration=None, secrets=None)
        return []
    except TypeError as exc:
        why = str(exc)
    params = sig.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    by_name = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    takes = ", ".join(n for n in params if n in by_name and n not in INJECTED)
    out = [(a, f"{qualname} has no argument {a!r} (it takes: {takes or 'none'})")
           for a in arguments if not takes_any and a not in by_name]
    out += [("", f"missing argument {n!r} of {qualname} (it has no default)")
            for n, p in params.items()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            and n not in arguments and n not in INJECTED]
    out += [("", f"{qualname} takes no {a!r} keyword (Chaos Toolkit passes it to providers)")
            for a in INJECTED if not takes_any and a not in by_name]
    return out or [("", f"does not bind to {qualname}{sig}: {why}")]


def gameday_extension(doc: Mapping[str, Any]) -> tuple[str, Any] | None:
    """(field path, body) of the x-gameday extension, as gameday/suites.py reads it."""
    for i, ext in enumerate(doc.get("extensions") or []):
        if isinstance(ext, Mapping) and ext.get("name") == GAMEDAY_EXTENSION:
            return f"extensions[{i}]", ext
    if GAMEDAY_EXTENSION in doc:
        return GAMEDAY_EXTENSION, doc[GAMEDAY_EXTENSION]
    return None


def gameday_problems(doc: Mapping[str, Any], objectives: set[str] | None,
                     runbook_dir: Path) -> list[str]:
    """The harness's own fields: what the run is judged against and who is paged.
    ``objectives`` None: the specs could not be loaded (reported elsewhere), not checked."""
    found = gameday_extension(doc)
    if found is None:
        required = ", ".join(GAMEDAY_REQUIRED)
        return [f"extensions: no {GAMEDAY_EXTENSION!r} extension (with {required})"]
    field, ext = found
    if not isinstance(ext, Mapping):
        return [f"{field}: a mapping, not {type(ext).__name__}"]
    problems = [f"{field}.{key}: missing (a non-empty string)" for key in GAMEDAY_REQUIRED
                if not isinstance(ext.get(key), str) or not ext[key].strip()]
    objective = ext.get("recovery_objective")
    if isinstance(objective, str) and objective and objectives is not None \
            and objective not in objectives:
        problems.append(f"{field}.recovery_objective: no RecoveryObjective {objective!r} in "
                        f"slo/specs (known: {', '.join(sorted(objectives))})")
    problems += _names_problems(field, ext, "slos", known_slos(), "SLO")
    problems += _names_problems(field, ext, "invariants", known_invariants(), "invariant")
    runbook = ext.get("runbook")
    if isinstance(runbook, str) and runbook.strip():
        if "/" in runbook or "\\" in runbook or runbook.startswith("."):
            problems.append(f"{field}.runbook: {runbook!r} is not a runbook id (a file name "
                            f"under runbooks/, without .md)")
        elif not (runbook_dir / f"{runbook}.md").is_file():
            problems.append(f"{field}.runbook: runbooks/{runbook}.md does not exist")
    return problems

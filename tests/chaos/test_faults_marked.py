"""Fault actions are marked where they are defined (``FAULTS`` of chaos/actions.py,
chaos/gray.py and chaos/restore.py), and `gameday run --dry-run` derives what a run hits from those marks."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from chaos import actions, gray, overload, restore, serving
from environments.base import FaultDriver
from gameday.suites import FAULT_FUNCS, load_experiment

# FaultDriver methods that undo a fault: an action calling only these is not a fault.
DRIVER_INVERSES = {"resume", "start", "artifact_store_restore", "registry_restore",
                   "restore_pool", "heal_agent", "heal_database", "restore_all",
                   "restore_zone"}


def not_exported(module_all: list[str], faults: tuple[str, ...]) -> list[str]:
    return [f for f in faults if f not in module_all]


def driver_faults_used(source: str) -> dict[str, set[str]]:
    """Public function -> the FaultDriver methods it calls that inject a fault
    (``<anything>.driver.<method>(...)``)."""
    out: dict[str, set[str]] = {}
    for fn in ast.parse(source).body:
        if not isinstance(fn, ast.FunctionDef) or fn.name.startswith("_"):
            continue
        calls = {n.func.attr for n in ast.walk(fn)
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and isinstance(n.func.value, ast.Attribute) and n.func.value.attr == "driver"}
        if calls - DRIVER_INVERSES:
            out[fn.name] = calls - DRIVER_INVERSES
    return out


def unmarked_faults(source: str, faults: tuple[str, ...]) -> list[str]:
    return sorted(set(driver_faults_used(source)) - set(faults))


@pytest.mark.parametrize("module", [actions, gray, overload, restore, serving], ids=lambda m: m.__name__)
def test_every_marked_fault_is_exported(module: object) -> None:
    assert module.FAULTS, "no fault marked"  # type: ignore[attr-defined]
    assert not_exported(module.__all__, module.FAULTS) == []  # type: ignore[attr-defined]


def test_every_fault_looking_action_is_marked() -> None:
    source = inspect.getsource(actions)
    used = driver_faults_used(source)
    assert "kill" in used and "crash_database_primary" in used  # the scan sees the real ones
    driver_methods = {n for n in vars(FaultDriver) if not n.startswith("_")}
    assert set().union(*used.values()) <= driver_methods
    assert DRIVER_INVERSES <= driver_methods
    assert unmarked_faults(source, actions.FAULTS) == []


def test_the_fault_checks_can_fail(tmp_path: Path) -> None:
    source = ("def cut(configuration=None, secrets=None):\n"
              "    return _ctx(configuration).driver.partition_agent('a')\n"
              "def heal(configuration=None, secrets=None):\n"
              "    return _ctx(configuration).driver.heal_agent('a')\n")
    assert unmarked_faults(source, ()) == ["cut"]
    assert unmarked_faults(source, ("cut",)) == []
    assert not_exported(["kill"], ("kill", "kil")) == ["kil"]


def test_dry_run_faults_come_from_the_marks() -> None:
    assert FAULT_FUNCS == (set(actions.FAULTS) | set(restore.FAULTS) | set(gray.FAULTS)
                           | set(overload.FAULTS) | set(serving.FAULTS))
    assert load_experiment("network-gray").faults()[0].startswith("add_toxics(target=agents, ")
    # the load step is listed beside its trigger, its stop is not
    assert [f.split("(")[0] for f in load_experiment("overload-metastability").faults()] == [
        "start_overload", "add_toxics"]
    # both modules' marks reach what the dry run prints; inverses and workload steps do not
    assert load_experiment("db-restore-from-backup").faults() == [
        "lose_database()", "restore_database_from_backup(backup=taken)"]
    assert load_experiment("agent-connectivity-loss").faults() == [
        "partition_agent_running(tag=work)", "send_late_reports(tag=work)"]

"""One experiment of a game day: wait for a healthy system, run it with Chaos Toolkit in its
own process group (rollbacks always, also on Ctrl-C), read its journal, and let its recovery
show before the next one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import Progress

from gameday.suites import load_experiment
from slo.run_index import observation_seconds
from slo.specs import load_specs

EXPERIMENT_TIMEOUT = 420.0


@dataclass
class ExperimentRun:
    name: str
    status: str = "pending"
    seconds: float = 0.0
    detail: str = ""
    log: deque[str] = field(default_factory=lambda: deque(maxlen=200))


def run_experiment(name: str, run_dir: Path, env_vars: dict[str, str], progress: Progress,
                   task: Any, record: ExperimentRun) -> None:
    exp_dir = run_dir / "experiments" / name
    exp_dir.mkdir(parents=True, exist_ok=True)
    chaos = str(Path(sys.executable).with_name("chaos"))
    argv = [chaos, "run", "--rollback-strategy", "always",
            "--journal-path", str(exp_dir / "journal.json"), str(load_experiment(name).path)]
    started = time.monotonic()
    with open(exp_dir / "chaos.out", "w") as out:
        proc = subprocess.Popen(argv, cwd=exp_dir, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **env_vars}, start_new_session=True)

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                out.flush()
                text = line.strip()
                if "] " in text:
                    text = text.split("] ", 1)[1]
                record.log.append(text)
                progress.update(task, description=f"{name}: {text[:70]}")

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            while proc.poll() is None:
                if time.monotonic() - started > EXPERIMENT_TIMEOUT:
                    record.detail = f"timed out after {EXPERIMENT_TIMEOUT:.0f}s"
                    _interrupt(proc)
                    break
                time.sleep(0.2)
        except KeyboardInterrupt:
            record.detail = "interrupted"
            _interrupt(proc)  # Chaos Toolkit plays its rollbacks on SIGINT
            reader.join(5)
            raise
        finally:
            reader.join(5)
            record.seconds = time.monotonic() - started
    record.status = _journal_status(exp_dir / "journal.json", proc.returncode)


def _interrupt(proc: subprocess.Popen[str], grace: float = 90.0) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def _journal_status(path: Path, rc: int | None) -> str:
    try:
        j = json.loads(path.read_text())
    except (OSError, ValueError):
        return f"no journal (chaos exited {rc})"
    before = ((j.get("steady_states") or {}).get("before") or {}).get("steady_state_met")
    if before is False:
        return "refused: steady state not met before the method"
    if j.get("deviated"):
        return "deviated"
    return j.get("status", "unknown")


def settle_seconds(env: str, experiment: str) -> float:
    """How long after an experiment ends (its work drained, every fault undone) the evaluator
    needs to see its SLIs recover and hold (slo.run_index.observation_seconds)."""
    specs = load_specs(env)
    g = load_experiment(experiment).gameday
    ro = specs.recovery_objectives.get(str(g.get("recovery_objective")))
    own = list(g.get("slos") or [])
    names = [n for n in (ro.judged_slos(own) if ro else dict.fromkeys(own)) if n in specs.slo_names]
    return observation_seconds(specs, names)


def settle(seconds: float, progress: Progress, task: Any, name: str) -> None:
    """Let the experiment's recovery be observable before the next fault starts (and before
    the evidence is collected, after the last one)."""
    if seconds > 0:
        progress.update(task, description=f"{name}: letting recovery show ({seconds:.0f}s)")
        time.sleep(seconds)


def wait_healthy(env: Any, adapter: Any, timeout: float) -> tuple[bool, str]:
    deadline = time.monotonic() + timeout
    why = ""
    while time.monotonic() < deadline:
        status = env.status()
        bad = [n for n, c in status["components"].items() if not c["healthy"]]
        ok, detail = adapter.healthy()
        if not bad and ok and not status.get("active_faults"):
            return True, ""
        why = f"unhealthy: {bad}" if bad else (detail if not ok else
                                               f"active faults {list(status['active_faults'])}")
        time.sleep(1.0)
    return False, why

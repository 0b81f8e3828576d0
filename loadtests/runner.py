"""Start Locust as its own process(es), wait or stop, collect, judge.

Python API for the game-day runner:

    handle = start_background(scenario, host, token, out_dir, s3_endpoint=...)
    ...                                   # inject faults while load runs
    summary = handle.stop()               # ends the run, writes the files, judges

`gameday load run` is `start(...).wait()`. Locust never runs in the caller's process: gevent's
monkey-patching breaks next to requests/boto3 (docs/DESIGN.md section 8.3).
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

from loadtests.collect import (
    STATS,
    Check,
    CollectError,
    harness_check,
    ledger_check,
    merge_parts,
    rejection_check,
)
from loadtests.runconfig import CONFIG_ENV, OWNER_ENV, TOKEN_ENV, RunConfig
from loadtests.safety import check_target
from loadtests.scenario import Scenario, load_scenario
from loadtests.stats import LoadStats, StatsError, read_load_stats
from loadtests.thresholds import ThresholdResult, evaluate_thresholds

__all__ = ["ExitCode", "LoadRun", "LoadSummary", "evaluate_thresholds", "run", "start",
           "start_background"]

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
_REPO_ROOT = Path(__file__).resolve().parent.parent
BACKGROUND_MAX = 6 * 3600.0  # a forgotten background run still ends
_STARTUP_GRACE = 90.0        # imports, worker connection and the final stats on a busy machine


class ExitCode(IntEnum):
    """The gate's exit semantics (slo/evaluate.py), so CI treats both alike."""

    PASS = 0
    CHECK_FAILED = 1
    OBJECTIVE_MISSED = 2
    EVIDENCE_UNUSABLE = 3


@dataclass(frozen=True)
class LoadSummary:
    scenario: Scenario
    out_dir: Path
    stats: LoadStats | None
    acknowledged: int
    outcomes: dict[str, int]      # submissions by outcome (acked, abandoned, rejected, interrupted)
    requests: int                 # lines in requests.jsonl
    thresholds: list[ThresholdResult]
    checks: list[Check]
    problems: list[str]           # why the evidence is unusable, if it is
    exit_code: ExitCode
    reason: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)  # its own session: only what we started
            except ProcessLookupError:
                pass


class LoadRun:
    """A running load test: one Locust process, or a master plus N workers."""

    def __init__(self, scenario: Scenario, out_dir: Path, config: RunConfig, procs: list[_Proc],
                 run_seconds: float) -> None:
        self.scenario, self.out_dir, self.config = scenario, out_dir, config
        self.procs = procs
        self.started = time.monotonic()
        self.deadline = time.monotonic() + run_seconds + scenario.stop_timeout + _STARTUP_GRACE
        self._summary: LoadSummary | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def running(self) -> bool:
        return self.procs[0].popen.poll() is None

    def acknowledged_so_far(self) -> int:
        """Ledger lines written so far (all processes), for progress display."""
        total = 0
        for part in self.config.parts_dir.glob("ledger.*.jsonl"):
            try:
                total += part.read_bytes().count(b"\n")
            except OSError:
                pass
        return total

    def wait(self, on_tick: Callable[[LoadRun], None] | None = None) -> LoadSummary:
        """Until the run ends by itself (duration) or the wall-clock bound forces it."""
        if self._summary is not None:
            return self._summary
        lead = self.procs[0].popen
        while lead.poll() is None and time.monotonic() < self.deadline:
            if on_tick:
                on_tick(self)
            time.sleep(0.5)
        forced = lead.poll() is None
        self._terminate(grace=10.0)
        self._summary = _summarize(self, forced=forced)
        return self._summary

    def stop(self, timeout: float | None = None) -> LoadSummary:
        """End the run now (users get `stop_timeout` to finish a task), collect and judge."""
        if self._summary is None:
            self.config.stop_file.touch()
            bound = timeout if timeout is not None else self.scenario.stop_timeout + _STARTUP_GRACE
            self.deadline = min(self.deadline, time.monotonic() + bound)
        return self.wait()

    def _terminate(self, grace: float) -> None:
        # the lead (master/single) is done or overdue; workers follow their master's "quit"
        end = time.monotonic() + grace
        for p in self.procs:
            if p.popen.poll() is None and time.monotonic() >= self.deadline:
                p.signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.popen.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.signal(signal.SIGKILL)
                p.popen.wait(5)


def _locust_cmd(config_path: Path, scenario: Scenario, host: str, run_seconds: float) -> list[str]:
    # --run-time is only a backstop: the locustfile ends the run itself (see _end_of_run)
    backstop = math.ceil(run_seconds + scenario.stop_timeout + 60)
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--host", host, "--headless",
            "--only-summary", "--loglevel", "INFO",
            "-u", str(scenario.users.total), "-r", str(scenario.spawn_rate),
            "-t", f"{backstop}s", "--stop-timeout", str(math.ceil(scenario.stop_timeout)),
            *scenario.users.locust_classes()]


def start(scenario: Scenario | str | Path, host: str, token: str, out_dir: str | Path, *,
          s3_endpoint: str | None = None, workers: int = 0, duration: float | None = None,
          allow_remote: bool = False, serving_endpoint: str | None = None,
          serving_model: str | None = None) -> LoadRun:
    """Start a run of `duration` (default: the scenario's). Raises ScenarioError or
    UnsafeTargetError before anything starts."""
    scn = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    check_target(host, allow_remote=allow_remote)
    if s3_endpoint:
        check_target(s3_endpoint, allow_remote=allow_remote, what="--s3-endpoint")
    if serving_endpoint:
        check_target(serving_endpoint, allow_remote=allow_remote, what="the serving endpoint")
    if duration is not None:
        scn = scn.model_copy(update={"duration": duration})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = out / ".locust"
    work.mkdir(exist_ok=True)
    config = RunConfig(scenario=scn, parts_dir=work / "parts", stats_path=out / STATS,
                       stop_file=work / "stop", s3_endpoint=s3_endpoint,
                       serving_endpoint=serving_endpoint, serving_model=serving_model,
                       owner_pid=int(os.environ.get(OWNER_ENV) or os.getpid()))
    config.stop_file.unlink(missing_ok=True)
    config.stats_path.unlink(missing_ok=True)  # never judge a previous run's stats
    config.save(work / "config.json")
    (out / "load_scenario.json").write_text(scn.model_dump_json(indent=2), encoding="utf-8")
    env = {**os.environ, CONFIG_ENV: str(work / "config.json"), TOKEN_ENV: token,
           "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(_REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    base = _locust_cmd(work / "config.json", scn, host, scn.duration)

    def spawn(name: str, extra: list[str]) -> _Proc:
        with open(out / f"{name}.log", "wb") as log:
            popen = subprocess.Popen([*base, *extra], stdout=log, stderr=subprocess.STDOUT, env=env,
                                     cwd=out, start_new_session=True)
        return _Proc(name, popen)

    if workers <= 0:
        procs = [spawn("locust", [])]
    else:
        port = _free_port()
        procs = [spawn("locust-master", ["--master", "--master-bind-host", "127.0.0.1",
                                         "--master-bind-port", str(port),
                                         "--expect-workers", str(workers),
                                         "--expect-workers-max-wait", "60"])]
        procs += [spawn(f"locust-worker-{i}", ["--worker", "--master-host", "127.0.0.1",
                                               "--master-port", str(port)])
                  for i in range(workers)]
    return LoadRun(scn, out, config, procs, scn.duration)


def start_background(scenario: Scenario | str | Path, host: str, token: str, out_dir: str | Path, *,
                     s3_endpoint: str | None = None, workers: int = 0, allow_remote: bool = False,
                     max_duration: float = BACKGROUND_MAX, serving_endpoint: str | None = None,
                     serving_model: str | None = None) -> LoadRun:
    """Run until `handle.stop()` (bounded by `max_duration`); stop() returns the LoadSummary."""
    return start(scenario, host, token, out_dir, s3_endpoint=s3_endpoint, workers=workers,
                 duration=max_duration, allow_remote=allow_remote,
                 serving_endpoint=serving_endpoint, serving_model=serving_model)


def start_for_platform(env: Any, adapter_factory: Callable[[], Any], out_dir: Path,
                       scenario: str, allow_remote: bool) -> LoadRun:
    """The reference control plane's background load (platforms/registry.py): the Locust
    scenario aimed at the environment's API with its first project's token and image. In the
    cloud there is no S3 endpoint URL, so the artifact reader is off (its downloads need IAM).
    An environment that serves no model (no ``serving`` endpoint) gets no Inferrer users."""
    eps = env.endpoints
    chosen = load_scenario(scenario)
    chosen = chosen.model_copy(update={"operation": chosen.operation.model_copy(
        update={"image": eps["image"]})})
    if not eps.get("serving") and chosen.users.inferrer.count:
        chosen = chosen.model_copy(update={"users": chosen.users.model_copy(
            update={"inferrer": chosen.users.inferrer.model_copy(update={"count": 0})})})
    _, token = min(env.tokens["projects"].items())
    return start_background(chosen, eps["api"], token, out_dir, s3_endpoint=eps.get("s3"),
                            allow_remote=allow_remote, serving_endpoint=eps.get("serving"),
                            serving_model=eps.get("serving_model"))


def run(scenario: Scenario | str | Path, host: str, token: str, out_dir: str | Path,
        **kwargs: object) -> LoadSummary:
    return start(scenario, host, token, out_dir, **kwargs).wait()  # type: ignore[arg-type]


def _summarize(handle: LoadRun, *, forced: bool) -> LoadSummary:
    scn, out = handle.scenario, handle.out_dir
    problems: list[str] = []
    if forced:
        problems.append("the Locust run did not end within its time bound and was killed")
    for p in handle.procs:
        code = p.popen.returncode
        if code not in (0, None) and not forced:
            problems.append(f"{p.name} exited with {code} (see {p.name}.log)")
    try:
        collected = merge_parts(handle.config.parts_dir, out)
    except CollectError as exc:
        problems.append(str(exc))
        collected = None
    stats: LoadStats | None = None
    try:
        stats = read_load_stats(out / STATS)
    except StatsError as exc:
        problems.append(str(exc))
    if collected is not None and not collected.requests:
        problems.append("requests.jsonl: empty; the load reached nothing")

    ledger = collected.ledger if collected else []
    outcomes = collected.outcomes if collected else {}
    checks = [ledger_check(ledger), rejection_check(collected.submissions if collected else [])]
    if stats is not None:
        checks.append(harness_check(stats.exceptions))
    thresholds = (evaluate_thresholds(scn.thresholds, stats, acknowledged=len(ledger),
                                      abandoned=outcomes.get("abandoned", 0))
                  if stats is not None else [])
    missed = [t.name for t in thresholds if t.failed]
    failed = [c.name for c in checks if not c.ok]
    if problems:
        code, reason = ExitCode.EVIDENCE_UNUSABLE, "evidence unusable: " + "; ".join(problems)
    elif missed:
        code, reason = ExitCode.OBJECTIVE_MISSED, "threshold(s) missed: " + ", ".join(missed)
    elif failed:
        code, reason = ExitCode.CHECK_FAILED, "check(s) failed: " + ", ".join(failed)
    else:
        code, reason = ExitCode.PASS, "all thresholds met, all checks passed"
    if not problems:  # otherwise keep config, stop file and any part files for a post-mortem
        shutil.rmtree(out / ".locust", ignore_errors=True)
    return LoadSummary(scenario=scn, out_dir=out, stats=stats, acknowledged=len(ledger),
                       outcomes=outcomes, requests=len(collected.requests) if collected else 0,
                       thresholds=thresholds, checks=checks, problems=problems,
                       exit_code=code, reason=reason)

"""The local runtime's start paths (warm parent and plain subprocess): exit codes, events,
sessions, stop, the death chain agent -> warm parent -> workload, warm-parent restart and the
fallback. Only ``fail``/``sleep`` workloads with no S3 behind them: no fixtures needed."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.runtimes.base import LaunchSpec, Outcome, RunResult
from controlplane.runtimes.local import LocalRunHandle, LocalRuntime

REPO = Path(__file__).resolve().parents[2]


def spec(kind: str = "fail", op: str = "op-rt", **params: float) -> LaunchSpec:
    return LaunchSpec(operation_id=op, attempt_id="att-1", attempt_number=1, project="p",
                      kind=kind, image="reg/x@sha256:00", params=params)


def wait_result(handle: LocalRunHandle, timeout: float = 15.0) -> RunResult:
    deadline = time.monotonic() + timeout
    while (res := handle.result()) is None:
        assert time.monotonic() < deadline, "workload did not end"
        time.sleep(0.02)
    return res


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def cmdline(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")


@pytest.fixture(params=["forkserver", "subprocess"])
def runtime(request: pytest.FixtureRequest) -> Iterator[LocalRuntime]:
    rt = LocalRuntime(start_method=request.param)
    yield rt
    rt.close()


@pytest.fixture
def forked() -> Iterator[LocalRuntime]:
    rt = LocalRuntime(start_method="forkserver")
    yield rt
    rt.close()


@pytest.mark.parametrize("code,outcome,transient", [(0, Outcome.SUCCEEDED, True),
                                                    (3, Outcome.FAILED, True),
                                                    (2, Outcome.FAILED, False)])
def test_exit_code_becomes_the_outcome_with_the_log_tail(runtime: LocalRuntime, code: int,
                                                         outcome: Outcome, transient: bool) -> None:
    handle = runtime.start(spec(exit_code=code, seconds=0))
    res = wait_result(handle)
    assert (res.outcome, res.exit_code, res.transient) == (outcome, code, transient)
    if code:
        assert f"fail workload exiting with {code} as asked" in res.reason
    assert [e.message for e in handle.drain_events()] == [f"fail workload exiting with {code} as asked"]


def test_workload_has_its_own_session_and_the_command_line_of_today(runtime: LocalRuntime) -> None:
    handle = runtime.start(spec(op="op-cmdline", exit_code=0, seconds=30))
    try:
        assert os.getsid(handle.pid) == handle.pid and os.getpgid(handle.pid) == handle.pid
        deadline = time.monotonic() + 10  # exec (or the title rewrite) follows the fork
        while b"controlplane.workload" not in (argv := cmdline(handle.pid)):
            assert time.monotonic() < deadline, argv
            time.sleep(0.01)
        assert argv[1:4] == [b"-u", b"-m", b"controlplane.workload"]
        assert argv[4:argv.index(b"--parent-pid")] == [
            b"--kind", b"fail", b"--operation-id", b"op-cmdline", b"--attempt", b"1", b"--bucket",
            b"ml-artifacts", b"--exit-code", b"0", b"--seconds", b"30"]
    finally:
        handle.stop(grace_seconds=2)
    res = wait_result(handle)
    assert res.exit_code == -signal.SIGTERM and "stopped by agent (signal 15)" in res.reason
    assert wait_gone(handle.pid)


def test_per_attempt_environment_reaches_the_workload(forked: LocalRuntime,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    wait_result(forked.start(spec(exit_code=0, seconds=0)))  # the warm parent exists now
    # set after the warm parent started: only a per-attempt environment can carry it
    monkeypatch.setenv("S3_ENDPOINT_URL", "http://127.0.0.1:1")
    handle = forked.start(spec(kind="sleep", seconds=5))
    deadline = time.monotonic() + 15
    seen: list[str] = []
    while not any("127.0.0.1:1" in m for m in seen):
        assert time.monotonic() < deadline, f"no storage error naming the endpoint: {seen}"
        seen += [e.message for e in handle.drain_events()]
        time.sleep(0.05)
    handle.stop(grace_seconds=1)


def agent_script(tmp_path: Path) -> Path:
    """An agent-like parent: starts a long workload, prints pids, then waits to be killed."""
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent("""
        import sys, time, threading
        from controlplane.runtimes.base import LaunchSpec
        from controlplane.runtimes.local import LocalRuntime
        rt = LocalRuntime(start_method="forkserver")
        spec = LaunchSpec(operation_id="op-orphan", attempt_id="a", attempt_number=1,
                          project="p", kind="fail", image="x", params={"seconds": 60})
        box = []
        # started from a short-lived thread, as the agent's per-attempt runner would
        t = threading.Thread(target=lambda: box.append(rt.start(spec)))
        t.start(); t.join()
        print(box[0].pid, rt._server.pid, flush=True)
        time.sleep(120)
    """))
    return script


@pytest.mark.parametrize("group", [False, True], ids=["agent", "agent-and-warm-parent"])
def test_workload_dies_when_the_agent_is_sigkilled(tmp_path: Path, group: bool) -> None:
    """Agent alone: the warm parent sees its socket close and kills its children. Agent and
    warm parent at once (their process group): only the workload's PR_SET_PDEATHSIG is left."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    agent = subprocess.Popen([sys.executable, str(agent_script(tmp_path))], env=env,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert agent.stdout is not None
        workload, zygote = map(int, agent.stdout.readline().split())
        time.sleep(0.3)  # the starting thread has exited: the workload must still run
        assert alive(workload) and alive(zygote)
        if group:
            os.killpg(agent.pid, signal.SIGKILL)
        else:
            agent.kill()
        agent.wait(timeout=5)
        assert wait_gone(zygote), "warm parent outlived the agent"
        assert wait_gone(workload), "workload outlived the agent"
    finally:
        agent.kill()
        for pid in locals().get("workload", 0), locals().get("zygote", 0):
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_dead_warm_parent_fails_its_attempts_and_is_replaced(
        forked: LocalRuntime, caplog: pytest.LogCaptureFixture) -> None:
    handle = forked.start(spec(exit_code=0, seconds=60))
    server = forked._server
    assert server is not None and forked.forkservers_started == 1
    os.kill(server.pid, signal.SIGKILL)
    res = wait_result(handle)
    assert res.outcome is Outcome.FAILED and res.transient
    assert "killed (signal 9)" in res.reason and "warm parent" in res.reason
    assert wait_gone(handle.pid), "workload outlived its warm parent"

    with caplog.at_level(logging.WARNING, logger="controlplane.runtimes"):
        again = forked.start(spec(exit_code=0, seconds=0))
    assert wait_result(again).outcome is Outcome.SUCCEEDED
    assert forked.forkservers_started == 2 and forked._server is not server
    assert any(f"warm parent pid {server.pid} is gone" in r.message for r in caplog.records)


def test_falls_back_to_plain_subprocesses_when_the_warm_parent_cannot_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    python = tmp_path / "python"  # a python on which the warm parent alone fails
    python.write_text(f'#!/bin/sh\ncase "$*" in *runtimes.zygote*) exit 1;; esac\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    rt = LocalRuntime(python=str(python), start_method="forkserver")
    with caplog.at_level(logging.WARNING, logger="controlplane.runtimes"):
        first, second = (rt.start(spec(exit_code=0, seconds=0)) for _ in range(2))
    assert wait_result(first).outcome is Outcome.SUCCEEDED
    assert wait_result(second).outcome is Outcome.SUCCEEDED
    assert rt._server is None and rt.forkservers_started == 0
    fallbacks = [r for r in caplog.records if "could not start" in r.message]
    assert len(fallbacks) == 1, "the fallback is logged once"


def test_unknown_start_method_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GAMEDAY_LOCAL_RUNTIME_START", "spawn")
    with pytest.raises(ValueError, match="GAMEDAY_LOCAL_RUNTIME_START='spawn'"):
        LocalRuntime()


def test_workload_runs_below_the_agents_cpu_priority(runtime: LocalRuntime) -> None:
    """Niceness 10 above the agent's, on both start paths, and the warm parent keeps the
    agent's: a busy workload cannot starve the agent that claims, heartbeats and reports."""
    agent = os.getpriority(os.PRIO_PROCESS, 0)
    handle = runtime.start(spec(exit_code=0, seconds=30))
    try:
        assert os.getpriority(os.PRIO_PROCESS, handle.pid) == min(agent + 10, 19)
        if runtime._server is not None:
            assert os.getpriority(os.PRIO_PROCESS, runtime._server.pid) == agent
    finally:
        handle.stop(grace_seconds=2)
    wait_result(handle)


def test_workload_niceness_follows_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GAMEDAY_LOCAL_RUNTIME_NICE", "0")
    rt = LocalRuntime(start_method="forkserver")
    try:
        handle = rt.start(spec(exit_code=0, seconds=30))
        assert os.getpriority(os.PRIO_PROCESS, handle.pid) == os.getpriority(os.PRIO_PROCESS, 0)
        handle.stop(grace_seconds=2)
        wait_result(handle)
    finally:
        rt.close()
    assert LocalRuntime(nice=3).nice == 3  # the argument wins over the environment


@pytest.mark.parametrize("value", ["-5", "20", "ten"])
def test_bad_niceness_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch,
                                                     value: str) -> None:
    monkeypatch.setenv("GAMEDAY_LOCAL_RUNTIME_NICE", value)
    with pytest.raises(ValueError, match=f"GAMEDAY_LOCAL_RUNTIME_NICE='{value}': expected a "
                                         "whole number from 0"):
        LocalRuntime()


def test_agent_command_refuses_a_bad_niceness_before_starting(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from controlplane.agent.cli import agent_cmd

    r = CliRunner().invoke(agent_cmd, [
        "--api", "http://127.0.0.1:9", "--name", "a", "--pool", "cpu", "--zone", "z",
        "--region", "r", "--cpu-slots", "1", "--token", "t" * 20,
        "--spool-dir", str(tmp_path / "spool")], env={"GAMEDAY_LOCAL_RUNTIME_NICE": "99"})
    assert r.exit_code == 2, r.output
    assert "GAMEDAY_LOCAL_RUNTIME_NICE='99': expected a whole number from 0" in r.output

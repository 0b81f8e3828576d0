"""A game day on the local environment (environments/base.py EnvironmentKind): what its dry run
says, and holding it for one run: brought up when it is not running (and down again
afterwards unless kept), then held by the game-day lock file in its state directory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from environments.environment_types import EnvironmentRefused, OpenRun, RunRequest
from environments.local.errors import EnvError
from environments.schedule import GameDayLock, ScheduleError


class Runnable(Protocol):
    """What holding an environment for a run asks of it (environments/local/env.py has it all)."""

    state_dir: Path

    @property
    def info(self) -> dict[str, Any]: ...
    @property
    def endpoints(self) -> dict[str, Any]: ...
    def is_running(self) -> bool: ...
    def up(self, reporter: Callable[[str], None] | None = None, *,
           platform: str = "controlplane") -> dict[str, Any]: ...
    def down(self, purge: bool = False) -> dict[str, Any]: ...


def dry_run(env: Runnable, req: RunRequest) -> Iterator[str]:
    running = env.is_running()
    state = "running (would be reused)" if running else "not running (would be brought up)"
    yield f"environment {req.env_name!r} at {env.state_dir}: {state}"
    if running:
        eps = env.endpoints
        yield (f"targets: API {eps.get('api')}, DB {eps.get('patroni')}, "
               f"S3 {eps.get('s3')}, registry {eps.get('registry')}")


@contextmanager
def hold_for_run(env: Runnable, load: Callable[[], Runnable], req: RunRequest,
                 new_run: Callable[[], tuple[str, Path]],
                 say: Callable[[str], None]) -> Iterator[OpenRun]:
    """``env`` brought up unless it runs, then attached again (``load``) and locked."""
    started_env = False
    if not env.is_running():
        say(f"bringing up environment {req.env_name!r} ...")
        try:
            env.up(reporter=lambda msg: say(f"  {msg}"), platform=req.platform)
        except EnvError as exc:
            raise EnvironmentRefused(f"the environment did not come up: {exc}") from None
        started_env = True
    env = load()
    running = env.info.get("platform", "controlplane")
    if running != req.platform:
        raise EnvironmentRefused(
            f"environment {req.env_name!r} runs platform {running!r}, not "
            f"{req.platform!r}: `gameday env down` it first or use another --env-name")
    run_id, run_dir = new_run()
    lock = GameDayLock(env.state_dir / "gameday.lock")
    try:
        lock.acquire({"run_id": run_id, "run_dir": str(run_dir)})
    except ScheduleError as exc:
        raise EnvironmentRefused(str(exc)) from None
    try:
        yield OpenRun(env, run_id, run_dir, lock)  # type: ignore[arg-type]
    finally:
        lock.release()
        if started_env and not req.keep_env:
            env.down()

"""The hand-over from `gameday load` to the Locust process: one small JSON file named by
GAMEDAY_LOAD_CONFIG. The token travels in GAMEDAY_LOAD_TOKEN instead, so no secret is ever
written into the run directory."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from loadtests.scenario import Scenario

CONFIG_ENV = "GAMEDAY_LOAD_CONFIG"
TOKEN_ENV = "GAMEDAY_LOAD_TOKEN"
# The process whose death ends the run: the one the local environment's servers die with too
# (tests set it to the pytest session), else the process that starts Locust.
OWNER_ENV = "GAMEDAY_OWNER_PID"


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    scenario: Scenario
    parts_dir: Path      # per-process ledger/requests/submissions part files
    stats_path: Path     # load_stats.json, written by the master (or the single process)
    stop_file: Path      # its appearance asks the run to end early (background mode)
    s3_endpoint: str | None = None
    serving_endpoint: str | None = None  # the serving frontend the Inferrer users call
    serving_model: str | None = None
    owner_pid: int | None = None  # Locust runs in its own session: it ends itself when this dies

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=2), encoding="utf-8")

    @classmethod
    def from_env(cls) -> tuple[RunConfig, str]:
        path = os.environ.get(CONFIG_ENV)
        if not path:
            raise RuntimeError(f"{CONFIG_ENV} is not set: run this locustfile via `gameday load run`")
        token = os.environ.get(TOKEN_ENV, "")
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8")), token

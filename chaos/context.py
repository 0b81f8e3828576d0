"""Where an experiment's probes and actions find the environment, the platform and the run.

Everything comes from the experiment's Chaos Toolkit ``configuration`` (which reads environment
variables set by ``gameday run``), so experiments stay plain Chaos Toolkit files that also run
under a bare ``chaos run`` against an environment that is up.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from environments.base import Environment, EnvironmentUnavailable, FaultDriver, open_environment
from environments.cloud.env import ALLOW_PROD_ENV, CLOUD_STATE_ENV, CLOUD_TARGET_ENV
from platforms import PlatformAdapter, get_adapter
from slo.ledger import LedgerEntry, LedgerWriter

DEFAULTS = {"gameday_env": "local", "gameday_home": "", "gameday_run_dir": "",
            "gameday_platform": "controlplane", "gameday_experiment": "adhoc"}


class ChaosError(Exception):
    """An action or probe could not do what it was asked (message says what and why)."""


def utcnow() -> str:
    return datetime.now(UTC).isoformat()


@dataclass
class Context:
    env_name: str
    home: Path | None
    run_dir: Path
    platform_name: str
    experiment: str

    @classmethod
    def from_configuration(cls, configuration: dict[str, Any] | None) -> Context:
        c = {**DEFAULTS, **{k: v for k, v in (configuration or {}).items() if v not in (None, "")}}
        home = Path(c["gameday_home"]) if c["gameday_home"] else None
        run_dir = Path(c["gameday_run_dir"] or os.environ.get("GAMEDAY_RUN_DIR") or
                       Path.cwd() / "runs" / "adhoc")
        return cls(c["gameday_env"], home, run_dir, c["gameday_platform"], c["gameday_experiment"])

    @property
    def cloud_target(self) -> str | None:
        """Set by ``gameday run`` for dev/staging/prod only: the explicit target file. Without
        it the environment is a local one, exactly as before."""
        return os.environ.get(CLOUD_TARGET_ENV) or None

    @cached_property
    def env(self) -> Environment:
        """The environment, seen only through environments/base.py."""
        state = os.environ.get(CLOUD_STATE_ENV)
        try:
            return open_environment(
                self.env_name, self.home,
                cloud_target=Path(self.cloud_target) if self.cloud_target else None,
                cloud_state_dir=Path(state) if state else None,
                allow_prod=os.environ.get(ALLOW_PROD_ENV, "").lower() in ("1", "true", "yes"))
        except EnvironmentUnavailable as exc:
            raise ChaosError(str(exc)) from None

    @cached_property
    def platform(self) -> PlatformAdapter:
        return get_adapter(self.platform_name, self.env.endpoints, self.env.tokens)

    @cached_property
    def driver(self) -> FaultDriver:
        return self.env.driver  # the environment's own fault driver, timeline included

    # -- per-experiment scratch state (what this experiment submitted, under which tags) ----
    @property
    def state_file(self) -> Path:
        return self.run_dir / "experiments" / self.experiment / "state.json"

    def remember(self, tag: str, ids: list[Any]) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.state_file.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = json.loads(self.state_file.read_text()) if self.state_file.exists() else {}
            data.setdefault(tag, []).extend(ids)
            self.state_file.write_text(json.dumps(data, indent=2))

    def recall(self, tag: str) -> list[Any]:
        if not self.state_file.exists():
            raise ChaosError(f"no operations were submitted under tag {tag!r} in this experiment")
        ids = json.loads(self.state_file.read_text()).get(tag)
        if not ids:
            raise ChaosError(f"no operations were submitted under tag {tag!r} in this experiment")
        return ids

    def ledger(self, acks: list[Any], source: str) -> None:
        """Acknowledged submissions made by experiments count for durability like the load's:
        one client-ledger line per ack (docs/EVIDENCE.md), tagged with who submitted it."""
        project = getattr(self.platform, "project", "")
        LedgerWriter(self.run_dir / "ledger-experiments.jsonl").append(
            LedgerEntry(operation_id=ack.operation_id, idempotency_key=ack.idempotency_key,
                        acked_at=ack.acked_at, project=project, status=ack.status,
                        source=source, request=ack.request) for ack in acks)

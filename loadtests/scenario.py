"""Scenario files (`loadtests/scenarios/*.yaml`): validated before anything runs.

A bad file fails with one ``ScenarioError`` naming the file, the field and the reason. This
module is imported by the CLI *and* inside the Locust process, so it stays free of network
libraries (requests/boto3 break gevent's monkey-patching, docs/DESIGN.md section 8.3).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from loadtests.routes import KNOWN_ROUTES, OVERALL
from slo.durations import parse_duration

SCENARIO_DIR = Path(__file__).with_name("scenarios")

Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class ScenarioError(Exception):
    """A scenario file is missing or invalid; the message names file, field and reason."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class UserClass(_Strict):
    count: int = Field(default=0, ge=0, le=10_000)
    # seconds between two tasks of one user: (min, max), uniformly drawn
    wait_s: tuple[float, float] = (0.1, 0.5)

    @model_validator(mode="after")
    def _wait_order(self) -> UserClass:
        low, high = self.wait_s
        if low < 0 or high < low:
            raise ValueError("wait_s must be [min, max] with 0 <= min <= max")
        return self


class Users(_Strict):
    submitter: UserClass = UserClass()
    poller: UserClass = UserClass()
    artifact_reader: UserClass = UserClass()
    # predictions through the serving frontend (docs/serving.md); none when the environment
    # serves no model (loadtests/runner.py start_for_platform)
    inferrer: UserClass = UserClass()

    @model_validator(mode="after")
    def _some_users(self) -> Users:
        if self.total == 0:
            raise ValueError("at least one user class needs count >= 1")
        return self

    @property
    def total(self) -> int:
        return (self.submitter.count + self.poller.count + self.artifact_reader.count
                + self.inferrer.count)

    def locust_classes(self) -> list[str]:
        """Names of the locustfile's user classes that get at least one user."""
        names = {"submitter": "Submitter", "poller": "Poller", "artifact_reader": "ArtifactReader",
                 "inferrer": "Inferrer"}
        return [names[f] for f in names if getattr(self, f).count > 0]


class Accelerator(_Strict):
    type: Name
    count: int = Field(default=1, ge=1, le=16)


class Placement(_Strict):
    regions: list[Name] | None = None
    dataset: Name | None = None


class OperationTemplate(_Strict):
    """What each submission asks for (docs/CONTRACTS.md `OperationSpec`)."""

    name_prefix: Name = "load"
    kind: Literal["train", "sleep", "fail"] = "train"
    image: str = Field(default="127.0.0.1:5000/ml/trainer:1.0", min_length=1, max_length=512)
    steps: int = Field(default=20, ge=1)
    checkpoint_every: int | None = Field(default=5, ge=1)
    params: dict[str, Any] = Field(default_factory=dict)  # extra workload params
    queue: Name = "default"
    priority: int = Field(default=0, ge=-100, le=100)
    cpu: int = Field(default=1, ge=1, le=64)
    accelerator: Accelerator | None = None
    placement: Placement = Placement()
    max_retries: int = Field(default=3, ge=0, le=20)
    timeout_seconds: int = Field(default=3600, ge=1)
    labels: dict[str, str] = Field(default_factory=dict)

    def body(self, name: str) -> dict[str, Any]:
        params: dict[str, Any] = {"steps": self.steps, **self.params}
        if self.checkpoint_every is not None:
            params["checkpoint_every"] = self.checkpoint_every
        return {
            "name": name, "queue": self.queue, "priority": self.priority,
            "workload": {"kind": self.kind, "image": self.image, "params": params},
            "resources": {"cpu": self.cpu,
                          "accelerator": self.accelerator.model_dump() if self.accelerator else None},
            "placement": self.placement.model_dump(),
            "max_retries": self.max_retries, "timeout_seconds": self.timeout_seconds,
            "labels": {"source": "gameday-load", **self.labels},
        }


class SubmitRetry(_Strict):
    """Bounded retries of one logical submission, always with the same Idempotency-Key."""

    max_attempts: int = Field(default=10, ge=1, le=1000)
    base_s: float = Field(default=0.1, gt=0)
    max_backoff_s: float = Field(default=2.0, gt=0)
    deadline: Duration = 30.0
    # the retry budget of each load process (loadtests/client.py RetryBudget): retries add at
    # most this share to the submissions sent, plus budget_min_per_s retries a second
    budget_ratio: float = Field(default=0.1, ge=0, le=1)
    budget_min_per_s: float = Field(default=5.0, ge=0)


class Client(_Strict):
    request_timeout_s: float = Field(default=5.0, gt=0)
    connect_timeout_s: float = Field(default=2.0, gt=0)
    submit_retry: SubmitRetry = SubmitRetry()
    list_page_size: int = Field(default=50, ge=1, le=500)
    list_max_pages: int = Field(default=3, ge=1, le=100)


Limit = float | dict[str, float]


class Thresholds(_Strict):
    """Objectives of the run. A number applies overall; a mapping is keyed by "METHOD route"
    (see loadtests/routes.py) or "overall"."""

    max_error_rate: Limit | None = None
    max_p95_ms: Limit | None = None
    min_acknowledged: int | None = Field(default=None, ge=0)
    max_abandoned_submissions: int | None = Field(default=None, ge=0)

    @field_validator("max_error_rate", "max_p95_ms")
    @classmethod
    def _route_keys(cls, value: Limit | None) -> Limit | None:
        allowed = (OVERALL, *KNOWN_ROUTES)
        for key, limit in (value.items() if isinstance(value, dict) else ()):
            if key not in allowed:
                raise ValueError(f"unknown route {key!r}; use one of {list(allowed)}")
            if limit < 0:
                raise ValueError(f"limit for {key!r} must be >= 0")
        if isinstance(value, (int, float)) and value < 0:
            raise ValueError("must be >= 0")
        return value

    def limits(self, field: Literal["max_error_rate", "max_p95_ms"]) -> dict[str, float]:
        value = getattr(self, field)
        if value is None:
            return {}
        return {OVERALL: float(value)} if isinstance(value, (int, float)) else dict(value)


class Scenario(_Strict):
    name: str = ""  # the file's stem unless given
    description: str = ""
    duration: Duration = 30.0
    spawn_rate: float = Field(default=10.0, gt=0)
    # a stopping user may finish its current task (e.g. a submission's retries) this long
    stop_timeout: Duration = 5.0
    users: Users
    operation: OperationTemplate = OperationTemplate()
    client: Client = Client()
    thresholds: Thresholds = Thresholds()


def resolve(name_or_path: str | Path) -> Path:
    """A bundled scenario name ("ci") or a path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        return path
    return SCENARIO_DIR / f"{name_or_path}.yaml"


def bundled() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def parse_scenario(raw: Any, where: str, default_name: str = "") -> Scenario:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: must be a YAML mapping")
    try:
        scenario = Scenario.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        raise ScenarioError(f"{where}: field {loc}: {msg}") from None
    return scenario if scenario.name else scenario.model_copy(update={"name": default_name})


def load_scenario(name_or_path: str | Path) -> Scenario:
    path = resolve(name_or_path)
    if not path.is_file():
        raise ScenarioError(f"{path}: no such scenario file (bundled: {', '.join(bundled())})")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise ScenarioError(f"{path}:{line} not valid YAML: {getattr(exc, 'problem', exc)}") from None
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc}") from None
    return parse_scenario(raw, str(path), path.stem)

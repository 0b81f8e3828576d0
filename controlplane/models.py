"""API payloads, validated at the edge (pydantic). Limits keep one request from hurting others."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from controlplane import dataset_uri, registry, workload_classes

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
_IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._:/-]*(:[A-Za-z0-9._-]+|@sha256:[0-9a-f]{64})?$")
MAX_PARAMS_BYTES = 16_384
# The largest request body the API reads (413 above it; the local environment's HAProxy
# refuses it too). The per-field caps below already bound a valid request: the largest, a
# pipeline of 64 steps each with 16 KiB of params, is about 1.1 MiB, so 2 MiB refuses nothing
# valid and keeps a 10 MB field from being parsed at all.
MAX_BODY_BYTES = 2 * 1024 * 1024
MAX_LABELS = 32
MAX_DATASETS = 64


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        # ValueError, not TypeError: pydantic reports only the former as a field's error
        raise ValueError("a boolean is not a number")  # noqa: TRY004
    return value


# The schema says integer (or number) and the API means it: pydantic's lax mode would read
# `false` as 0, strict mode would refuse 3.0, which JSON Schema counts as an integer.
Int = Annotated[int, BeforeValidator(_not_bool)]
Float = Annotated[float, BeforeValidator(_not_bool)]
# and boolean means true or false, not 0, 1 or "yes"
Bool = Annotated[bool, Field(strict=True)]


# the schema enumerates them: a client (or fuzzer) learns the valid classes from it
WorkloadClassName = Literal[tuple(sorted(workload_classes.CLASSES))]  # type: ignore[valid-type]


class Accelerator(Strict):
    type: Name
    count: Int = Field(ge=1, le=16)


class Resources(Strict):
    cpu: Int = Field(default=1, ge=1, le=64)
    accelerator: Accelerator | None = None


class Placement(Strict):
    regions: list[Name] | None = Field(default=None, min_length=1, max_length=16)
    dataset: Name | None = None
    # spot/preemptible nodes: allowed only for a checkpointable workload class
    interruptible: Bool = False


class Workload(Strict):
    kind: Literal["train", "sleep", "fail", "prepare", "evaluate"] = "train"
    image: str = Field(min_length=1, max_length=512)
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if not _IMAGE_RE.match(v):
            raise ValueError("not a valid image reference (registry/name:tag or name@sha256:...)")
        # the agent's own check (controlplane/registry.py): refused here, not at start
        problem = registry.path_problem(v)
        if problem:
            raise ValueError(f"not a valid image reference: {problem}")
        return v

    @field_validator("params")
    @classmethod
    def _params_size(cls, v: dict[str, Any]) -> dict[str, Any]:
        import json

        if len(json.dumps(v)) > MAX_PARAMS_BYTES:
            raise ValueError(f"params larger than {MAX_PARAMS_BYTES} bytes")
        return v


Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class Dataset(Strict):
    """An input dataset: its name is for people, its sha256 (of the bytes) is its identity, its
    uri where it is read at start (controlplane/dataset_uri.py)."""

    name: Name
    sha256: Sha256
    uri: str | None = Field(default=None, max_length=dataset_uri.MAX_LENGTH)

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                dataset_uri.split(v)
            except ValueError as exc:
                raise ValueError(f"not an s3 URI of the artifact bucket: {exc}") from None
        return v


def check_datasets(datasets: list[Dataset], where: str, *, read_all: str | None = None,
                   ) -> None:
    """Dataset names are unique (a source is named in results and failures by its name);
    with ``read_all`` (why every dataset is read at start) each needs a uri. ``where`` is the
    field path of the list in the messages (``datasets``, ``steps[0].datasets``)."""
    seen: dict[str, int] = {}
    for j, ds in enumerate(datasets):
        if ds.name in seen:
            raise ValueError(f"{where}[{j}].name: duplicate dataset name {ds.name!r} "
                             f"(also {where.rsplit('.', 1)[-1]}[{seen[ds.name]}])")
        seen[ds.name] = j
    if read_all is None:
        return
    for j, ds in enumerate(datasets):
        if not ds.uri:
            raise ValueError(f"{where}[{j}].uri: {read_all}; {ds.name!r} has no uri")


class OperationSpec(Strict):
    name: Name
    queue: Name = "default"
    priority: Int = Field(default=0, ge=-100, le=100)
    workload: Workload
    resources: Resources = Field(default_factory=Resources)
    placement: Placement = Field(default_factory=Placement)
    max_retries: Int = Field(default=3, ge=0, le=20)
    timeout_seconds: Int = Field(default=3600, ge=1, le=7 * 24 * 3600)
    labels: dict[Name, Annotated[str, Field(max_length=256)]] = Field(default_factory=dict)
    workload_class: WorkloadClassName | None = None  # controlplane/workload_classes.py
    # read from the artifact bucket and checked against their sha256 before the workload
    # starts (docs/CONTRACTS.md section 5, "Data at start"); a mismatch is a start failure
    datasets: list[Dataset] = Field(default_factory=list, max_length=MAX_DATASETS)

    @field_validator("datasets")
    @classmethod
    def _datasets(cls, v: list[Dataset]) -> list[Dataset]:
        check_datasets(v, "datasets", read_all="an operation reads every dataset it declares "
                       "at start")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_LABELS:
            raise ValueError(f"at most {MAX_LABELS} labels")
        return v

    def document(self) -> dict[str, Any]:
        """The stored document. Fields added after the first schema are left out at their
        defaults: the payload hash behind idempotency (a reused key with a different payload
        is a 409) stays the same for the same request across an upgrade."""
        doc = self.model_dump(mode="json")
        if doc["workload_class"] is None:
            del doc["workload_class"]
        if not doc["placement"]["interruptible"]:
            del doc["placement"]["interruptible"]
        if not doc["datasets"]:
            del doc["datasets"]
        return doc

    @model_validator(mode="after")
    def _workload_class(self) -> OperationSpec:
        if self.workload_class is None:
            workload_classes.check_capacity(None, self.placement.interruptible)
            return self
        wc = workload_classes.lookup(self.workload_class)
        explicit = explicit_fields(self)
        workload_classes.check_overrides(wc, explicit)
        workload_classes.check_capacity(wc, self.placement.interruptible)
        data = workload_classes.apply_defaults(self.model_dump(), wc, explicit)
        for key in {path.split(".")[0] for path in wc.defaults}:
            current = getattr(self, key)
            value = data[key]
            # nested defaults are validated like a submitted value
            setattr(self, key, type(current).model_validate(value)
                    if isinstance(current, BaseModel) else value)
        return self


def explicit_fields(model: BaseModel, prefix: str = "") -> set[str]:
    """Dotted paths of the fields the submitter set (not defaults), nested models included."""
    out: set[str] = set()
    for name in model.model_fields_set:
        value = getattr(model, name)
        if isinstance(value, BaseModel) and value.model_fields_set:
            out |= explicit_fields(value, f"{prefix}{name}.")
        elif not isinstance(value, BaseModel):
            out.add(prefix + name)
    return out


class CancelRequest(Strict):
    reason: str = Field(default="canceled by user", max_length=1000)


class SideEffectRequest(Strict):
    action_id: str = Field(min_length=1, max_length=200)
    kind: Name
    payload: dict[str, Any] = Field(default_factory=dict)


class Capabilities(Strict):
    cpu_slots: Int = Field(ge=0, le=1024)
    accelerator_type: Name | None = None
    accelerator_count: Int = Field(default=0, ge=0, le=64)
    datasets: list[Name] = Field(default_factory=list, max_length=256)
    registries: list[str] = Field(default_factory=list, max_length=64)


class AgentRegistration(Strict):
    name: Name
    pool: Name
    zone: Name
    region: Name
    capabilities: Capabilities


class ClaimRequest(Strict):
    max: Int = Field(default=1, ge=1, le=64)
    # the agent's wall clock (epoch seconds) when it sent the request: recorded as the agent's
    # offset from the database's clock, never used for the lease (controlplane/clock.py)
    agent_time: Float | None = None
    # the agent's id of this claim, sent again unchanged when it asks again after a transport
    # error: what that claim granted comes back instead of its lease running out unused
    claim_id: str | None = Field(default=None, min_length=1, max_length=64,
                                 pattern=r"^[A-Za-z0-9_-]+$")


class FencedRequest(Strict):
    fencing_token: Int = Field(ge=1)


class AttemptHeartbeat(FencedRequest):
    progress: dict[str, Any] | None = None
    agent_time: Float | None = None  # as in ClaimRequest: reported, never trusted


class AgentEvent(Strict):
    kind: Name
    message: str = Field(default="", max_length=4000)
    data: dict[str, Any] = Field(default_factory=dict)


class AttemptEvents(FencedRequest):
    events: list[AgentEvent] = Field(max_length=200)


class AgentEvidenceEvent(AgentEvent):
    # Unfenced, so only the agent's own evidence accounting: never workload events.
    kind: Literal["evidence_dropped"]  # type: ignore[assignment]


class AgentEvents(Strict):
    """Agent-level evidence, recorded on an attempt this agent held (whatever its state)."""

    attempt_id: str = Field(min_length=1, max_length=64)
    events: list[AgentEvidenceEvent] = Field(min_length=1, max_length=10)


class ErrorInfo(Strict):
    kind: Literal["transient", "deterministic"]
    message: str = Field(max_length=4000)


class AttemptReport(FencedRequest):
    state: Literal["running", "succeeded", "failed"]
    reason: str = Field(default="", max_length=1000)
    error: ErrorInfo | None = None
    result: dict[str, Any] | None = None
    # recorded before the state changes, in its transaction: saves an events request per attempt
    events: list[AgentEvent] = Field(default_factory=list, max_length=200)


class RouteOverride(Strict):
    agent: Name


class BreakerOverride(Strict):
    state: Literal["open", "closed"]

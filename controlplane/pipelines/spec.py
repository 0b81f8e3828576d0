"""A submitted pipeline, validated at the edge: typed fields, then the graph rules (unique step
names, known ``needs``, no cycle, a partial-failure policy on every aggregation step and on no
other). Every error names the field it is about."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from controlplane.models import (
    MAX_DATASETS,
    Bool,
    Dataset,
    Int,
    Name,
    OperationSpec,
    Sha256,
    Strict,
    check_datasets,
)

MAX_STEPS = 64


class SourcePolicy(Strict):
    """What a step does when one of its datasets (its sources) cannot be read at start, or its
    bytes are not the declared ones (controlplane/workload/data.py). ``fail``: the step fails
    at start, naming the source. ``degrade``: it runs without the bad sources, as long as at
    least ``min_sources`` were read as declared, and its result names each one it left out
    with why (never a silent shrink)."""

    policy: Literal["fail", "degrade"]
    min_sources: Int | None = Field(default=None, ge=1, le=64)

    @model_validator(mode="after")
    def _minimum(self) -> SourcePolicy:
        if self.policy == "degrade" and self.min_sources is None:
            raise ValueError("policy degrade needs min_sources (the fewest sources it may run on)")
        if self.policy == "fail" and self.min_sources is not None:
            raise ValueError("min_sources applies to policy degrade only, not fail")
        return self


class FailurePolicy(Strict):
    policy: Literal["fail", "continue-incomplete", "accept-subset"]
    min_successful: Int | None = Field(default=None, ge=1, le=MAX_STEPS)

    @model_validator(mode="after")
    def _minimum(self) -> FailurePolicy:
        if self.policy == "accept-subset" and self.min_successful is None:
            raise ValueError("policy accept-subset needs min_successful")
        if self.policy != "accept-subset" and self.min_successful is not None:
            raise ValueError(f"min_successful applies to accept-subset only, not {self.policy}")
        return self


class StepOperation(OperationSpec):
    """An operation spec whose name is given by the pipeline (``<pipeline>.<step>``)."""

    name: Name | None = None  # type: ignore[assignment]

    @field_validator("datasets")
    @classmethod
    def _datasets(cls, v: list[Dataset]) -> list[Dataset]:  # replaces the operation's check
        if v:  # one place per step, read under the step's on_source_unavailable policy
            raise ValueError("a pipeline step declares its datasets on the step "
                             "(steps[i].datasets), not in its operation")
        return v


class SideEffect(Strict):
    kind: Name = "model_registration"


class Step(Strict):
    name: Name
    phase: Literal["prepare", "train", "evaluate", "register", "other"] = "other"
    # task: runs when every upstream succeeded; aggregate: inspects upstream failures under
    # its on_upstream_failure policy; release: runs only after successful upstream checks
    role: Literal["task", "aggregate", "release"] = "task"
    needs: list[Name] = Field(default_factory=list, max_length=MAX_STEPS)
    operation: StepOperation
    datasets: list[Dataset] = Field(default_factory=list, max_length=MAX_DATASETS)
    code_digest: Sha256 | None = None
    environment: dict[Name, Annotated[str, Field(max_length=256)]] = Field(default_factory=dict)
    cache: Bool | None = None  # None: on, except release steps (external state)
    on_upstream_failure: FailurePolicy | None = None
    # the datasets read at start: what happens when one is unavailable or corrupt
    on_source_unavailable: SourcePolicy | None = None
    side_effect: SideEffect | None = None

    @property
    def cache_enabled(self) -> bool:
        return self.cache if self.cache is not None else self.role != "release"


class PipelineSpec(Strict):
    name: Name
    max_parallel_steps: Int = Field(default=4, ge=1, le=MAX_STEPS)
    steps: list[Step] = Field(min_length=1, max_length=MAX_STEPS)
    labels: dict[Name, Annotated[str, Field(max_length=256)]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _graph(self) -> PipelineSpec:
        seen: dict[str, int] = {}
        for i, step in enumerate(self.steps):
            if step.name in seen:
                raise ValueError(f"steps[{i}].name: duplicate step name {step.name!r} "
                                 f"(also steps[{seen[step.name]}])")
            seen[step.name] = i
        for i, step in enumerate(self.steps):
            for ref in step.needs:
                if ref not in seen:
                    raise ValueError(f"steps[{i}].needs: unknown step {ref!r}")
                if ref == step.name:
                    raise ValueError(f"steps[{i}].needs: step {ref!r} needs itself (cycle)")
            if len(set(step.needs)) != len(step.needs):
                raise ValueError(f"steps[{i}].needs: a step is listed twice")
            if step.role == "aggregate" and step.on_upstream_failure is None:
                raise ValueError(f"steps[{i}].on_upstream_failure: aggregation step "
                                 f"{step.name!r} must declare its partial-failure policy "
                                 "(fail, continue-incomplete or accept-subset)")
            if step.role != "aggregate" and step.on_upstream_failure is not None:
                raise ValueError(f"steps[{i}].on_upstream_failure: only an aggregation step "
                                 f"(role: aggregate) takes a policy; {step.name!r} is a "
                                 f"{step.role} step")
            if step.role in ("aggregate", "release") and not step.needs:
                raise ValueError(f"steps[{i}].needs: a {step.role} step needs upstream steps")
            _check_sources(i, step)
            pol = step.on_upstream_failure
            if pol and pol.min_successful and pol.min_successful > len(step.needs):
                raise ValueError(f"steps[{i}].on_upstream_failure.min_successful: "
                                 f"{pol.min_successful} > {len(step.needs)} upstream steps")
        cycle = find_cycle({s.name: s.needs for s in self.steps})
        if cycle:
            raise ValueError("steps.needs: cycle " + " -> ".join(cycle))
        return self

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    def operation_doc(self, step: Step) -> dict[str, Any]:
        """The stored operation document of a step (as ``OperationSpec.document``)."""
        doc = step.operation.document()  # validated once, class defaults applied
        doc["name"] = f"{self.name}.{step.name}"
        return doc


def _check_sources(i: int, step: Step) -> None:
    """Dataset names are unique within a step (a source is named in results by its name); a
    source policy needs sources that are read (each dataset with a uri), at most as many as
    its minimum."""
    check_datasets(step.datasets, f"steps[{i}].datasets")
    pol = step.on_source_unavailable
    if pol is None:
        return
    if not step.datasets:
        raise ValueError(f"steps[{i}].on_source_unavailable: step {step.name!r} declares no "
                         "datasets to read")
    check_datasets(step.datasets, f"steps[{i}].datasets",
                   read_all="a step with on_source_unavailable reads every dataset at start")
    if pol.min_sources is not None and pol.min_sources > len(step.datasets):
        raise ValueError(f"steps[{i}].on_source_unavailable.min_sources: {pol.min_sources} > "
                         f"{len(step.datasets)} datasets")


def find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """A cycle as [a, b, ..., a], or None (iterative DFS, deterministic order)."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(graph, WHITE)
    for root in graph:
        if color[root] != WHITE:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = []
        while stack:
            node, i = stack.pop()
            if i == 0:
                color[node] = GREY
                path.append(node)
            deps = graph.get(node, [])
            if i < len(deps):
                stack.append((node, i + 1))
                nxt = deps[i]
                if color.get(nxt) == GREY:
                    return path[path.index(nxt):] + [nxt]
                if color.get(nxt) == WHITE:
                    stack.append((nxt, 0))
            else:
                color[node] = BLACK
                path.pop()
    return None

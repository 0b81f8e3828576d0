"""A submission's commit and answer, shared by the route (api/operations.py) and its fast path
(api/fast_submit.py), so both commit and answer alike."""

from __future__ import annotations

import json
from typing import Any

import orjson

from controlplane import metrics
from controlplane.api import serialize
from controlplane.api.group_commit import GroupCommit
from controlplane.models import OperationSpec
from controlplane.store import StoreUnavailable
from controlplane.store import auth as auth_store
from controlplane.store.submissions import SubmitItem, SubmitResult

# the scope key under which the fast path hands the route a commit's failure: the route then
# answers it as its own, without committing a second time
PRIOR_FAILURE = "controlplane.submit_failure"


async def commit(commits: GroupCommit, p: auth_store.Principal, key: str,
                 doc: dict[str, Any], prior: BaseException | None = None) -> SubmitResult:
    """Commit ``doc`` (`OperationSpec.document`) in the next group; raises what the group
    earned (Conflict, InvalidReference, StoreUnavailable after one retry), counting nothing:
    the caller counts a refusal. ``prior``: what the fast path's attempt earned, raised as is."""
    if prior is not None:
        raise prior
    item = SubmitItem(p.project_id, key, doc, f"user:{p.project}")  # type: ignore[arg-type]
    try:
        return await commits.submit(item)
    except StoreUnavailable:
        # a pooled connection broken by a failover: the statement is idempotent (ON CONFLICT
        # on the key), so one retry on a fresh connection is safe
        return await commits.submit(item)


def answer(res: SubmitResult, p: auth_store.Principal, spec: OperationSpec) -> tuple[int, bytes]:
    """Count a committed submission (its group logged it: api/group_commit.py); its status and
    JSON body."""
    metrics.child(metrics.SUBMISSIONS, p.project, spec.queue,
                  "accepted" if res.created else "duplicate").inc()
    return (201 if res.created else 200), encode(serialize.operation(res.operation, p.project))


def encode(doc: dict[str, Any]) -> bytes:
    """Compact JSON by orjson (json.dumps' encoder was 5 % of the API's CPU per submission:
    docs/performance.md); json for what orjson refuses (an integer beyond 64 bits in a result)."""
    try:
        return orjson.dumps(doc)
    except TypeError:
        return json.dumps(doc, separators=(",", ":")).encode()

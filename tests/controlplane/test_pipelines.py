"""Pipelines through the API and the reconciler on a real PostgreSQL: validation, idempotent
submit, manifests between steps, cache identity, partial-failure policies, side effects once,
the concurrency limit, two reconcilers. The test plays the agent (claim, report), as the other
control-plane tests do; the result it reports is what controlplane/agent/attempt.py reports
after reading COMPLETE.json back."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from typing import Any

import psycopg
import pytest

from controlplane.pipelines.spec import PipelineSpec
from controlplane.store import auth
from controlplane.store import pipelines as store
from environments.local.launch import ControlPlane

from .helpers import Api, claim_one, wait_for

PINNED = "127.0.0.1:5000/ml/trainer@sha256:" + "c" * 64
DATA_V1 = hashlib.sha256(b"churn rows v1").hexdigest()
DATA_V2 = hashlib.sha256(b"churn rows v2").hexdigest()


class Pipes(Api):
    def submit_pipeline(self, body: dict[str, Any], key: str | None = None) -> Any:
        return self.c.post("/v1/pipelines", json=body,
                           headers={"Idempotency-Key": str(uuid.uuid4()) if key is None else key})

    def pipeline(self, pid: str) -> dict[str, Any]:
        r = self.c.get(f"/v1/pipelines/{pid}")
        r.raise_for_status()
        return r.json()

    def pipeline_events(self, pid: str) -> list[dict[str, Any]]:
        return self.c.get(f"/v1/pipelines/{pid}/events").json()["items"]


@pytest.fixture
def user(cp_stack: ControlPlane) -> Pipes:
    return Pipes(cp_stack.api_url, cp_stack.user_token)


@pytest.fixture
def agent(cp_stack: ControlPlane) -> Pipes:
    return Pipes(cp_stack.api_url, cp_stack.agent_token)


def step(name: str, **over: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"name": name, "operation": {
        "workload": {"kind": "sleep", "image": PINNED, "params": {"seconds": 0.1}},
        "max_retries": 1}}
    s.update(over)
    return s


def churn(data: str = DATA_V1, policy: dict[str, Any] | None = None, candidates: int = 2,
          **over: Any) -> dict[str, Any]:
    # candidates differ in their parameters: two identical ones would share one cache key
    trains = [step(f"train-{i}", phase="train", needs=["prepare"], operation={"workload": {
        "kind": "sleep", "image": PINNED, "params": {"seconds": 0.1 + i / 100}}})
        for i in range(candidates)]
    body: dict[str, Any] = {"name": "churn", "steps": [
        step("prepare", phase="prepare", datasets=[{"name": "churn-rows", "sha256": data}]),
        *trains,
        step("evaluate", phase="evaluate", role="aggregate", needs=[t["name"] for t in trains],
             on_upstream_failure=policy or {"policy": "fail"}),
        step("register", phase="register", role="release", needs=["evaluate"],
             side_effect={"kind": "model_registration"}),
    ]}
    body.update(over)
    return body


def output_for(claim: dict[str, Any], content: bytes, checks: dict[str, Any] | None = None,
               ) -> dict[str, Any]:
    """The result an agent reports after verifying COMPLETE.json: the attempt's own prefix,
    files with sizes and sha256, and the inputs the step was given, by digest."""
    prefix = f"artifacts/{claim['operation_id']}/attempt-{claim['number']}/"
    out = {"artifacts_prefix": prefix, "completion_manifest": prefix + "COMPLETE.json",
           "files": {"out.bin": {"sha256": hashlib.sha256(content).hexdigest(),
                                 "size": len(content)}},
           "inputs": claim["spec"]["pipeline"]["inputs"]["digests"]}
    if checks is not None:
        out["checks"] = checks
    return out


def run_step(agent: Pipes, agent_id: str, *, fail: bool = False, content: bytes | None = None,
             checks: dict[str, Any] | None = None, expect: str | None = None) -> dict[str, Any]:
    claim = claim_one(agent, agent_id)
    name = claim["spec"]["pipeline"]["step"]
    if expect is not None:
        assert name == expect, f"expected step {expect}, got {name}"
    if fail:
        r = agent.report(claim, "failed", error={"kind": "deterministic", "message": "diverged"})
    else:
        digests = ",".join(claim["spec"]["pipeline"]["inputs"]["digests"])
        r = agent.report(claim, "succeeded", result=output_for(
            claim, content if content is not None else (name + digests).encode(), checks))
    assert r.status_code == 200, r.text
    return claim


def step_state(user: Pipes, pid: str, name: str) -> str:
    return next(s["state"] for s in user.pipeline(pid)["steps"] if s["name"] == name)


def wait_pipeline(user: Pipes, pid: str, *states: str) -> dict[str, Any]:
    return wait_for(lambda: (p := user.pipeline(pid))["state"] in states and p, 20,
                    what=f"pipeline {pid} in {states}")


PASS = {"auc": {"passed": True, "value": 0.91}}


def run_churn(user: Pipes, agent: Pipes, agent_id: str, body: dict[str, Any],
              ) -> tuple[str, list[str]]:
    """Submit and play every step that gets an operation; returns (id, steps that ran)."""
    pid = user.submit_pipeline(body).json()["id"]
    ran: list[str] = []
    while user.pipeline(pid)["state"] == "running":
        claims = agent.claim(agent_id, 1)
        if not claims:
            continue
        claim = claims[0]
        name = claim["spec"]["pipeline"]["step"]
        # a step's output bytes depend on its input bytes (as a real step's would)
        content = (name + ",".join(claim["spec"]["pipeline"]["inputs"]["digests"])).encode()
        agent.report(claim, "succeeded", result=output_for(
            claim, content, PASS if name == "evaluate" else None)).raise_for_status()
        ran.append(name)
    return pid, ran


# -- validation and idempotency ---------------------------------------------------------------


def test_invalid_pipelines_get_422_naming_the_field(user: Pipes) -> None:
    cyc = churn()
    cyc["steps"][0]["needs"] = ["register"]
    r = user.submit_pipeline(cyc)
    assert r.status_code == 422 and "cycle prepare -> register -> evaluate" in r.text
    nopol = churn()
    del nopol["steps"][3]["on_upstream_failure"]
    r = user.submit_pipeline(nopol)
    assert r.status_code == 422 and "steps[3].on_upstream_failure" in r.text
    unknown = churn()
    unknown["steps"][1]["needs"] = ["prep"]
    assert "steps[1].needs: unknown step 'prep'" in user.submit_pipeline(unknown).text
    dup = churn()
    dup["steps"][2]["name"] = "train-0"
    assert "duplicate step name 'train-0'" in user.submit_pipeline(dup).text
    bad_image = churn()
    bad_image["steps"][0]["operation"]["workload"]["image"] = "NOT AN IMAGE"
    r = user.submit_pipeline(bad_image)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][:4] == [
        "body", "steps", 0, "operation"]
    assert user.submit_pipeline(churn(), key="").status_code == 422


def test_submit_is_idempotent_per_key_and_isolated_per_project(user: Pipes,
                                                               cp_stack: ControlPlane) -> None:
    first = user.submit_pipeline(churn(), key="pipe-1")
    assert first.status_code == 201
    again = user.submit_pipeline(churn(), key="pipe-1")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    clash = user.submit_pipeline(churn(data=DATA_V2), key="pipe-1")
    assert clash.status_code == 409 and "different pipeline payload" in clash.text
    other = Pipes(cp_stack.api_url, cp_stack.other_user_token)
    assert other.c.get(f"/v1/pipelines/{first.json()['id']}").status_code == 404
    assert other.submit_pipeline(churn(), key="pipe-1").json()["id"] != first.json()["id"]


# -- manifests, cache, policies, side effects -------------------------------------------------


def test_downstream_starts_only_from_upstream_manifest(user: Pipes, agent: Pipes) -> None:
    agent_id = agent.register("a1")
    pid = user.submit_pipeline(churn(candidates=1)).json()["id"]
    prep = claim_one(agent, agent_id)
    assert prep["spec"]["pipeline"]["step"] == "prepare"
    assert prep["spec"]["pipeline"]["inputs"]["digests"] == [DATA_V1]
    assert agent.claim(agent_id, 4) == []  # nothing downstream while prepare runs
    # a success whose result is not the attempt's manifest is refused: train never starts
    bad = output_for(prep, b"rows")
    bad["artifacts_prefix"] = f"artifacts/{prep['operation_id']}/latest/"
    agent.report(prep, "succeeded", result=bad).raise_for_status()
    p = wait_pipeline(user, pid, "failed")
    assert "completion manifest rejected" in p["state_reason"]
    # train is skipped; evaluate applies its policy (fail) to the skipped candidate
    assert [s["state"] for s in p["steps"]] == ["failed", "skipped", "failed", "skipped"]
    assert agent.claim(agent_id, 4) == []
    # the same pipeline with a valid manifest: train receives prepare's manifest explicitly
    pid = user.submit_pipeline(churn(candidates=1)).json()["id"]
    prep = claim_one(agent, agent_id)
    agent.report(prep, "succeeded", result=output_for(prep, b"rows")).raise_for_status()
    train = claim_one(agent, agent_id)
    given = train["spec"]["pipeline"]["inputs"]["steps"]
    assert [g["step"] for g in given] == ["prepare"]
    assert given[0]["artifacts_prefix"] == f"artifacts/{prep['operation_id']}/attempt-1/"
    assert train["spec"]["pipeline"]["inputs"]["digests"] == [hashlib.sha256(b"rows").hexdigest()]
    assert step_state(user, pid, "prepare") == "succeeded"


def test_cache_hits_when_nothing_changed_and_misses_when_bytes_changed(
        user: Pipes, agent: Pipes) -> None:
    agent_id = agent.register("a1")
    first, ran = run_churn(user, agent, agent_id, churn())
    assert sorted(ran) == ["evaluate", "prepare", "register", "train-0", "train-1"]
    assert user.pipeline(first)["state"] == "succeeded"
    # nothing that matters changed: every cacheable step is reused, register (release) runs
    second, ran = run_churn(user, agent, agent_id, churn())
    assert ran == ["register"]
    reused = [e for e in user.pipeline_events(second) if e["kind"] == "cache_reused"]
    assert sorted(e["data"]["step"] for e in reused) == ["evaluate", "prepare", "train-0",
                                                         "train-1"]
    prep_hit = next(e for e in reused if e["data"]["step"] == "prepare")
    assert prep_hit["data"]["source_pipeline_id"] == first
    assert prep_hit["data"]["cache_key"].startswith("sha256:")
    assert prep_hit["data"]["source_operation_id"]
    # same dataset name, different bytes: prepare misses, and so does everything after it
    third, ran = run_churn(user, agent, agent_id, churn(data=DATA_V2))
    assert sorted(ran) == ["evaluate", "prepare", "register", "train-0", "train-1"]
    kinds = {e["data"]["step"]: e["kind"] for e in user.pipeline_events(third)
             if e["kind"].startswith("cache_")}
    assert kinds == {"prepare": "cache_miss", "train-0": "cache_miss", "train-1": "cache_miss",
                     "evaluate": "cache_miss", "register": "cache_disabled"}
    # reuse disabled per step: a stochastic repetition runs even with a stored result
    body = churn()
    body["steps"][1]["cache"] = False
    _, ran = run_churn(user, agent, agent_id, body)
    assert ran == ["train-0", "register"]


def _policy_run(user: Pipes, agent: Pipes, policy: dict[str, Any], failing: int,
                ) -> tuple[str, str]:
    agent_id = agent.register(f"a-{uuid.uuid4().hex[:6]}")
    fresh = hashlib.sha256(uuid.uuid4().bytes).hexdigest()  # new data: nothing cached
    pid = user.submit_pipeline(churn(data=fresh, policy=policy, candidates=3)).json()["id"]
    run_step(agent, agent_id, expect="prepare")
    for i in range(3):
        run_step(agent, agent_id, fail=i < failing)
    return pid, agent_id


def test_policy_fail_stops_before_evaluation(user: Pipes, agent: Pipes) -> None:
    pid, _ = _policy_run(user, agent, {"policy": "fail"}, failing=1)
    p = wait_pipeline(user, pid, "failed")
    ev = next(s for s in p["steps"] if s["name"] == "evaluate")
    assert ev["state"] == "failed" and "policy fail: 1 of 3" in ev["state_reason"]
    assert ev["operation_id"] is None and step_state(user, pid, "register") == "skipped"


def test_policy_continue_incomplete_names_every_excluded_candidate(user: Pipes,
                                                                  agent: Pipes) -> None:
    pid, agent_id = _policy_run(user, agent, {"policy": "continue-incomplete"}, failing=2)
    ev = run_step(agent, agent_id, expect="evaluate", checks=PASS)
    pipe = ev["spec"]["pipeline"]
    assert len(pipe["inputs"]["steps"]) == 1 and sorted(pipe["excluded"]) == ["train-0",
                                                                              "train-1"]
    run_step(agent, agent_id, expect="register")
    p = wait_pipeline(user, pid, "succeeded")
    assert p["report"]["incomplete"] is True
    assert sorted(p["report"]["excluded"]) == ["train-0", "train-1"]
    assert all("diverged" in why for why in p["report"]["excluded"].values())
    rep = next(s for s in p["steps"] if s["name"] == "evaluate")["report"]
    assert rep["candidates"] == ["train-0", "train-1", "train-2"]
    assert "succeeded incomplete: 2 candidate(s) excluded" in p["state_reason"]


def test_policy_accept_subset_enforces_its_minimum(user: Pipes, agent: Pipes) -> None:
    pid, agent_id = _policy_run(user, agent, {"policy": "accept-subset", "min_successful": 2},
                                failing=1)
    run_step(agent, agent_id, expect="evaluate", checks=PASS)
    run_step(agent, agent_id, expect="register")
    assert wait_pipeline(user, pid, "succeeded")["report"]["excluded"].keys() == {"train-0"}
    pid, _ = _policy_run(user, agent, {"policy": "accept-subset", "min_successful": 2},
                         failing=2)
    p = wait_pipeline(user, pid, "failed")
    assert "fewer than the minimum 2" in p["state_reason"]


def test_release_requires_successful_checks(user: Pipes, agent: Pipes) -> None:
    agent_id = agent.register("a1")
    pid = user.submit_pipeline(churn(candidates=1)).json()["id"]
    for name in ("prepare", "train-0"):
        run_step(agent, agent_id, expect=name)
    # the evaluation itself succeeds (it inspected the candidates) but its check failed
    run_step(agent, agent_id, expect="evaluate", checks={"auc": {"passed": False}})
    p = wait_pipeline(user, pid, "failed")
    reg = next(s for s in p["steps"] if s["name"] == "register")
    assert reg["state"] == "failed" and "check(s) auc of step evaluate failed" in reg[
        "state_reason"] and reg["operation_id"] is None


def test_registration_is_not_duplicated_by_a_retry_after_a_lost_response(
        user: Pipes, agent: Pipes, cp_stack: ControlPlane) -> None:
    agent_id = agent.register("a1")
    pid = user.submit_pipeline(churn(candidates=1)).json()["id"]
    for name in ("prepare", "train-0"):
        run_step(agent, agent_id, expect=name)
    run_step(agent, agent_id, expect="evaluate", checks=PASS)
    reg = claim_one(agent, agent_id)
    effect = reg["spec"]["pipeline"]["side_effect"]
    assert effect["action_id"] == f"pipeline:{pid}:step:register:model_registration"
    body = {"action_id": effect["action_id"], "kind": "model_registration",
            "payload": {"model_sha256": "d" * 64}}
    url = f"/v1/operations/{reg['operation_id']}/side-effects"
    first = agent.c.post(url, json=body)
    assert first.status_code == 201
    # the response was lost: the attempt's lease runs out, a second attempt registers again
    retry = wait_for(lambda: (c := agent.claim(agent_id, 1)) and c[0], 20,
                     what="the retried attempt")
    assert retry["spec"]["pipeline"]["side_effect"] == effect  # the same action identity
    again = agent.c.post(url, json=body)
    assert again.status_code == 200 and again.json()["created"] is False
    assert again.json()["receipt"] == first.json()["receipt"]
    agent.report(retry, "running").raise_for_status()
    agent.report(retry, "succeeded", result=output_for(retry, b"registered")).raise_for_status()
    p = wait_pipeline(user, pid, "succeeded")
    # the lost first attempt shows as recovery time of the register step
    assert p["timing"]["steps"]["register"]["recovery"] > 0
    assert p["timing"]["phases"]["recovery"] > 0
    with psycopg.connect(cp_stack.dsn) as conn:
        n = conn.execute("SELECT count(*) FROM side_effects WHERE action_id = %s",
                         (effect["action_id"],)).fetchone()
        ops = conn.execute("SELECT count(*) FROM operations WHERE idempotency_key = %s",
                           (f"pipeline:{pid}:register",)).fetchone()
    assert n == (1,) and ops == (1,)


def test_concurrency_limit_is_separate_from_capacity_and_timing_is_recorded(
        user: Pipes, agent: Pipes) -> None:
    agent_id = agent.register("a1", cpu_slots=16)  # capacity for all three candidates
    pid = user.submit_pipeline(churn(candidates=3, max_parallel_steps=2,
                                     policy={"policy": "continue-incomplete"})).json()["id"]
    run_step(agent, agent_id, expect="prepare")
    first = wait_for(lambda: agent.claim(agent_id, 8), what="claims")
    assert len(first) == 2  # the pipeline's limit, not the agent's capacity
    p = user.pipeline(pid)
    waiting = next(s for s in p["steps"] if s["state"] == "waiting" and s["name"] != "evaluate"
                   and s["name"] != "register")
    assert "concurrency limit (2" in waiting["state_reason"]
    for c in first:
        agent.report(c, "succeeded", result=output_for(c, b"m")).raise_for_status()
    run_step(agent, agent_id)
    run_step(agent, agent_id, expect="evaluate", checks=PASS)
    run_step(agent, agent_id, expect="register")
    timing = wait_pipeline(user, pid, "succeeded")["timing"]
    assert set(timing["steps"]) == {"prepare", "train-0", "train-1", "train-2", "evaluate",
                                    "register"}
    phases = timing["phases"]
    for k in ("queue_wait", "startup", "data_preparation", "computation", "evaluation"):
        assert phases[k] is not None and phases[k] >= 0, k
    assert phases["recovery"] is None  # no step needed a second attempt


# -- two reconcilers --------------------------------------------------------------------------


def test_two_reconcilers_advance_each_step_once(user: Pipes, agent: Pipes,
                                                cp_stack: ControlPlane) -> None:
    cp_stack.start_reconciler(1)
    agent_id = agent.register("a1")
    pid, ran = run_churn(user, agent, agent_id, churn(candidates=3))
    assert sorted(ran) == ["evaluate", "prepare", "register", "train-0", "train-1", "train-2"]
    evs = user.pipeline_events(pid)
    started = [e["data"]["step"] for e in evs
               if e["kind"] == "step_transition" and e["data"]["state"] == "running"]
    assert sorted(started) == sorted(ran)
    assert sum(e["kind"] == "pipeline_finished" for e in evs) == 1


def test_concurrent_advance_passes_on_one_database(pg_dsn: str) -> None:
    """Store level, without timing luck: eight passes at once on separate connections."""
    with psycopg.connect(pg_dsn) as conn:
        auth.seed(conn, {"projects": [{"name": "p", "token": "t" * 20}],
                         "queues": [{"name": "default"}]})
        project = str(conn.execute("SELECT id FROM projects").fetchone()[0])  # type: ignore[index]
    spec = PipelineSpec.model_validate(churn(candidates=4, max_parallel_steps=8))

    async def run() -> str:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as c:
            res = await store.submit(c, project_id=project, key="k", spec=spec, actor="t")
            pid = res.pipeline["id"]
            await c.execute("UPDATE pipeline_steps SET state = 'succeeded', manifest = %s"
                            " WHERE pipeline_id = %s AND name = 'prepare'",
                            (psycopg.types.json.Jsonb({"files": {"x": {
                                "sha256": DATA_V1, "size": 1}}}), pid))
        conns = [await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
                 for _ in range(8)]
        try:
            await asyncio.gather(*(store.advance(c) for c in conns))
        finally:
            for c in conns:
                await c.close()
        return str(pid)

    pid = asyncio.run(run())
    with psycopg.connect(pg_dsn) as conn:
        ops = conn.execute("SELECT count(*) FROM operations").fetchone()
        misses = conn.execute("SELECT count(*) FROM events WHERE operation_id = %s"
                              " AND kind = 'cache_miss'", (pid,)).fetchone()
    assert ops == (4,) and misses == (4,)


def test_a_step_with_a_workload_class_is_submitted_with_the_class_defaults(pg_dsn: str) -> None:
    """Progression submits the operation document validated at the edge; it never validates
    the stored spec again (class defaults, once applied, would read as forbidden overrides)."""
    with psycopg.connect(pg_dsn) as conn:
        auth.seed(conn, {"projects": [{"name": "p", "token": "t" * 20}],
                         "queues": [{"name": "default"}]})
        project = str(conn.execute("SELECT id FROM projects").fetchone()[0])  # type: ignore[index]
    body = {"name": "wc", "steps": [{"name": "prep", "operation": {
        "workload_class": "batch-preprocessing",
        "workload": {"kind": "sleep", "image": PINNED, "params": {"seconds": 0.1}}}}]}
    spec = PipelineSpec.model_validate(body)
    expected = spec.operation_doc(spec.steps[0])

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as c:
            await store.submit(c, project_id=project, key="k", spec=spec, actor="t")
            assert await store.advance(c) == 1

    asyncio.run(run())
    with psycopg.connect(pg_dsn) as conn:
        stored = conn.execute("SELECT spec FROM operations").fetchone()[0]  # type: ignore[index]
    assert stored["workload_class"] == "batch-preprocessing"
    assert {k: stored[k] for k in expected if k != "labels"} == {
        k: v for k, v in expected.items() if k != "labels"}


# -- data at start: a step's source policy -----------------------------------------------------


def test_source_policy_degrade_names_the_source_left_out_and_fail_is_422_checked(
        user: Pipes, agent: Pipes, cp_stack: ControlPlane) -> None:
    """A step reading ten sources under ``degrade``: its result leaving one out is accepted
    only when it names it; the step says so, the pipeline succeeds degraded naming it, and the
    degraded result is never cached. Policies are validated at the edge, naming the field."""
    ds = [{"name": f"s{i:02d}", "sha256": hashlib.sha256(f"r{i}".encode()).hexdigest(),
           "uri": f"datasets/t/s{i:02d}.csv"} for i in range(10)]
    body = {"name": "sources", "steps": [step(
        "prepare", phase="prepare", datasets=ds,
        on_source_unavailable={"policy": "degrade", "min_sources": 9})]}
    bad = {**body, "steps": [{**body["steps"][0],
                              "on_source_unavailable": {"policy": "degrade"}}]}
    r = user.submit_pipeline(bad)
    assert r.status_code == 422 and "needs min_sources" in r.text
    r = user.submit_pipeline({**body, "steps": [{**body["steps"][0], "on_source_unavailable": {
        "policy": "degrade", "min_sources": 11}}]})
    assert r.status_code == 422 and "on_source_unavailable.min_sources: 11 > 10" in r.text
    agent_id = agent.register("cpu-sources")
    pid = user.submit_pipeline(body).json()["id"]
    claim = claim_one(agent, agent_id)
    inputs = claim["spec"]["pipeline"]["inputs"]
    assert inputs["sources"] == {"policy": "degrade", "min_sources": 9}
    out = output_for(claim, b"prepared")
    out["inputs"] = sorted(d["sha256"] for d in ds if d["name"] != "s03")
    agent.report(claim, "succeeded", result={
        **out, "sources": {"excluded": {"s03": "sha256 mismatch"}}}).raise_for_status()
    p = wait_pipeline(user, pid, "succeeded", "failed")
    assert p["state"] == "succeeded", p
    assert p["report"]["excluded_sources"] == {"prepare": {"s03": "sha256 mismatch"}}
    assert p["report"]["degraded"] is True and "left out 1 source(s) (s03)" in p["state_reason"]
    [s] = p["steps"]
    assert "degraded: 1 source(s) left out (s03: sha256 mismatch)" in s["state_reason"]
    # the same pipeline again runs (no reuse of a degraded result); leaving out without
    # naming it is a rejected manifest
    pid2 = user.submit_pipeline(body).json()["id"]
    claim = claim_one(agent, agent_id)
    out = output_for(claim, b"prepared")
    out["inputs"] = sorted(d["sha256"] for d in ds if d["name"] != "s03")
    agent.report(claim, "succeeded", result=out).raise_for_status()
    p2 = wait_pipeline(user, pid2, "succeeded", "failed")
    assert p2["state"] == "failed" and "completion manifest rejected: inputs:" in (
        p2["steps"][0]["state_reason"])

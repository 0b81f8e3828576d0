"""The OpenAPI schema describes the API (no database): the answers each route can give, the
bearer scheme, enumerated workload classes; and every route goes through the edge checks."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane import workload_classes
from controlplane.api.app import Settings, create_app
from controlplane.api.edge import EdgeRoute, api_routes


@pytest.fixture(scope="module")
def app() -> Any:
    # the pool is created closed and only opened by the lifespan, which never runs here
    return create_app(Settings(dsn="postgresql://unused@127.0.0.1:1/none"))


@pytest.fixture(scope="module")
def doc(app: Any) -> dict[str, Any]:
    return app.openapi()  # type: ignore[no-any-return]


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m.upper(), p, op) for p, ops in doc["paths"].items() for m, op in ops.items()]


def test_every_route_checks_its_input_at_the_edge(app: Any) -> None:
    routes = list(api_routes(app))
    assert len(routes) >= 25
    assert [r.path for r in routes if not isinstance(r, EdgeRoute)] == []


def test_the_bearer_scheme_is_declared_and_required_where_a_token_is(
        doc: dict[str, Any]) -> None:
    assert doc["components"]["securitySchemes"] == {
        "HTTPBearer": {"type": "http", "scheme": "bearer",
                       "description": "A project (user), agent or admin token."}}
    for method, path, op in _operations(doc):
        if path.startswith("/v1/"):
            assert op.get("security") == [{"HTTPBearer": []}], (method, path)
            assert "401" in op["responses"], (method, path)
            # the header is the scheme's, not an optional parameter of its own
            assert "authorization" not in {p["name"].lower() for p in op.get("parameters", [])}


def test_the_answers_a_route_can_give_are_declared(doc: dict[str, Any]) -> None:
    missing = []
    for method, path, op in _operations(doc):
        codes = set(op["responses"])
        need = {"400", "413"}
        if "{" in path:
            need |= {"404", "405", "422"}
        if path.startswith("/v1/"):
            need |= {"401", "503"}
        if path.startswith(("/v1/admin/", "/v1/attempts/")) or path == "/v1/agents":
            need.add("403")
        if path.startswith("/v1/operations/{op_id}"):
            need.add("308")
        if missing_here := need - codes:
            missing.append((method, path, sorted(missing_here)))
    assert missing == []
    responses = doc["paths"]["/v1/operations"]["post"]["responses"]
    assert {"200", "201", "403", "409", "422"} <= set(responses)
    assert responses["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/HTTPValidationError"}
    assert "409" in doc["paths"]["/v1/attempts/{attempt_id}/report"]["post"]["responses"]


def test_workload_classes_are_enumerated(doc: dict[str, Any]) -> None:
    field = doc["components"]["schemas"]["OperationSpec"]["properties"]["workload_class"]
    enums = [s["enum"] for s in field["anyOf"] if "enum" in s]
    assert enums == [sorted(workload_classes.CLASSES)]


def test_the_idempotency_key_is_a_required_header(doc: dict[str, Any]) -> None:
    for path in ("/v1/operations", "/v1/pipelines"):
        params = {p["name"]: p for p in doc["paths"][path]["post"]["parameters"]}
        key = params["idempotency-key"]
        assert key["in"] == "header" and key["required"] is True
        assert key["schema"]["minLength"] == 1 and key["schema"]["maxLength"] == 200


def test_create_answers_link_to_the_routes_that_take_their_id(doc: dict[str, Any]) -> None:
    links = doc["paths"]["/v1/operations"]["post"]["responses"]["201"]["links"]
    targets = {p for p in doc["paths"] if "{op_id}" in p}
    linked = {path for path, ops in doc["paths"].items() for op in ops.values()
              if op["operationId"] in links}
    assert linked == targets
    assert all(link["parameters"] == {"op_id": "$response.body#/id"} for link in links.values())

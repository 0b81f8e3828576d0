"""The answers every route shares, declared in the OpenAPI schema where they can occur, so that
clients generated from it (and fuzzers) are not misled. Route-specific ones (409) stay on the
route's decorator; this adds what follows from a route's shape:

- 400: the request could not be parsed (a body that is not UTF-8 JSON text);
- 401 / 403: the route needs a token / a role not every token has;
- 404, 405: a path parameter names nothing, or (with an encoded ``/``) lands on a path that
  another method serves; 308: an operation id a database restore redirected (api/admin.py);
- 413: a body above the API's limit (api/body_limit.py), on every route;
- 422: declared by FastAPI wherever there is a parameter or a body (api/edge.py keeps every
  422 in that shape);
- 503: overload (api/admission.py) or the database unavailable (api/errors.py), everywhere
  but liveness and the metrics scrape.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from controlplane.api.deps import principal
from controlplane.api.edge import api_routes
from controlplane.api.errors import ErrorMessage

__all__ = ["ALL_ROLES", "install", "shared_answers"]

ALL_ROLES = frozenset({"user", "agent", "admin"})
_ERROR_REF = {"$ref": "#/components/schemas/ErrorMessage"}
NEVER_SHED = frozenset({"/healthz", "/metrics"})  # api/admission.py: health is never bounded


def _answer(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ERROR_REF}}}


def _calls(dep: Dependant) -> Iterator[Any]:
    yield dep.call
    for sub in dep.dependencies:
        yield from _calls(sub)


def shared_answers(route: APIRoute) -> dict[str, dict[str, Any]]:
    calls = list(_calls(route.dependant))
    roles: set[str] = set(ALL_ROLES)
    for call in calls:
        roles &= set(getattr(call, "roles", ALL_ROLES))
    out: dict[str, dict[str, Any]] = {
        "400": _answer("The request could not be parsed (a body that is not UTF-8 JSON)"),
        "413": _answer("The body is larger than the API's limit"),
    }
    if principal in calls:
        out["401"] = _answer("No token, or an unknown, expired or revoked one")
    if roles != ALL_ROLES:
        out["403"] = _answer(f"The token's role may not do this (needs {'/'.join(sorted(roles))})")
    if route.dependant.path_params:
        out["404"] = _answer("The resource the path names does not exist")
        out["405"] = _answer("The path (with an encoded '/' in a parameter) is another route's, "
                             "which this method does not serve")
    if any(p.name == "op_id" for p in route.dependant.path_params):
        out["308"] = _answer("The operation was replaced after a database restore: Location "
                             "names it (the body's operation_id too)")
    if route.path not in NEVER_SHED:
        out["503"] = _answer("Overloaded (Retry-After says when to retry) or the database is "
                             "unavailable; retry with the same Idempotency-Key")
    return out


# Stateful links: the id a create answer holds, and the path parameter it fills in every route
# that takes one (a fuzzer's stateful phase follows them: create, then read, cancel, report).
LINKS: dict[tuple[str, str, str], tuple[str, str]] = {
    ("post", "/v1/operations", "201"): ("op_id", "$response.body#/id"),
    ("post", "/v1/pipelines", "201"): ("pipeline_id", "$response.body#/id"),
    ("post", "/v1/agents/register", "200"): ("agent_id", "$response.body#/agent_id"),
    ("post", "/v1/agents/{agent_id}/claim", "200"): ("attempt_id",
                                                     "$response.body#/items/0/attempt_id"),
}


def _add_links(doc: dict[str, Any]) -> None:
    for (method, path, status), (param, source) in LINKS.items():
        answer = doc["paths"].get(path, {}).get(method, {}).get("responses", {}).get(status)
        if answer is None:
            continue
        links = answer.setdefault("links", {})
        for target_path, ops in doc["paths"].items():
            if "{" + param + "}" not in target_path:
                continue
            for op in ops.values():
                links[op["operationId"]] = {"operationId": op["operationId"],
                                            "parameters": {param: source}}


def install(app: FastAPI) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = generate()  # FastAPI's, cached on the app; completed here once
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        schemas.setdefault("ErrorMessage", ErrorMessage.model_json_schema())
        for route in api_routes(app):
            for method in route.methods or ():
                operation = doc["paths"][route.path_format].get(method.lower())
                if operation is None:
                    continue
                responses = operation.setdefault("responses", {})
                for code, answer in shared_answers(route).items():
                    responses.setdefault(code, answer)
        _add_links(doc)
        return doc

    app.openapi = openapi  # type: ignore[method-assign]

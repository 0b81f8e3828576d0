"""What every request's input must be before a route sees it, checked once for every route.

PostgreSQL text cannot hold a NUL character, UTF-8 cannot encode an unpaired UTF-16 surrogate,
and JSON has no non-finite numbers (Python's parser accepts ``NaN`` and turns ``1e999`` into
``inf``; stored, it came back as ``null``). Any of them anywhere in a declared parameter or the
JSON body is a 422 naming the field, before validation, storage or an error answer could trip
on it. Every router uses `EdgeRoute` (tests/controlplane/test_api_schema.py checks they all do).

Validation answers (422) quote at most a short prefix of a bad value: a 10 MB field is not
echoed back in a 20 MB answer.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

__all__ = ["MAX_QUOTED_CHARS", "EdgeRoute", "api_routes", "bounded", "input_problems",
           "install", "quote", "validation_answer"]

BAD_CHAR = re.compile("[\x00\ud800-\udfff]")
# A JSON text can hold a NUL or a surrogate only as an escape (valid JSON has no raw control
# character in a string, valid UTF-8 no surrogate): a body without one has no string to walk.
JSON_ESCAPE = b"\\u"
# longest excerpt of a submitted value an error answer repeats
MAX_QUOTED_CHARS = 64
MAX_MESSAGE_CHARS = 500


def _string_problem(s: str) -> str | None:
    bad = BAD_CHAR.search(s)
    if bad is None:
        return None
    if bad.group() == "\x00":
        return "contains a NUL character (U+0000), which cannot be stored"
    return (f"contains an unpaired UTF-16 surrogate (U+{ord(bad.group()):04X}), which is not "
            "valid Unicode text")


def _walk(doc: Any, loc: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """(location, problem) of every bad string, key or number in a parsed JSON document.
    Iterative: a deeply nested body must not exhaust the stack."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [(loc, doc)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            problem = _string_problem(value)
            if problem:
                yield where, problem
        elif isinstance(value, float):
            if not math.isfinite(value):
                yield where, f"is not a finite number ({value}): JSON numbers must be finite"
        elif isinstance(value, dict):
            for key, item in value.items():
                problem = _string_problem(key)
                if problem:
                    yield (*where, key), f"key {problem}"
                stack.append(((*where, key), item))
        elif isinstance(value, list):
            stack.extend(((*where, i), item) for i, item in enumerate(value))


def input_problems(doc: Any, loc: tuple[str | int, ...] = ("body",)) -> list[dict[str, Any]]:
    """Validation errors (FastAPI's shape) for a bad value of ``doc`` (the walk stops at the
    first it meets), or []."""
    for where, problem in _walk(doc, loc):
        return [{"type": "value_error", "loc": list(where), "msg": f"Value error, {problem}"}]
    return []


class EdgeRequest(Request):
    """Parses the JSON body once, as Starlette does, noting whether it met a non-finite number
    (``NaN``, ``Infinity``, or a literal too large for a float): the walk runs only then, or
    when the body has an escape, so an ordinary submission pays no walk."""

    nonfinite = False

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            def parse_float(text: str) -> float:
                value = float(text)
                if not math.isfinite(value):
                    self.nonfinite = True
                return value

            def parse_constant(text: str) -> float:
                self.nonfinite = True
                return float(text)

            self._json = json.loads(await self.body(), parse_float=parse_float,
                                    parse_constant=parse_constant)
        return self._json


class EdgeRoute(APIRoute):
    """An APIRoute that refuses NUL, unpaired surrogates and non-finite numbers in its declared
    path, query and header parameters and in its JSON body, before FastAPI validates them."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        query = tuple(_declared(self.dependant, "query_params"))
        headers = tuple(a.replace("_", "-").lower()
                        for a in _declared(self.dependant, "header_params"))
        has_body = self.body_field is not None

        async def edge(request: Request) -> Response:
            request = EdgeRequest(request.scope, request.receive)
            errors = _param_problems(request, query, headers)
            if not errors and has_body and _is_json(request):
                try:
                    # cached on the request: FastAPI's own parse below reuses it
                    doc = await request.json()
                except (ValueError, RecursionError):
                    doc = None  # not JSON: FastAPI answers that itself, as before
                if request.nonfinite or JSON_ESCAPE in await request.body():
                    errors = input_problems(doc)
            if errors:
                raise RequestValidationError(errors)
            return await handler(request)

        return edge


def api_routes(container: Any) -> Iterator[APIRoute]:
    """Every APIRoute served, also those behind include_router's wrapper."""
    for r in getattr(container, "routes", []):
        if isinstance(r, APIRoute):
            yield r
        elif hasattr(r, "original_router"):
            yield from api_routes(r.original_router)


def _declared(dep: Dependant, kind: str) -> set[str]:
    """Names of the route's parameters of one kind, its dependencies' included."""
    names = {f.alias for f in getattr(dep, kind)}
    for sub in dep.dependencies:
        names |= _declared(sub, kind)
    return names


def _is_json(request: Request) -> bool:
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return ctype == "application/json" or ctype.endswith("+json")


def _param_problems(request: Request, query: tuple[str, ...],
                    headers: tuple[str, ...]) -> list[dict[str, Any]]:
    for name, value in request.path_params.items():
        if isinstance(value, str) and (errors := input_problems(value, ("path", name))):
            return errors
    for name in query:
        for value in request.query_params.getlist(name):
            if errors := input_problems(value, ("query", name)):
                return errors
    for name in headers:
        value = request.headers.get(name)
        if value is not None and (errors := input_problems(value, ("header", name))):
            return errors
    return []


def quote(value: Any) -> Any:
    """A short, always-encodable excerpt of a submitted value for an error answer."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    text = value if isinstance(value, str) else json.dumps(value, default=str,
                                                           ensure_ascii=False)[:1024]
    # unpaired surrogates would make the answer itself unencodable
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_QUOTED_CHARS else text[:MAX_QUOTED_CHARS] + "..."


def bounded(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """An error message as an answer may carry it: encodable, and at most ``limit`` characters
    (a message may quote a path parameter as long as the request line)."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "..."


def validation_answer(errors: list[dict[str, Any]]) -> JSONResponse:
    """422 with FastAPI's declared body (HTTPValidationError), bounded in size."""
    detail = []
    for e in errors:
        item: dict[str, Any] = {
            "type": str(e.get("type", "value_error")),
            "loc": [x if isinstance(x, int) else bounded(str(x), MAX_QUOTED_CHARS)
                    for x in e.get("loc", ())],
            "msg": bounded(str(e.get("msg", "")), MAX_MESSAGE_CHARS),
        }
        if "input" in e:
            item["input"] = quote(e["input"])
        if e.get("ctx"):
            item["ctx"] = {str(k): quote(v) for k, v in e["ctx"].items()}
        detail.append(item)
    return JSONResponse({"detail": detail}, 422)


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_answer(list(exc.errors()))


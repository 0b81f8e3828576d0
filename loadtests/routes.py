"""Route templates the load users produce. `requests.jsonl` and the stats use these templates
(never concrete ids), so thresholds and SLIs aggregate per endpoint, not per operation."""

from __future__ import annotations

SUBMIT = "/v1/operations"
GET_OPERATION = "/v1/operations/{id}"
LIST_OPERATIONS = "/v1/operations"
# Artifact downloads go to the object store, not the API: the "s3:" prefix lets an SLI that
# means "API availability" leave them out with one startswith().
ARTIFACT = "s3:/{bucket}/artifacts/{id}/attempt-{n}/{file}"
# Predictions go to the serving frontend, not the API: "serving:" keeps them out of it too
INFER = "serving:/v2/models/{name}/infer"

OVERALL = "overall"

# "METHOD route" keys, as used in load_stats.json and in scenario thresholds
KNOWN_ROUTES: tuple[str, ...] = (
    f"POST {SUBMIT}",
    f"GET {GET_OPERATION}",
    f"GET {LIST_OPERATIONS}",
    f"GET {ARTIFACT}",
    f"POST {INFER}",
)


def route_key(method: str, route: str) -> str:
    return f"{method.upper()} {route}"

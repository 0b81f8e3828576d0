"""Pipelines: a DAG of steps, each an ordinary operation (docs/CONTRACTS.md, "Pipelines").

spec.py validates a submitted pipeline, cache_key.py computes a step's cache identity,
manifest.py checks a step's completion manifest, policy.py applies an aggregation step's
partial-failure policy. All four are pure; the SQL is in controlplane/store/pipelines.py.
"""

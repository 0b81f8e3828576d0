"""Model serving of the reference platform: the served model's artifact and golden set
(artifact.py, catalog.py, pure) and one KServe model-server replica (server.py, run in its own
virtualenv; docs/serving.md)."""

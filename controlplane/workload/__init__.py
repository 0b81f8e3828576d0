"""The sample training workload (``python -m controlplane.workload``)."""

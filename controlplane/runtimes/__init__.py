"""Workload runtimes behind one interface (``base.Runtime``): local processes, Kubernetes Jobs."""

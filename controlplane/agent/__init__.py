"""Agents: claim attempts, hold their leases, run them through a runtime, report."""

"""Fault drivers: one implementation of the fault primitives per environment kind."""

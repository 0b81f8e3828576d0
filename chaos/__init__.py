"""Chaos Toolkit extension of the harness: probes, actions and fault drivers.

Experiments live in ``chaos/experiments/*.yaml`` and call the functions of ``chaos.probes`` and
``chaos.actions`` (plain functions with ``configuration``/``secrets`` keyword arguments, as
Chaos Toolkit expects). The functions reach the environment through ``chaos.context``.
"""

"""Local environment: the whole platform on real local servers (docs/DESIGN.md section 5.1).

``environments.local.env.LocalEnvironment`` is the entry point; ``environments.local.cli`` holds the
``gameday env`` and ``gameday fault`` command groups.
"""

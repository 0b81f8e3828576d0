"""Pulumi ComponentResources that make up the platform (one module per concern)."""

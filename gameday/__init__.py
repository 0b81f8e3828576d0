"""The product's one CLI entry point (`gameday`) and what ties the parts together."""

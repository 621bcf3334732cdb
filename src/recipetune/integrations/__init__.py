"""Hooks for the training frameworks users already have: a few lines in their script, and it
writes recipetune's metrics stream (see docs/architecture.md, "Metrics stream")."""

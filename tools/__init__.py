"""Tooling for the LocalExecutor patch series: pins, apply engine, verify, delivery."""

"""Markers upstream's tests share: only those ``test_local_executor.py`` imports."""

from __future__ import annotations

import os

import pytest

# Airflow's CI runs a job with the lowest dependency versions (FORCE_LOWEST_DEPENDENCIES=true).
skip_if_force_lowest_dependencies_marker = pytest.mark.skipif(
    os.environ.get("FORCE_LOWEST_DEPENDENCIES", "false") == "true",
    reason="skipped when the lowest dependencies are forced",
)

"""Stand-in for Airflow's ``tests_common`` (devel-common): only what upstream's
``test_local_executor.py`` imports (``tests/upstream_standins/README.md``)."""

from __future__ import annotations

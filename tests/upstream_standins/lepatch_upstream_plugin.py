"""pytest plugin (``-p lepatch_upstream_plugin``) standing in for the parts of Airflow's conftest
that upstream's ``test_local_executor.py`` relies on: its markers and a database-free home."""

from __future__ import annotations

import multiprocessing
import os
import tempfile

import pytest

# The start method the whole run uses (its module-level markers read it at import): the runner's
# --start-method, else the platform's default.
START_METHOD_ENV = "LEPATCH_UPSTREAM_START_METHOD"
if os.environ.get(START_METHOD_ENV):
    multiprocessing.set_start_method(os.environ[START_METHOD_ENV], force=True)

_HOME = tempfile.mkdtemp(prefix="lepatch-upstream-home-")
for _name, _value in {
    "AIRFLOW_HOME": _HOME,
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
}.items():
    os.environ.setdefault(_name, _value)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "db_test: the test needs Airflow's metadata database (none here)")
    config.addinivalue_line("markers", "execution_timeout(seconds): fail the test after that long")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker("execution_timeout")
        if marker is not None and item.get_closest_marker("timeout") is None:
            seconds = marker.args[0] if marker.args else marker.kwargs.get("timeout", 60)
            item.add_marker(pytest.mark.timeout(seconds))

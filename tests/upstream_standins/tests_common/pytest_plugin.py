"""Stands in for Airflow's ``tests_common.pytest_plugin``, which task-sdk's tests/conftest.py loads
(``pytest_plugins``): only the markers upstream's test_supervisor.py carries, and the database-free
home and ``execution_timeout`` of ``lepatch_upstream_plugin``. Its fixtures that need upstream's test
DAG machinery (``create_runtime_ti``, ``mocked_parse``, ``mock_supervisor_comms``) are left out on
purpose: the few tests using them error alike on the patched and unpatched supervisor.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest_plugins = ["lepatch_upstream_plugin"]


def pytest_configure(config: pytest.Config) -> None:
    # why only registered: pytest-rerunfailures (flaky) is blocked by task-sdk's own conftest anyway
    config.addinivalue_line("markers", "flaky(reruns, reruns_delay): rerun a flaky test (not here)")
    config.addinivalue_line("markers", "enable_redact: upstream turns secrets masking on for the test")


class _Captured(list):  # type: ignore[type-arg]
    """The structlog events of a test; ``{"event": re.compile(...), "log_level": "error"} in it`` holds
    when one event has every key, each equal to the value or matched by the compiled pattern."""

    def __contains__(self, wanted: object) -> bool:
        if not isinstance(wanted, dict):
            return super().__contains__(wanted)
        return any(all(_matches(event.get(k), v) for k, v in wanted.items()) for event in self)


def _matches(got: object, want: object) -> bool:
    if hasattr(want, "match") and isinstance(got, str):
        return bool(want.match(got))
    return got == want


@pytest.fixture
def cap_structlog() -> Iterator[_Captured]:
    """Every structlog event the test logs, as upstream's fixture of that name gives them."""
    import structlog
    from structlog.testing import LogCapture

    saved = structlog.get_config()
    capture = LogCapture()
    structlog.configure(processors=[capture], cache_logger_on_first_use=False)
    events = _Captured()
    capture.entries = events
    try:
        yield events
    finally:
        structlog.configure(**saved)

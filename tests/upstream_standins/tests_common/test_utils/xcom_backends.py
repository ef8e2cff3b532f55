"""``SerializeValueOnlyXCom``: imported by task-sdk 1.4's test_supervisor.py for one test, which swaps it
in for task_runner's XCom. Stands in by name only: task-sdk's own XCom class, unchanged."""

from __future__ import annotations

from airflow.sdk.bases.xcom import BaseXCom


class SerializeValueOnlyXCom(BaseXCom):  # type: ignore[misc]
    """task-sdk's XCom as it is (upstream's helper narrows what it serializes; not reproduced here)."""

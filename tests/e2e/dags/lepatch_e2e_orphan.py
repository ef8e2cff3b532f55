"""The DAG of the e2e ``kill-orphan`` scenario: does a killed worker's task process outlive it?

One PythonOperator task, ``retries=1``, ``retry_delay`` 5 s. Every second for
``LEPATCH_E2E_ORPHAN_SECONDS`` (default 40) seconds it appends ``<try_number> <pid> <time.time()>``
to the file named by ``LEPATCH_E2E_MARKS`` (one ``os.write`` on an ``O_APPEND`` descriptor, so
lines of two concurrent tries do not interleave). While it loops it writes nothing to its log:
no print, no logging. A task process whose supervisor (the LocalExecutor worker) was SIGKILLed
only notices on its next write to the supervisor, so a silent loop keeps marking until its body
ends unless something kills it.

The driver (``tools/measure/e2e/driver.py``) sets both variables for the stack; the scheduler's
environment is inherited by the workers and the task processes.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

DAG_ID = "lepatch_e2e_orphan"


def _mark(ti: Any) -> int:
    path = os.environ["LEPATCH_E2E_MARKS"]
    seconds = int(float(os.environ.get("LEPATCH_E2E_ORPHAN_SECONDS", "40")))
    try_number = int(ti.try_number)
    pid = os.getpid()
    for _ in range(seconds):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{try_number} {pid} {time.time():.3f}\n".encode())
        finally:
            os.close(fd)
        time.sleep(1.0)
    return try_number


with DAG(
    dag_id=DAG_ID,
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    is_paused_upon_creation=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=5)},
    tags=["lepatch-e2e"],
):
    PythonOperator(task_id="mark", python_callable=_mark)

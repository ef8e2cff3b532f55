"""The DAG of the e2e ``throughput`` scenario: many no-op tasks, nothing killed.

``LEPATCH_E2E_TP_TASKS`` (default 200) independent PythonOperator tasks whose callable returns
at once, ``max_active_tasks`` as high as the task count, so ``core.parallelism`` is the only
limit and the run measures how fast the scheduler and the executor get tasks through: run wall
time, tasks per second, and each task instance's queued-to-start delay. ``retries=0``: a task
that fails is a failed run, not a slower one.

The driver (``tools/measure/e2e/driver.py``) sets the variable for the stack (the dag-processor parses
this file with it) and copies the file into the stack's dags folder.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

DAG_ID = "lepatch_e2e_throughput"
TASKS = int(os.environ.get("LEPATCH_E2E_TP_TASKS", "200"))


def _noop(n: int) -> int:
    return n


with DAG(
    dag_id=DAG_ID,
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    is_paused_upon_creation=False,
    max_active_tasks=max(TASKS, 1),
    max_active_runs=1,
    default_args={"retries": 0},
    tags=["lepatch-e2e"],
):
    for i in range(TASKS):
        PythonOperator(task_id=f"noop_{i:04d}", python_callable=_noop, op_args=[i])

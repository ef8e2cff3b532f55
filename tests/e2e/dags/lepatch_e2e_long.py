"""The DAG of the e2e ``queued-timeout`` scenario: more long tasks than workers.

``LEPATCH_E2E_LONG_TASKS`` independent PythonOperator tasks (the driver sets twice the
parallelism), each sleeping ``LEPATCH_E2E_TASK_SECONDS``, longer than the stack's
``[scheduler] task_queued_timeout``: whatever is queued behind the first wave waits a whole task
for a worker. ``retries=0``: a task the scheduler's stuck-in-queued check fails stays failed.
"""

from __future__ import annotations

import os
import time
from datetime import datetime

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

DAG_ID = "lepatch_e2e_long"
TASKS = int(os.environ.get("LEPATCH_E2E_LONG_TASKS", "4"))
TASK_SECONDS = float(os.environ.get("LEPATCH_E2E_TASK_SECONDS", "80"))


def _work(n: int) -> int:
    time.sleep(TASK_SECONDS)
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
        PythonOperator(task_id=f"long_{i:02d}", python_callable=_work, op_args=[i])

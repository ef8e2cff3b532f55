"""The DAG that ``nox -s e2e`` runs against a real scheduler with LocalExecutor.

Thirty independent short tasks, half BashOperator and half PythonOperator, so that a run keeps
every LocalExecutor worker busy at the default parallelism (8) for a few waves. Each task sleeps
``LEPATCH_E2E_TASK_SECONDS`` (default 2): long enough for the driver to catch a worker while
its task runs, short enough that a clean run finishes in well under a minute.

``retries=1`` with a short ``retry_delay``: a task whose worker was killed is failed by the
executor and then retried, so with the patch series the run ends in success and the killed
task shows two tries. Without the series the killed key is never reported, and the task stays
``queued`` or ``running`` until the deadline.

The driver (``tools/measure/e2e/driver.py``) copies this file into the stack's own dags folder; the
environment it sets for the scheduler is inherited by the workers and the task processes.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta

from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

DAG_ID = "lepatch_e2e"
TASKS = 30
TASK_SECONDS = float(os.environ.get("LEPATCH_E2E_TASK_SECONDS", "2"))


def _work(n: int) -> int:
    time.sleep(TASK_SECONDS)
    return n


with DAG(
    dag_id=DAG_ID,
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    is_paused_upon_creation=False,
    max_active_tasks=TASKS,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=2)},
    tags=["lepatch-e2e"],
):
    for i in range(TASKS):
        if i % 2 == 0:
            BashOperator(task_id=f"bash_{i:02d}", bash_command=f"sleep {TASK_SECONDS:g}")
        else:
            PythonOperator(task_id=f"python_{i:02d}", python_callable=_work, op_args=[i])

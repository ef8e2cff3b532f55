"""The DAG of the e2e ``scale`` scenario: many BashOperator jobs that print and record their own life.

``LEPATCH_E2E_SCALE_TASKS`` (default 500) independent BashOperator tasks. Each job prints a line
every 0.2 s for a duration drawn from ``LEPATCH_E2E_SCALE_SEED`` (5-20 s, the same on every stage)
and records its own life in a file of its own under ``LEPATCH_E2E_SCALE_DIR``,
``<task_id>.<try_number>.<pid>`` (``tools/measure/e2e/scale.py`` reads them):

- ``s <wall> <pid> <starttime>`` when it starts (``$EPOCHREALTIME``; the job's pid, the shell that
  BashOperator's SubprocessHook starts in a session of its own, and its /proc starttime, which tells
  it from a later process with the same pid);
- ``m <wall>`` once a second while it prints (a killed job's last mark bounds its life from below);
- ``e <wall>`` when it ends.

The output lines are what makes a job's task process notice a dead worker (its next log line to
the supervisor fails): a quiet job would not. ``retries=2`` and ``retry_delay`` 2 s: Airflow's own
defaults (``retries`` 0, ``retry_delay`` 300 s) would never run a second try beside a first one, so
nothing would test the overlap. ``max_active_tasks`` is the task count: ``core.parallelism`` is the
only limit.

The driver (``tools/measure/e2e/driver.py``) sets the variables for the stack; BashOperator's job
inherits the task process's environment.
"""

from __future__ import annotations

import os
import random
from datetime import datetime, timedelta

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

DAG_ID = "lepatch_e2e_scale"
TASKS = int(os.environ.get("LEPATCH_E2E_SCALE_TASKS", "500"))
SEED = int(os.environ.get("LEPATCH_E2E_SCALE_SEED", "1"))
LINE_S = 0.2
MIN_S, MAX_S = 5.0, 20.0

# The job: record its start, print a line every 0.2 s (a mark in its file every 5th), record its end.
# Jinja fills in the task id and try; bash expands the rest.
COMMAND = """\
f="$LEPATCH_E2E_SCALE_DIR/{{ ti.task_id }}.{{ ti.try_number }}.$$"
read -r -a st < /proc/$$/stat
echo "s $EPOCHREALTIME $$ ${st[21]}" >> "$f"
for ((i = 0; i < LINES; i++)); do
  echo "{{ ti.task_id }} try {{ ti.try_number }} line $i of LINES"
  if ((i % 5 == 0)); then echo "m $EPOCHREALTIME" >> "$f"; fi
  sleep 0.2
done
echo "e $EPOCHREALTIME" >> "$f"
"""


def lines_of(n: int, seed: int = SEED) -> list[int]:
    """How many 0.2 s lines each task prints: durations uniform in [5, 20] s, drawn from the seed."""
    rng = random.Random(f"lepatch-e2e-scale:{seed}")
    return [round(rng.uniform(MIN_S, MAX_S) / LINE_S) for _ in range(n)]


with DAG(
    dag_id=DAG_ID,
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    is_paused_upon_creation=False,
    max_active_tasks=max(TASKS, 1),
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=2)},
    tags=["lepatch-e2e"],
):
    for i, lines in enumerate(lines_of(TASKS)):
        BashOperator(task_id=f"job_{i:04d}", bash_command=COMMAND.replace("LINES", str(lines)))

"""The DAG of the soak (``nox -s soak``): short mixed tasks that each record their own attempt.

Triggered again and again (one run every few seconds) while faults land on the stack. Its tasks:
no-op, sleep (``LEPATCH_SOAK_SLEEP_SECONDS``, default 3), CPU (a busy loop of about 1 s), a task
that forks a child which outlives it by ``LEPATCH_SOAK_CHILD_SECONDS`` (default 2), and a task that
fails its first try on purpose. Every task has ``retries=3``, ``retry_delay`` 2 s: a killed try
is retried.

Each run of a task's callable appends JSON lines to the file ``LEPATCH_SOAK_RECORDS`` names, one
``os.write`` on an ``O_APPEND`` descriptor each (lines of concurrent tries never interleave):
``start`` (dag_id, run_id, task_id, try, the try's uuid, pid and its /proc starttime, monotonic
and wall clock), ``mark`` every 0.5 s while it sleeps or burns CPU (the last time it was seen alive if it is
killed), ``child`` (the forked child's pid, starttime and when it will end), and ``end``. The
checker (``tools/measure/e2e/soak_check.py``) reads them afterwards: what ran, when, and twice or
not, comes from the tasks themselves, not from the executor or the database.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

DAG_ID = "lepatch_e2e_soak"
RECORDS = os.environ.get("LEPATCH_SOAK_RECORDS", "")
SLEEP_SECONDS = float(os.environ.get("LEPATCH_SOAK_SLEEP_SECONDS", "3"))
CHILD_SECONDS = float(os.environ.get("LEPATCH_SOAK_CHILD_SECONDS", "2"))
CPU_SECONDS = 1.0
MARK_EVERY = 0.5


def _starttime(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def _record(ti: Any, ev: str, **extra: Any) -> None:
    if not RECORDS:
        return
    pid = os.getpid()
    line = {
        "ev": ev,
        "dag_id": ti.dag_id,
        "run_id": ti.run_id,
        "task_id": ti.task_id,
        "map_index": ti.map_index,
        "try": int(ti.try_number),
        "ti_id": str(ti.id),  # each try has its own; the driver names it when it kills that try's process
        "pid": pid,
        "pst": _starttime(pid),
        "mono": time.monotonic(),
        "wall": time.time(),
        **extra,
    }
    fd = os.open(RECORDS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def _marking(ti: Any, seconds: float, burn: bool) -> None:
    end = time.monotonic() + seconds
    next_mark = time.monotonic() + MARK_EVERY
    while (now := time.monotonic()) < end:
        if now >= next_mark:
            _record(ti, "mark")
            next_mark = now + MARK_EVERY
        if not burn:
            time.sleep(max(0.01, min(next_mark, end) - now))


def noop(ti: Any) -> None:
    _record(ti, "start")
    _record(ti, "end")


def sleep(ti: Any) -> None:
    _record(ti, "start")
    _marking(ti, SLEEP_SECONDS, burn=False)
    _record(ti, "end")


def cpu(ti: Any) -> None:
    _record(ti, "start")
    _marking(ti, CPU_SECONDS, burn=True)
    _record(ti, "end")


def fork(ti: Any) -> None:
    _record(ti, "start")
    # Not waited for: the child is meant to outlive this task by CHILD_SECONDS.
    child = subprocess.Popen(["sleep", f"{CHILD_SECONDS:g}"])
    _record(
        ti, "child", child=child.pid, child_pst=_starttime(child.pid), until=time.monotonic() + CHILD_SECONDS
    )
    _record(ti, "end")


def flaky(ti: Any) -> None:
    _record(ti, "start")
    if int(ti.try_number) == 1:
        _record(ti, "end", raised=True)
        raise RuntimeError("lepatch soak: the flaky task fails its first try on purpose")
    _record(ti, "end")


TASKS = {
    "noop_0": noop,
    "noop_1": noop,
    "noop_2": noop,
    "sleep_0": sleep,
    "sleep_1": sleep,
    "sleep_2": sleep,
    "cpu_0": cpu,
    "cpu_1": cpu,
    "fork_0": fork,
    "flaky_0": flaky,
}

with DAG(
    dag_id=DAG_ID,
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    is_paused_upon_creation=False,
    max_active_runs=64,
    max_active_tasks=256,
    default_args={"retries": 3, "retry_delay": timedelta(seconds=2)},
    tags=["lepatch-e2e"],
):
    for task_id, fn in TASKS.items():
        PythonOperator(task_id=task_id, python_callable=fn)

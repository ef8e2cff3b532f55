#
# Licensed to the Apache Software Foundation (ASF) under one
# or more contributor license agreements.  See the NOTICE file
# distributed with this work for additional information
# regarding copyright ownership.  The ASF licenses this file
# to you under the Apache License, Version 2.0 (the
# "License"); you may not use this file except in compliance
# with the License.  You may obtain a copy of the License at
#
#   http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing,
# software distributed under the License is distributed on an
# "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY
# KIND, either express or implied.  See the License for the
# specific language governing permissions and limitations
# under the License.
"""
A worker ends on SIGTERM, whatever handler the executor's process had when it forked it.

The scheduler's SIGTERM handler returns without exiting in any process but the scheduler's own,
and a forked worker inherits it: SIGTERM did nothing to a worker, so nothing short of SIGKILL
stopped one. Here the executor's process has such a handler; the worker running a task is sent
SIGTERM, then the worker that replaced it, running the next task. Each must end, its task process
with it, before its key is failed.
"""

from __future__ import annotations

import multiprocessing.process
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from harness import dispatch, key_of, make_workload, new_executor, read_marks, run_scenario, wait_until

SIGTERM_PATCH = "0008-kill-a-dead-localexecutor-workers-task-processes.patch"


def _dead(pid: int) -> bool:
    """``pid`` runs no more: gone, or a zombie nobody reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat[stat.rindex(")") + 2] in ("Z", "X")


def _scheduler_like_sigterm_handler() -> None:
    owner = os.getpid()

    def exit_gracefully(signum: int, frame: object) -> None:
        if os.getpid() == owner:  # only the scheduler's own process exits; a fork of it returns
            raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, exit_gracefully)


def sigterm_the_worker_of_each_task() -> dict[str, Any]:
    _scheduler_like_sigterm_handler()
    executor = new_executor(1)  # one worker: the second task runs on the worker that replaced the first
    marks = str(Path(tempfile.mkdtemp(), "marks"))
    started_dir = tempfile.mkdtemp()
    outcome: dict[str, Any] = {}
    for tag in ("original", "replacement"):
        workload = make_workload(tag, fake={"started_dir": started_dir, "marks": marks, "mark_for": 60})
        key = key_of(workload)
        dispatch(executor, [workload])

        def marking(tag: str = tag) -> bool:
            executor.sync()
            return any(t == tag for t, _, _ in read_marks(marks))

        if not wait_until(marking, timeout=60):
            outcome[tag] = "never started"
            break
        (worker,) = (int(n.rsplit(".", 1)[1]) for n in os.listdir(started_dir) if n.startswith(f"{tag}."))
        (task_process,) = {pid for t, pid, _ in read_marks(marks) if t == tag}
        os.kill(worker, signal.SIGTERM)
        sent = time.monotonic()
        # The scheduler's loop: sync() until the key's failure shows.
        while key not in executor.event_buffer and time.monotonic() - sent < 30:
            executor.sync()
            time.sleep(0.01)
        outcome[tag] = {
            "worker_ended": _dead(worker),
            "state": str(executor.event_buffer.get(key, ("not reported",))[0]),
            "task_process_dead": _dead(task_process),
        }
        executor.event_buffer.clear()
        if not outcome[tag]["worker_ended"]:
            break
    executor.terminate()  # nothing left to wait for, or a worker that ignored SIGTERM
    return outcome


@pytest.mark.fixed_by(SIGTERM_PATCH)
def test_sigterm_ends_a_worker_and_its_task_process_under_a_scheduler_like_handler(start_method: str) -> None:
    outcome = run_scenario(sigterm_the_worker_of_each_task, start_method=start_method, deadline=150)
    for tag in ("original", "replacement"):
        assert outcome.get(tag) == {"worker_ended": True, "state": "failed", "task_process_dead": True}, (
            outcome
        )


def _exitcode(proc: multiprocessing.process.BaseProcess) -> int | None:
    try:
        return proc.exitcode
    except ValueError:  # closed once reaped: its exit code is gone with it
        return None


def terminate_busy_workers(count: int, ignore_sigterm: bool) -> dict[str, Any]:
    _scheduler_like_sigterm_handler()
    executor = new_executor(count)
    started_dir = tempfile.mkdtemp()
    fake = {"started_dir": started_dir, "sleep": 120, "no_fork": True, "ignore_sigterm": ignore_sigterm}
    dispatch(executor, [make_workload(f"busy_{i}", fake=fake) for i in range(count)])

    def all_started() -> bool:
        executor.sync()
        return len(os.listdir(started_dir)) == count

    started = wait_until(all_started, timeout=60)
    procs = list(executor.workers.values())
    t0 = time.monotonic()
    executor.terminate()
    return {
        "all_started": started,
        "seconds": round(time.monotonic() - t0, 2),
        "alive": [p.pid for p in procs if not _dead(p.pid)],
        "exitcodes": sorted({_exitcode(p) for p in procs}, key=str),
    }


@pytest.mark.fixed_by(SIGTERM_PATCH)
def test_terminate_stops_sixteen_busy_workers_with_sigterm_alone() -> None:
    # Forked workers only: a spawned worker starts with no Python handler to inherit.
    outcome = run_scenario(
        terminate_busy_workers, start_method="fork", deadline=90, count=16, ignore_sigterm=False
    )
    assert outcome["all_started"], outcome
    assert outcome["alive"] == [], outcome
    # Each died of its SIGTERM: none waited out 0.2 s for a SIGKILL (3.2 s for 16, one after another).
    assert outcome["exitcodes"] == [-signal.SIGTERM], outcome


@pytest.mark.fixed_by(SIGTERM_PATCH)
def test_terminate_stops_workers_that_ignore_sigterm_together(start_method: str) -> None:
    # task-sdk 1.4's supervisor defers SIGTERM while a task runs. One after another, each such worker
    # cost its 0.2 s wait before its SIGKILL: 1.6 s for 8; together, one wait.
    outcome = run_scenario(
        terminate_busy_workers, start_method=start_method, deadline=90, count=8, ignore_sigterm=True
    )
    assert outcome["all_started"], outcome
    assert outcome["alive"] == [], outcome
    assert outcome["exitcodes"] == [-signal.SIGKILL], outcome
    assert outcome["seconds"] < 1.0, outcome

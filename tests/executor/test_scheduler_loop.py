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
Workers are not left idle between scheduler loops.

The scheduler reads ``slots_available`` before its ``heartbeat()`` (which is where ``sync()`` reads
results), and sleeps ``scheduler_idle_sleep_time`` after an idle loop. A slot freed by a result
nobody has read would then wait for the scheduler's heartbeat instead of counting when the scheduler
first looks at the executor.
"""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import pytest
from harness import (
    dispatch,
    key_of,
    make_workload,
    new_executor,
    run_scenario,
    wait_for_states,
    wait_until,
)

LOOP_PATCH = "0009-keep-localexecutor-workers-busy-between-scheduler-loops.patch"


def _started(started_dir: str, task_id: str) -> bool:
    return any(name.startswith(f"{task_id}.") for name in os.listdir(started_dir))


def freed_slot_before_heartbeat() -> dict:
    executor = new_executor(2)
    at_rest = executor.slots_available
    started_dir = tempfile.mkdtemp()
    gate = Path(tempfile.mkdtemp(), "go")
    quick = make_workload("quick", fake={"started_dir": started_dir})
    held = make_workload("held", fake={"wait_for": str(gate)})
    dispatch(executor, [quick, held])
    assert wait_until(lambda: _started(started_dir, "quick"), timeout=30), "quick never started"
    # No heartbeat() and no sync() from here on: only what the scheduler reads before its heartbeat.
    # Milliseconds when it works; the wait only bounds how long the stage before the fix takes to fail.
    freed = wait_until(lambda: executor.slots_available == at_rest - 1, timeout=3)
    outcome = {
        "freed_before_heartbeat": freed,
        "quick_reported": str(executor.event_buffer.get(key_of(quick), ("missing",))[0]),
        "held_running": key_of(held) in executor.running,
    }
    gate.touch()
    wait_for_states(executor, [key_of(held)], timeout=20)
    outcome["at_rest_again"] = executor.slots_available == at_rest
    executor.end()
    return outcome


@pytest.mark.fixed_by(LOOP_PATCH)
def test_freed_slot_is_visible_in_slots_available_before_heartbeat(start_method):
    outcome = run_scenario(freed_slot_before_heartbeat, start_method=start_method, deadline=90)
    assert outcome == {
        "freed_before_heartbeat": True,
        "quick_reported": "success",
        "held_running": True,
        "at_rest_again": True,
    }


def short_tasks_beside_a_long_one() -> dict:
    executor = new_executor(2)
    started_dir = tempfile.mkdtemp()
    gate = Path(tempfile.mkdtemp(), "go")
    long = make_workload("long", fake={"started_dir": started_dir, "wait_for": str(gate)})
    dispatch(executor, [long])
    assert wait_until(lambda: _started(started_dir, "long"), timeout=30), "long never started"
    # More than the one free slot, as keys that take more workers than slots do (a resumed deferral's
    # second dispatch, connection tests): four wait in the executor for a worker.
    shorts = [make_workload(f"short_{i}", fake={"started_dir": started_dir, "sleep": 0.1}) for i in range(5)]
    dispatch(executor, shorts)
    states = wait_for_states(executor, [key_of(w) for w in shorts], timeout=20)
    outcome = {
        "shorts": len(shorts),
        "states": sorted(set(states.values())),
        "long_still_running": not gate.exists() and key_of(long) in executor.running,
        "processes": sorted({name.rsplit(".", 1)[1] for name in os.listdir(started_dir)}),
    }
    gate.touch()
    wait_for_states(executor, [key_of(long)], timeout=20)
    executor.end()
    return outcome


def test_no_workload_waits_behind_a_long_task_while_a_worker_is_free():
    """Workloads no worker could take wait in the executor, not in a busy worker's pipe: all run beside it."""
    outcome = run_scenario(short_tasks_beside_a_long_one, deadline=90)
    assert outcome["shorts"] == 5
    assert outcome["states"] == ["success"]
    assert outcome["long_still_running"]
    # At most parallelism workers ever ran anything: the long task's and one for all the short ones.
    assert len(outcome["processes"]) == 2


def kill_worker_with_workloads_waiting() -> dict:
    executor = new_executor(1)
    at_rest = executor.slots_available
    started_dir = tempfile.mkdtemp()
    doomed = make_workload("doomed", fake={"started_dir": started_dir, "sleep": 60})
    waiting = make_workload("waiting", fake={"started_dir": started_dir})
    dispatch(executor, [doomed, waiting])
    assert wait_until(lambda: _started(started_dir, "doomed"), timeout=30), "doomed never started"
    pid = int(next(n for n in os.listdir(started_dir) if n.startswith("doomed.")).rsplit(".", 1)[1])
    os.kill(pid, signal.SIGKILL)
    states = wait_for_states(executor, [key_of(doomed), key_of(waiting)], timeout=30)
    failures = [k for k, (state, _) in executor.event_buffer.items() if str(state) == "failed"]
    outcome = {
        "states": states,
        "failed_events": len(failures),
        "at_rest_again": executor.slots_available == at_rest,
    }
    executor.end()
    return outcome


def test_worker_killed_while_a_workload_waits_fails_its_key_once_and_runs_the_waiting_one():
    outcome = run_scenario(kill_worker_with_workloads_waiting, deadline=90)
    assert outcome == {
        "states": {"doomed": "failed", "waiting": "success"},
        "failed_events": 1,
        "at_rest_again": True,
    }


def dead_worker_while_the_scheduler_reads_slots() -> dict:
    """A busy worker dies; the scheduler reads the slots (pool rows locked), then beats."""
    executor = new_executor(2)
    started_dir = tempfile.mkdtemp()
    held = make_workload(
        "held", fake={"started_dir": started_dir, "wait_for": str(Path(started_dir, "never"))}
    )
    dispatch(executor, [held])
    assert wait_until(lambda: _started(started_dir, "held"), timeout=30), "held never started"
    (worker,) = (int(name.rsplit(".", 1)[1]) for name in os.listdir(started_dir))
    os.kill(worker, signal.SIGKILL)
    os.waitid(os.P_PID, worker, os.WEXITED | os.WNOWAIT)  # dead, and left for the executor to reap
    workers = set(executor.workers)
    for _ in range(20):  # what the scheduler reads, its pool rows locked
        _ = (executor.slots_available, executor.slots_occupied)
    outcome = {
        "held_running": key_of(held) in executor.running,  # until its worker is reaped
        "reaped_by_slot_reads": worker not in executor.workers,
        "started_by_slot_reads": sorted(set(executor.workers) - workers),
    }
    # heartbeat()'s sync() does it.
    outcome["held"] = wait_for_states(executor, [key_of(held)], timeout=20)["held"]
    outcome["reaped_by_sync"] = worker not in executor.workers
    executor.end()
    return outcome


def test_reading_the_slots_forks_nothing_and_reaps_nothing(start_method):
    # Reaping a dead worker scans /proc and may wait for what it started to die (up to 5 s); starting
    # one forks. The scheduler reads the slots while it holds its pool rows locked: neither belongs there.
    outcome = run_scenario(
        dead_worker_while_the_scheduler_reads_slots, start_method=start_method, deadline=90
    )
    assert outcome == {
        "held_running": True,
        "reaped_by_slot_reads": False,
        "started_by_slot_reads": [],
        "held": "failed",
        "reaped_by_sync": True,
    }

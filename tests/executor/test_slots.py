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
"""A dispatched workload holds a parallelism slot until it ends, its worker dies, or it is revoked."""

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

SLOT_PATCH = "0002-hold-a-parallelism-slot-per-dispatched-workload.patch"


def slots_while_running(parallelism: int) -> dict:
    executor = new_executor(parallelism)
    gate = Path(tempfile.mkdtemp(), "go")
    items = [make_workload(f"held_{i}", fake={"wait_for": str(gate)}) for i in range(parallelism)]
    dispatch(executor, items)
    held = {"slots": executor.slots_available, "running": len(executor.running)}
    gate.touch()
    states = wait_for_states(executor, [key_of(w) for w in items], timeout=20)
    after = {"slots": executor.slots_available, "running": len(executor.running)}
    executor.end()
    return {"held": held, "after": after, "states": states}


@pytest.mark.fixed_by(SLOT_PATCH)
def test_dispatched_workloads_hold_slots_until_their_result(start_method):
    outcome = run_scenario(slots_while_running, start_method=start_method, deadline=60, parallelism=2)
    assert outcome["held"] == {"slots": 0, "running": 2}
    assert outcome["states"] == {"held_0": "success", "held_1": "success"}
    assert outcome["after"] == {"slots": 2, "running": 0}


def kill_busy_worker() -> dict:
    executor = new_executor(2)
    started_dir = tempfile.mkdtemp()
    doomed = make_workload("doomed", fake={"started_dir": started_dir, "sleep": 60})
    dispatch(executor, [doomed])
    assert wait_until(lambda: os.listdir(started_dir), timeout=20), "the workload never started"
    pid = int(os.listdir(started_dir)[0].rsplit(".", 1)[1])
    os.kill(pid, signal.SIGKILL)
    states = wait_for_states(executor, [key_of(doomed)], timeout=5)
    slots = executor.slots_available
    # The executor keeps working afterwards.
    after = make_workload("after")
    dispatch(executor, [after])
    states.update(wait_for_states(executor, [key_of(after)], timeout=20))
    executor.end()
    return {"states": states, "slots_after_death": slots}


@pytest.mark.fixed_by(SLOT_PATCH)
def test_worker_killed_after_start_frees_its_slot_and_fails_the_key(start_method):
    outcome = run_scenario(kill_busy_worker, start_method=start_method, deadline=60)
    assert outcome["states"] == {"doomed": "failed", "after": "success"}
    assert outcome["slots_after_death"] == 2


class _Alive:
    """A stand-in worker process that never dies."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def is_alive(self):
        return True


def _bookkeeping_only(executor, worker_pids):
    """The executor as start() leaves it, with stand-in workers: nothing forks and nothing is sent."""
    executor.workers = {pid: _Alive(pid) for pid in worker_pids}
    executor._inputs = {}
    executor._outputs = {}
    executor.sync = lambda: None
    executor._idle_worker = lambda: next((p for p in worker_pids if p not in executor._worker_tasks), None)
    executor._send_workload = lambda pid, workload: None
    executor._stop_workers = lambda pids: executor.stopped.extend(pids)
    executor._terminate_worker_process = lambda proc: executor.stopped.append(proc.pid)
    executor._reap_workers = lambda pids: None
    executor.stopped = []


def _dispatch(executor, workload):
    executor.queue_workload(workload, session=None)
    executor._process_workloads([workload])


def test_result_from_a_process_that_is_not_a_worker_is_ignored():
    from airflow.executors.local_executor import LocalExecutor
    from airflow.utils.state import TaskInstanceState

    executor = LocalExecutor(parallelism=2)
    _bookkeeping_only(executor, [1])
    workload = make_workload("stray")
    key = key_of(workload)
    _dispatch(executor, workload)
    # pid 4242 is no worker of this executor (a reaped one, say): its messages change nothing.
    executor._handle_result(4242, key, "running", None)
    executor._handle_result(4242, key, TaskInstanceState.SUCCESS, None)
    assert key in executor.running
    assert key not in executor.event_buffer


def test_earlier_dispatch_result_keeps_the_slot_of_a_newer_dispatch():
    """A resumed attempt reuses the key while its earlier dispatch has not reported."""
    from airflow.executors.local_executor import LocalExecutor
    from airflow.utils.state import TaskInstanceState

    executor = LocalExecutor(parallelism=2)
    _bookkeeping_only(executor, [1, 2])
    workload = make_workload("resumed")
    key = key_of(workload)
    _dispatch(executor, workload)
    _dispatch(executor, workload)  # to the other worker
    executor._handle_result(1, key, TaskInstanceState.SUCCESS, None)
    assert key in executor.running, "the newer dispatch still holds its slot"
    executor._handle_result(2, key, TaskInstanceState.SUCCESS, None)
    assert key not in executor.running
    assert executor.event_buffer[key][0] == TaskInstanceState.SUCCESS


def test_revoke_task_releases_a_workload_whose_worker_never_started_it(monkeypatch):
    """The scheduler's stuck-in-queued handling calls revoke_task: the slot comes back, no event."""
    from types import SimpleNamespace

    from airflow.executors import local_executor
    from airflow.executors.local_executor import LocalExecutor

    monkeypatch.setattr(local_executor, "_exited", lambda proc, timeout=0.0: False, raising=False)

    executor = LocalExecutor(parallelism=1)
    _bookkeeping_only(executor, [1])
    workload = make_workload("lost")
    key = key_of(workload)
    _dispatch(executor, workload)
    assert executor.slots_available == 0
    executor.revoke_task(ti=SimpleNamespace(key=workload.ti.key, id=workload.ti.id))
    assert key not in executor.running
    assert executor.slots_available == 1
    assert key not in executor.event_buffer
    assert executor.stopped == [1], "the worker it was sent to is stopped"

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
A worker never preempts its own exiting task process.

The worker is task-sdk's supervisor: once the task process's sockets reach EOF it polls once for
the exit, and if the process is not reaped yet it sleeps ``[workers] min_heartbeat_interval``.
Run under the batch policy, the woken worker waits for the exiting process instead of
preempting it; the task process itself runs under the normal policy.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from harness import (
    dispatch,
    key_of,
    make_workload,
    new_executor,
    read_marks,
    run_scenario,
    wait_for_states,
    wait_until,
)

BATCH_PATCH = "0016-run-localexecutor-workers-under-the-batch-scheduling-policy.patch"

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="Linux scheduling policies")


def _policy(pid: int) -> str:
    names = {os.SCHED_OTHER: "normal", os.SCHED_BATCH: "batch"}
    return names.get(os.sched_getscheduler(pid), "other")


def policies_of_worker_and_task_process() -> dict:
    executor = new_executor(1)
    marks = str(Path(tempfile.mkdtemp(), "marks"))
    workload = make_workload("task", fake={"marks": marks, "mark_for": 2.0})
    dispatch(executor, [workload])
    wait_until(lambda: read_marks(marks), timeout=30)
    (worker,) = executor.workers
    task_process = read_marks(marks)[0][1]
    seen = {"worker": _policy(worker), "task process": _policy(task_process)}
    states = wait_for_states(executor, [key_of(workload)])
    executor.end()
    return {"policies": seen, "states": list(states.values())}


@pytest.mark.fixed_by(BATCH_PATCH)
def test_worker_runs_batch_and_its_task_process_normal(start_method):
    outcome = run_scenario(policies_of_worker_and_task_process, start_method=start_method, deadline=60)
    assert outcome == {
        "policies": {"worker": "batch", "task process": "normal"},
        "states": ["success"],
    }

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
A task's end ends the scheduler's idle sleep; its start, or an executor with nothing to say, does not.

With a slot held per dispatch, a task's end frees its slot only for the scheduler's next loop. After
an idle loop the scheduler sleeps up to ``scheduler_idle_sleep_time``: the slot waits out that sleep
unless the executor's results end it. A task's start acknowledgement and running state free no slot:
a loop for each would only cost the scheduler (and its database) more loops.
"""

from __future__ import annotations

import time

import pytest
from harness import dispatch, key_of, make_workload, new_executor, run_scenario, wait_for_states

WAKE_PATCH = "0012-wake-the-idle-scheduler-when-an-executor-has-news.patch"

# The scheduler's idle sleep here; a task's end must cut it short by far more than a loaded machine's
# delays, so a sleep the result does not end cannot pass.
IDLE_SLEEP = 2.0
WOKEN_WITHIN = 1.0
QUIET_SLEEP = 0.5
# A task that runs through one whole idle sleep: its start and running state arrive within it.
THROUGH_START = 1.0
RUNS_FOR = 1.5


def _idle_sleep(executor, timeout: float) -> None:
    """The scheduler's sleep after an idle loop (before the fix: the whole time)."""
    from airflow.executors import base_executor

    wait = getattr(base_executor, "wait_for_executor_events", None)
    if wait is None:
        time.sleep(timeout)
    else:
        wait([executor], timeout)


def woken_by_a_result() -> dict:
    from airflow.utils.state import TaskInstanceState

    executor = new_executor(1)
    warm = make_workload("warm")
    dispatch(executor, [warm])  # a spawned worker imports Airflow first: not part of what is timed
    wait_for_states(executor, [key_of(warm)], timeout=60)
    quick = make_workload("quick", fake={"sleep": 0.05})
    dispatch(executor, [quick])
    began = time.monotonic()
    # The scheduler's loops while nothing else happens: sync(), find nothing to do, sleep.
    while time.monotonic() - began < 2 * IDLE_SLEEP:  # two sleeps: a stage that sleeps through fails soon
        executor.sync()
        if executor.event_buffer.get(key_of(quick), (None,))[0] == TaskInstanceState.SUCCESS:
            break
        _idle_sleep(executor, IDLE_SLEEP)
    took = time.monotonic() - began
    # Every result is read now: nothing may end the next sleep early, or an idle scheduler spins.
    quiet_began = time.monotonic()
    _idle_sleep(executor, QUIET_SLEEP)
    quiet = time.monotonic() - quiet_began
    executor.end()
    return {
        "quick": str(executor.event_buffer.get(key_of(quick), ("missing",))[0]),
        "took": round(took, 3),
        "woken": took < WOKEN_WITHIN,
        "slept_when_quiet": quiet >= QUIET_SLEEP,
    }


@pytest.mark.fixed_by(WAKE_PATCH)
def test_a_result_ends_the_schedulers_idle_sleep(start_method):
    outcome = run_scenario(woken_by_a_result, start_method=start_method, deadline=120, stuck_after=5.0)
    took = outcome.pop("took")
    assert outcome == {"quick": "success", "woken": True, "slept_when_quiet": True}, f"took {took} s"


def slept_through_a_start() -> dict:
    executor = new_executor(1)
    warm = make_workload("warm")
    dispatch(executor, [warm])
    wait_for_states(executor, [key_of(warm)], timeout=60)
    slow = make_workload("slow", fake={"sleep": RUNS_FOR})
    dispatch(executor, [slow])
    began = time.monotonic()
    _idle_sleep(executor, THROUGH_START)  # the worker's running state and start acknowledgement come now
    through_start = time.monotonic() - began
    # Its end comes about RUNS_FOR - THROUGH_START in: only that may end this sleep before its time.
    _idle_sleep(executor, 3 * THROUGH_START)
    to_end = time.monotonic() - began - through_start
    executor.sync()
    executor.end()
    return {
        "slow": str(executor.event_buffer.get(key_of(slow), ("missing",))[0]),
        "slept_through_start": through_start >= THROUGH_START,
        "woken_by_end": to_end < 3 * THROUGH_START,
    }


@pytest.mark.fixed_by(WAKE_PATCH)
def test_only_a_tasks_end_ends_the_schedulers_idle_sleep(start_method):
    outcome = run_scenario(slept_through_a_start, start_method=start_method, deadline=120, stuck_after=5.0)
    assert outcome == {"slow": "success", "slept_through_start": True, "woken_by_end": True}

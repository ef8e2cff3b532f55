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
The prefetch room takes nothing while tasks run long.

A workload in the room waits for a busy worker to finish. Behind tasks longer than
``[scheduler] task_queued_timeout`` the scheduler's stuck-in-queued check revokes it and queues it
again, and fails it the third time; if the room took it back each time, every such task would fail.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

from harness import (
    dispatch,
    key_of,
    make_workload,
    new_executor,
    run_scenario,
    wait_for_states,
    wait_until,
)

# A quarter of it is what a task must run to count as long: 2 s here (30 s by default).
QUEUED_TIMEOUT = 8.0
LONG = QUEUED_TIMEOUT / 4


def _started(started_dir: str, task_id: str) -> bool:
    return any(name.startswith(f"{task_id}.") for name in os.listdir(started_dir))


def revoked_from_the_room_behind_a_long_task() -> dict:
    os.environ["AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT"] = str(QUEUED_TIMEOUT)
    executor = new_executor(1, prefetch_fraction=1.0)
    at_rest = executor.slots_available
    started_dir = tempfile.mkdtemp()
    gate = Path(tempfile.mkdtemp(), "go")
    long = make_workload("long", fake={"started_dir": started_dir, "wait_for": str(gate)})
    waiting = make_workload("waiting", fake={"started_dir": started_dir})
    # The scheduler queues both at once: the second into the room, behind a task nobody knows is long.
    dispatch(executor, [long, waiting])
    assert wait_until(lambda: _started(started_dir, "long"), timeout=30), "long never started"
    # What the scheduler's stuck-in-queued check does to it (sooner than it would, not later).
    executor.revoke_task(ti=SimpleNamespace(key=key_of(waiting), id=waiting.ti.id))
    # Once the task has run LONG seconds, no slot is offered for it again: the scheduler leaves it
    # scheduled. With the room open it is queued into the room at once, to be revoked again.
    closed = wait_until(lambda: executor.slots_available == 0, timeout=LONG + 3)
    not_started = not _started(started_dir, "waiting")
    gate.touch()
    states = wait_for_states(executor, [key_of(long)], timeout=20)
    # A long task just ended: still no room, only the free worker.
    after_long = executor.slots_available
    again = make_workload("waiting", fake={"started_dir": started_dir}, same_ti_as=waiting)
    dispatch(executor, [again])
    states.update(wait_for_states(executor, [key_of(again)], timeout=20))
    # The last task to end was short: the room is open again.
    outcome = {
        "room_closed": closed,
        "revoked_never_started": not_started,
        "after_long_task": after_long,
        "states": states,
        "open_again": executor.slots_available == at_rest,
    }
    executor.end()
    return outcome


def test_room_takes_nothing_back_behind_a_long_task(start_method):
    outcome = run_scenario(revoked_from_the_room_behind_a_long_task, start_method=start_method, deadline=90)
    assert outcome == {
        "room_closed": True,
        "revoked_never_started": True,
        "after_long_task": 1,
        "states": {"long": "success", "waiting": "success"},
        "open_again": True,
    }


def room_closes_while_it_holds_work() -> dict:
    os.environ["AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT"] = str(QUEUED_TIMEOUT)
    executor = new_executor(2, prefetch_fraction=1.0)
    at_rest = executor.slots_available
    started_dir = tempfile.mkdtemp()
    gate = Path(tempfile.mkdtemp(), "go")
    items = [
        make_workload(f"t{i}", fake={"started_dir": started_dir, "wait_for": str(gate)}) for i in range(4)
    ]
    # As the scheduler does: it takes every slot offered in one loop, two of them in the room.
    dispatch(executor, items[:at_rest])
    started = wait_until(lambda: executor.sync() or len(os.listdir(started_dir)) == 2, timeout=30)
    # The two running tasks turn long: the room closes while it still holds two.
    closed = wait_until(lambda: executor._room() == 0, timeout=LONG + 3)
    available = executor.slots_available
    gate.touch()
    states = wait_for_states(executor, [key_of(w) for w in items[:at_rest]], timeout=30)
    executor.end()
    return {
        "at_rest": at_rest,
        "started": started,
        "closed": closed,
        "available": available,
        "states": states,
    }


def test_slots_available_is_never_negative_when_the_room_closes_while_it_holds_work():
    # The scheduler sums slots_available over its executors: a negative count would cancel another's free
    # slots, and stop its queuing for every executor in that loop.
    outcome = run_scenario(room_closes_while_it_holds_work, deadline=90)
    assert outcome["at_rest"] == 4 and outcome["started"] and outcome["closed"], outcome
    assert outcome["available"] == 0, outcome
    assert set(outcome["states"].values()) == {"success"}, outcome

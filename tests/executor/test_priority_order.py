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
What starts next is what the scheduler chose last: a higher priority first.

The scheduler queues task instances by ``priority_weight`` and hands the executor at most what its
slots allow. A workload an executor took early, beyond ``parallelism``, would start at the next free
worker ahead of a task of higher priority that became ready after it was taken. So the executor
holds a slot per dispatch on every line, as 3.4's does, and takes nothing beyond its slots: what
waits stays in BaseExecutor's queues, highest priority first. What the executor holds (a key that
takes more workers than slots) waits highest priority first too.
"""

from __future__ import annotations

import os
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import pytest
from harness import (
    airflow_line,
    heartbeat,
    key_of,
    make_workload,
    new_executor,
    run_scenario,
    wait_for_states,
    wait_until,
)

# What waits for a worker stays in BaseExecutor's queues, which hand it over highest priority first.
OWN_PIPES_PATCH = "0007-share-no-lock-or-pipe-between-localexecutor-processes.patch"
# Starts closer than this are the same scheduler loop's: a low task that took the high one's worker ran its
# 0.3 s first, while two workers handed work in one loop start within a loaded machine's delay (0.23 s
# seen with four test runs on two cores).
SAME_TIME = 0.25


def _release() -> tuple[int, ...]:
    """The installed apache-airflow-core release, without importing Airflow into pytest's process."""
    return tuple(int(part) for part in version("apache-airflow-core").split(".")[:2])


def _starts(started_dir: str) -> dict[str, float]:
    """When each task started (its marker's modification time, in the clock ``time.time()`` reads)."""
    return {
        name.rsplit(".", 1)[0]: os.stat(Path(started_dir, name)).st_mtime_ns / 1e9
        for name in os.listdir(started_dir)
    }


def scheduler_loop_with_a_late_high_priority_task() -> dict:
    """
    As the issue's loop: parallelism 2, two long tasks running, four priority-1 tasks ready, then one of
    priority 100. Each loop queues what ``slots_available`` allows, highest priority first, and beats.
    """
    executor = new_executor(2)
    started_dir = tempfile.mkdtemp()
    gate = Path(tempfile.mkdtemp(), "go")

    def fake(**extra: object) -> dict:
        return {"started_dir": started_dir, **extra}

    ready = [make_workload(f"long{i}", fake=fake(wait_for=str(gate))) for i in range(2)]
    lows = [make_workload(f"low{i}", fake=fake(sleep=0.3)) for i in range(4)]
    high = make_workload("high", fake=fake(sleep=0.3), priority_weight=100)
    everything = [*ready, *lows, high]

    def loop() -> None:
        ready.sort(key=lambda w: -w.ti.priority_weight)
        for workload in ready[: max(0, executor.slots_available)]:
            key_of(workload)
            executor.queue_workload(workload, session=None)
            ready.remove(workload)
        executor.heartbeat()

    while len(os.listdir(started_dir)) < 2:
        loop()
        time.sleep(0.02)
    ready.extend(lows)
    for _ in range(10):  # the lows are offered for a while before the high one is ready
        loop()
        time.sleep(0.02)
    ready.append(high)
    high_ready = time.time()
    gate.touch()  # both long tasks end: a worker frees with the high one ready
    give_up = time.monotonic() + 30
    while time.monotonic() < give_up and not all(key_of(w) in executor.event_buffer for w in everything):
        loop()
        time.sleep(0.02)
    states = wait_for_states(executor, [key_of(w) for w in everything], timeout=10)
    executor.end()
    starts = _starts(started_dir)
    high_start = starts.get("high", float("inf"))
    # Ahead: started after the high one was ready, and while it still waited for a worker. A low one
    # that starts beside it (two workers freed at once, both queued in one loop) is not: every low one
    # runs 0.3 s, so one that took the high one's worker started that long before it.
    ahead = [
        t for t, at in starts.items() if t.startswith("low") and high_ready <= at < high_start - SAME_TIME
    ]
    return {
        "lows started ahead of the high one": len(ahead),
        "high waited": round(high_start - high_ready, 2),
        "states": sorted(set(states.values())),
        "line": airflow_line(),
    }


def test_no_low_priority_task_starts_ahead_of_a_higher_one_it_was_taken_before(start_method):
    outcome = run_scenario(
        scheduler_loop_with_a_late_high_priority_task, start_method=start_method, deadline=90
    )
    assert outcome["states"] == ["success"]
    # None on any line, as 3.4's own executor (3.3.2's starts all four low ones first).
    assert outcome["lows started ahead of the high one"] == 0, outcome


def held_workloads_in_priority_order() -> dict:
    executor = new_executor(1)
    started_dir = tempfile.mkdtemp()
    gate = Path(tempfile.mkdtemp(), "go")
    long = make_workload("long", fake={"started_dir": started_dir, "wait_for": str(gate)})
    low = make_workload("low", fake={"started_dir": started_dir})
    high = make_workload("high", fake={"started_dir": started_dir}, priority_weight=100)
    items = [long, low, high]
    # One batch each, the way a key dispatched again (a resumed deferral) or a connection test comes in
    # beyond the slots: the low one waits in the executor before the high one comes.
    for workload in items:
        key_of(workload)
        executor.queue_workload(workload, session=None)
        executor._process_workloads([workload])
        if workload is long:
            assert wait_until(lambda: os.listdir(started_dir), timeout=30), "long never started"
    gate.touch()
    states = wait_for_states(executor, [key_of(w) for w in items], timeout=30)
    executor.end()
    starts = _starts(started_dir)
    return {"order": sorted(starts, key=starts.__getitem__), "states": sorted(set(states.values()))}


@pytest.mark.fixed_by(OWN_PIPES_PATCH)
def test_workloads_the_executor_holds_start_highest_priority_first(start_method):
    outcome = run_scenario(held_workloads_in_priority_order, start_method=start_method, deadline=90)
    assert outcome == {"order": ["long", "high", "low"], "states": ["success"]}


def a_callback_held_behind_tasks() -> dict:
    from test_other_workloads import _callback

    executor = new_executor(1)
    started_dir = tempfile.mkdtemp()
    gate = Path(tempfile.mkdtemp(), "go")
    names = {
        "long": make_workload("long", fake={"started_dir": started_dir, "wait_for": str(gate)}),
        "high": make_workload("high", priority_weight=100),
        "callback": _callback("lepatch.callbacks.notify", {}),
    }
    key = executor.get_workload_key if hasattr(executor, "get_workload_key") else (lambda w: w.key)
    keys = {key(w): name for name, w in names.items()}
    # Held by the executor while its only worker runs the long one: the task, then the callback.
    for name, workload in names.items():
        executor.queue_workload(workload, session=None)
        executor._process_workloads([workload])
        if name == "long":
            assert wait_until(lambda: os.listdir(started_dir), timeout=30), "long never started"
    gate.touch()
    ended: list[str] = []  # one worker: the order they end in is the order they started in
    give_up = time.monotonic() + 30
    while len(ended) < len(keys) and time.monotonic() < give_up:
        heartbeat(executor)
        ended += [name for key, name in keys.items() if key in executor.event_buffer and name not in ended]
        time.sleep(0.01)
    executor.end()
    return {"order": ended}


# Before 3.3 nothing but tasks reaches an executor: no order to keep.
if _release()[:2] >= (3, 3):

    @pytest.mark.fixed_by(OWN_PIPES_PATCH)
    def test_callbacks_start_before_every_task_the_executor_holds(start_method):
        # BaseExecutor hands callbacks over before any task, and the executor holds none of its own.
        outcome = run_scenario(a_callback_held_behind_tasks, start_method=start_method, deadline=90)
        assert outcome == {"order": ["long", "callback", "high"]}

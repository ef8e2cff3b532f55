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
Operators size the prefetch room from ``[local_executor]``, as they set any other option.

Set through the environment (``AIRFLOW__LOCAL_EXECUTOR__...``), as a deployment does: each scenario
runs in a process of its own, so what it sets ends with it.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from pathlib import Path

import pytest
from harness import dispatch, key_of, make_workload, new_executor, queued, run_scenario, wait_until

CONFIG_PATCH = "0009-keep-localexecutor-workers-busy-between-scheduler-loops.patch"
ABOVE_ONE_PATCH = "0009-keep-localexecutor-workers-busy-between-scheduler-loops.patch"

FRACTION = "AIRFLOW__LOCAL_EXECUTOR__PREFETCH_FRACTION"
MAX_TASK_SECONDS = "AIRFLOW__LOCAL_EXECUTOR__PREFETCH_MAX_TASK_SECONDS"


def _at_rest(parallelism: int, **options: str) -> int:
    for name, value in options.items():
        os.environ[name] = value
    executor = new_executor(parallelism)
    try:
        return int(executor.slots_available)
    finally:
        executor.end()
        for name in options:
            del os.environ[name]


def prefetch_off_through_heartbeat() -> dict:
    sizes = {
        "all": _at_rest(4, **{FRACTION: "1"}),
        "half": _at_rest(4, **{FRACTION: "0.5"}),
        "off": _at_rest(4, **{FRACTION: "0"}),
        "no task is short": _at_rest(4, **{FRACTION: "1", MAX_TASK_SECONDS: "0"}),
    }
    os.environ[FRACTION] = "0"
    executor = new_executor(2)
    started_dir = tempfile.mkdtemp()
    gate = Path(tempfile.mkdtemp(), "go")
    fake = {"started_dir": started_dir, "wait_for": str(gate)}
    items = [make_workload(f"t{i}", fake=fake) for i in range(3)]
    for workload in items:
        key_of(workload)
        executor.queue_workload(workload, session=None)
    # The scheduler's loop: what heartbeat() hands over is what the open slots allow, and no more.
    executor.heartbeat()
    wait_until(lambda: len(os.listdir(started_dir)) >= 2, timeout=30)
    time.sleep(0.2)  # a third one handed over would have started by now
    while_busy = {
        "started": len(os.listdir(started_dir)),
        "left queued": len(queued(executor)),
        "slots": executor.slots_available,
    }
    gate.touch()
    keys = [key_of(w) for w in items]
    give_up = time.monotonic() + 30
    while time.monotonic() < give_up and not all(k in executor.event_buffer for k in keys):
        executor.heartbeat()
        time.sleep(0.02)
    states = sorted(str(executor.event_buffer.get(k, ("missing",))[0]) for k in keys)
    executor.end()
    return {"at rest": sizes, "while busy": while_busy, "states": states}


@pytest.mark.fixed_by(CONFIG_PATCH)
def test_prefetch_fraction_from_config_sizes_the_room(start_method):
    outcome = run_scenario(prefetch_off_through_heartbeat, start_method=start_method, deadline=90)
    assert outcome == {
        # parallelism 4, and the room: all of it, half, none.
        "at rest": {"all": 8, "half": 6, "off": 4, "no task is short": 4},
        # Two running and one queued against parallelism 2: nothing more for the scheduler to queue (0, never
        # a negative count that would cancel another executor's free slots in the scheduler's sum).
        "while busy": {"started": 2, "left queued": 1, "slots": 0},
        "states": ["success", "success", "success"],
    }


def _send_long_task(executor) -> tuple[str, Path]:
    """Dispatch a task that runs until its gate file exists; its started-marker directory and gate."""
    started_dir = tempfile.mkdtemp()
    gate = Path(tempfile.mkdtemp(), "go")
    dispatch(executor, [make_workload("long", fake={"started_dir": started_dir, "wait_for": str(gate)})])
    return started_dir, gate


def room_closing_after_max_task_seconds() -> dict:
    os.environ[MAX_TASK_SECONDS] = "1"
    os.environ[FRACTION] = "1"
    executor = new_executor(1)
    started_dir, gate = _send_long_task(executor)
    room_while_young = executor.slots_available
    wait_until(lambda: os.listdir(started_dir), timeout=30)
    # 1 s after it was sent, the task counts as long: nothing is taken to wait behind it.
    closed = wait_until(lambda: executor.slots_available == 0, timeout=4)
    gate.touch()
    executor.end()
    return {"room while young": room_while_young, "closed": closed}


@pytest.mark.fixed_by(CONFIG_PATCH)
def test_prefetch_max_task_seconds_from_config_closes_the_room(start_method):
    outcome = run_scenario(room_closing_after_max_task_seconds, start_method=start_method, deadline=60)
    assert outcome == {"room while young": 1, "closed": True}


def room_above_parallelism() -> dict:
    os.environ[FRACTION] = "2"
    os.environ[MAX_TASK_SECONDS] = "1"
    executor = new_executor(2)
    at_rest = int(executor.slots_available)
    started_dir, gate = _send_long_task(executor)
    young = int(executor.slots_available)
    wait_until(lambda: os.listdir(started_dir), timeout=30)
    # 1 s after it was sent the task counts as long: its worker's share of the room goes, the other's stays.
    wait_until(lambda: executor.slots_available < young, timeout=4)
    with_long = int(executor.slots_available)
    gate.touch()
    executor.end()
    return {"at rest": at_rest, "one young task": young, "one long task": with_long}


@pytest.mark.fixed_by(ABOVE_ONE_PATCH)
def test_prefetch_fraction_above_one_gives_each_worker_more_than_one(start_method):
    outcome = run_scenario(room_above_parallelism, start_method=start_method, deadline=60)
    # Parallelism 2 and a fraction of 2: a room of 4, two per worker; one worker held by a long task
    # leaves the other's two.
    assert outcome == {"at rest": 6, "one young task": 5, "one long task": 3}


def start_with_bad_values() -> dict:
    from airflow.exceptions import AirflowConfigException
    from airflow.executors.local_executor import LocalExecutor

    refused = {}
    for name, value in ((FRACTION, "lots"), (FRACTION, "-1"), (MAX_TASK_SECONDS, "inf")):
        os.environ[name] = value
        executor = LocalExecutor(parallelism=2)
        try:
            executor.start()
        except AirflowConfigException as error:
            refused[f"{name}={value}"] = str(error)
        else:
            refused[f"{name}={value}"] = "started"
            executor.end()
        del os.environ[name]
    return {"refused": refused, "processes left": len(multiprocessing.active_children())}


@pytest.mark.fixed_by(CONFIG_PATCH)
def test_a_prefetch_option_that_is_not_a_number_stops_start(start_method):
    outcome = run_scenario(start_with_bad_values, start_method=start_method, deadline=60)
    must = "must be a number >= 0, not"
    assert outcome == {
        "refused": {
            f"{FRACTION}=lots": f"[local_executor] prefetch_fraction {must} 'lots'",
            f"{FRACTION}=-1": f"[local_executor] prefetch_fraction {must} '-1'",
            f"{MAX_TASK_SECONDS}=inf": f"[local_executor] prefetch_max_task_seconds {must} 'inf'",
        },
        # Nothing was started for an executor that refused to start.
        "processes left": 0,
    }

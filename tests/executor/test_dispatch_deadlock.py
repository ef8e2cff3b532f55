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
"""Dispatching a batch never deadlocks against workers writing results (apache/airflow#70526)."""

from __future__ import annotations

import pytest
from harness import (
    dispatch,
    key_of,
    label,
    make_workload,
    new_executor,
    queued,
    run_scenario,
    wait_for_states,
)

DRAIN_PATCH = "0003-drain-the-result-queue-before-each-workload-put.patch"


def one_batch(parallelism: int, count: int, pad: int = 900, fail_bytes: int = 0) -> dict:
    """Hand ``count`` workloads to the executor in one ``_process_workloads`` call, then collect them."""
    executor = new_executor(parallelism)
    # What fills the pipes is the number and size of workloads and results, not the task process.
    fake: dict = {"no_fork": True, **({"fail_bytes": fail_bytes} if fail_bytes else {})}
    items = [make_workload(f"w{i}", fake=fake, pad=pad) for i in range(count)]
    dispatch(executor, items)
    states = wait_for_states(executor, [key_of(w) for w in items], timeout=60)
    executor.end()
    expected = "failed" if fail_bytes else "success"
    return {"wrong": {k: v for k, v in states.items() if v != expected}, "count": len(states)}


@pytest.mark.fixed_by(DRAIN_PATCH)
def test_process_workloads_does_not_deadlock_on_a_full_result_pipe():
    # 1000 realistic workloads (about 1.7 KB each) are far more than the 64 KiB activity pipe holds;
    # unpatched, the workers' results fill the result pipe while the batch is still being written.
    # (fork: with spawn no worker exists yet to read the batch, see test_spawn_batch_larger_than_the_pipe.)
    outcome = run_scenario(one_batch, start_method="fork", deadline=120, parallelism=2, count=1000)
    assert outcome == {"wrong": {}, "count": 1000}


BLOCKED_PUT_PATCH = "0004-keep-draining-results-while-a-workload-put-is-blocked.patch"


@pytest.mark.fixed_by(BLOCKED_PUT_PATCH)
def test_process_workloads_progresses_under_concurrent_result_refill():
    # 64 KiB workloads failing with 64 KiB exceptions: a worker refills the result pipe between the
    # drain before a put and the put itself, and Linux frees pipe space only a page at a time, so
    # draining once before each put still deadlocks. Reading results while the put is blocked does not.
    outcome = run_scenario(
        one_batch,
        start_method="fork",
        deadline=120,
        parallelism=2,
        count=200,
        pad=64 * 1024,
        fail_bytes=64 * 1024,
    )
    assert outcome == {"wrong": {}, "count": 200}


def sigterm_during_dispatch(count: int) -> dict:
    """SIGTERM (the scheduler's handler raises SystemExit) arrives while a big batch is handed over."""
    import os
    import signal
    import threading
    import time

    def exit_on_sigterm(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_on_sigterm)
    executor = new_executor(2)
    items = [make_workload(f"w{i}", fake={"sleep": 0.01}, pad=64 * 1024) for i in range(count)]
    keys = {key_of(w): w.ti.task_id for w in items}
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    interrupted = False
    try:
        dispatch(executor, items)
        # The scheduler loop, heartbeating until the signal arrives (if the batch was not still
        # being written when it came).
        give_up = time.monotonic() + 10
        while time.monotonic() < give_up:
            executor.sync()
            time.sleep(0.005)
    except SystemExit:
        interrupted = True
    executor.end()
    # After end(): from patch 11 on, it queues again what no worker took.
    still_queued = {keys[k] for k in keys if k in queued(executor)}
    reported = {label(key) for key in executor.event_buffer}
    return {
        "interrupted": interrupted,
        "lost": sorted(set(keys.values()) - still_queued - reported),
        "both": sorted(still_queued & reported),
        "failed": sorted(label(k) for k, (state, _) in executor.event_buffer.items() if state != "success"),
    }


@pytest.mark.fixed_by(BLOCKED_PUT_PATCH)
def test_sigterm_during_dispatch_leaves_every_workload_sent_or_queued():
    # 100 workloads of 64 KiB: the signal comes while the batch is still being written. Unpatched,
    # SystemExit is raised in the middle of a pipe write and leaves half a workload in the pipe.
    outcome = run_scenario(sigterm_during_dispatch, deadline=15, count=100)
    assert outcome["interrupted"]
    # Every workload either went out whole (and was run and reported) or is still queued for the
    # scheduler; none is lost in between and none is both.
    assert outcome["lost"] == []
    assert outcome["both"] == []
    assert outcome["failed"] == []


SPAWN_PATCH = "0005-undo-a-failed-put-and-spawn-workers-while-one-is-blocked.patch"


@pytest.mark.fixed_by(SPAWN_PATCH)
def test_spawn_batch_larger_than_the_pipe():
    # With spawn no worker exists before the first batch, and workers were only started after it:
    # a batch larger than the activity pipe waited for a reader that was never started.
    outcome = run_scenario(one_batch, start_method="spawn", deadline=120, parallelism=2, count=1000)
    assert outcome == {"wrong": {}, "count": 1000}

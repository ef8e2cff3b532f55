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
"""LocalExecutor.end() and terminate(): shutting down never waits on a worker that cannot move."""

from __future__ import annotations

import multiprocessing.process
import os
import tempfile
import time

import pytest
from harness import dispatch, make_workload, new_executor, run_scenario, terminal_states, wait_until

END_PATCH = "0001-drain-result-queue-to-prevent-process-join-deadlock.patch"


def end_with_unread_results(parallelism: int, count: int, result_bytes: int) -> dict:
    """Shut down while workers still have more result bytes to write than the result pipe holds."""
    executor = new_executor(parallelism)
    dispatch(executor, [make_workload(f"big_{i}", fake={"fail_bytes": result_bytes}) for i in range(count)])
    # end() starts no workload that still waits for a worker (patch 11): wait until each is sent to
    # one. Before patch 7 nothing waits in the executor (the workloads are in the shared queue).
    assert wait_until(lambda: not getattr(executor, "_pending", ()))
    started = time.monotonic()
    executor.end()
    return {"states": terminal_states(executor), "seconds": time.monotonic() - started}


@pytest.mark.fixed_by(END_PATCH)
def test_end_reads_results_while_joining_workers(start_method):
    # 2 failures carrying 512 KiB each: 1 MiB of results against a 64 KiB pipe.
    outcome = run_scenario(
        end_with_unread_results,
        start_method=start_method,
        deadline=60,
        parallelism=2,
        count=2,
        result_bytes=512 * 1024,
    )
    assert outcome["states"] == {f"big_{i}": "failed" for i in range(2)}


def terminate_busy_workers() -> dict:
    """terminate() while one task exits on SIGTERM and the other ignores it."""
    executor = new_executor(2)
    started_dir = tempfile.mkdtemp()
    dispatch(
        executor,
        [
            make_workload("polite", fake={"started_dir": started_dir, "sleep": 120}),
            make_workload(
                "stubborn", fake={"started_dir": started_dir, "sleep": 120, "ignore_sigterm": True}
            ),
        ],
    )
    executor.sync()  # spawn start method: workers are started from sync()
    executor.sync()
    both_started = wait_until(lambda: len(os.listdir(started_dir)) == 2, timeout=30)
    procs = list(executor.workers.values())
    t0 = time.monotonic()
    executor.terminate()
    return {
        "both_started": both_started,
        "seconds": time.monotonic() - t0,
        "alive": [p.pid for p in procs if _alive(p)],
    }


def _alive(proc: multiprocessing.process.BaseProcess) -> bool:
    try:
        return proc.is_alive()
    except ValueError:  # closed by terminate(): it was reaped
        return False


@pytest.mark.fixed_by(END_PATCH)
def test_terminate_escalates_sigterm_to_sigkill(start_method):
    outcome = run_scenario(terminate_busy_workers, start_method=start_method, deadline=60)
    assert outcome["both_started"]
    assert outcome["alive"] == []
    # The stubborn worker costs a short SIGTERM wait before SIGKILL, not the length of its task.
    assert outcome["seconds"] < 5


def terminate_idle_workers() -> dict:
    executor = new_executor(3)
    procs = list(executor.workers.values())
    t0 = time.monotonic()
    executor.terminate()
    return {"seconds": time.monotonic() - t0, "alive": [p.pid for p in procs if _alive(p)]}


@pytest.mark.fixed_by(END_PATCH)
def test_terminate_stops_idle_workers_at_once():
    outcome = run_scenario(terminate_idle_workers, deadline=60)
    assert outcome["alive"] == []
    assert outcome["seconds"] < 3

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
What a worker costs the scheduler, and where a scheduler's limits stop it.

Descriptors per worker (the release holds two), the soft ``RLIMIT_NOFILE`` of 1024 that systemd gives
services, the work one read of the slots does with every worker idle, a send to a worker that takes
nothing, and how the executor decides a task's start when task-sdk does not say.
"""

from __future__ import annotations

import os
import resource
import signal
import time

import pytest
from harness import airflow_line, dispatch, key_of, make_workload, run_scenario, wait_for_states

LIMITS_PATCH = "0009-keep-localexecutor-workers-busy-between-scheduler-loops.patch"


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def descriptors_per_worker(parallelism: int) -> dict:
    from airflow.executors.local_executor import LocalExecutor

    executor = LocalExecutor(parallelism=parallelism)
    before = _open_descriptors()
    executor.start()
    after = _open_descriptors()
    executor.end()
    return {"per_worker": (after - before) / parallelism}


@pytest.mark.fixed_by(LIMITS_PATCH)
def test_a_worker_holds_two_descriptors_in_the_scheduler():
    # Its two pipe ends; multiprocessing's sentinel and the pipe its child watches are closed.
    outcome = run_scenario(descriptors_per_worker, start_method="fork", deadline=90, parallelism=16)
    assert outcome["per_worker"] == 2, outcome


def start_under_nofile(parallelism: int, soft: int, hard: int) -> dict:
    from airflow.executors.local_executor import LocalExecutor

    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    except (ValueError, OSError):  # no privilege to raise the hard limit: keep the one there is
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    executor = LocalExecutor(parallelism=parallelism)
    try:
        executor.start()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}", "workers": len(getattr(executor, "workers", {}))}
    items = [make_workload(f"task_{i}", fake={"no_fork": True}) for i in range(4)]
    dispatch(executor, items)
    states = wait_for_states(executor, [key_of(w) for w in items], timeout=60)
    workers = len(executor.workers)
    executor.end()
    return {"error": None, "workers": workers, "states": sorted(set(states.values()))}


@pytest.mark.fixed_by(LIMITS_PATCH)
def test_parallelism_512_starts_and_runs_under_systemds_soft_limit():
    if 0 <= resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 2048:
        pytest.skip("the hard RLIMIT_NOFILE here is below 2048")
    outcome = run_scenario(
        start_under_nofile, start_method="fork", deadline=240, parallelism=512, soft=1024, hard=524288
    )
    assert outcome == {"error": None, "workers": 512, "states": ["success"]}


@pytest.mark.fixed_by(LIMITS_PATCH)
def test_parallelism_above_the_hard_limit_fails_at_once_naming_it():
    outcome = run_scenario(
        start_under_nofile, start_method="fork", deadline=120, parallelism=600, soft=1024, hard=1024
    )
    assert outcome["workers"] == 0, outcome
    assert outcome["error"].startswith("RuntimeError: LocalExecutor: parallelism 600 needs"), outcome
    assert "LimitNOFILE=" in outcome["error"], outcome


def read_slots_with_idle_workers(parallelism: int) -> dict:
    from multiprocessing.connection import Connection

    from airflow.executors.local_executor import LocalExecutor

    executor = LocalExecutor(parallelism=parallelism)
    executor.start()
    polls = []
    real_poll = Connection.poll
    Connection.poll = lambda self, *args: polls.append(self) or real_poll(self, *args)  # type: ignore[method-assign]
    try:
        executor.sync()  # what every heartbeat does; slots_occupied reads the same way
        occupied = executor.slots_occupied
    finally:
        Connection.poll = real_poll  # type: ignore[method-assign]
    executor.end()
    return {"occupied": occupied, "pipes_polled_one_by_one": len(polls)}


@pytest.mark.fixed_by(LIMITS_PATCH)
def test_reading_results_polls_no_idle_worker_pipe_by_itself():
    # One registered poll object answers for every pipe: an idle worker costs no selector per read, in
    # sync() or in slots_occupied.
    outcome = run_scenario(read_slots_with_idle_workers, start_method="fork", deadline=90, parallelism=16)
    assert outcome == {"occupied": 0, "pipes_polled_one_by_one": 0}


def send_to_a_stopped_worker(sigterm_after: float | None) -> dict:
    from airflow.executors.local_executor import LocalExecutor

    executor = LocalExecutor(parallelism=1)
    executor.send_timeout = 2.0
    executor.start()
    (worker,) = executor.workers
    os.kill(worker, signal.SIGSTOP)  # a debugger, a cgroup freezer: it reads nothing
    big = make_workload("big", pad=200_000)  # more than a pipe holds
    outcome: dict = {}
    if sigterm_after is not None:

        def scheduler_handler(signum, frame):
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, scheduler_handler)
        signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
        signal.setitimer(signal.ITIMER_REAL, sigterm_after)
    started = time.monotonic()
    try:
        dispatch(executor, [big])
    except SystemExit:
        outcome["ended_by_sigterm_after"] = round(time.monotonic() - started - (sigterm_after or 0), 1)
        return outcome
    outcome["returned_after"] = round(time.monotonic() - started, 1)
    outcome["stopped_worker_gone"] = worker not in executor.workers
    # It never left BaseExecutor's queue for the stopped worker: a fresh worker took it.
    outcome["states"] = wait_for_states(executor, [key_of(big)], timeout=30)
    executor.end()
    return outcome


@pytest.mark.fixed_by(LIMITS_PATCH)
def test_a_worker_that_takes_no_workload_is_killed_and_the_workload_stays_queued():
    outcome = run_scenario(send_to_a_stopped_worker, start_method="fork", deadline=60, sigterm_after=None)
    assert 2.0 <= outcome["returned_after"] < 10.0, outcome
    assert outcome["stopped_worker_gone"], outcome
    assert outcome["states"] == {"big": "success"}, outcome


def test_sigterm_during_a_send_ends_the_scheduler_within_a_second():
    # Signals are held off while a workload moves (patch 9); a send that waits must not hold them for long.
    outcome = run_scenario(send_to_a_stopped_worker, start_method="fork", deadline=60, sigterm_after=0.5)
    assert outcome["ended_by_sigterm_after"] < 1.0, outcome


# Not a regression test of the verify matrix: it skips on 3.1-3.3, whose task-sdk forks every task process.
def test_a_task_counts_as_started_when_task_sdk_does_not_say_how_it_starts(monkeypatch):
    if airflow_line() != "3.4":
        pytest.skip("only task-sdk 1.4 starts a task process without fork()")
    from airflow.executors import local_executor
    from airflow.sdk.execution_time import supervisor

    monkeypatch.delattr(supervisor, "_task_process_uses_exec")
    # Unsure, the worker acknowledges the start before running the task: a worker that dies mid-task
    # fails it (a try spent) rather than queueing a task that ran for another run.
    assert local_executor._forks_task_process(make_workload("task")) is False

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
No task process outlives its worker: a killed worker's task is gone before its key is failed.

A worker runs a task the way task-sdk's ``supervise`` does: it forks a task process and waits
for it. Here the task process is quiet (it never writes to the worker, so nothing makes it
notice that the worker is gone) and leaves a mark in a file every 50 ms. Once the executor
reports the key failed, the scheduler may run it again at once; two copies of one task must
never run side by side.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from pathlib import Path

import pytest
from harness import (
    MARK_INTERVAL,
    dispatch,
    key_of,
    make_workload,
    new_executor,
    read_marks,
    run_scenario,
    wait_for_states,
    wait_until,
)

KILL_TASKS_PATCH = "0008-kill-a-dead-localexecutor-workers-task-processes.patch"


def _dead(pid: int) -> bool:
    """``pid`` runs no more: gone, or a zombie nobody reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat[stat.rindex(")") + 2] in ("Z", "X")


def _pids(marks: str, tag: str) -> set[int]:
    return {pid for t, pid, _ in read_marks(marks) if t == tag}


def _start_first_try(executor, marks: str, **fake) -> tuple:
    """Dispatch a task whose task process marks as "try1"; return its key, worker and marking process."""
    started_dir = tempfile.mkdtemp()
    first = make_workload(
        "task", fake={"started_dir": started_dir, "marks": marks, "mark_as": "try1", **fake}
    )
    dispatch(executor, [first])

    def task_marking() -> bool:
        executor.sync()
        return bool(_pids(marks, "try1"))

    assert wait_until(task_marking, timeout=60), "the task process never started"
    (worker,) = (int(name.rsplit(".", 1)[1]) for name in os.listdir(started_dir))
    (marker,) = _pids(marks, "try1")
    return key_of(first), worker, marker


def _marks_after(marks: str, tag: str, since: float) -> int:
    return sum(1 for t, _, when in read_marks(marks) if t == tag and when > since)


def _zombie_children(executor) -> list[int]:
    """This process's children that have exited and wait to be reaped, workers left out."""
    stats = (_stat(e) for e in os.listdir("/proc") if e.isdigit())
    me = str(os.getpid())
    return [int(f[0]) for f in stats if f and f[2:4] == ["Z", me] and int(f[0]) not in executor.workers]


def _stat(pid: str) -> list[str] | None:
    with contextlib.suppress(OSError):
        text = Path(f"/proc/{pid}/stat").read_text()
        return [pid, "", *text[text.rindex(")") + 2 :].split()]
    return None


def kill_worker_running_a_task(own_session: bool, exit_with_worker: bool = False) -> dict:
    executor = new_executor(2)
    marks = str(Path(tempfile.mkdtemp(), "marks"))
    key, worker, task_process = _start_first_try(
        executor, marks, mark_in_own_session=own_session, exit_with_worker=exit_with_worker
    )

    os.kill(worker, signal.SIGKILL)
    killed_at = time.monotonic()
    # The scheduler's view: poll sync() until the key's failure shows (every second, as a scheduler's loop
    # where the task process exits by itself), and look at the task process at that very moment.
    while key not in executor.event_buffer and time.monotonic() - killed_at < 30:
        executor.sync()
        time.sleep(1.0 if exit_with_worker else 0.0)
    reported_at = time.monotonic()
    failed = str(executor.event_buffer.get(key, ("missing",))[0])
    task_dead_when_reported = _dead(task_process)
    slots_when_reported = executor.slots_available
    zombies_after_sync = _zombie_children(executor)

    # The scheduler retries the key at once.
    executor.event_buffer.clear()
    retry = make_workload("task", fake={"marks": marks, "mark_as": "try2", "mark_for": 0.5})
    dispatch(executor, [retry])
    states = wait_for_states(executor, [key_of(retry)], timeout=30)
    time.sleep(5 * MARK_INTERVAL)  # a task process still alive would have marked by now
    lines = read_marks(marks)
    first_try2 = next((i for i, (tag, _, _) in enumerate(lines) if tag == "try2"), len(lines))
    executor.end()
    return {
        "failed": failed,
        "task_dead_when_reported": task_dead_when_reported,
        "slots_when_reported": slots_when_reported,
        "zombies_after_sync": zombies_after_sync,
        "try1_marks_after_report": _marks_after(marks, "try1", reported_at),
        "try1_marks_after_try2_began": sum(1 for tag, _, _ in lines[first_try2:] if tag == "try1"),
        "try2_marks": sum(1 for tag, _, _ in lines if tag == "try2"),
        "retry": states,
        "reported_ms": round((reported_at - killed_at) * 1000, 1),
    }


@pytest.mark.fixed_by(KILL_TASKS_PATCH)
@pytest.mark.parametrize(
    ("own_session", "exit_with_worker"),
    [(False, False), (True, False), (True, True)],
    ids=["task-process", "its-child-in-own-session", "its-child-in-own-session-orphaned"],
)
def test_task_process_of_a_killed_worker_is_dead_before_its_key_is_failed(
    start_method, own_session, exit_with_worker
):
    # own_session: the marks come from a process the task process started in a session of its own, as
    # BashOperator's shell. exit_with_worker: the task process exits as soon as its worker is gone (its
    # next log line fails), so that shell is an orphan the moment the worker dies, long before any scan.
    outcome = run_scenario(
        kill_worker_running_a_task,
        start_method=start_method,
        deadline=120,
        own_session=own_session,
        exit_with_worker=exit_with_worker,
    )
    assert outcome["failed"] == "failed", outcome
    assert outcome["task_dead_when_reported"], outcome
    assert outcome["slots_when_reported"] == 2, outcome
    assert outcome["zombies_after_sync"] == [], outcome
    assert outcome["try1_marks_after_report"] == 0, outcome
    # The retry ran, and never beside the first try.
    assert outcome["retry"] == {"task": "success"}, outcome
    assert outcome["try2_marks"] > 0, outcome
    assert outcome["try1_marks_after_try2_began"] == 0, outcome


FORKSERVER_PATCH = "0008-kill-a-dead-localexecutor-workers-task-processes.patch"


@pytest.mark.fixed_by(FORKSERVER_PATCH)
def test_under_forkserver_the_task_process_of_a_killed_worker_is_dead_before_its_key_is_failed():
    # Python 3.14's default start method on Linux. Its workers were the forkserver's children, reaped by
    # it at once: the executor could not hold a dead worker's pid, so its task process ran on unseen.
    outcome = run_scenario(
        kill_worker_running_a_task, start_method="forkserver", deadline=120, own_session=False
    )
    assert outcome["failed"] == "failed", outcome
    assert outcome["task_dead_when_reported"], outcome
    assert outcome["try1_marks_after_report"] == 0, outcome
    assert outcome["retry"] == {"task": "success"}, outcome
    assert outcome["try1_marks_after_try2_began"] == 0, outcome


def stop_executor_with_task_processes(how: str) -> dict:
    """``end()`` after tasks that left processes behind, or ``terminate()`` while tasks run."""
    executor = new_executor(2)
    marks = str(Path(tempfile.mkdtemp(), "marks"))
    # end() waits for the tasks, so they finish, but each leaves a process behind that goes on marking.
    # terminate() does not wait: the task processes themselves are still running.
    detached = how == "end"
    items = [
        make_workload(f"task_{i}", fake={"marks": marks, "mark_as": f"task_{i}", "mark_detached": detached})
        for i in range(2)
    ]
    dispatch(executor, items)

    def all_marking() -> bool:
        executor.sync()
        return all(_pids(marks, f"task_{i}") for i in range(2))

    assert wait_until(all_marking, timeout=60), "the task processes never started"
    if detached:
        states = wait_for_states(executor, [key_of(w) for w in items], timeout=30)
        assert set(states.values()) == {"success"}, states
    task_processes = set().union(*(_pids(marks, f"task_{i}") for i in range(2)))
    getattr(executor, how)()
    returned_at = time.monotonic()
    alive = sorted(pid for pid in task_processes if not _dead(pid))
    time.sleep(5 * MARK_INTERVAL)
    return {
        "alive_after_return": alive,
        "marks_after_return": sum(_marks_after(marks, f"task_{i}", returned_at) for i in range(2)),
    }


@pytest.mark.fixed_by(KILL_TASKS_PATCH)
@pytest.mark.parametrize("how", ["end", "terminate"])
def test_no_task_process_is_left_after_the_executor_stops(start_method, how):
    outcome = run_scenario(
        stop_executor_with_task_processes, start_method=start_method, deadline=120, how=how
    )
    assert outcome == {"alive_after_return": [], "marks_after_return": 0}


def worker_reaped_by_someone_else() -> dict:
    """A busy worker dies and something other than the executor reaps it, then more work comes."""
    executor = new_executor(1)
    started_dir = tempfile.mkdtemp()
    gate = Path(tempfile.mkdtemp(), "go")
    held = make_workload("held", fake={"started_dir": started_dir, "wait_for": str(gate)})
    dispatch(executor, [held])

    def started() -> bool:
        executor.sync()
        return bool(os.listdir(started_dir))

    assert wait_until(started, timeout=60), "the workload never started"
    (worker,) = (int(name.rsplit(".", 1)[1]) for name in os.listdir(started_dir))
    os.kill(worker, signal.SIGKILL)
    # A library's waitpid(-1), or SIGCHLD set to SIG_IGN: the executor can learn no exit status.
    os.waitpid(worker, 0)
    states = wait_for_states(executor, [key_of(held)], timeout=20)
    if states["held"] == "missing":
        # Taken for alive: end() would wait for it for ever.
        return {"states": states, "forgotten": worker not in executor.workers}
    after = make_workload("after")
    dispatch(executor, [after])
    states.update(wait_for_states(executor, [key_of(after)], timeout=30))
    executor.end()
    return {"states": states, "forgotten": worker not in executor.workers}


# Patch 7 finds dead workers with waitid(), which says ECHILD for one reaped elsewhere; before it,
# multiprocessing's waitpid() failed the same way and is_alive() read that as running.
@pytest.mark.fixed_by("0007-share-no-lock-or-pipe-between-localexecutor-processes.patch")
def test_a_worker_reaped_by_someone_else_is_seen_dead(start_method):
    # It was taken for alive for ever: its key never failed, its slot never freed, and end() never returned.
    outcome = run_scenario(worker_reaped_by_someone_else, start_method=start_method, deadline=90)
    assert outcome == {"states": {"held": "failed", "after": "success"}, "forgotten": True}


def kill_worker_whose_task_forks_after_the_scan() -> dict:
    """A process of the task, in a session of its own, starts another just after the executor found it."""
    from airflow.executors import local_executor

    executor = new_executor(1)
    marks = str(Path(tempfile.mkdtemp(), "marks"))
    key, worker, marker = _start_first_try(
        executor, marks, mark_for=10.0, mark_in_own_session=True, fork_on_usr1=True
    )
    scan = getattr(local_executor, "_left_behind", None)
    forked: list[int] = []

    def found_then_fork(pid):
        assert scan is not None
        found = scan(pid)
        if found and int(pid) == marker and not forked:
            # The marker starts another process between the scan that found it and its kill.
            forked.append(marker)
            os.kill(marker, signal.SIGUSR1)
            wait_until(lambda: _pids(marks, "try1") - {marker}, timeout=10)
        return found

    if scan is not None:  # no scan before the executor kills what a dead worker left
        local_executor._left_behind = found_then_fork
    os.kill(worker, signal.SIGKILL)
    killed_at = time.monotonic()
    while key not in executor.event_buffer and time.monotonic() - killed_at < 30:
        executor.sync()
    reported_at = time.monotonic()
    started = _pids(marks, "try1")
    alive = sorted(pid for pid in started if not _dead(pid))
    time.sleep(5 * MARK_INTERVAL)
    after = _marks_after(marks, "try1", reported_at)
    for pid in alive:  # what the executor left running must not outlive the test either
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    failed = str(executor.event_buffer.get(key, ("missing",))[0])
    executor.end()
    return {
        "failed": failed,
        "started_after_the_scan": len(started - {marker}),
        "alive_when_reported": alive,
        "marks_after_report": after,
    }


@pytest.mark.fixed_by(KILL_TASKS_PATCH)
def test_a_process_started_after_the_scan_is_killed_too():
    # A killed process's children go to a reaper: one started between the scan that found its parent and
    # the parent's kill was never found, and ran beside the retry.
    outcome = run_scenario(kill_worker_whose_task_forks_after_the_scan, start_method="fork", deadline=90)
    assert outcome == {
        "failed": "failed",
        "started_after_the_scan": 1,
        "alive_when_reported": [],
        "marks_after_report": 0,
    }

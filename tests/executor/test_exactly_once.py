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
Every dispatched workload ends exactly once: run and reported, queued again, or failed.

Whatever line of the executor the scheduler's SIGTERM handler interrupts; whatever result a worker
sends back; and a workload whose worker died before it started goes to another worker.
"""

from __future__ import annotations

import dis
import json
import linecache
import os
import signal
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from harness import (
    dispatch,
    heartbeat,
    key_of,
    label,
    make_workload,
    new_executor,
    queued,
    read_marks,
    run_scenario,
    wait_for_states,
    wait_until,
)

EXACTLY_ONCE_PATCH = "0009-keep-localexecutor-workers-busy-between-scheduler-loops.patch"
OWN_PIPES_PATCH = "0007-share-no-lock-or-pipe-between-localexecutor-processes.patch"


def _starts(started_dir: str) -> dict[str, int]:
    """How many times each task id started (``fake_run`` touches ``<task id>.<worker pid>``)."""
    counts: dict[str, int] = {}
    for name in os.listdir(started_dir):
        task_id = name.split(".")[0]
        counts[task_id] = counts.get(task_id, 0) + 1
    return counts


# --------------------------------------------------------------------------------------
# A SIGTERM at any line of the executor the scheduler's thread runs while it dispatches.
# --------------------------------------------------------------------------------------


def _leaving_with(frame: FrameType) -> bool:
    """
    The line event of a ``with`` line after its block: ``__exit__`` is called next.

    A real signal's Python handler runs only where the interpreter checks for pending signals (calls,
    backward jumps, function entry), and there is no such check between a block's last line and the
    call of its ``__exit__``; raising here would leak the lock the block holds, which no SIGTERM can.
    """
    code = frame.f_code
    if not linecache.getline(code.co_filename, frame.f_lineno).lstrip().startswith("with "):
        return False
    return frame.f_lasti != min(o for o, line in dis.findlinestarts(code) if line == frame.f_lineno)


def _interrupted_dispatch(line_number: int, executor_file: str) -> tuple[int, dict | None]:
    """
    Hand three workloads to the executor and heartbeat twice, as the scheduler does, with SIGTERM raised
    at the ``line_number``-th line ``executor_file`` runs in this thread meanwhile (0: none); then run the
    scheduler's loop until every workload reported, or end() the executor as the scheduler's exit does.
    Return how many lines ran, and what became of each workload if the signal came.
    """
    import signal
    import sys

    executor = new_executor(2)
    started_dir = tempfile.mkdtemp()
    items = [make_workload(f"w{i}", fake={"started_dir": started_dir}) for i in range(3)]
    for workload in items:
        key_of(workload)
        executor.queue_workload(workload, session=None)
    keys = [key_of(w) for w in items]
    seen = 0

    def on_line(frame, event, arg):
        nonlocal seen
        if event == "line" and not _leaving_with(frame):
            seen += 1
            if seen == line_number:
                # Its Python handler runs before the line does, as if the signal came just then.
                signal.raise_signal(signal.SIGTERM)
        return on_line

    def on_call(frame, event, arg):
        return on_line if frame.f_code.co_filename == executor_file else None

    interrupted = False
    try:
        sys.settrace(on_call)
        try:
            executor._process_workloads(items)  # what trigger_tasks() does with the queued workloads
            executor.sync()
            executor.sync()
        finally:
            sys.settrace(None)
        give_up = time.monotonic() + 10
        while time.monotonic() < give_up and not all(k in executor.event_buffer for k in keys):
            executor.sync()
            time.sleep(0.002)
    except SystemExit:
        interrupted = True
    executor.end()
    if not interrupted:
        return seen, None
    starts = _starts(started_dir)
    events = {label(k): str(s) for k, (s, _) in executor.event_buffer.items() if str(s) != "running"}
    still_queued = {label(k) for k in keys if k in queued(executor)}
    names = [label(k) for k in keys]
    return seen, {
        # Neither run, nor reported, nor queued again: nobody will ever run it.
        "lost": [n for n in names if not starts.get(n) and n not in events and n not in still_queued],
        # Queued again although it ran, or reported, too.
        "both": [n for n in names if n in still_queued and (starts.get(n) or n in events)],
        "twice": [n for n in names if starts.get(n, 0) > 1],
        # Failed although it never started: a worker killed while it held it, or a key never sent.
        "failed_unstarted": [n for n in names if events.get(n) == "failed" and not starts.get(n)],
        "ran_unreported": [n for n in names if starts.get(n) and events.get(n) != "success"],
        "still_running": len(executor.running),
    }


# Each start method's sweep, (stride, last line): every fourth line with fork; with spawn, whose workers
# take a second each to start, every third of the first 40. Run under the start methods the session asks
# for (LEPATCH_START_METHODS, as the start_method fixture), fork always: it reaches every line.
SWEEPS = {"fork": (4, 10_000), "spawn": (3, 40)}
SWEEP_METHODS = {"fork", *os.environ.get("LEPATCH_START_METHODS", "fork,spawn").split(",")}


def sigterm_at_every_line(stride: int, upto: int) -> dict:
    import signal

    from airflow.executors import local_executor

    def exit_on_sigterm(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_on_sigterm)
    executor_file = local_executor.__file__
    # How many lines a dispatch runs varies with how soon results come back (a loaded machine: tens of
    # lines): sweep as far as the longest of three runs, and expect the signal in the tries the
    # shortest one reaches.
    runs = [_interrupted_dispatch(0, executor_file)[0] for _ in range(3)]
    bad: dict[int, dict] = {}
    tried = 0
    for line_number in range(1, min(max(runs), upto) + 1, stride):
        _, outcome = _interrupted_dispatch(line_number, executor_file)
        tried += outcome is not None
        if outcome is not None and any(outcome.values()):
            bad[line_number] = outcome
            if len(bad) == 3:
                break  # the bug is shown: the rest of the sweep would only show it again
    lines = min(min(runs), upto)
    return {"lines": lines, "tried": tried, "bad": dict(list(bad.items())[:5]), "bad_count": len(bad)}


@pytest.mark.fixed_by(EXACTLY_ONCE_PATCH)
# Above the scenario's own deadline (300 s): the spawn sweep starts an executor per try, a second per
# worker, and on a loaded two-CPU machine takes over pytest's default two minutes.
@pytest.mark.timeout(330)
@pytest.mark.parametrize(
    ("start_method", "stride", "upto"),
    [pytest.param(method, *SWEEPS[method], id=method) for method in SWEEPS if method in SWEEP_METHODS],
)
def test_sigterm_at_any_line_of_a_dispatch_leaves_each_workload_in_exactly_one_place(
    start_method, stride, upto
):
    # Before, SystemExit raised between taking a workload off its queue and adding it to the deque, or
    # between taking it off the deque and sending it, loses it (not queued, never run, its key running for
    # ever); one right after a worker was marked busy has end() report a never-sent key failed. Every
    # fourth line with fork; with spawn, whose workers take a second each to start, every third of the
    # first 40 (handing the workloads over, and starting the workers they need): each try starts an
    # executor afresh. A window is several lines wide, so each workload's is hit either way.
    outcome = run_scenario(
        sigterm_at_every_line, start_method=start_method, deadline=300, stride=stride, upto=upto
    )
    # The signal came in (nearly) every try a dispatch as short as the shortest calibration run reaches.
    assert outcome["bad"] == {}, outcome
    assert outcome["tried"] >= 0.9 * len(range(1, outcome["lines"] + 1, stride)) >= 5, outcome


# --------------------------------------------------------------------------------------
# A worker that dies before it starts its workload.
def task_process_that_forks() -> dict:
    from airflow.executors import local_executor

    started = getattr(local_executor, "STARTED", None)
    acknowledged: list[object] = []
    handle = local_executor.LocalExecutor._handle_result

    def counting(self: Any, pid: int, key: object, state: object, *rest: Any) -> Any:
        if state == started:
            acknowledged.append(key)
        return handle(self, pid, key, state, *rest)

    local_executor.LocalExecutor._handle_result = counting
    executor = new_executor(1)
    task = make_workload("task", fake={"task_process_forks": 3})
    dispatch(executor, [task])
    states = wait_for_states(executor, [key_of(task)], timeout=30)
    for _ in range(20):  # a frame written late would be read by now
        executor.sync()
        time.sleep(0.01)
    executor.end()
    return {"states": states, "start acknowledgements": len(acknowledged) if started else None}


def test_a_task_process_that_forks_writes_no_start_acknowledgement(start_method):
    # The task process inherits its worker's at-fork hook; each fork it made wrote one more STARTED frame
    # into the worker's results pipe, where one could land inside a frame the worker was writing.
    outcome = run_scenario(task_process_that_forks, start_method=start_method, deadline=60)
    if outcome["start acknowledgements"] is None:
        pytest.skip("no start acknowledgement before patch 9")
    assert outcome == {"states": {"task": "success"}, "start acknowledgements": 1}


# --------------------------------------------------------------------------------------


def worker_dies_before_starting() -> dict:
    executor = new_executor(2)
    started_dir = tempfile.mkdtemp()
    marker = str(Path(tempfile.mkdtemp(), "died"))
    doomed = make_workload("doomed", fake={"started_dir": started_dir, "die_before_fork_once": marker})
    other = make_workload("other", fake={"started_dir": started_dir})
    dispatch(executor, [doomed, other])
    states = wait_for_states(executor, [key_of(doomed), key_of(other)], timeout=30)
    outcome = {
        "worker_died": os.path.exists(marker),
        "states": states,
        "starts": _starts(started_dir),
        "failed_events": sorted(
            label(k) for k, (s, _) in executor.event_buffer.items() if str(s) == "failed"
        ),
        "running": len(executor.running),
    }
    executor.end()
    return outcome


@pytest.mark.fixed_by(EXACTLY_ONCE_PATCH)
def test_workload_whose_worker_died_before_starting_it_runs_on_another_worker(start_method):
    # Unpatched it is failed: the task burns a try (with retries=0 it fails for good) though it never ran.
    outcome = run_scenario(worker_dies_before_starting, start_method=start_method, deadline=90)
    assert outcome == {
        "worker_died": True,
        "states": {"doomed": "success", "other": "success"},
        "starts": {"doomed": 1, "other": 1},
        "failed_events": [],
        "running": 0,
    }


# A worker that dies after task-sdk spawned its task process (no at-fork handler ran).
# --------------------------------------------------------------------------------------


def worker_dies_after_its_task_started_without_fork(routed: bool) -> dict:
    if routed:
        # task-sdk 1.4 starts a task routed to another runtime's coordinator with subprocess. The
        # coordinator is never built: the worker only asks which one the task's queue has.
        os.environ["AIRFLOW__SDK__COORDINATORS"] = json.dumps(
            {"other": {"classpath": "airflow.sdk.execution_time.coordinator.BaseCoordinator"}}
        )
        os.environ["AIRFLOW__SDK__QUEUE_TO_COORDINATOR"] = json.dumps({"other-runtime": "other"})
    else:
        # task-sdk 1.4 starts the task process with posix_spawn when this is set (and on macOS).
        os.environ["AIRFLOW__CORE__EXECUTE_TASKS_NEW_PYTHON_INTERPRETER"] = "True"
    executor = new_executor(1)
    marks = str(Path(tempfile.mkdtemp(), "marks"))
    queue = "other-runtime" if routed else "default"
    task = make_workload("task", fake={"marks": marks, "mark_for": 2.0}, queue=queue)
    dispatch(executor, [task])
    wait_until(lambda: read_marks(marks), timeout=30)
    (worker,) = executor.workers
    os.kill(worker, signal.SIGKILL)
    states = wait_for_states(executor, [key_of(task)], timeout=30)
    time.sleep(0.5)  # what a second dispatch of it would have marked by now
    executor.end()
    return {"states": states, "task processes": len({pid for _, pid, _ in read_marks(marks)})}


def test_worker_killed_after_spawning_its_task_process_fails_its_key_once(start_method):
    # Before the fix the spawned start was never acknowledged: the key went to a new worker and ran twice.
    outcome = run_scenario(
        worker_dies_after_its_task_started_without_fork, start_method=start_method, deadline=60, routed=False
    )
    assert outcome == {"states": {"task": "failed"}, "task processes": 1}


def test_worker_killed_mid_task_of_another_runtime_fails_its_key_once(start_method):
    # Its start was acknowledged only when the workload returned: the key went to a new worker, and the
    # second run met a task instance already running (409 from the API server).
    outcome = run_scenario(
        worker_dies_after_its_task_started_without_fork, start_method=start_method, deadline=60, routed=True
    )
    assert outcome == {"states": {"task": "failed"}, "task processes": 1}


# --------------------------------------------------------------------------------------
# A result the scheduler cannot unpickle.
# --------------------------------------------------------------------------------------


def unloadable_result() -> dict:
    executor = new_executor(1)
    bad = make_workload("bad", fake={"fail_unloadable": True})
    dispatch(executor, [bad])
    raised: list[str] = []
    give_up = time.monotonic() + 10
    while key_of(bad) not in executor.event_buffer and time.monotonic() < give_up:
        try:
            executor.sync()
        except Exception as e:
            raised.append(type(e).__name__)
            if len(raised) > 3:
                break
        time.sleep(0.005)
    state, info = executor.event_buffer.get(key_of(bad), ("missing", None))
    # The worker is free again: with parallelism 1 the next workload runs.
    after = make_workload("after")
    try:
        dispatch(executor, [after])
        after_state = wait_for_states(executor, [key_of(after)], timeout=10)["after"]
    except Exception as e:
        after_state = f"raised {type(e).__name__}"
    outcome = {
        "raised": raised,
        "bad": str(state),
        # Unpatched it could not be read back; patched, the worker sends the error's repr.
        "names_the_result": "HTTP 503 from the API" in str(info),
        "after": after_state,
    }
    if after_state == "success":
        executor.end()  # else the worker is busy for ever, and end() would wait for it until the deadline
    return outcome


@pytest.mark.fixed_by(OWN_PIPES_PATCH)
def test_a_result_that_cannot_be_unpickled_fails_its_key_and_frees_its_worker():
    # Unpatched, sync() raises the unpickling error and the worker stays busy for ever: with parallelism
    # 1 nothing runs again. (fork: the exception class is the harness's, found the same way in both.)
    outcome = run_scenario(unloadable_result, deadline=60)
    assert outcome == {"raised": [], "bad": "failed", "names_the_result": True, "after": "success"}


# --------------------------------------------------------------------------------------
# A key dispatched again while its earlier dispatch runs, whose newer dispatch's worker dies first.
# --------------------------------------------------------------------------------------


def earlier_dispatch_ends_last() -> dict:
    import signal

    from airflow.executors.base_executor import BaseExecutor

    reported: list[str] = []  # every terminal state reported for the key, in order
    change_state = BaseExecutor.change_state

    def recording(self, key, state, *args, **kwargs):
        if key == key_of(older) and str(state) in ("success", "failed"):
            reported.append(str(state))
        return change_state(self, key, state, *args, **kwargs)

    BaseExecutor.change_state = recording  # type: ignore[method-assign, unused-ignore]
    executor = new_executor(2)
    gate = str(Path(tempfile.mkdtemp(), "gate"))
    older_started, newer_started, after_started = (tempfile.mkdtemp() for _ in range(3))
    older = make_workload("k", fake={"started_dir": older_started, "wait_for": gate})
    dispatch(executor, [older])
    assert wait_until(lambda: bool(os.listdir(older_started)))
    # The scheduler queues the key again (a resumed deferral): a new workload, the same key.
    newer = make_workload("k", fake={"started_dir": newer_started, "wait_for": gate}, same_ti_as=older)
    dispatch(executor, [newer])
    assert wait_until(lambda: bool(os.listdir(newer_started)))
    (marker,) = os.listdir(newer_started)
    os.kill(int(marker.split(".")[1]), signal.SIGKILL)
    newer_state = wait_for_states(executor, [key_of(newer)], timeout=30)
    Path(gate).touch()  # the earlier dispatch succeeds now
    # Two workloads that run at the same time: both workers are free, so the earlier dispatch's result
    # was read (a worker is idle again only then); the states are read once they are applied.
    after_gate = str(Path(tempfile.mkdtemp(), "gate"))
    after = [
        make_workload(f"after{i}", fake={"started_dir": after_started, "wait_for": after_gate})
        for i in (1, 2)
    ]
    dispatch(executor, after)

    # Syncing as the scheduler's loop does: the second may wait in the executor for the earlier
    # dispatch's worker until its result is read.
    def both_started() -> bool:
        heartbeat(executor)
        return len(os.listdir(after_started)) == 2

    both_ran = wait_until(both_started)
    Path(after_gate).touch()
    after_states = wait_for_states(executor, [key_of(w) for w in after], timeout=30)
    outcome = {
        "newer": newer_state,
        "reported": reported,
        "state": str(executor.event_buffer.get(key_of(older), ("missing", None))[0]),
        "after": after_states,
        "both_ran": both_ran,
        "running": len(executor.running),
    }
    executor.end()
    return outcome


@pytest.mark.fixed_by(EXACTLY_ONCE_PATCH)
def test_a_result_of_an_earlier_dispatch_of_a_key_is_not_reported():
    # Unpatched, the earlier dispatch's late success overwrites the failure of the newer one: the
    # scheduler sees the key succeed though its newest dispatch died.
    outcome = run_scenario(earlier_dispatch_ends_last, deadline=90)
    assert outcome == {
        "newer": {"k": "failed"},
        "reported": ["failed"],
        "state": "failed",
        "after": {"after1": "success", "after2": "success"},
        "both_ran": True,
        "running": 0,
    }


# --------------------------------------------------------------------------------------
# end() right after a dispatch the handoff thread is still writing.
# --------------------------------------------------------------------------------------


def end_during_a_long_write() -> dict:
    import signal
    import threading

    executor = new_executor(1)
    (pid,) = executor.workers
    # The worker cannot read for 1.5 s (longer than end() waits for the handoff thread to stop), and
    # the workload is larger than a pipe holds: the handoff thread is still writing it when end() sends
    # the shutdown message. (A spawned worker still importing Airflow on a busy machine does the same.)
    os.kill(pid, signal.SIGSTOP)
    threading.Timer(1.5, os.kill, (pid, signal.SIGCONT)).start()
    big = make_workload("big", pad=256 * 1024)
    dispatch(executor, [big])
    # Once the thread has taken it (one still waiting when end() begins is queued again, never sent).
    wait_until(lambda: not getattr(executor, "_pending", ()), timeout=10)
    executor.end()
    return {
        "states": {label(k): str(s) for k, (s, _) in executor.event_buffer.items() if str(s) != "running"}
    }


def test_end_right_after_a_dispatch_runs_a_workload_larger_than_the_pipe():
    # Found by `nox -s chaos` (seed 2026, run 22: spawn, a 180 KB workload) on the first version of
    # patch 11: end() wrote the shutdown message while the handoff thread was still writing the
    # workload, and the worker read the two frames torn into each other.
    outcome = run_scenario(end_during_a_long_write, deadline=60)
    assert outcome == {"states": {"big": "success"}}


# --------------------------------------------------------------------------------------
# end() while a workload waits for a worker.
# --------------------------------------------------------------------------------------


def end_while_a_workload_waits() -> dict:
    import threading

    executor = new_executor(1)
    started_dir = tempfile.mkdtemp()
    gate = Path(tempfile.mkdtemp(), "go")
    running = make_workload("running", fake={"started_dir": started_dir, "wait_for": str(gate)})
    waiting = make_workload("waiting", fake={"started_dir": started_dir})
    dispatch(executor, [running, waiting])  # the second one waits in the executor for a worker
    wait_until(lambda: _starts(started_dir).get("running"), timeout=30)
    # The running task ends while end() waits for it, and its worker is free for the waiting one.
    threading.Timer(0.5, gate.touch).start()
    executor.end()
    return {
        "starts": _starts(started_dir),
        "states": {label(k): str(s) for k, (s, _) in executor.event_buffer.items() if str(s) != "running"},
        "queued_again": sorted(label(k) for k in queued(executor)),
        "running": sorted(label(k) for k in executor.running),
    }


@pytest.mark.fixed_by(OWN_PIPES_PATCH)
def test_end_starts_no_workload_that_waits_for_a_worker(start_method):
    # Before, a workload no worker could take waited in the shared pipe, and end() let a worker take it
    # once a running task finished: a scheduler told to stop started new tasks. Now it never leaves
    # BaseExecutor's queue, and the next scheduler runs its task instance.
    outcome = run_scenario(end_while_a_workload_waits, start_method=start_method, deadline=90)
    assert outcome == {
        "starts": {"running": 1},
        "states": {"running": "success"},
        "queued_again": ["waiting"],
        "running": [],
    }


# --------------------------------------------------------------------------------------
# A SIGTERM while the scheduler's sync() reaps a dead worker (found by `nox -s model`).
# --------------------------------------------------------------------------------------


def sigterm_in_the_reap_of_a_dead_worker(line_number: int) -> dict:
    """
    SIGKILL the worker of a started task, then raise SIGTERM at the ``line_number``-th line that
    ``_reap_workers`` itself runs in the next sync() (0: none), and end() the executor as the scheduler's
    exit does. Half reaped, the worker made end() raise KeyError, or left its key running for ever.
    """
    import signal
    import sys

    from airflow.executors import local_executor

    def exit_on_sigterm(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_on_sigterm)
    executor = new_executor(1)
    started_dir = tempfile.mkdtemp()
    gate = Path(tempfile.mkdtemp(), "go")
    victim = make_workload("victim", fake={"started_dir": started_dir, "wait_for": str(gate)})
    dispatch(executor, [victim])
    assert wait_until(lambda: os.listdir(started_dir), timeout=30), "the task never started"
    # Its start acknowledgement read (from patch 9 on): the task is failed, not queued again.
    assert wait_until(lambda: executor.sync() or not getattr(executor, "_unstarted", ()), timeout=10)
    (pid,) = executor.workers
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT), timeout=10)
    seen = 0

    def on_line(frame, event, arg):
        nonlocal seen
        if event == "line" and frame.f_code.co_name == "_reap_workers":
            seen += 1
            if seen == line_number:
                signal.raise_signal(signal.SIGTERM)
        return on_line

    def on_call(frame, event, arg):
        return on_line if frame.f_code.co_filename == local_executor.__file__ else None

    interrupted = False
    try:
        sys.settrace(on_call)
        try:
            executor.sync()
        finally:
            sys.settrace(None)
    except SystemExit:
        interrupted = True
    try:
        executor.end()
        ended = "returned"
    except BaseException as e:
        ended = f"raised {type(e).__name__}"
    state = executor.event_buffer.get(key_of(victim), ("missing", None))[0]
    return {
        "lines": seen,
        "interrupted": interrupted,
        "end": ended,
        "state": str(state),
        "running": len(executor.running),
    }


@pytest.mark.fixed_by(EXACTLY_ONCE_PATCH)
def test_sigterm_while_a_dead_worker_is_reaped_leaves_end_working_and_its_key_failed():
    lines = run_scenario(sigterm_in_the_reap_of_a_dead_worker, deadline=60, line_number=0)["lines"]
    assert lines >= 5, lines
    bad = {}
    for line_number in range(1, lines + 1):
        outcome = run_scenario(sigterm_in_the_reap_of_a_dead_worker, deadline=60, line_number=line_number)
        expected = {"interrupted": True, "end": "returned", "state": "failed", "running": 0}
        if {k: outcome[k] for k in expected} != expected:
            bad[line_number] = outcome
    assert bad == {}, bad

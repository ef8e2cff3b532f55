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
"""A worker SIGKILLed at any instant (idle, holding a lock, mid-result) wedges nothing (#74575)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from harness import (
    BLOCKED_WCHAN_PREFIXES,
    dispatch,
    key_of,
    label,
    make_workload,
    new_executor,
    run_scenario,
    wait_for_states,
    wait_until,
)

OWN_QUEUE_PATCH = "0007-share-no-lock-or-pipe-between-localexecutor-processes.patch"
NO_SHARED_PIPE_PATCH = "0007-share-no-lock-or-pipe-between-localexecutor-processes.patch"
DEAD_WORKER_PATCH = "0008-kill-a-dead-localexecutor-workers-task-processes.patch"
# Writing N here makes the next process created in this pid namespace get N + 1, if N + 1 is free.
NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")

BIG = 1024 * 1024  # a result frame 16 times the size of a Linux pipe


def _proc_field(pid: int, name: str) -> str:
    try:
        if name == "wchan":
            return Path(f"/proc/{pid}/wchan").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2]  # the state letter
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _reading_pipe(pid: int) -> bool:
    return _proc_field(pid, "wchan").startswith(("pipe_read", "anon_pipe_read"))


def _writing_pipe(pid: int) -> bool:
    return _proc_field(pid, "wchan").startswith(("pipe_write", "anon_pipe_write"))


def _kill_and_wait(pid: int) -> None:
    """SIGKILL ``pid`` and wait until it is a zombie: dead, not yet reaped by the executor (or reaped)."""
    with contextlib.suppress(ProcessLookupError):  # killed before, and reaped by the executor already
        os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: _proc_field(pid, "state") in ("Z", "X", ""), timeout=10), f"{pid} survived"


def _started_pids(started_dir: str, task_id: str) -> list[int]:
    return [int(name.rsplit(".", 1)[1]) for name in os.listdir(started_dir) if name.split(".")[0] == task_id]


def _warm_up(executor, count: int) -> list[int]:
    """Have ``count`` workers run one workload each at the same time, then go idle; return their pids."""
    gate = Path(tempfile.mkdtemp(), "go")
    started_dir = tempfile.mkdtemp()
    items = [
        make_workload(f"warm_{i}", fake={"wait_for": str(gate), "started_dir": started_dir})
        for i in range(count)
    ]
    dispatch(executor, items)

    def all_started() -> bool:
        executor.sync()  # the spawn start method starts workers from sync() on the early stages
        return len(os.listdir(started_dir)) == count

    assert wait_until(all_started, timeout=60), "the warm-up workloads never all started"
    gate.touch()
    states = wait_for_states(executor, [key_of(w) for w in items], timeout=30)
    assert set(states.values()) == {"success"}, states
    pids = sorted(int(name.rsplit(".", 1)[1]) for name in os.listdir(started_dir))
    # Idle: every worker asleep on its input (a pipe read, or the shared read lock's futex).
    assert wait_until(
        lambda: all(_proc_field(p, "wchan").startswith(BLOCKED_WCHAN_PREFIXES) for p in pids), timeout=10
    ), "the workers never went idle"
    return pids


# --------------------------------------------------------------------------------------
# Idle workers (patch 7): the shared input queue's read lock dies with its holder.
# --------------------------------------------------------------------------------------


def kill_read_lock_holder(parallelism: int) -> dict:
    executor = new_executor(parallelism)
    pids = _warm_up(executor, parallelism)

    # With one shared input queue exactly one idle worker sits in the pipe read, holding the queue's read
    # lock, while the others wait for that lock (a futex). With a queue per worker, all of them read.
    readers: list[int] = []

    def settled() -> bool:
        readers[:] = [p for p in pids if _reading_pipe(p)]
        return len(readers) in (1, len(pids))

    assert wait_until(settled, timeout=10), "the idle workers never settled in their reads"
    holder = readers[0]
    _kill_and_wait(holder)
    after = make_workload("after_kill")
    dispatch(executor, [after])
    states = wait_for_states(executor, [key_of(after)], timeout=10)
    return {"shared_lock": len(readers) == 1, "states": states}


@pytest.mark.fixed_by(OWN_QUEUE_PATCH)
def test_workload_runs_after_worker_holding_read_lock_is_killed(start_method):
    outcome = run_scenario(kill_read_lock_holder, start_method=start_method, deadline=90, parallelism=3)
    assert outcome["states"] == {"after_kill": "success"}, outcome


def kill_every_idle_worker(parallelism: int) -> dict:
    executor = new_executor(parallelism)
    pids = _warm_up(executor, parallelism)
    for pid in pids:
        _kill_and_wait(pid)
    after = make_workload("after_kill")
    dispatch(executor, [after])
    states = wait_for_states(executor, [key_of(after)], timeout=15)
    return {"states": states, "new_workers": sorted(set(executor.workers) - set(pids)) != []}


@pytest.mark.fixed_by(OWN_QUEUE_PATCH)
def test_workload_runs_after_every_idle_worker_is_killed(start_method):
    outcome = run_scenario(kill_every_idle_worker, start_method=start_method, deadline=90, parallelism=2)
    assert outcome == {"states": {"after_kill": "success"}, "new_workers": True}


def kill_worker_holding_unstarted_workload() -> dict:
    """The only worker is stopped, takes (but cannot start) a workload, and is killed."""
    executor = new_executor(1)
    (pid,) = _warm_up(executor, 1)
    started_dir = tempfile.mkdtemp()
    os.kill(pid, signal.SIGSTOP)
    orphan = make_workload("orphan", fake={"started_dir": started_dir})
    dispatch(executor, [orphan])
    _kill_and_wait(pid)
    states = wait_for_states(executor, [key_of(orphan)], timeout=10)
    info = executor.event_buffer.get(key_of(orphan), (None, None))[1]
    after = make_workload("after_kill")
    dispatch(executor, [after])
    states.update(wait_for_states(executor, [key_of(after)], timeout=15))
    return {
        "states": states,
        "orphan_started": bool(os.listdir(started_dir)),
        "info": str(info),
        "running": len(executor.running),
    }


@pytest.mark.fixed_by(OWN_QUEUE_PATCH)
def test_key_dispatched_to_a_worker_that_dies_before_starting_it_is_not_left_queued(start_method):
    # On 3.3.2 the scheduler never rescues a queued key whose worker died before starting it, so the
    # executor ends it: failed, for the scheduler to retry (patches 7-10), or run on another worker,
    # since it never started (from patch 11 on); never left waiting for ever.
    outcome = run_scenario(kill_worker_holding_unstarted_workload, start_method=start_method, deadline=90)
    assert outcome["states"]["after_kill"] == "success", outcome
    if outcome["states"]["orphan"] == "failed":
        assert not outcome["orphan_started"]
        assert "died" in outcome["info"]
    else:
        assert outcome["states"]["orphan"] == "success", outcome
    assert outcome["running"] == 0


def kill_worker_sent_a_large_workload() -> dict:
    """The only worker is stopped with a process it started still holding its input pipe, is sent a
    workload larger than a pipe holds, and is killed while the executor writes it."""
    executor = new_executor(1)
    started_dir = tempfile.mkdtemp()
    # The task leaves a process behind, which holds (as everything the worker forks) the worker's end of
    # its input pipe: once the worker is dead the pipe is never read, and never broken either.
    first = make_workload("first", fake={"started_dir": started_dir, "leave_behind": 60})
    dispatch(executor, [first])
    states = wait_for_states(executor, [key_of(first)], timeout=30)
    (pid,) = _started_pids(started_dir, "first")
    os.kill(pid, signal.SIGSTOP)
    killer = subprocess.Popen(["sh", "-c", f"sleep 1; kill -9 {pid}"])
    large = make_workload("large", fake={"padding": "x" * (4 * 65536)})
    dispatch(executor, [large])  # the write waited for the stopped worker, for ever once it was dead
    states.update(wait_for_states(executor, [key_of(large)], timeout=30))
    killer.wait()
    for left in _started_pids(started_dir, "left_behind"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(left, signal.SIGKILL)
    executor.end()
    return {"states": states}


@pytest.mark.fixed_by(OWN_QUEUE_PATCH)
def test_a_workload_larger_than_a_pipe_goes_to_another_worker_when_its_worker_dies(start_method):
    outcome = run_scenario(kill_worker_sent_a_large_workload, start_method=start_method, deadline=30)
    assert outcome == {"states": {"first": "success", "large": "success"}}


# --------------------------------------------------------------------------------------
# Workers writing results (patch 8): no result pipe or write lock is shared.
# --------------------------------------------------------------------------------------


def _unread(executor, pid: int) -> int:
    """Bytes waiting in the pipe the results of worker ``pid`` arrive on (its own from patch 8)."""
    import fcntl
    import struct
    import termios

    outputs = getattr(executor, "_outputs", None)
    conn = outputs[pid] if outputs and pid in outputs else executor.result_queue._reader
    conn = getattr(conn, "conn", conn)  # a reader wrapping the Connection, in earlier cuts
    unread: int = struct.unpack("i", fcntl.ioctl(conn.fileno(), termios.FIONREAD, b"\0" * 4))[0]
    return unread


def _big_worker(executor, started_dir: str) -> tuple[int, object]:
    """Dispatch a workload whose result is ``BIG`` bytes; return its worker (once blocked writing) and key."""
    big = make_workload("big", fake={"started_dir": started_dir, "fail_bytes": BIG})
    dispatch(executor, [big])
    assert wait_until(lambda: bool(_started_pids(started_dir, "big")), timeout=60), "big never started"
    (pid,) = _started_pids(started_dir, "big")
    # Nobody reads results until the next sync(): a worker that writes the whole error fills the pipe and
    # blocks mid-frame. From patch 7 on it writes a summary that fits in the pipe at once, and never does.
    wait_until(lambda: _writing_pipe(pid), timeout=5)
    return pid, key_of(big)


def kill_worker_blocked_writing_result() -> dict:
    executor = new_executor(3)
    started_dir = tempfile.mkdtemp()
    big_pid, big_key = _big_worker(executor, started_dir)
    _kill_and_wait(big_pid)
    items = [make_workload(f"small_{i}") for i in range(3)]
    t0 = time.monotonic()
    dispatch(executor, items)
    dispatch_seconds = time.monotonic() - t0
    states = wait_for_states(executor, [big_key, *(key_of(w) for w in items)], timeout=20)
    return {
        "dispatch_seconds": dispatch_seconds,
        "states": states,
        "big_info": str(executor.event_buffer.get(big_key, (None, ""))[1]),
    }


@pytest.mark.fixed_by(NO_SHARED_PIPE_PATCH)
def test_results_keep_flowing_after_worker_killed_while_writing_a_large_result(start_method):
    outcome = run_scenario(kill_worker_blocked_writing_result, start_method=start_method, deadline=90)
    assert outcome["states"] == {"big": "failed", **{f"small_{i}": "success" for i in range(3)}}
    # Failed by the executor, or with its own error if its one frame went out before the kill.
    assert "died" in outcome["big_info"] or "xxxx" in outcome["big_info"], outcome["big_info"][:200]
    # The dispatching side never waits on the dead worker (spawn: starting a replacement takes a moment).
    assert outcome["dispatch_seconds"] < 2


def kill_worker_mid_frame(other_bytes: int) -> dict:
    executor = new_executor(3)
    started_dir = tempfile.mkdtemp()
    gate = Path(tempfile.mkdtemp(), "go")
    # Two more workers hold large results of their own until the gate opens.
    others = [
        make_workload(f"other_{i}", fake={"wait_for": str(gate), "fail_bytes": other_bytes}) for i in range(2)
    ]
    # The others first, each on a worker of its own: from patch 7 on the big one's result is one small
    # frame, written before it is stopped, and its worker would be idle for the next dispatch.
    dispatch(executor, others)
    big_pid, big_key = _big_worker(executor, started_dir)
    # Freeze the writer half way through its frame before anything reads it, let the executor read what
    # is in the pipe (part of the frame), and kill the writer while the executor may still be inside
    # that read.
    os.kill(big_pid, signal.SIGSTOP)
    assert wait_until(lambda: _proc_field(big_pid, "state") == "T", timeout=10), "big was not stopped"

    def kill_once_read() -> None:
        # Once the executor has taken all the writer got out (it waits inside its read of that frame, or
        # keeps its start in a buffer: either way the rest never comes); after 10 s if it never reads.
        wait_until(lambda: _unread(executor, big_pid) == 0, timeout=10, interval=0.001)
        os.kill(big_pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_once_read, daemon=True)
    killer.start()
    executor.sync()
    gate.touch()  # the others write their results meanwhile
    executor.sync()
    killer.join()
    _kill_and_wait(big_pid)
    keys = [key_of(w) for w in others]
    states = wait_for_states(executor, [big_key, *keys], timeout=20)
    infos = {label(k): executor.event_buffer[k][1] for k in keys if k in executor.event_buffer}
    after = make_workload("after")
    dispatch(executor, [after])
    states.update(wait_for_states(executor, [key_of(after)], timeout=20))
    return {
        "states": states,
        "big_info": str(executor.event_buffer.get(big_key, (None, ""))[1]),
        # Each other result arrived whole: as many x as its worker sent (from patch 7 on, in a summary).
        "other_sizes": sorted(str(info).count("x") for info in infos.values()),
    }


@pytest.mark.fixed_by(NO_SHARED_PIPE_PATCH)
def test_worker_killed_mid_frame_fails_only_its_own_key(start_method):
    size = 100 * 1024
    outcome = run_scenario(kill_worker_mid_frame, start_method=start_method, deadline=90, other_bytes=size)
    assert outcome["states"] == {
        "big": "failed",
        "other_0": "failed",
        "other_1": "failed",
        "after": "success",
    }
    assert "died" in outcome["big_info"] or "xxxx" in outcome["big_info"], outcome["big_info"][:200]
    # Each other result arrived whole: the summary of the error its worker raised, as the worker cut it.
    assert outcome["other_sizes"] == [_summary_xs(size)] * 2


def _summary_xs(size: int) -> int:
    """How many of the ``size`` x's raised reach the scheduler: all before patch 7 cut the error short."""
    from airflow.executors import local_executor

    summary = getattr(local_executor, "_summary", None)
    return size if summary is None else summary(RuntimeError("x" * size)).count("x")


def _next_fork_gets(pid: int, executor, seen: dict) -> None:
    """Make this process's next os.fork() create ``pid``, if no process holds it by then; say how it went."""
    real_fork = os.fork

    def fork() -> int:
        os.fork = real_fork
        # The race is on only if the executor still counts ``pid`` as its worker while the pid is free.
        seen["at_risk"] = pid in executor.workers and not os.path.exists(f"/proc/{pid}")
        NS_LAST_PID.write_text(str(pid - 1))  # as late as can be: anything that forks meanwhile takes it
        child = real_fork()
        if child:
            seen["child"] = child
        return child

    os.fork = fork


def _idle_worker_dies_before_a_dispatch_forks() -> dict:
    executor = new_executor(2)
    pids = _warm_up(executor, 2)
    outcome: dict = {}
    seen: dict = {}
    if hasattr(executor, "_idle_worker"):  # no idle-worker choice before patch 7: nothing to race
        survivor, doomed = pids
        _kill_and_wait(doomed)
        executor.heartbeat()  # the worker check forgets the dead one: one worker, one free place
        assert wait_until(lambda: doomed not in executor.workers, timeout=10), "the dead worker stayed"
        idle_worker = executor._idle_worker

        def survivor_dies_first(*args, **kwargs):
            executor._idle_worker = idle_worker  # once
            _kill_and_wait(survivor)
            _next_fork_gets(survivor, executor, seen)
            return idle_worker(*args, **kwargs)

        executor._idle_worker = survivor_dies_first
    after = make_workload("after")
    try:
        dispatch(executor, [after])
    except Exception as e:  # unpatched: StopIteration from the choice of the new worker
        outcome["dispatch_error"] = repr(e)
    outcome["states"] = wait_for_states(executor, [key_of(after)], timeout=15)
    # One process per worker entry, none of them a dead worker taken for a live one.
    outcome["distinct_live_workers"] = all(
        proc.pid == pid and _proc_field(pid, "state") not in ("Z", "X", "")
        for pid, proc in executor.workers.items()
    )
    # Another process on the machine forked between the pid request and the fork, and took the pid.
    outcome["inconclusive"] = (
        bool(seen.get("at_risk")) and seen.get("child") != pids[0] and "dispatch_error" not in outcome
    )
    if outcome["inconclusive"]:
        executor.end()
    return outcome


def idle_worker_dies_before_a_dispatch_forks() -> dict:
    """
    An idle worker dies after the worker check and before the dispatch that forks a replacement.

    Found dead by the dispatch, the worker must stay unreaped (its pid taken) until it is forgotten: else
    the replacement can get its pid and be taken for it. The kernel hands pids out in order, so that
    needs luck or many forks; this makes the next fork ask for the dead worker's pid, and tries again
    (up to 5 times) when something else on the machine forked first and took it.
    """
    attempts = 0
    while True:
        attempts += 1
        outcome = _idle_worker_dies_before_a_dispatch_forks()
        if not outcome.pop("inconclusive") or attempts == 5:
            return {**outcome, "attempts": attempts}


@pytest.mark.fixed_by(DEAD_WORKER_PATCH, introduced_by=OWN_QUEUE_PATCH)
def test_a_worker_forked_after_an_idle_worker_died_never_takes_its_place():
    if not os.access(NS_LAST_PID, os.W_OK):
        pytest.skip(f"forcing a pid to be reused needs write access to {NS_LAST_PID} (root)")
    # Fork only: a spawned worker is created by fork_exec, which this cannot steer, and taking a dead
    # worker's place there only leaks its pipes; the fix (never reap a worker the executor still has) is
    # the same code for both.
    outcome = run_scenario(idle_worker_dies_before_a_dispatch_forks, deadline=60)
    assert "dispatch_error" not in outcome, outcome
    assert outcome["states"] == {"after": "success"}, outcome
    assert outcome["distinct_live_workers"], outcome


def epipe_to_an_exited_worker_not_yet_reaped() -> dict:
    from airflow.executors import local_executor

    executor = new_executor(2)
    victim = next(iter(executor.workers))  # _idle_worker() tries the workers in this order
    os.kill(victim, signal.SIGKILL)
    os.waitid(os.P_PID, victim, os.WEXITED | os.WNOWAIT)  # a zombie now: its end of the pipe is closed
    failed_sends: list[int] = []
    exited = local_executor._exited
    send = type(executor)._send_workload

    # The executor looks for a dead worker before it sends to one; the worker can die right after it
    # looked. Make it look too early, once: until a send to the victim has failed, it seems alive.
    def seems_alive_until_a_send_failed(proc, *args, **kwargs):
        return exited(proc, *args, **kwargs) if (proc.pid != victim or failed_sends) else False

    def recording_send(self, pid, workload):
        try:
            send(self, pid, workload)
        except BrokenPipeError:
            failed_sends.append(pid)
            raise

    local_executor._exited = seems_alive_until_a_send_failed
    type(executor)._send_workload = recording_send
    try:
        workload = make_workload("after_epipe")
        dispatch(executor, [workload])
        state = wait_for_states(executor, [key_of(workload)], timeout=20)["after_epipe"]
    finally:
        local_executor._exited = exited
        type(executor)._send_workload = send
    outcome = {
        "state": state,
        "failed_sends": ["victim" if pid == victim else pid for pid in failed_sends],
        "victim_reaped": victim not in executor.workers,
        "events": sorted(label(k) for k in executor.event_buffer),
    }
    executor.end()
    return outcome


def test_a_workload_sent_to_a_dead_worker_not_yet_reaped_goes_to_another_worker():
    # EPIPE on the send: the worker never got the whole workload, so it is given to the next worker,
    # and the dead one is reaped (no event for it: it held nothing).
    outcome = run_scenario(epipe_to_an_exited_worker_not_yet_reaped, deadline=60)
    assert outcome == {
        "state": "success",
        "failed_sends": ["victim"],
        "victim_reaped": True,
        "events": ["after_epipe"],
    }

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
"""Which worker a workload goes to: an idle one, a new one under parallelism, or none yet (it waits)."""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from harness import (
    dispatch,
    key_of,
    make_workload,
    new_executor,
    queued,
    run_scenario,
    wait_for_states,
    wait_until,
)

OWN_QUEUE_PATCH = "0007-share-no-lock-or-pipe-between-localexecutor-processes.patch"


class _Proc:
    """A worker process that is alive; nothing is started."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def is_alive(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _stand_ins_say_whether_they_run(monkeypatch):
    """waitid() knows nothing of a stand-in, which is no child of this process: the stand-in says."""
    from airflow.executors import local_executor

    if (exited := getattr(local_executor, "_exited", None)) is not None:

        def stand_in_exited(proc, *args, **kwargs) -> bool:
            return not proc.is_alive() if isinstance(proc, _Proc) else exited(proc, *args, **kwargs)

        monkeypatch.setattr(local_executor, "_exited", stand_in_exited)


def _executor(parallelism: int, busy: dict[int, object] | None = None, idle=(), fork: bool = True):
    """An executor with stand-in workers: ``busy`` maps a pid to the workload it runs, ``idle`` lists pids."""
    from airflow.executors.local_executor import LocalExecutor

    executor = LocalExecutor(parallelism=parallelism)
    executor.is_mp_using_fork = fork
    executor.workers = {}
    executor._inputs = {}
    executor._outputs = {}
    for pid in [*(busy or {}), *idle]:
        executor.workers[pid] = _Proc(pid)
    for pid, workload in (busy or {}).items():
        executor._worker_tasks[pid] = key_of(workload), workload
        if hasattr(executor, "_newest"):  # the dispatch it holds is the key's newest
            executor._newest[key_of(workload)] = workload
        executor.running.add(key_of(workload))
    executor.sent = []
    executor._send_workload = lambda pid, workload: executor.sent.append((pid, workload.ti.task_id))
    new_pids = iter(range(1000, 2000))

    def spawn_worker() -> int:
        pid = next(new_pids)
        executor.workers[pid] = _Proc(pid)
        return pid

    executor._spawn_worker = mock.Mock(side_effect=spawn_worker)
    executor._read_results = mock.Mock()
    return executor


def _held(executor) -> dict:
    """The key each busy worker holds, by pid."""
    return {pid: key for pid, (key, _) in executor._worker_tasks.items()}


def _queue(executor, task_id: str):
    workload = make_workload(task_id)
    executor.queue_workload(workload, session=None)
    return workload


@pytest.mark.fixed_by(OWN_QUEUE_PATCH)
def test_dispatch_reuses_an_idle_worker():
    busy = make_workload("busy")
    executor = _executor(2, busy={1: busy}, idle=[2])
    workload = _queue(executor, "a")

    executor._process_workloads([workload])

    assert executor.sent == [(2, "a")]
    assert _held(executor) == {1: key_of(busy), 2: key_of(workload)}
    executor._spawn_worker.assert_not_called()
    # A send cannot block, so dispatching needs no drain per put any more: results are read once per
    # batch, by the worker check that reaps dead workers before choosing an idle one.
    assert executor._read_results.call_count <= 1


@pytest.mark.fixed_by(OWN_QUEUE_PATCH)
@pytest.mark.parametrize("fork", [pytest.param(True, id="fork"), pytest.param(False, id="spawn")])
def test_dispatch_starts_a_worker_under_parallelism(fork):
    executor = _executor(3, busy={1: make_workload("busy")}, fork=fork)
    workload = _queue(executor, "a")

    with mock.patch("gc.freeze") as freeze, mock.patch("gc.unfreeze") as unfreeze:
        executor._process_workloads([workload])

    ((pid, task),) = executor.sent
    assert task == "a" and pid >= 1000  # a new worker takes it
    if fork:
        # A replacement is forked like the first workers: all missing ones at once, with the GC frozen.
        assert executor._spawn_worker.call_count == 2
        assert (freeze.call_count, unfreeze.call_count) == (1, 1)
    else:
        # Spawn is slow: only the worker this workload needs.
        assert executor._spawn_worker.call_count == 1
        freeze.assert_not_called()


@pytest.mark.fixed_by(OWN_QUEUE_PATCH)
def test_dispatch_keeps_the_workload_when_every_worker_is_busy():
    from airflow.utils.state import TaskInstanceState

    first = make_workload("first")
    executor = _executor(2, busy={1: first, 2: make_workload("second")})
    workload = _queue(executor, "a")

    executor._process_workloads([workload])

    # Not queued behind a busy worker's task: it stays where the scheduler put it, holding no slot.
    assert executor.sent == []
    assert queued(executor)[key_of(workload)] is workload
    assert key_of(workload) not in executor.running
    executor._spawn_worker.assert_not_called()

    # The first worker to finish takes it, at the next heartbeat.
    executor._handle_result(1, key_of(first), TaskInstanceState.SUCCESS, None)
    executor._process_workloads([workload])
    assert executor.sent == [(1, "a")]
    assert key_of(workload) not in queued(executor)


@pytest.mark.fixed_by(OWN_QUEUE_PATCH)
def test_every_worker_busy_is_warned_once_until_a_heartbeat_places_all_it_got():
    from airflow.utils.state import TaskInstanceState

    first = make_workload("first")
    executor = _executor(2, busy={1: first, 2: make_workload("second")})
    executor._log = mock.Mock()
    waiting = _queue(executor, "a")
    for _ in range(3):  # three heartbeats, every worker busy
        executor._process_workloads([waiting])
    assert executor.log.warning.call_count == 1

    executor._handle_result(1, key_of(first), TaskInstanceState.SUCCESS, None)
    executor._process_workloads([waiting])  # placed: the next time every worker is busy is news
    executor._process_workloads([_queue(executor, "b")])
    assert executor.log.warning.call_count == 2


def frames_of_a_wide_key(record: str) -> dict:
    import multiprocessing.connection
    import select

    from airflow.utils.state import TaskInstanceState

    me, send = os.getpid(), multiprocessing.connection.Connection._send  # type: ignore[attr-defined]

    def sending(self, buf, *args):  # in a forked worker: every write of a frame to the results pipe
        if os.getpid() != me and len(buf) > select.PIPE_BUF:
            with open(record, "a") as out:
                out.write(f"{len(buf)}\n")
        return send(self, buf, *args)

    multiprocessing.connection.Connection._send = sending  # type: ignore[attr-defined]
    executor = new_executor(1)
    # Names of 250 characters in 4-byte UTF-8, as KEY_REGEX allows, and an error of 2,000 characters.
    workload = make_workload("\U0001f600" * 250, fake={"fail_bytes": 2000})
    workload.ti.dag_id = workload.ti.run_id = "\U0001f600" * 250
    dispatch(executor, [workload])
    wait_for_states(executor, [key_of(workload)], timeout=60)
    state, _ = executor.event_buffer[key_of(workload)]
    executor.end()
    with open(record) as out:
        oversized = [int(size) for size in out.read().split()]
    return {"failed": state == TaskInstanceState.FAILED, "oversized": oversized}


def test_a_result_frame_of_the_widest_key_fits_in_one_atomic_write(tmp_path):
    # The invariant no torn frame rests on: over PIPE_BUF a write is not atomic, a worker killed within it
    # would leave a torn frame, and the executor's read after poll() would wait for the rest. (On 3.4 the
    # key is the task instance's uuid: this holds there with room to spare.)
    record = tmp_path / "oversized"
    record.touch()
    outcome = run_scenario(frames_of_a_wide_key, start_method="fork", deadline=120, record=str(record))
    assert outcome == {"failed": True, "oversized": []}, outcome


@pytest.mark.fixed_by(OWN_QUEUE_PATCH)
def test_a_result_is_matched_to_the_key_its_workload_had_when_sent():
    # The scheduler may change the task instance a workload was made from once it is sent (a new try, a
    # new uuid): the worker reports the key it was sent, and the executor must match that one.
    import uuid

    from airflow.utils.state import TaskInstanceState

    executor = _executor(1, idle=[1])
    workload = _queue(executor, "a")
    key = key_of(workload)
    executor._process_workloads([workload])
    workload.ti.id = uuid.uuid4()
    workload.ti.try_number += 1
    now = executor.get_workload_key(workload) if hasattr(executor, "get_workload_key") else workload.ti.key
    assert now != key
    executor._handle_result(1, key, TaskInstanceState.SUCCESS, None)
    assert executor.event_buffer[key][0] == TaskInstanceState.SUCCESS
    assert executor._worker_tasks == {}, "its worker is idle again"
    assert key not in executor.running


@pytest.mark.fixed_by(OWN_QUEUE_PATCH)
def test_running_result_keeps_the_worker_busy():
    from airflow.utils.state import TaskInstanceState

    busy = make_workload("busy")
    key = key_of(busy)
    executor = _executor(1, busy={1: busy})
    executor._handle_result(1, key, TaskInstanceState.RUNNING, None)
    assert _held(executor) == {1: key}
    assert key in executor.running


@pytest.mark.fixed_by(OWN_QUEUE_PATCH)
def test_terminal_result_for_a_key_no_longer_running_frees_its_worker():
    from airflow.utils.state import TaskInstanceState

    stale_workload = make_workload("stale")
    stale = key_of(stale_workload)
    executor = _executor(1, busy={1: stale_workload})
    # The key was failed already (its dispatch ended); its worker's terminal result still arrives.
    getattr(executor, "_newest", {}).clear()
    executor.running.clear()
    workload = _queue(executor, "a")
    executor._process_workloads([workload])
    assert executor.sent == []

    executor._handle_result(1, stale, TaskInstanceState.SUCCESS, None)

    assert stale not in executor.event_buffer, "a result with no dispatch in flight is not reported"
    assert executor._worker_tasks == {}, "but its worker is idle again"
    executor._process_workloads([workload])
    assert executor.sent == [(1, "a")]


class _Killable(_Proc):
    """A stand-in worker that records being killed (what a send does to a worker it may have torn)."""

    killed = False

    def kill(self) -> None:
        self.killed = True


class _Pipe:
    """
    A stand-in for a worker's pipe: a real pipe, non-blocking as the executor's end of a worker's is, whose
    frames the test reads back; a ``broken`` one has lost its reader (EPIPE).

    A real pipe, not a Mock: ``_send_workload`` writes to its file descriptor, and a Mock keeping the
    memoryview of the BytesIO it pickled into is a reference cycle. Collected by the GC later, the BytesIO
    would be finalized with its buffer still exported: its close() raises BufferError, which Python 3.13
    reports as an unraisable exception in whatever test runs then.
    """

    def __init__(self, broken: bool = False) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self.broken = broken
        if broken:
            os.close(self._read)

    def fileno(self) -> int:
        return self._write

    @property
    def sent(self) -> list[bytes]:
        """The frames written so far (each a length, then that many bytes), as the worker would read them."""
        if self.broken:
            return []
        os.set_blocking(self._read, False)
        data = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self._read, 65536):
                data += chunk
        frames = []
        while data:
            (size,) = struct.unpack("!i", data[:4])
            frames.append(data[4 : 4 + size])
            data = data[4 + size :]
        return frames


def _really_sending(executor, pids, broken=()):
    """The executor's own ``_send_workload``, with a stand-in pipe per worker (``broken`` ones: EPIPE)."""
    del executor._send_workload
    for pid in pids:
        executor.workers[pid] = _Killable(pid)
        executor._inputs[pid] = _Pipe(broken=pid in broken)
    return executor


def test_a_workload_that_cannot_be_pickled_is_never_written_and_its_worker_is_kept():
    import threading

    executor = _really_sending(_executor(2, idle=[1]), [1])
    workload = _queue(executor, "a")
    workload.ti.executor_config["fake"]["lock"] = threading.Lock()  # pickles nowhere

    with pytest.raises(TypeError):
        executor._send_workload(1, workload)
    with pytest.raises(TypeError):
        executor._process_workloads([workload])

    assert executor._inputs[1].sent == []
    assert not executor.workers[1].killed, "nothing was written: the worker's stream is whole"
    assert queued(executor)[key_of(workload)] is workload
    assert executor._worker_tasks == {}
    assert not executor.running


def test_a_failed_write_retires_the_worker_and_the_workload_goes_to_the_next_one():
    executor = _really_sending(_executor(2, idle=[1, 2]), [1, 2], broken=[1])
    executor._reap_workers = mock.Mock(side_effect=lambda pids: [executor.workers.pop(p) for p in pids])
    first = executor.workers[1]
    workload = _queue(executor, "a")

    executor._process_workloads([workload])

    assert first.killed
    # Part of the frame may be in the pipe: the worker could read it as the start of the next one.
    retired = executor._reap_workers.call_args.args[0]
    assert list(retired) == [1]
    assert len(executor._inputs[2].sent) == 1
    assert _held(executor) == {2: key_of(workload)}
    assert key_of(workload) in executor.running
    assert key_of(workload) not in queued(executor)


def lazy_spawn(parallelism: int) -> dict:
    """With spawn, workers start one per workload that needs one, never before."""
    executor = new_executor(parallelism)
    counts = {"after_start": len(executor.workers)}
    gate = Path(tempfile.mkdtemp(), "go")
    started = tempfile.mkdtemp()
    first = make_workload("first", fake={"wait_for": str(gate), "started_dir": started})
    dispatch(executor, [first])
    counts["after_first"] = len(executor.workers)
    assert wait_until(lambda: os.listdir(started), timeout=60)
    second = make_workload("second")
    dispatch(executor, [second])  # the first worker is busy: a second one starts
    counts["after_second"] = len(executor.workers)
    states = wait_for_states(executor, [key_of(second)], timeout=60)
    gate.touch()
    states.update(wait_for_states(executor, [key_of(first)], timeout=30))
    third = make_workload("third")
    dispatch(executor, [third])  # both are idle now: one of them takes it
    counts["after_third"] = len(executor.workers)
    states.update(wait_for_states(executor, [key_of(third)], timeout=30))
    executor.end()
    return {"counts": counts, "states": states}


@pytest.mark.fixed_by(OWN_QUEUE_PATCH)
def test_spawn_start_method_starts_workers_lazily():
    # Before, a worker was started for every batch while fewer than parallelism existed, idle or not.
    outcome = run_scenario(lazy_spawn, start_method="spawn", deadline=120, parallelism=3)
    assert outcome["counts"] == {"after_start": 0, "after_first": 1, "after_second": 2, "after_third": 2}
    assert set(outcome["states"].values()) == {"success"}

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
LocalExecutor.

.. seealso::
    For more information on how the LocalExecutor works, take a look at the guide:
    :ref:`executor:LocalExecutor`

Data flow (one pair of pipes per worker; the executor runs in the scheduler process)::

    executor                                                      worker (pid)
    _process_workloads() -> _pending deque
    _dispatch_pending() --- workload ---> [workloads pipe] -----> recv(); run it
       (idle workers only: one at a time)   writes: executor       |
                                            reads:  this worker    v
    sync()/end(): wait() <-- frames ----- [results pipe] <------- (key, state, exc) frames
                  wait() <-- exit ------- [sentinel]              writes: this worker
                  waitpid() decides death; _reap_worker() handles it

No lock exists and no pipe is shared: each pipe has one writer and one reader, and every process
closes the ends that are not its own (a forked worker closes the executor's ends it inherited). So a
SIGKILL of a worker at any instant (idle, running, half way through a frame) damages only its own
pipes: results are read without blocking and a partial frame stays in that worker's buffer, a write to
a dead worker fails with EPIPE instead of blocking, and _reap_worker() fails the one workload the worker
held and frees its slot. Workloads no worker has taken yet stay in the executor's deque.

What a worker started dies with it. Each worker leads a session of its own (its pid is the session
id), so every process it starts for a workload (the task process task-sdk's supervisor forks, and
whatever that starts) is in that session, even in a process group of its own, unless it starts a
session itself (as SubprocessHook does: those are found as children of processes in the session).
Once a worker has exited, for whatever reason, the executor SIGKILLs all of them and waits until they
are dead, and only then reaps the worker, fails the workload it held and frees its slot: the scheduler
never runs a task again while an earlier copy still runs. Until it is reaped, the dead worker keeps
its pid, so no unrelated process can have that session id; each process is signalled by pidfd.

Every fork happens in a process with one thread: the executor starts no thread, so a worker forked
to replace a dead one (from the scheduler's thread, in ``sync()``) cannot inherit a lock another thread
held. Results are read, and workloads written, by the scheduler's thread alone.

Workers are kept busy between scheduler loops. The scheduler reads ``slots_available`` before its
heartbeat reads results, and sleeps ``scheduler_idle_sleep_time`` after a loop that did nothing, so a
slot freed by a result nobody has read would wait up to that sleep and one more loop. So
``slots_available`` and ``slots_occupied`` first apply every result already waiting in the pipes (read
without blocking): a slot freed by now counts in this decision. They fork nothing and reap nothing (the
scheduler reads them holding its pool rows locked): dead workers are reaped, and workers started, by
``heartbeat()``'s ``sync()``. The executor takes no more than its slots allow, as the scheduler hands it
over: what waits for a slot stays in BaseExecutor's queues, highest priority first, until the next
heartbeat.

Every workload is in exactly one place, whenever the scheduler is interrupted:

- the scheduler's thread holds SIGTERM's and SIGINT's handlers off while it moves a workload or a
  result from one place to the next (``_HeldOff``), so a signal handler never cuts a write, or the
  bookkeeping around it, in two; ``end()`` queues again what no worker took;
- a worker writes a start acknowledgement (``STARTED``) as soon as it has forked a workload's first
  process (the task process). A task workload whose worker died before that frame was read never had
  a task process (or had it killed with the worker's session before anything is decided): it goes to
  another worker at once, and the task keeps its try. One that had started is failed, as before;
- a result the executor cannot unpickle fails the key its worker held, naming what could not be read,
  and leaves the worker idle: ``sync()`` does not raise.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.process
import os
import select
import signal
import struct
import sys
import threading
import time
from collections import deque
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, NamedTuple, cast

from airflow.executors import workloads
from airflow.executors.base_executor import BaseExecutor
from airflow.utils.state import TaskInstanceState

# add logger to parameter of setproctitle to support logging
if sys.platform == "darwin":
    setproctitle = lambda title, logger: logger.debug("Mac OS detected, skipping setproctitle")
else:
    from setproctitle import setproctitle as real_setproctitle

    setproctitle = lambda title, logger: real_setproctitle(title)

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterator, Sequence
    from multiprocessing.connection import Connection
    from types import FrameType

    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskinstancekey import TaskInstanceKey as WorkloadKey
    from airflow.utils.state import TaskInstanceState as WorkloadState

    # What a worker reports on its own results pipe, which says who sent it.
    # (The state is STARTED in a worker's start acknowledgement.)
    LocalResult = tuple[WorkloadKey, WorkloadState | str | None, Exception | None]


# macOS has no os.waitid: there a worker can only be waited for by reaping it (see _kill_left_behind()).
_WAITID = hasattr(os, "waitid")


def _exited(proc: multiprocessing.Process) -> bool:
    """Whether the worker has exited."""
    if _WAITID:  # not reaped (WNOWAIT): its pid, its session id, stays taken
        try:
            status = os.waitid(os.P_PID, cast("int", proc.pid), os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            # Reaped already, not by the executor (_kill_left_behind() says so): it has exited. is_alive()
            # would say it runs, for ever: its waitpid() fails the same way, which multiprocessing reads as
            # alive.
            return True
        return status is not None
    return not proc.is_alive()


def _wait_exited(proc: multiprocessing.Process, timeout: float | None = None) -> bool:
    """Wait until the worker has exited, without reaping it (where the platform can); return whether it has."""
    if not _WAITID:
        proc.join(timeout)
        return proc.exitcode is not None
    if timeout is None:
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, cast("int", proc.pid), os.WEXITED | os.WNOWAIT)
        return True
    give_up = time.monotonic() + timeout
    while not _exited(proc):
        if time.monotonic() >= give_up:
            return False
        time.sleep(0.005)
    return True


def _unreaped(proc: multiprocessing.Process) -> bool:
    """Whether the exited worker is still a zombie only the executor can reap."""
    if not _WAITID:
        return False
    try:
        return os.waitid(os.P_PID, cast("int", proc.pid), os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return False


def _stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` from the state on (state, ppid, pgrp, session...); None if gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        stat = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    # The command name may hold spaces and parentheses; the fields after the last ")" do not.
    end = stat.rfind(b")")
    return stat[end + 2 :].split() if end >= 0 else None


def _left_behind(sessions: Collection[int]) -> dict[int, int] | None:
    """
    Find the live processes that the workers whose session ids are ``sessions`` started; None without /proc.

    Those in the sessions map to 0. Below them, processes in sessions of their own (SubprocessHook starts
    one, so BashOperator's shell and what it runs are there) map to their parent, which comes first.
    A session's leader, the worker itself, is left out.
    """
    try:
        entries = os.listdir("/proc")
    except FileNotFoundError:
        return None
    table = {}
    for entry in entries:
        if entry.isdigit() and (fields := _stat_fields(entry)) is not None:  # None: it exited meanwhile
            table[int(entry)] = fields
    found = {pid: 0 for pid, fields in table.items() if int(fields[3]) in sessions and pid != int(fields[3])}
    children: dict[int, list[int]] = {}
    for pid, fields in table.items():
        children.setdefault(int(fields[1]), []).append(pid)
    stack = list(found)
    while stack:
        parent = stack.pop()
        for child in children.get(parent, ()):
            if child not in found:
                found[child] = parent
                stack.append(child)
    # A zombie runs nothing (and has no children: they went to a reaper when it exited).
    return {pid: parent for pid, parent in found.items() if table[pid][0] not in (b"Z", b"X")}


def _pidfd_exited(pidfd: int) -> bool:
    """Whether the process a pidfd names has exited (its pidfd turns readable)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def _stopped(pid: int, pidfd: int) -> bool:
    """Whether a process sent SIGSTOP has stopped, or exited: either way it starts nothing more."""
    fields = _stat_fields(pid)
    return _pidfd_exited(pidfd) or fields is None or fields[0] in (b"T", b"t", b"Z", b"X")


# A result frame: its length, then the pickled (key, state, exc).
_FRAME_HEADER = struct.Struct("!Q")

# The state of the frame a worker writes, once per workload, as soon as it has forked the workload's first
# process (task-sdk's supervisor forks the task process before the task can do anything). A workload
# whose worker died before this frame was read never started: the executor gives it to another worker.
# After the fork, not before: a stop or kill signal pending during fork() aborts the fork, so a worker
# caught in it has no task process yet.
STARTED = "lepatch:started"


def _send_result(output: Connection, result: LocalResult) -> None:
    """Write one result frame (blocking: only the executor reads this pipe, and it always does)."""
    try:
        data = ForkingPickler.dumps(result)
    except Exception as e:
        key, state, exc = result
        if exc is None:
            raise
        # An exception holding a lock, a socket or a client does not pickle: raised here it would kill the
        # worker, failing the key as a dead worker's with the real error only in the worker's log.
        data = ForkingPickler.dumps((key, state, f"{exc!r} (could not be pickled: {e})"))
    frame = memoryview(_FRAME_HEADER.pack(len(data)) + data)
    while frame:
        frame = frame[os.write(output.fileno(), frame) :]


class _Unreadable(NamedTuple):
    """A whole result frame that could not be unpickled: only a worker's terminal result carries objects."""

    error: str
    size: int


class _ResultReader:
    """
    The executor's end of one worker's results pipe.

    Reads never block and a frame is delivered only once complete: a worker killed in the middle of
    writing one leaves its partial frame here, where it cannot hold up or corrupt anything else.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.buffer = bytearray()
        self.eof = False
        os.set_blocking(conn.fileno(), False)

    def read(self) -> Iterator[LocalResult | _Unreadable]:
        """Yield each complete result waiting, oldest first."""
        while not self.eof:
            try:
                chunk = os.read(self.conn.fileno(), 1 << 16)
            except BlockingIOError:
                break
            self.eof = not chunk
            self.buffer += chunk
        while len(self.buffer) >= _FRAME_HEADER.size:
            (size,) = _FRAME_HEADER.unpack_from(self.buffer)
            end = _FRAME_HEADER.size + size
            if len(self.buffer) < end:
                break
            data = bytes(self.buffer[_FRAME_HEADER.size : end])
            del self.buffer[:end]
            try:
                yield ForkingPickler.loads(data)
            except Exception as e:
                # It pickled in the worker but does not unpickle here (an exception whose constructor
                # needs more arguments than it pickles, as httpx.HTTPStatusError): the frame was whole,
                # so the stream stays in step, and the executor fails the key the worker held.
                yield _Unreadable(f"{type(e).__name__}: {e}", len(data))


class _HeldOff(contextlib.ContextDecorator):
    """
    In the main thread, hold off SIGTERM's and SIGINT's Python handlers until the outermost block ends.

    The scheduler's handlers raise (SystemExit, KeyboardInterrupt) wherever its thread is, and the
    executor's state moves in several steps (a workload leaves its queue, then joins the deque; a result
    leaves its pipe, then is applied). Held off, a signal that comes in between is handled right after
    the block, with every workload in exactly one place. ``__enter__`` undoes itself if a signal comes
    before the handlers are swapped (after, none can raise). Another thread runs no signal handler: a
    no-op there.
    """

    def __init__(self) -> None:
        self.depth = 0
        self.saved: dict[int, Callable[[int, FrameType | None], object]] = {}
        self.caught: list[int] = []

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.caught.append(signum)

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            if self.depth == 0:
                for signum in (signal.SIGTERM, signal.SIGINT):
                    handler = signal.getsignal(signum)
                    if callable(handler) and handler != self._record:
                        self.saved[signum] = handler  # first: a swap cut short leaves it restorable
                        signal.signal(signum, self._record)
            self.depth += 1
        except BaseException:
            if self.depth == 0:
                self._restore()
            raise

    def __exit__(self, *exc_info: object) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self.depth -= 1
        if self.depth == 0:
            self._restore()

    def _restore(self) -> None:
        error: BaseException | None = None
        for signum, handler in self.saved.items():
            while True:
                try:
                    # A signal handled here runs the recorder or, once restored, the scheduler's handler:
                    # every handler is restored before anything propagates.
                    signal.signal(signum, handler)
                    break
                except BaseException as e:
                    error = error or e
        self.saved.clear()
        caught, self.caught = self.caught, []
        for signum in caught:
            signal.raise_signal(signum)  # the scheduler's handler runs at the next bytecode
        if error is not None:
            raise error


# One for the process: signal handlers are the process's, not an executor's.
_held_off = _HeldOff()


def _priority_weight(workload: object) -> float:
    """A task's ``priority_weight``; above every task for callbacks and connection tests, as BaseExecutor."""
    ti = getattr(workload, "ti", None)
    return (ti.priority_weight or 0) if ti is not None else float("inf")


def _worker_process() -> type[multiprocessing.Process]:
    """
    The class workers are started with: the default start method's, but spawn's where it is forkserver.

    Invariant: a worker is this process's child, and stays unreaped until the executor has killed what
    it started, so its pid, the id of its session, cannot be taken meanwhile. A forkserver's children
    are the forkserver's, which reaps them at once: what a dead worker started could then run on
    unseen beside its retry. Spawn starts a fresh interpreter too (and forks nothing of this process
    but an exec), as a child of this process. (forkserver is Python 3.14's default on Linux.)
    """
    if multiprocessing.get_start_method() == "forkserver":
        return cast("type[multiprocessing.Process]", multiprocessing.get_context("spawn").Process)
    return multiprocessing.Process


def _forks_task_process(workload: object) -> bool:
    """Whether task-sdk starts ``workload``'s first process with ``fork()``, which runs the at-fork hook."""
    import importlib

    from airflow.sdk.execution_time import supervisor

    # task-sdk 1.4 spawns on macOS and with [core] execute_tasks_new_python_interpreter; before, it forks.
    uses_exec = getattr(supervisor, "_task_process_uses_exec", None)
    if uses_exec is not None and uses_exec():
        return False
    ti = getattr(workload, "ti", None)
    try:
        coordinator = importlib.import_module("airflow.sdk.execution_time.coordinator")
    except ImportError:  # before task-sdk 1.4: every task process is forked
        return True
    if ti is None:
        return True
    # A task routed to another runtime's coordinator ([sdk] queue_to_coordinator: Java, ...) starts with
    # subprocess, which runs no at-fork hook either; only the Python one forks.
    try:
        chosen = coordinator.get_coordinator_manager().for_queue(ti.queue or "default")
    except Exception:
        return False
    return isinstance(chosen, getattr(coordinator, "_PythonCoordinator", ()))


def _run_worker(
    logger_name: str,
    input: Connection,
    output: Connection,
    inherited: Sequence[Connection],
):
    # Invariant: every process this worker starts (task processes, and what they start) is in a session
    # whose id is this worker's pid, so the executor can find and kill them all once this worker is dead,
    # even those in process groups of their own. First thing: a worker killed before it had started nothing.
    try:
        os.setsid()
        own_session = None
    except OSError as e:
        own_session = e

    # Ignore ctrl-c in this process -- we don't want to kill _this_ one. we let tasks run to completion
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A forked worker inherits the executor process's SIGTERM handler: the scheduler's returns without
    # exiting in any process but its own, so SIGTERM did nothing here. A worker ends on SIGTERM; what it
    # started is killed once the executor sees it dead, and its key is failed, as for any dead worker.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    # A forked worker inherits the executor's ends of every worker's pipes, its own included. Holding them
    # would keep those pipes alive past their owners: a worker would never see EOF when the executor dies.
    for conn in inherited:
        conn.close()

    log = logging.getLogger(logger_name)
    log.info("Worker starting up pid=%d", os.getpid())

    # The key of the workload this worker runs until it writes its start acknowledgement, else None.
    unacknowledged: list = [None]

    me = os.getpid()

    def acknowledge_start() -> None:
        # After a fork in this worker (the task process is its first), in the worker: the frame is complete
        # before the task process can have done anything worth keeping (it is killed with this worker).
        # The task process inherits this hook: when it forks (a multiprocessing pool) it must not write a
        # frame of its own into this worker's results pipe, where it could land inside one of the worker's.
        if os.getpid() == me and (key := unacknowledged[0]) is not None:
            unacknowledged[0] = None
            _send_result(output, (key, STARTED, None))

    os.register_at_fork(after_in_parent=acknowledge_start)
    if own_session is not None:
        log.warning(
            "Worker pid=%d could not start a session of its own (%s): if it dies, the task processes it "
            "started are not killed",
            os.getpid(),
            own_session,
        )

    while True:
        setproctitle("airflow worker -- LocalExecutor: <idle>", log)
        try:
            workload = input.recv()
        except EOFError:
            log.info(
                "Failed to read tasks from the task queue because the other "
                "end has closed the connection. Terminating worker %s.",
                multiprocessing.current_process().name,
            )
            break

        if workload is None:
            # Received poison pill, no more tasks to run
            return

        if not isinstance(workload, workloads.ExecuteTask):
            raise ValueError(f"LocalExecutor does not know how to handle {type(workload)}")

        key = None
        if ti := getattr(workload, "ti", None):
            key = ti.key
        else:
            raise TypeError(f"Don't know how to get ti key from {type(workload).__name__}")
        # Say which worker took it: 3.1 reports no running state for a task.
        _send_result(output, (key, None, None))
        unacknowledged[0] = key
        if not _forks_task_process(workload):
            # No at-fork hook will run: acknowledge before the workload runs, so a worker that dies mid-task
            # never has its started task taken for one that never started (run twice). Dying before the
            # task process starts then fails the key rather than moving it, as for any dead worker.
            acknowledge_start()

        try:
            _execute_work(log, workload)

            acknowledge_start()  # a workload that forked nothing started all the same
            _send_result(output, (key, TaskInstanceState.SUCCESS, None))
        except Exception as e:
            log.exception("uhoh")
            acknowledge_start()
            _send_result(output, (key, TaskInstanceState.FAILED, e))


def _execute_work(log: logging.Logger, workload: workloads.ExecuteTask) -> None:
    """
    Execute command received and stores result state in queue.

    :param key: the key to identify the task instance
    :param command: the command to execute
    """
    from airflow.configuration import conf
    from airflow.sdk.execution_time.supervisor import supervise

    setproctitle(f"airflow worker -- LocalExecutor: {workload.ti.id}", log)

    base_url = conf.get("api", "base_url", fallback="/")
    # If it's a relative URL, use localhost:8080 as the default
    if base_url.startswith("/"):
        base_url = f"http://localhost:8080{base_url}"
    default_execution_api_server = f"{base_url.rstrip('/')}/execution/"

    # This will return the exit code of the task process, but we don't care about that, just if the
    # _supervisor_ had an error reporting the state back (which will result in an exception.)
    supervise(
        # This is the "wrong" ti type, but it duck types the same. TODO: Create a protocol for this.
        ti=workload.ti,  # type: ignore[arg-type]
        dag_rel_path=workload.dag_rel_path,
        bundle_info=workload.bundle_info,
        token=workload.token,
        server=conf.get("core", "execution_api_server_url", fallback=default_execution_api_server),
        log_path=workload.log_path,
    )


def _workload_key(workload: workloads.All) -> WorkloadKey:
    # 3.1 runs tasks only, known by their ti's key.
    if (ti := getattr(workload, "ti", None)) is None:
        raise TypeError(f"Don't know how to get ti key from {type(workload).__name__}")
    return ti.key


def _failed_state(key: WorkloadKey) -> WorkloadState:
    return TaskInstanceState.FAILED


class LocalExecutor(BaseExecutor):
    """
    LocalExecutor executes tasks locally in parallel.

    It uses the multiprocessing Python library and queues to parallelize the execution of tasks.

    :param parallelism: how many parallel processes are run in the executor, must be > 0
    """

    is_local: bool = True
    is_mp_using_fork: bool = multiprocessing.get_start_method() == "fork"

    serve_logs: bool = True

    workers: dict[int, multiprocessing.Process]
    # The executor's ends of each worker's two pipes, by pid: it is the only writer of the first and the
    # only reader of the second, so no lock exists that a dead worker could hold.
    _inputs: dict[int, Connection]
    _outputs: dict[int, _ResultReader]
    # Dispatched workloads no worker could take yet, with the executor queue each was taken from.
    _pending: deque[tuple[workloads.All, dict]]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The key of the one workload each busy worker was sent and has not finished, by worker pid,
        # recorded when it is sent. A worker that is not in here is idle: its input queue is empty and it
        # is waiting on it.
        self._worker_tasks: dict[int, WorkloadKey] = {}
        self._dispatch_counts: dict[WorkloadKey, int] = {}
        # Invariant: a dispatch is the workload object the scheduler handed over (each queueing makes a new
        # one), counted in ``_dispatch_counts`` until it ends, once. Only the end of ``_newest[key]`` is
        # reported; an earlier dispatch's results (or death) are logged and dropped (its end frees only its
        # worker and its count), and a key the scheduler ended has no newest one.
        self._newest: dict[WorkloadKey, workloads.All] = {}
        self._holding: dict[int, workloads.All] = {}  # the workload of each pid in ``_worker_tasks``
        # The task workload each busy worker was sent and has not acknowledged starting (STARTED), with
        # the queue it was taken from: if that worker dies, the workload goes to another one.
        self._unstarted: dict[int, tuple[workloads.All, dict]] = {}
        self._redispatched: dict[WorkloadKey, int] = {}

    def start(self) -> None:
        """Start the executor."""
        # We delay opening these queues until the start method mostly for unit tests. ExecutorLoader caches
        # instances, so each test reusues the same instance! (i.e. test 1 runs, closes the queues, then test 2
        # comes back and gets the same LocalExecutor instance, so we have to open new here.)
        self.workers = {}
        self._inputs = {}
        self._outputs = {}
        self._pending = deque()
        self._worker_tasks.clear()
        self._holding.clear()
        self._newest.clear()
        self._unstarted.clear()
        self._redispatched.clear()
        self._dispatch_counts.clear()

        if self.is_mp_using_fork:
            # This creates the maximum number of worker processes (parallelism) at once
            # to minimize gc freeze/unfreeze cycles when using fork in multiprocessing
            self._spawn_workers_with_gc_freeze(self.parallelism)

    @property
    def slots_available(self):
        """Free slots, counting every result that has arrived by now (read without blocking)."""
        return self.parallelism - self.slots_occupied

    @property
    def slots_occupied(self):
        """Occupied slots, counting every result that has arrived by now (read without blocking)."""
        # Never a fork or a reap: the scheduler reads the slots holding its pool rows locked, so reaping a
        # dead worker (a /proc scan, up to left_behind_timeout) and starting workers wait for sync().
        self._read_results()
        return super().slots_occupied

    @_held_off
    def _check_workers(self):
        """Reap dead workers, failing the workload each held, then hand pending workloads to idle ones."""
        self._read_results()
        # _exited(), not sentinel or EOF: a task process the worker forked keeps both open after the
        # worker itself is gone.
        if dead := [pid for pid, proc in self.workers.items() if _exited(proc)]:
            self._reap_workers(dead)
        self._dispatch_pending()

    #: Seconds ``_kill_left_behind()`` waits for the SIGKILLed processes of a dead worker to die before it
    #: gives up on them (a process in uninterruptible sleep dies only once it wakes).
    left_behind_timeout: float = 5.0

    def _reap_workers(self, pids: Collection[int]) -> None:
        """Kill what the exiting workers left behind, then forget them and their pipes and fail their work."""
        for pid in pids:
            _wait_exited(self.workers[pid])
        # Before any key is failed or slot freed: the scheduler may run the key again at once.
        self._kill_left_behind(pids)
        for pid in pids:
            self._reap_worker(pid)

    def _kill_left_behind(self, workers: Collection[int]) -> None:
        """SIGKILL every process the exited ``workers`` started and left running; wait until they are dead."""
        # Invariant: a worker's session id is its pid, and an exited worker keeps its pid until it is reaped,
        # so while it is unreaped no process but those it started can be in its session (or process group).
        # Only the executor reaps its workers: multiprocessing is told to keep off them in _spawn_worker().
        sessions = {pid for pid in workers if _unreaped(self.workers[pid])}
        if lost := sorted(set(workers) - sessions):
            self.log.warning(
                "Workers %s were reaped before what they started could be killed (%s): any process of theirs "
                "that is still running is left alone, since their pids may be reused",
                lost,
                "this platform has no waitid" if not _WAITID else "not by this executor",
            )
        if not sessions:
            return
        if (found := _left_behind(sessions)) is None or not hasattr(os, "pidfd_open"):
            self.log.warning(
                "Without /proc and pidfd, what workers %s started outside their process groups is not killed",
                sorted(sessions),
            )
            for session in sessions:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(session, signal.SIGKILL)
            return
        held: dict[int, int] = {}  # pid -> pidfd of each process proven ours and sent SIGSTOP
        spared: set[int] = set()  # processes the executor cannot, or may not, signal
        # Stop everything, then kill: a killed process's children go to a reaper and can no longer be told
        # from anyone else's, while a stopped one starts nothing more. A scan that finds nothing new once
        # everything held has stopped leaves nothing of theirs to find.
        give_up = time.monotonic() + self.left_behind_timeout
        try:
            while True:
                for pid, parent in found.items():  # parents first
                    if pid in held or pid in spared:
                        continue
                    try:
                        held[pid] = pidfd = os.pidfd_open(pid)
                    except ProcessLookupError:
                        continue
                    except (
                        OSError
                    ) as e:  # ENOSYS: Linux < 5.3; by pid alone, one that exits could be another's
                        self.log.error(
                            "Cannot kill pid=%s, started by an exited worker, without pidfd: %s", pid, e
                        )
                        spared.add(pid)
                        continue
                    # The pidfd names, for good, the process that had ``pid`` when it was opened; until that
                    # process is reaped it keeps ``pid``, so /proc/pid shows it. It is ours if it is in a
                    # worker's session (nothing else can be while the worker is unreaped), or if its parent is
                    # ``parent``, one of ours that is still there afterwards (so it was when this one named it).
                    fields = _stat_fields(pid)
                    up = held.get(parent)
                    if fields is None or not (
                        int(fields[3]) in sessions
                        if parent == 0
                        else up is not None and int(fields[1]) == parent and not _pidfd_exited(up)
                    ):
                        os.close(held.pop(pid))
                        continue
                    try:
                        signal.pidfd_send_signal(pidfd, signal.SIGSTOP)
                    except ProcessLookupError:
                        pass
                    except (
                        PermissionError
                    ):  # another user's (run_as_user): only its own supervisor may stop it
                        self.log.error("Not allowed to stop pid=%s, started by an exited worker", pid)
                        spared.add(pid)
                        os.close(held.pop(pid))
                if time.monotonic() > give_up:
                    self.log.error(
                        "Processes %s started by exited workers did not stop; killing them", sorted(held)
                    )
                    break
                time.sleep(0.001)
                stopped = all(_stopped(pid, pidfd) for pid, pidfd in held.items())
                found = _left_behind(sessions) or {}
                if stopped and found.keys() <= held.keys() | spared:
                    break
            for pidfd in held.values():
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            give_up = time.monotonic() + self.left_behind_timeout
            while alive := sorted(pid for pid, pidfd in held.items() if not _pidfd_exited(pidfd)):
                if time.monotonic() > give_up:
                    self.log.error(
                        "Processes %s started by exited workers outlived SIGKILL by %.0fs; giving up on them",
                        alive,
                        self.left_behind_timeout,
                    )
                    return
                time.sleep(0.001)
        finally:
            for pidfd in held.values():
                os.close(pidfd)

    def _reap_worker(self, pid: int) -> None:
        """Forget a dead worker and its pipes; fail the workload it held unless it reported its end."""
        proc = self.workers[pid]
        # The frames it finished before dying are in the pipe: apply them before deciding that the workload
        # it held never finished. What is left is a frame it died writing.
        self._read_results(pids=[pid])
        output = self._outputs.pop(pid)
        if output.buffer:
            self.log.warning(
                "Worker pid=%s died writing a result; dropping %d bytes", pid, len(output.buffer)
            )
        output.conn.close()
        self._inputs.pop(pid).close()
        del self.workers[pid]
        proc.join()
        if proc.exitcode is not None:  # None: reaped elsewhere, and close() would take it for running
            proc.close()
        self._fail_lost_workload(pid)

    #: How many times a task workload whose worker died before starting it goes to another worker before
    #: the executor fails it (a workload that kills every worker it reaches must not go round forever).
    max_redispatch: int = 3

    def _fail_lost_workload(self, pid: int) -> None:
        unstarted = self._unstarted.pop(pid, None)
        key = self._worker_tasks.pop(pid, None)
        dispatch = self._holding.pop(pid, None)
        if key is None:
            return
        if self._stale(key, dispatch) or key not in self.running:
            self._finish_dispatch(key, _failed_state(key), None, dispatch, pid)
            return
        if unstarted is not None:
            redispatched = self._redispatched.get(key, 0)
            if redispatched < self.max_redispatch:
                # It never started (no STARTED frame came, and a worker writes one once it has forked
                # the task process, which died with the worker's session): nothing of it runs, so it
                # goes to another worker at once, still holding its slot, and the task keeps its try.
                self.log.warning(
                    "Worker pid=%s died before it started %s; giving it to another worker", pid, key
                )
                self._redispatched[key] = redispatched + 1
                self._pending.appendleft(unstarted)
                return
        # A worker that died after starting its workload, or one that never started it too often: on 3.3
        # nothing else would ever release the key (the scheduler's stuck-in-queued check does not fire for
        # it), and failed, the scheduler retries it.
        self.log.error("Worker pid=%s died while holding %s; marking it failed", pid, key)
        self._finish_dispatch(key, _failed_state(key), f"LocalExecutor worker pid={pid} died", dispatch, pid)

    def _dispatch_pending(self) -> None:
        """Send each pending workload to an idle worker, starting workers up to ``parallelism``."""
        while self._pending:
            pid = self._idle_worker()
            if pid is None:
                # Every worker is busy. The scheduler hands over at most ``parallelism - len(running)``
                # workloads, so this only happens when keys occupy more workers than slots: a key
                # dispatched again (a resumed deferral) while its earlier dispatch has not reported is one
                # slot but two workers, and connection tests are triggered outside the slot count. The
                # workload waits here, not behind a busy worker's possibly long task, and goes to the
                # first worker that finishes (or its replacement, if that worker dies).
                return
            workload, taken_from = self._pending.popleft()
            self._worker_tasks[pid] = _workload_key(workload)
            self._holding[pid] = workload
            if isinstance(workload, workloads.ExecuteTask):
                # Only a task's start is acknowledged by a fork (what else runs may run in the worker).
                self._unstarted[pid] = (workload, taken_from)
            try:
                self._send_workload(pid, workload)
            except BaseException as e:
                del self._worker_tasks[pid]
                del self._holding[pid]
                self._unstarted.pop(pid, None)
                if isinstance(e, BrokenPipeError):
                    # The worker is gone and never got the whole workload: keep it for the next worker.
                    self._pending.appendleft((workload, taken_from))
                    self._reap_workers([pid])
                    continue
                # Nothing was sent (a workload that cannot be pickled, an interrupt): it stays queued.
                self._undo_dispatches([workload], [taken_from])
                raise

    def _send_workload(self, pid: int, workload: workloads.All | None) -> None:
        data = ForkingPickler.dumps(workload)  # a workload that cannot be pickled fails before any write
        frame = memoryview(struct.pack("!i", len(data)) + data)  # as the worker's recv_bytes() reads it
        fd = self._inputs[pid].fileno()
        try:
            # No cyclic wait: only an idle worker is sent a workload, and it writes nothing until it has
            # read all of it, so this write waits at most for that read (in practice not at all: the pipe
            # is empty and a workload much smaller). But a worker that died while a process it started still
            # holds its end would never read, so the pipe is non-blocking and a full one waited on only while
            # the worker lives.
            while frame:
                try:
                    frame = frame[os.write(fd, frame) :]
                except BlockingIOError:
                    if _exited(self.workers[pid]):
                        raise BrokenPipeError(f"worker pid={pid} exited") from None
                    poller = select.poll()
                    poller.register(fd, select.POLLOUT)
                    poller.poll(10)
        except BaseException:
            # EPIPE, or interrupted part way: a torn frame would be read as the start of the next one, so
            # this worker can take nothing more. It never got the whole workload, so it never started it.
            self.workers[pid].kill()
            raise

    def _idle_worker(self) -> int | None:
        """Return an idle live worker, starting one if all are busy and fewer than ``parallelism`` exist."""
        for pid, proc in self.workers.items():
            if pid not in self._worker_tasks and not _exited(proc):
                return pid
        if len(self.workers) >= self.parallelism:
            return None
        if self.is_mp_using_fork:
            # Replacements too are forked with the GC frozen, and all at once, to keep freeze/unfreeze
            # cycles (and copy-on-write of the parent's memory) down.
            before = set(self.workers)
            self._spawn_workers_with_gc_freeze(self.parallelism - len(self.workers))
            return next(pid for pid in self.workers if pid not in before)
        # With spawn a worker takes a second or more to start: start only the one this workload needs.
        return self._spawn_worker()

    def _spawn_worker(self) -> int:
        input_r, input_w = multiprocessing.Pipe(duplex=False)
        output_r, output_w = multiprocessing.Pipe(duplex=False)
        inherited = [input_w, output_r, *self._inputs.values(), *(o.conn for o in self._outputs.values())]
        p = _worker_process()(
            target=_run_worker,
            kwargs={
                "logger_name": self.log.name,
                "input": input_r,
                "output": output_w,
                # A spawned worker is passed only its own two ends.
                "inherited": inherited if self.is_mp_using_fork else [],
            },
        )
        try:
            p.start()
        finally:
            # The worker's ends belong to the worker alone: a copy kept here would keep its pipes open
            # after it died, so reading them would never see EOF and writing them never fail.
            input_r.close()
            output_w.close()
        os.set_blocking(input_w.fileno(), False)
        if TYPE_CHECKING:
            assert p.pid  # Since we've called start
        # Only the executor reaps its workers: multiprocessing reaps every dead child it knows of whenever a
        # process starts, which would free a dead worker's pid (its session id) for reuse while the executor
        # may still be killing what the worker left behind (_kill_left_behind()).
        multiprocessing.process._children.discard(p)  # type: ignore[attr-defined]
        self.workers[p.pid] = p
        self._inputs[p.pid] = input_w
        self._outputs[p.pid] = _ResultReader(output_r)
        return p.pid

    def _spawn_workers_with_gc_freeze(self, spawn_number):
        """
        Freeze the GC before forking worker process and unfreeze it after forking.

        This is done to prevent memory increase due to COW (Copy-on-Write) by moving all
        existing objects to the permanent generation before forking the process. After forking,
        unfreeze is called to ensure there is no impact on gc operations
        in the original running process.

        Ref: https://docs.python.org/3/library/gc.html#gc.freeze
        """
        import gc

        gc.freeze()
        try:
            for _ in range(spawn_number):
                self._spawn_worker()
        finally:
            gc.unfreeze()

    def sync(self) -> None:
        """Sync will get called periodically by the heartbeat method."""
        self._check_workers()

    @_held_off
    def _read_results(self, timeout: float = 0.0, pids: Collection[int] | None = None) -> None:
        """Apply every complete result waiting, waiting up to ``timeout`` for a result or a worker exit."""
        if timeout:
            readers = [output.conn for output in self._outputs.values() if not output.eof]
            sentinels = [proc.sentinel for proc in self.workers.values()]
            multiprocessing.connection.wait([*readers, *sentinels], timeout)
        for pid in list(self._outputs) if pids is None else pids:
            for result in self._outputs[pid].read():
                if isinstance(result, _Unreadable):
                    key = self._worker_tasks.get(pid)
                    self.log.error(
                        "Could not read the result of %s from worker pid=%s (%d bytes): %s; failing it",
                        key,
                        pid,
                        result.size,
                        result.error,
                    )
                    if key is not None:
                        error = f"LocalExecutor could not read the result worker pid={pid} sent"
                        self._handle_result(pid, key, _failed_state(key), f"{error}: {result.error}")
                    continue
                self._handle_result(pid, *result)

    def _handle_result(self, pid: int, key: WorkloadKey, state: WorkloadState | str | None, exc) -> None:
        if pid not in self.workers:
            return
        held = self._worker_tasks.get(pid) == key
        dispatch = self._holding.get(pid) if held else None
        if state == STARTED:
            if held:
                self._unstarted.pop(pid, None)
        elif state is None or state == "running":
            if self._stale(key, dispatch):
                self.log.warning(
                    "Dropping %s of an earlier dispatch of %s from worker pid=%s", state, key, pid
                )
            elif state is not None and key in self.running:
                self.change_state(key, state, remove_running=False)
        elif held:
            # Its worker is idle again whatever became of the key: a worker is sent one workload at a
            # time, and one never marked idle would never be sent another.
            del self._worker_tasks[pid]
            self._holding.pop(pid, None)
            self._unstarted.pop(pid, None)
            self._finish_dispatch(key, cast("WorkloadState", state), exc, dispatch, pid)

    def end(self) -> None:
        """End the executor."""
        self.log.info(
            "Shutting down LocalExecutor"
            "; waiting for running tasks to finish.  Signal again if you don't want to wait."
        )
        try:
            # Nothing starts once shutdown has begun, so it waits only for the tasks that run: a workload no
            # worker took (one waiting for a worker to start, or for a busy key's worker) is queued again below.
            # Each worker gets its shutdown message on its own pipe, behind at most the workload it runs.
            for pid in list(self.workers):
                with contextlib.suppress(OSError):  # already gone: reaped below
                    self._send_workload(pid, None)

            # A worker cannot exit while it is blocked writing a result nobody reads: keep reading results
            # while waiting. A worker that is gone is reaped at once, whatever it left in its pipes, once
            # what it started is dead.
            while self.workers:
                self._read_results(timeout=0.1)
                if exited := [pid for pid, proc in self.workers.items() if _exited(proc)]:
                    self._reap_workers(exited)
        except (KeyboardInterrupt, SystemExit):
            self.log.error("KeyboardInterrupt received during shutdown. Force terminating workers.")
            self._stop_workers(list(self.workers))
            # Their complete frames are read, a partial one is dropped: nothing here can block.
            if exited := [pid for pid, proc in self.workers.items() if _exited(proc)]:
                self._reap_workers(exited)
            raise
        finally:
            # What no worker took never ran: it is queued again, as before its dispatch, for the next
            # scheduler to run (its task instance is still queued).
            with _held_off:
                if self._pending:
                    unsent = list(self._pending)
                    self._pending.clear()
                    self._undo_dispatches([w for w, _ in unsent], [q for _, q in unsent])

    def terminate(self):
        """Terminate all worker processes under control of the executor forcefully."""
        self.log.info("Terminating all LocalExecutor worker processes.")
        self._stop_workers(list(self.workers))

        # Then what they started and left running; they are reaped only once that is dead (their pids
        # are the session ids it is found by). Results are not read any more.
        exited = [pid for pid, proc in self.workers.items() if _exited(proc)]
        self._kill_left_behind(exited)
        for pid in exited:
            self.workers[pid].join(timeout=0)

    def _stop_workers(self, pids: Collection[int]) -> None:
        """SIGTERM the workers, then SIGKILL those alive 0.2 s later; the executor reaps them afterwards."""
        # All at once: one worker after another, parallelism workers that ignore SIGTERM (task-sdk's
        # supervisor defers it while a task runs) took parallelism x 0.2 s.
        procs = [self.workers[pid] for pid in pids if not _exited(self.workers[pid])]
        for stop in ("terminate", "kill"):
            for proc in procs:
                getattr(proc, stop)()
            deadline = time.monotonic() + 0.2
            procs = [p for p in procs if not _wait_exited(p, timeout=max(0.0, deadline - time.monotonic()))]
            if procs and stop == "terminate":
                self.log.warning(
                    "Workers %s did not stop after SIGTERM. Sending SIGKILL.", [p.pid for p in procs]
                )

    @_held_off
    def _process_workloads(self, workloads):
        for workload in workloads:
            # It may be sent later, from sync(): one that cannot be pickled fails here, and stays queued.
            ForkingPickler.dumps(workload)
            taken_from = self._take_queued(workload)
            key = _workload_key(workload)
            self.running.add(key)
            self._dispatch_counts[key] = self._dispatch_counts.get(key, 0) + 1
            self._newest[key] = workload
            self._add_pending(workload, taken_from)
        self._check_workers()
        if self._pending:
            self.log.warning(
                "%d dispatched workloads wait for a free worker: every one of %d workers is busy",
                len(self._pending),
                len(self.workers),
            )

    def _add_pending(self, workload: workloads.All, taken_from: dict) -> None:
        """Queue ``workload`` for the next free worker behind every one of at least its priority."""
        weight = _priority_weight(workload)
        at = len(self._pending)
        while at and _priority_weight(self._pending[at - 1][0]) < weight:
            at -= 1
        self._pending.insert(at, (workload, taken_from))

    def _take_queued(self, workload) -> dict:
        """Remove a workload from the executor's queue it waits in, and return that queue."""
        # A valid workload will exist in exactly one of these dicts.
        queues: tuple[dict, ...] = (self.queued_tasks,)
        for queue in queues:
            if queue.pop(_workload_key(workload), None) is not None:
                return queue
        raise KeyError(f"Workload {_workload_key(workload)} was not found in any queue")

    def _undo_dispatches(self, unsent: list, queues: list[dict]) -> None:
        """Give back workloads that were registered but never sent: they stay queued, as before."""
        for workload, queue in zip(unsent, queues, strict=True):
            key = _workload_key(workload)
            remaining = self._dispatch_counts.pop(key, 1) - 1
            if remaining > 0:
                # An earlier dispatch of the key is still in flight: it keeps the slot.
                self._dispatch_counts[key] = remaining
            else:
                self._newest.pop(key, None)
                self.running.discard(key)
            queue[key] = workload

    def _stale(self, key: WorkloadKey, dispatch: object) -> bool:
        """Whether ``dispatch`` is an earlier dispatch of ``key`` than its newest (None: none was recorded)."""
        return dispatch is not None and dispatch is not self._newest.get(key)

    def _finish_dispatch(
        self, key: WorkloadKey, state: WorkloadState, info, dispatch: workloads.All | None, pid: int
    ) -> None:
        """End ``dispatch``, which worker ``pid`` held: report it if it is the key's newest, else drop it."""
        # A resumed attempt reuses its key, so the previous dispatch can finish while the next one is live.
        stale = self._stale(key, dispatch)
        remaining = self._dispatch_counts.pop(key, 1) - 1
        if remaining > 0:
            self._dispatch_counts[key] = remaining
        else:
            self._redispatched.pop(key, None)
            self._newest.pop(key, None)
        if stale:
            self.log.warning("Dropping %s of an earlier dispatch of %s from worker pid=%s", state, key, pid)
            if remaining <= 0:
                self.running.discard(key)
        elif key in self.running:
            super().change_state(key, state, info=info, remove_running=remaining <= 0)

    @_held_off
    def _forget_workload(self, key: WorkloadKey) -> None:
        # A worker holding the key stays busy until it reports its end or dies: it is still running the
        # workload, and a workload sent to it now would wait behind that one. Its dispatch stays counted
        # until then, and ends as an earlier one: a later dispatch of the key is counted apart.
        self._redispatched.pop(key, None)
        self._newest.pop(key, None)
        kept = deque((w, q) for w, q in self._pending if _workload_key(w) != key)
        remaining = self._dispatch_counts.pop(key, 0) - (len(self._pending) - len(kept))
        if remaining > 0:
            self._dispatch_counts[key] = remaining
        self._pending = kept

    def change_state(self, key, state, info=None, remove_running=True) -> None:
        if remove_running:
            self._forget_workload(key)
        super().change_state(key, state, info=info, remove_running=remove_running)

    @_held_off
    def revoke_task(self, *, ti: TaskInstance) -> None:
        key = ti.key
        self.queued_tasks.pop(key, None)
        holders = [pid for pid, task_key in self._worker_tasks.items() if task_key == key]
        self._stop_workers(holders)
        self._forget_workload(key)
        self.running.discard(key)
        # What they started is dead before the scheduler can queue the key again.
        if exited := [pid for pid in holders if _exited(self.workers[pid])]:
            self._reap_workers(exited)

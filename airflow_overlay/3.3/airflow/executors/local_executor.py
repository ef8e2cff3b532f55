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
    _process_workloads(): idle workers only, one workload each
       _send_workload() --- workload ---> [workloads pipe] -----> recv(); run it
                                            writes: executor       |
                                            reads:  this worker    v
    sync()/end(): _read_results() <-- frames -- [results pipe] <-- (key, state, info) frames
                  one poll() of all pipes      writes: this worker
                  _exited() decides death (waitid)         | forks, adopts orphans (subreaper)
                  _reap_workers() handles it               v
                  _kill_left_behind(): what a dead worker   task process -> what the task starts
                  left comes to the executor (subreaper)

Per worker the executor holds two descriptors, its ends of the two pipes (multiprocessing's sentinel and
the pipe its child watches are closed at once: death is decided by waitid), and ``start()`` raises the
soft RLIMIT_NOFILE to cover ``parallelism``, or fails at once naming the limit. A read of the results is
one ``poll()`` of an object every results pipe is registered with, however many workers are idle.

No lock exists and no pipe is shared: each pipe has one writer and one reader, and every process
closes the ends that are not its own (a forked worker closes the executor's ends it inherited). So a
SIGKILL of a worker at any instant (idle, running, half way through a frame) damages only its own
pipes: results are read without blocking and a partial frame stays in that worker's buffer, a write to
a dead worker fails instead of blocking, and _reap_workers() ends the one workload the worker held and
frees its slot.

The executor keeps no queue of its own. It takes a workload from BaseExecutor's queues only when an
idle worker takes it; what no worker can take (keys holding more workers than slots: a key dispatched
again while its earlier dispatch runs, connection tests) stays there, in priority order, until the
next heartbeat.
A task workload whose worker died before starting it goes back there too.

What a worker started dies with it. On Linux the executor's process and every worker are child
subreapers: an orphan goes to its nearest such ancestor, not to init. So a live worker adopts what its
tasks leave (a BashOperator job whose task process exited, a daemon), and reaps it between workloads;
when a worker dies, its children come to the executor's process at once, and the rest of its tree as
their parents die. Each worker leads a session of its own, which everything it starts is in or below,
never in the scheduler's: what dead workers left is the executor process's children that are neither
workers nor in its session. Once a worker has exited, for whatever reason, the executor SIGKILLs those
by pid (an unreaped child's pid names it) and reaps them, level by level, until none is left, and only
then reaps the worker, ends the workload it held and frees its slot: the scheduler never runs a task
again while an earlier copy still runs. Not covered: another user's processes (run_as_user), which it
may not signal (logged); platforms without /proc or prctl; a process the scheduler's own code starts in
a session of its own, which would be taken for a worker's (Airflow's scheduler starts none).

Every fork happens in a process with one thread: the executor starts no thread, so a worker forked
to replace a dead one (from the scheduler's thread, in ``sync()``) cannot inherit a lock another thread
held. ``slots_occupied`` (and so ``slots_available``) first applies every result already in the pipes,
read without blocking: a slot freed by now counts in the scheduler's next decision. It forks and reaps
nothing (the scheduler reads it holding its pool rows locked).

Every workload is in exactly one place whenever the scheduler is interrupted:

- the scheduler's thread holds SIGTERM's and SIGINT's handlers off while it moves a workload or a
  result from one place to the next (``_held_off``): a workload is written whole to an idle worker and
  then taken from its queue, or left there;
- a worker writes a start acknowledgement (``STARTED``) as soon as it has forked a task's first process
  (the task process). A task whose worker died before that frame was read never had a task process (or
  had it killed with what the worker left before anything is decided): it is queued again and keeps its
  try. One that had started is failed, as before.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.process
import os
import resource
import select
import signal
import struct
import sys
import threading
import time
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, cast

import structlog

from airflow.executors import workloads
from airflow.executors.base_executor import BaseExecutor, get_execution_api_server_url
from airflow.executors.workloads.types import state_class_for_key

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

    from airflow.executors.workloads import ExecutorWorkload
    from airflow.executors.workloads.types import WorkloadKey, WorkloadState
    from airflow.models.taskinstance import TaskInstance

    # What a worker reports on its own results pipe, which says who sent it: the key, its state (STARTED
    # in a start acknowledgement) and, for a failure, the error's repr.
    LocalResult = tuple[WorkloadKey, WorkloadState | str | None, str | None]


def _get_executor_process_title_prefix(team_name: str | None) -> str:
    """
    Build the process title prefix for LocalExecutor workers.

    :param team_name: Team name from executor configuration
    """
    team_suffix = f" [{team_name}]" if team_name else ""
    return f"airflow worker -- LocalExecutor{team_suffix}:"


def _unreaped(proc: multiprocessing.Process) -> bool | None:
    """Whether the worker has exited, unreaped (its pid, its session's id, stays taken); None if reaped."""
    if not hasattr(os, "waitid"):  # macOS: only reaping tells, so what the worker left cannot be found
        return False if proc.is_alive() else None
    try:
        return os.waitid(os.P_PID, cast("int", proc.pid), os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        # Reaped already, not by the executor. is_alive() would say it runs for ever: its waitpid() fails
        # the same way, which multiprocessing reads as alive.
        return None


def _until(done: Callable[[], bool], timeout: float) -> bool:
    """Whether ``done()`` turns true within ``timeout`` seconds, asking every millisecond."""
    give_up = time.monotonic() + timeout
    while not (result := done()) and time.monotonic() < give_up:
        time.sleep(0.001)
    return result


def _exited(proc: multiprocessing.Process, timeout: float = 0.0) -> bool:
    """Whether the worker has exited, waiting up to ``timeout`` seconds; it is left unreaped."""
    return _until(lambda: _unreaped(proc) is not False, timeout)


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` from the state on (state, ppid, pgrp, session...); None if gone."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
        # The command name may hold spaces and parentheses; the fields after the last ")" do not.
        return stat[stat.rfind(b")") + 2 :].split()
    return None


# The pids of every executor's workers in this process, until each is reaped: never left behind.
_WORKERS: set[int] = set()


def _adopt_orphans() -> None:
    """Make this process the reaper of its descendants' orphans (Linux; no privilege needed)."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _left_behind(pid: int) -> bool:
    """Whether process ``pid`` is a child of this process that exited workers left (module docstring)."""
    f = _stat_fields(pid)
    return f is not None and int(f[1]) == os.getpid() and int(f[3]) != os.getsid(0) and pid not in _WORKERS


def _reap(pids: list[int]) -> bool:
    """Reap ``pids``, children of this process, in order as each exits (dropping it); whether all are."""
    while pids:
        with contextlib.suppress(ChildProcessError):  # reaped already
            if not os.waitpid(pids[0], os.WNOHANG)[0]:
                return False
        del pids[0]
    return True


# The state of the frame a worker writes, once per task, as soon as it has forked the task's first
# process (task-sdk's supervisor forks the task process before the task can do anything). A task whose
# worker died before this frame was read never started: it is queued again. After the fork, not
# before: a stop or kill signal pending during fork() aborts the fork, so a worker caught in it has no
# task process yet.
STARTED = "lepatch:started"


@contextlib.contextmanager
def _held_off() -> Iterator[None]:
    """
    In the main thread, hold off SIGTERM's and SIGINT's Python handlers until the block ends.

    The scheduler's handlers raise (SystemExit, KeyboardInterrupt) wherever its thread is, and a workload
    or a result moves in steps (written to a worker, then taken from its queue; read, then applied).
    Held off, a signal that comes in between is handled right after the block, where nothing is half
    moved. A nested block records into the outer one's recorder, which it restores.
    """
    main = threading.current_thread() is threading.main_thread()  # only it may set handlers: no-op elsewhere
    saved: dict[int, Callable[[int, FrameType | None], object]] = {
        signum: h
        for signum in (signal.SIGTERM, signal.SIGINT)
        if main and callable(h := signal.getsignal(signum))
    }
    caught: list[int] | None = []  # None once the block has ended

    def record(signum: int, frame: FrameType | None) -> None:
        if caught is None:  # left installed by a restore that a signal cut short: the handler again
            saved[signum](signum, frame)
        else:
            caught.append(signum)

    record.caught = caught  # type: ignore[attr-defined]  # for _signal_held_off()
    try:
        for signum in saved:
            signal.signal(signum, record)
        yield
    finally:
        replay, caught = caught or [], None
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        for caught_signal in replay:
            signal.raise_signal(caught_signal)  # the scheduler's handler runs at the next bytecode


def _signal_held_off() -> bool:
    """Whether the innermost ``_held_off()`` block has recorded a SIGTERM or SIGINT: a wait must end."""
    return any(getattr(signal.getsignal(s), "caught", None) for s in (signal.SIGTERM, signal.SIGINT))


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


def _forks_task_process(workload: workloads.ExecuteTask) -> bool:
    """Whether task-sdk starts the task process with ``fork()``, which runs the at-fork hook; False if unsure."""
    from airflow.sdk import __version__ as sdk_version
    from airflow.sdk.execution_time import supervisor

    try:
        from airflow.sdk.execution_time import coordinator
    except ImportError:  # before task-sdk 1.4: every task process is forked
        return True
    # task-sdk 1.4 spawns on macOS and with [core] execute_tasks_new_python_interpreter; 1.3 forks every
    # Python task process. A private name gone from a later task-sdk means one this was not written for:
    # the task counts as started before it runs (a worker that dies costs the task a try), never as
    # unstarted once it runs (it would run twice).
    if getattr(supervisor, "_task_process_uses_exec", lambda: not sdk_version.startswith("1.3."))():
        return False
    # A task routed to another runtime's coordinator ([sdk] queue_to_coordinator: Java, ...) starts with
    # subprocess, which runs no at-fork hook either; only the Python one forks.
    try:
        chosen = coordinator.get_coordinator_manager().for_queue(workload.ti.queue or "default")
    except Exception:
        return False
    return type(chosen).__name__ == "_PythonCoordinator"


def _summary(error: BaseException) -> str:
    """
    What a worker reports of a failure: the error's repr, escaped to ASCII and cut short.

    Not the exception: one holding a lock or a client does not pickle, and one that pickles may not
    unpickle.
    """
    return ascii(error)[:1024]


def _send_result(output: Connection, key: WorkloadKey, state, info: str | None = None) -> None:
    """
    Write one result frame in one write() of at most PIPE_BUF bytes, which the kernel makes atomic.

    Invariant: a worker killed at any instant has written whole frames only, and the executor, which
    reads only after poll(), never waits for the rest of one. A key of three 250-character names in
    4-byte UTF-8 (the most ``KEY_REGEX`` and the run_id column allow) takes about 3 KB: the summary
    gives way.
    """
    data = ForkingPickler.dumps((key, state, info))
    if info and (excess := len(data) + 4 - select.PIPE_BUF) > 0:  # 4: the length header
        data = ForkingPickler.dumps((key, state, info[:-excess]))
    output.send_bytes(data)


def _run_worker(
    logger_name: str,
    input: Connection,
    output: Connection,
    inherited: Sequence[Connection],
    team_conf,
):
    # Invariant: every process this worker starts is in this worker's session or one below it, never the
    # scheduler's, and comes to this worker (or, once it is dead, to the executor) when orphaned. First
    # thing: a worker killed before it had started nothing.
    os.setsid()
    _adopt_orphans()
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

    log = structlog.get_logger(logger_name)
    log.info("Worker starting up pid=%d", os.getpid())

    me = os.getpid()
    unacknowledged: list = [None]  # the key of the task this worker runs until it acknowledges its start

    def acknowledge_start() -> None:
        # After a fork in this worker (the task process is its first), in the worker: the frame is complete
        # before the task process can have done anything worth keeping (it is killed with this worker).
        # The task process inherits this hook: when it forks (a multiprocessing pool) it must not write a
        # frame of its own into this worker's results pipe, where it could land inside one of the worker's.
        if os.getpid() == me and (key := unacknowledged[0]) is not None:
            unacknowledged[0] = None
            _send_result(output, key, STARTED, None)

    os.register_at_fork(after_in_parent=acknowledge_start)

    while True:
        # Between workloads only: during one, task-sdk's supervisor (psutil) must be the task process's only
        # reaper. What is reaped here is what tasks left and this worker adopted, once it has exited.
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        setproctitle(f"{_get_executor_process_title_prefix(team_conf.team_name)} <idle>", log)
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

        if workload.running_state is not None:
            _send_result(output, workload.key, workload.running_state, None)
        # Set for every workload: a task whose process never forked must not leave its key to the next one.
        unacknowledged[0] = workload.key if isinstance(workload, workloads.ExecuteTask) else None
        if unacknowledged[0] is not None and not _forks_task_process(workload):
            # No at-fork hook will run: acknowledge before it runs, so a worker that dies mid-task never
            # has its started task taken for one that never started (run twice).
            acknowledge_start()

        try:
            BaseExecutor.run_workload(
                workload,
                server=get_execution_api_server_url(team_conf),
                proctitle=f"{_get_executor_process_title_prefix(team_conf.team_name)} {workload.display_name}",
                subprocess_logs_to_stdout=True,
            )
            _send_result(output, workload.key, workload.success_state, None)
        except Exception as e:
            log.exception("Workload execution failed.", workload_type=type(workload).__name__)
            _send_result(output, workload.key, workload.failure_state, _summary(e))


class LocalExecutor(BaseExecutor):
    """
    LocalExecutor executes tasks locally in parallel.

    It uses the multiprocessing Python library and queues to parallelize the execution of tasks.

    :param parallelism: how many parallel processes are run in the executor, must be > 0
    """

    is_local: bool = True
    is_mp_using_fork: bool

    supports_multi_team: bool = True
    serve_logs: bool = True
    supports_callbacks: bool = True
    supports_connection_test: bool = True

    workers: dict[int, multiprocessing.Process]
    # The executor's ends of each worker's two pipes, by pid: it is the only writer of the first and the
    # only reader of the second, so no lock exists that a dead worker could hold.
    _inputs: dict[int, Connection]
    _outputs: dict[int, Connection]

    #: Seconds ``_kill_left_behind()`` waits for what it killed to die, and for a scan that finds nothing.
    left_behind_timeout: float = 5.0

    #: How many times a task whose worker died before starting it is queued again before it is failed
    #: (a workload that kills every worker it reaches must not go round forever).
    max_redispatch: int = 3

    #: Seconds an idle worker has to take a whole workload before it is killed (and the workload stays queued).
    send_timeout: float = 10.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Invariant: the key and the workload each busy worker was sent and has not ended, by pid; a worker
        # not in here is idle. A key stays in ``running`` while any worker holds it. The key is the one it
        # had when sent: the scheduler may change the task instance it was made from afterwards.
        self._worker_tasks: dict[int, tuple[WorkloadKey, ExecutorWorkload]] = {}
        self._all_busy = False  # every worker was busy for the last workload given: warned once
        # A dispatch is the workload object the scheduler handed over (each queueing makes a new one), and
        # only the end of the key's newest one is reported: an earlier dispatch's end (or death) is logged
        # and frees its worker, and a key the scheduler ended has no newest one.
        self._newest: dict[WorkloadKey, ExecutorWorkload] = {}
        self._unstarted: set[int] = set()  # busy workers whose task has not acknowledged its start
        self._redispatched: dict[WorkloadKey, int] = {}
        self._results_poll = select.poll()  # every worker's results pipe: one poll() call reads them all

        # Resolve the start method at instantiation, not at import: the component CLI entry may have
        # set it via [<component>]/[core] mp_start_method before the executor is created.
        self.is_mp_using_fork = multiprocessing.get_start_method() == "fork"

        # Check if self has the ExecutorConf set on the self.conf attribute, and if not, set it to the global
        # configuration object. This allows the changes to be backwards compatible with older versions of
        # Airflow.
        # Can be removed when minimum supported provider version is equal to the version of core airflow
        # which introduces multi-team configuration.
        if not hasattr(self, "conf"):
            from airflow.configuration import conf

            self.conf = conf

    def start(self) -> None:
        """Start the executor."""
        self.workers = {}
        self._inputs = {}
        self._outputs = {}
        self._worker_tasks.clear()
        self._unstarted.clear()
        _adopt_orphans()  # what dead workers left comes here to be killed, not to init
        # Two descriptors per worker (the executor's pipe ends) beside those open now, and room for more:
        # failing here names the limit, where a fork half way through would fail with EMFILE.
        need = 2 * self.parallelism + len(os.listdir("/dev/fd")) + 64
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if need > hard != resource.RLIM_INFINITY:
            raise RuntimeError(
                f"LocalExecutor: parallelism {self.parallelism} needs about {need} open files, above the hard"
                f" RLIMIT_NOFILE {hard}: raise it (systemd LimitNOFILE=, ulimit -n) or lower parallelism"
            )
        if need > soft != resource.RLIM_INFINITY:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))

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
        # Never a fork or a reap: the scheduler reads the slots holding its pool rows locked.
        self._read_results()
        return super().slots_occupied

    def _idle_worker(self) -> int | None:
        """Return an idle live worker, starting one if all are busy and fewer than ``parallelism`` exist."""
        for pid, proc in self.workers.items():
            if pid not in self._worker_tasks and not _exited(proc):
                return pid
        if len(self.workers) >= self.parallelism:
            return None
        if self.is_mp_using_fork:
            # Replacements too are forked with the GC frozen, and all at once.
            before = set(self.workers)
            self._spawn_workers_with_gc_freeze(self.parallelism - len(self.workers))
            return next(pid for pid in self.workers if pid not in before)
        # With spawn a worker takes a second or more to start: start only the one this workload needs.
        return self._spawn_worker()

    def _spawn_worker(self) -> int:
        input_r, input_w = multiprocessing.Pipe(duplex=False)
        output_r, output_w = multiprocessing.Pipe(duplex=False)
        inherited = [input_w, output_r, *self._inputs.values(), *self._outputs.values()]
        p = _worker_process()(
            target=_run_worker,
            kwargs={
                "logger_name": self.log.name,
                "input": input_r,
                "output": output_w,
                # A spawned worker is passed only its own two ends.
                "inherited": inherited if self.is_mp_using_fork else [],
                "team_conf": self.conf,
            },
        )
        p.start()
        # multiprocessing's sentinel and the pipe its child watches: two descriptors per worker the executor
        # does not need (it decides a worker's death with waitid, never by sentinel, join(timeout) or wait()).
        p._popen.finalizer()  # type: ignore[attr-defined]
        # The worker's ends belong to the worker alone: a copy kept here would keep its pipes open after
        # it died, so reading them would never see EOF and writing them never fail.
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
        _WORKERS.add(p.pid)
        self._inputs[p.pid] = input_w
        self._outputs[p.pid] = output_r
        self._results_poll.register(output_r, select.POLLIN)
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
        self._read_results()
        # _exited(), not sentinel or EOF: a task process the worker forked keeps both open after the
        # worker itself is gone.
        if dead := [pid for pid, proc in self.workers.items() if _exited(proc)]:
            self._reap_workers(dead)
        # What a worker left and exited on its own is reaped here, or zombies pile up: one peek when none has.
        with contextlib.suppress(ChildProcessError, AttributeError):  # no child at all; no waitid (macOS)
            peek = os.WEXITED | os.WNOHANG | os.WNOWAIT
            while (child := os.waitid(os.P_ALL, 0, peek)) and _left_behind(child.si_pid):
                os.waitpid(child.si_pid, 0)

    def event_waitables(self) -> list[Connection]:
        """Each worker's results pipe: readable once a frame is there to read."""
        # Not a worker's exit: a task process it forked keeps its pipe open after it died. sync() finds a
        # dead worker on the scheduler's next loop.
        return list(self._outputs.values())

    def gather_events(self) -> bool:
        """Read the results that arrived; True if a worker is free again (a slot for the scheduler)."""
        # A start acknowledgement or a running state is read and left for the next loop: only an end
        # gives the scheduler something to do at once. A pipe still readable once all is read is at EOF
        # (its worker died, for sync() to reap), or the idle sleep would spin on it.
        busy = len(self._worker_tasks)
        self._read_results()
        return len(self._worker_tasks) < busy or bool(self._results_poll.poll(0))

    @_held_off()
    def _process_workloads(self, workload_list):
        self.sync()
        for workload in workload_list:
            while (pid := self._idle_worker()) is not None:
                try:
                    self._send_workload(pid, workload)
                    break
                except BrokenPipeError:  # it died before it got the workload: the next idle one takes it
                    self._reap_workers([pid])
                    if _signal_held_off():  # the wait ended for a SIGTERM: handled once this block ends
                        return
            else:
                # Every worker is busy: keys hold more workers than slots (a key dispatched again while its
                # earlier dispatch runs; connection tests, outside the slot count). What is left stays in
                # BaseExecutor's queues, in priority order, for the next heartbeat.
                if not self._all_busy:  # once, not every heartbeat, until a heartbeat places all it got
                    self.log.warning("All %d workers are busy; workloads wait for one", len(self.workers))
                self._all_busy = True
                return
            self._take_queued(workload)
            key = workload.key
            self.running.add(key)
            self._newest[key] = workload
            self._worker_tasks[pid] = key, workload
            if isinstance(workload, workloads.ExecuteTask):
                self._unstarted.add(pid)
        self._all_busy = False

    def _take_queued(self, workload) -> None:
        """Remove a workload from the executor's queue it waits in."""
        # A valid workload will exist in exactly one of these dicts.
        queues = (self.queued_tasks, self.queued_callbacks, self.queued_connection_tests)
        if not any(queue.pop(workload.key, None) is not None for queue in queues):
            raise KeyError(f"Workload {workload.key} was not found in any queue")

    def _send_workload(self, pid: int, workload: ExecutorWorkload | None) -> None:
        """Write the whole workload to the worker's pipe, or kill the worker: a torn frame would be misread."""
        data = ForkingPickler.dumps(workload)  # a workload that cannot be pickled fails before any write
        frame = memoryview(struct.pack("!i", len(data)) + data)  # as the worker's recv() reads it
        fd, give_up = self._inputs[pid].fileno(), time.monotonic() + self.send_timeout
        try:
            # Only an idle worker is sent a workload, and it writes nothing until it has read all of it, so
            # this waits at most for that read. But a worker that died while a process it started holds its
            # end would never read, and one stopped (a debugger, a cgroup freezer) reads nothing: a full
            # pipe is waited on only while the worker lives, for send_timeout at most, and no longer once
            # a SIGTERM is held off. A worker that has not taken its workload by then is treated as dead.
            while frame:
                try:
                    frame = frame[os.write(fd, frame) :]
                except BlockingIOError:
                    if _exited(self.workers[pid]) or time.monotonic() > give_up or _signal_held_off():
                        raise BrokenPipeError(f"worker pid={pid} exited or took no workload") from None
                    time.sleep(0.001)  # for the worker to read: a workload is rarely larger than the pipe
        except BaseException:
            self.workers[pid].kill()  # part of it may have gone: a torn frame would be read as the next one
            raise

    @_held_off()
    def _read_results(self, pids: Collection[int] | None = None) -> None:
        """Apply every result that has arrived (read without blocking)."""
        if pids is None:  # one poll() of every worker's pipe, not a selector per pipe
            ready = {fd for fd, _ in self._results_poll.poll(0)}
            pids = [pid for pid, output in self._outputs.items() if output.fileno() in ready] if ready else ()
        for pid in pids:
            # A frame is written whole or not at all (see _run_worker()): one that poll() sees has arrived.
            while (output := self._outputs[pid]).poll():
                try:
                    result = output.recv()
                except EOFError:
                    break
                self._handle_result(pid, *result)

    def _handle_result(self, pid: int, key: WorkloadKey, state: WorkloadState | str | None, info) -> None:
        if self._worker_tasks.get(pid, (None,))[0] != key:
            return
        workload = self._worker_tasks[pid][1]
        if state == STARTED:
            self._unstarted.discard(pid)
        elif state == "running":
            if workload is self._newest.get(key):
                self.change_state(key, state, remove_running=False)
        else:
            self._end_dispatch(pid, cast("WorkloadState", state), info)

    def _end_dispatch(self, pid: int, state: WorkloadState, info: str | None) -> None:
        """End the dispatch worker ``pid`` held: its worker is idle again; report it if it is the newest."""
        key, workload = self._worker_tasks.pop(pid)
        self._unstarted.discard(pid)
        others = bool(self._holders(key))
        if workload is not self._newest.get(key):
            self.log.warning("Dropping %s of %s from worker pid=%s: not its newest dispatch", state, key, pid)
            if not others:
                self.running.discard(key)
            return
        super().change_state(key, state, info=info, remove_running=not others)
        self._forget(key)

    def _holders(self, key: WorkloadKey) -> list[int]:
        """The workers that hold a dispatch of ``key``."""
        return [pid for pid, (held, _) in self._worker_tasks.items() if held == key]

    def _forget(self, key: WorkloadKey) -> None:
        # A worker holding the key stays busy until it reports its end or dies: its dispatch ends then, as
        # an earlier one.
        self._newest.pop(key, None)
        self._redispatched.pop(key, None)

    def change_state(self, key, state, info=None, remove_running=True) -> None:
        if remove_running:
            self._forget(key)
        super().change_state(key, state, info=info, remove_running=remove_running)

    def fail_connection_test(self, key) -> None:
        self._forget(key)
        super().fail_connection_test(key)

    @_held_off()  # a SIGTERM must not leave a worker half reaped: end() would reap it again
    def _reap_workers(self, pids: Collection[int]) -> None:
        """Kill what the exited workers left behind, then forget them and their pipes and end their work."""
        for pid in pids:
            _exited(self.workers[pid], timeout=math.inf)
        # Before any key is failed or slot freed: the scheduler may run the key again at once.
        self._kill_left_behind()
        for pid in pids:
            # The frames it finished before dying are in the pipe: apply them before deciding that the
            # workload it held never finished. What is left is a frame it died writing.
            self._read_results(pids=[pid])
            self._results_poll.unregister(output := self._outputs.pop(pid))
            output.close()
            self._inputs.pop(pid).close()
            proc = self.workers.pop(pid)
            proc.join()
            _WORKERS.discard(pid)
            if (exitcode := proc.exitcode) is not None:  # None: reaped elsewhere; close() would refuse
                proc.close()
            if pid in self._worker_tasks:
                self._worker_died(pid, exitcode)

    def _worker_died(self, pid: int, exitcode: int | None) -> None:
        key, workload = self._worker_tasks[pid]
        tries = self._redispatched.get(key, 0)
        if pid in self._unstarted and workload is self._newest.get(key) and tries < self.max_redispatch:
            # It never started (no STARTED frame came, and a worker writes one once it has forked the task
            # process, which was killed with what the worker left): nothing of it runs, so it is queued again
            # where the scheduler put it, and the task keeps its try. Its dispatch, no longer the newest,
            # ends below freeing only its worker and its slot.
            self.log.warning("Worker pid=%s died before it started %s; queueing it again", pid, key)
            self._redispatched[key] = tries + 1
            self.queued_tasks[key] = self._newest.pop(key)  # type: ignore[index,assignment]  # a task's
        else:
            # On 3.3 nothing else would ever release the key (the scheduler's stuck-in-queued check does
            # not fire for it), and failed, the scheduler retries it.
            self.log.error("Worker pid=%s died (exit code %s) holding %s; failing it", pid, exitcode, key)
        self._end_dispatch(pid, state_class_for_key(key).FAILED, f"LocalExecutor worker pid={pid} died")

    def _kill_left_behind(self) -> None:
        """SIGKILL and reap every process exited workers left (_left_behind()); return once none is left."""
        # Invariant: only this process's own unreaped children are signalled, by pid, which names them until
        # they are reaped here. A killed one's children come here in turn: each round goes one level deeper.
        spared: set[int] = set()  # another user's (run_as_user): it may not be signalled from here

        def killed_all() -> bool:
            found = [int(e) for e in os.listdir("/proc") if e.isdigit() and _left_behind(int(e))]
            found = [pid for pid in found if pid not in spared]
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                except PermissionError as e:
                    self.log.error("Cannot kill pid=%s, left by an exited worker: %s", pid, e)
                    spared.add(pid)
            killed = [pid for pid in found if pid not in spared]
            _until(lambda: _reap(killed), self.left_behind_timeout)
            return not found

        if os.path.exists("/proc/self/stat") and not _until(killed_all, self.left_behind_timeout):
            self.log.error("Processes left by exited workers outlived SIGKILL (uninterruptible sleep?)")

    def end(self) -> None:
        """End the executor."""
        self.log.info(
            "Shutting down LocalExecutor"
            "; waiting for running tasks to finish.  Signal again if you don't want to wait."
        )
        try:
            # Each worker gets its shutdown message on its own pipe, behind at most the workload it runs.
            for pid in list(self.workers):
                with contextlib.suppress(OSError):  # already gone: reaped below
                    self._send_workload(pid, None)
            # A worker cannot exit while it is blocked writing a result nobody reads: keep reading results
            # while waiting. A worker that is gone is reaped once what it started is dead.
            while self.workers:
                self._results_poll.poll(100)
                self.sync()
        except (KeyboardInterrupt, SystemExit):
            self.log.error("KeyboardInterrupt received during shutdown. Force terminating workers.")
            self._stop_workers(list(self.workers))
            self.sync()  # their complete frames are read, a partial one is dropped: nothing here can block
            raise

    def terminate(self):
        """Terminate all worker processes under control of the executor forcefully."""
        self.log.info("Terminating all LocalExecutor worker processes.")
        self._stop_workers(list(self.workers))
        # Then what they started and left running. Results are not read any more.
        self._kill_left_behind()
        for pid in [pid for pid, proc in self.workers.items() if _exited(proc)]:
            self.workers[pid].join()
            _WORKERS.discard(pid)

    def _stop_workers(self, pids: Collection[int]) -> None:
        """SIGTERM the workers, then SIGKILL those alive 0.2 s later; the executor reaps them afterwards."""
        # All at once: one worker after another, parallelism workers that ignore SIGTERM (task-sdk's
        # supervisor defers it while a task runs) took parallelism x 0.2 s.
        procs = [self.workers[pid] for pid in pids if not _exited(self.workers[pid])]
        for stop in ("terminate", "kill"):
            for proc in procs:
                getattr(proc, stop)()
            deadline = time.monotonic() + 0.2
            procs = [p for p in procs if not _exited(p, timeout=max(0.0, deadline - time.monotonic()))]
            if procs and stop == "terminate":
                self.log.warning("Workers %s ignored SIGTERM; sending SIGKILL", [p.pid for p in procs])

    @_held_off()
    def revoke_task(self, *, ti: TaskInstance) -> None:
        key = ti.key
        self.queued_tasks.pop(key, None)
        holders = self._holders(key)
        self._stop_workers(holders)
        self._forget(key)
        self.running.discard(key)
        # What they started is dead before the scheduler can queue the key again.
        self._reap_workers([pid for pid in holders if _exited(self.workers[pid])])

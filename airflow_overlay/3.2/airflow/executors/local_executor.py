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
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.sharedctypes
import os
import sys
import threading
import time
from multiprocessing import Queue, SimpleQueue
from typing import TYPE_CHECKING

import structlog

from airflow.executors import workloads
from airflow.executors.base_executor import BaseExecutor
from airflow.executors.workloads.callback import execute_callback_workload
from airflow.utils.state import CallbackState, TaskInstanceState

# add logger to parameter of setproctitle to support logging
if sys.platform == "darwin":
    setproctitle = lambda title, logger: logger.debug("Mac OS detected, skipping setproctitle")
else:
    from setproctitle import setproctitle as real_setproctitle

    setproctitle = lambda title, logger: real_setproctitle(title)

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger as Logger

    from airflow.executors.workloads.types import WorkloadKey, WorkloadResultType, WorkloadState

# Every workload type's running state has this value; any other state a worker reports is terminal.
_RUNNING = "running"


def _get_executor_process_title_prefix(team_name: str | None) -> str:
    """
    Build the process title prefix for LocalExecutor workers.

    :param team_name: Team name from executor configuration
    """
    team_suffix = f" [{team_name}]" if team_name else ""
    return f"airflow worker -- LocalExecutor{team_suffix}:"


def _run_worker(
    logger_name: str,
    input: SimpleQueue[workloads.All | None],
    output: Queue[WorkloadResultType],
    unread_messages: multiprocessing.sharedctypes.Synchronized[int],
    team_conf,
):
    import signal

    # Ignore ctrl-c in this process -- we don't want to kill _this_ one. we let tasks run to completion
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    log = structlog.get_logger(logger_name)
    log.info("Worker starting up pid=%d", os.getpid())

    while True:
        setproctitle(f"{_get_executor_process_title_prefix(team_conf.team_name)} <idle>", log)
        try:
            workload = input.get()
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

        # Decrement this as soon as we pick up a message off the queue
        with unread_messages:
            unread_messages.value -= 1

        # Tell the executor which worker holds this workload, so a slot held by a worker that dies is
        # released instead of leaking. Every message carries the sender's pid for the same reason.
        pid = os.getpid()
        key, _ = _key_and_failure_state(workload)
        output.put((key, None, None, pid))

        # Handle different workload types
        if isinstance(workload, workloads.ExecuteTask):
            try:
                _execute_work(log, workload, team_conf)
                output.put((key, TaskInstanceState.SUCCESS, None, pid))
            except Exception as e:
                log.exception("Task execution failed.")
                output.put((key, TaskInstanceState.FAILED, e, pid))

        elif isinstance(workload, workloads.ExecuteCallback):
            output.put((key, CallbackState.RUNNING, None, pid))
            try:
                _execute_callback(log, workload, team_conf)
                output.put((key, CallbackState.SUCCESS, None, pid))
            except Exception as e:
                log.exception("Callback execution failed")
                output.put((key, CallbackState.FAILED, e, pid))

        else:
            raise ValueError(f"LocalExecutor does not know how to handle {type(workload)}")


def _key_and_failure_state(workload: workloads.All) -> tuple[WorkloadKey, WorkloadState]:
    if isinstance(workload, workloads.ExecuteCallback):
        return workload.callback.id, CallbackState.FAILED
    return workload.ti.key, TaskInstanceState.FAILED


def _execute_work(log: Logger, workload: workloads.ExecuteTask, team_conf) -> None:
    """
    Execute command received and stores result state in queue.

    :param log: Logger instance
    :param workload: The workload to execute
    :param team_conf: Team-specific executor configuration
    """
    from airflow.sdk.execution_time.supervisor import supervise

    setproctitle(f"{_get_executor_process_title_prefix(team_conf.team_name)} {workload.ti.id}", log)

    base_url = team_conf.get("api", "base_url", fallback="/")
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
        server=team_conf.get("core", "execution_api_server_url", fallback=default_execution_api_server),
        log_path=workload.log_path,
        subprocess_logs_to_stdout=True,
    )


def _execute_callback(log: Logger, workload: workloads.ExecuteCallback, team_conf) -> None:
    """
    Execute a callback workload.

    :param log: Logger instance
    :param workload: The ExecuteCallback workload to execute
    :param team_conf: Team-specific executor configuration
    """
    setproctitle(f"{_get_executor_process_title_prefix(team_conf.team_name)} {workload.callback.id}", log)

    success, error_msg = execute_callback_workload(workload.callback, log)

    if not success:
        raise RuntimeError(error_msg or "Callback execution failed")


class LocalExecutor(BaseExecutor):
    """
    LocalExecutor executes tasks locally in parallel.

    It uses the multiprocessing Python library and queues to parallelize the execution of tasks.

    :param parallelism: how many parallel processes are run in the executor, must be > 0
    """

    is_local: bool = True
    is_mp_using_fork: bool = multiprocessing.get_start_method() == "fork"

    supports_multi_team: bool = True
    serve_logs: bool = True
    supports_callbacks: bool = True

    activity_queue: SimpleQueue[workloads.All | None]
    result_queue: SimpleQueue[WorkloadResultType]
    workers: dict[int, multiprocessing.Process]
    _unread_messages: multiprocessing.sharedctypes.Synchronized[int]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

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
        # We delay opening these queues until the start method mostly for unit tests. ExecutorLoader caches
        # instances, so each test reusues the same instance! (i.e. test 1 runs, closes the queues, then test 2
        # comes back and gets the same LocalExecutor instance, so we have to open new here.)
        self.activity_queue = SimpleQueue()
        self.result_queue = SimpleQueue()
        self.workers = {}

        # Mypy sees this value as `SynchronizedBase[c_uint]`, but that isn't the right runtime type behaviour
        # (it looks like an int to python)
        self._unread_messages = multiprocessing.Value(ctypes.c_uint)

        # A dispatched workload holds a parallelism slot (its key stays in ``running``) until its terminal
        # result arrives or the worker that took it dies. A key can be dispatched again while an earlier
        # dispatch has not reported yet (a resumed deferral), so dispatches are counted per key and the slot
        # is released only when the last one ends.
        self._dispatch_counts: dict[WorkloadKey, int] = {}
        self._failure_states: dict[WorkloadKey, WorkloadState] = {}
        # The key each worker took and has not finished, by worker pid.
        self._worker_keys: dict[int, WorkloadKey] = {}

        if self.is_mp_using_fork:
            # This creates the maximum number of worker processes (parallelism) at once
            # to minimize gc freeze/unfreeze cycles when using fork in multiprocessing
            self._spawn_workers_with_gc_freeze(self.parallelism)

    def _check_workers(self):
        # Reap any dead workers
        to_remove = set()
        for pid, proc in self.workers.items():
            if not proc.is_alive():
                to_remove.add(pid)
                proc.close()

        if to_remove:
            self.workers = {pid: proc for pid, proc in self.workers.items() if pid not in to_remove}
            # A dead worker's last messages are already complete in the pipe: read them before deciding
            # that the workload it held never finished.
            self._read_results()
            for pid in to_remove:
                self._fail_lost_workload(pid)

        with self._unread_messages:
            num_outstanding = self._unread_messages.value

        if num_outstanding <= 0 or self.activity_queue.empty():
            # Nothing to do. Future enhancement if someone wants: shut down workers that have been idle for N
            # seconds
            return

        # If we're using spawn in multiprocessing (default on macOS now) to start tasks, this can get called a
        # via `sync()` a few times before the spawned process actually starts picking up messages. Try not to
        # create too much
        if num_outstanding and len(self.workers) < self.parallelism:
            if self.is_mp_using_fork:
                # This creates the maximum number of worker processes at once
                # to minimize gc freeze/unfreeze cycles when using fork in multiprocessing
                self._spawn_workers_with_gc_freeze(self.parallelism - len(self.workers))
            else:
                # This only creates one worker, which is fine as we call this directly after putting a message on
                # activity_queue in execute_async when using spawn in multiprocessing
                self._spawn_worker()

    def _spawn_worker(self):
        p = multiprocessing.Process(
            target=_run_worker,
            kwargs={
                "logger_name": self.log.name,
                "input": self.activity_queue,
                "output": self.result_queue,
                "unread_messages": self._unread_messages,
                "team_conf": self.conf,
            },
        )
        p.start()
        if TYPE_CHECKING:
            assert p.pid  # Since we've called start
        self.workers[p.pid] = p

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
        self._check_workers()

    def _read_results(self):
        while not self.result_queue.empty():
            key, state, exc, pid = self.result_queue.get()
            if self._dispatch_counts.get(key, 0) <= 0:
                # Not a live dispatch: the key was already failed because its worker was reaped.
                self.log.warning("Ignoring result %s for %s: it has no dispatch in flight", state, key)
                continue
            if state is None:
                self._worker_keys[pid] = key
            elif state == _RUNNING:
                self.change_state(key, state, remove_running=False)
            else:
                self._worker_keys.pop(pid, None)
                self._end_dispatch(key, state, exc)

    def _begin_dispatch(self, workload: workloads.All) -> None:
        key, failure_state = _key_and_failure_state(workload)
        self._dispatch_counts[key] = self._dispatch_counts.get(key, 0) + 1
        self._failure_states[key] = failure_state
        self.running.add(key)

    def _end_dispatch(self, key: WorkloadKey, state: WorkloadState | None, info=None, report=True) -> None:
        remaining = self._dispatch_counts[key] - 1
        if remaining > 0:
            # Another dispatch of the same key is still in flight: the slot stays held for it.
            self._dispatch_counts[key] = remaining
            return
        del self._dispatch_counts[key]
        self._failure_states.pop(key, None)
        if report:
            self.change_state(key, state, info)
        else:
            self.running.discard(key)

    def _fail_lost_workload(self, pid: int) -> None:
        key = self._worker_keys.pop(pid, None)
        if key is None or self._dispatch_counts.get(key, 0) <= 0:
            return
        self.log.error("Worker pid=%s died while running %s; marking it failed", pid, key)
        self._end_dispatch(key, self._failure_states[key], f"LocalExecutor worker pid={pid} died")

    def end(self) -> None:
        """End the executor."""
        self.log.info(
            "Shutting down LocalExecutor"
            "; waiting for running tasks to finish.  Signal again if you don't want to wait."
        )

        # We can't tell which proc will pick which close message up, so we send all the messages, and then
        # wait on all the procs

        for proc in self.workers.values():
            # Send the shutdown message once for each alive worker
            if proc.is_alive():
                self.activity_queue.put(None)

        # A worker cannot exit while it is blocked writing a result into a full result pipe, and that pipe
        # only empties if we read it: keep reading results while waiting, or both sides wait forever.
        for proc in self.workers.values():
            while proc.is_alive():
                self._read_results()
                proc.join(timeout=0.05)
            proc.close()
        self.workers = {}

        # Process any extra results before closing
        self._read_results()

        self.activity_queue.close()
        self.result_queue.close()

    #: Seconds ``terminate()`` gives workers to exit on SIGTERM before it kills them.
    terminate_grace_period: float = 5.0

    def terminate(self):
        """
        Stop every worker now, without waiting for their tasks.

        Workers get SIGTERM, and SIGKILL once ``terminate_grace_period`` has passed. Results are not
        read any more: a worker killed in the middle of writing one leaves a partial message behind,
        and reading it would block forever.
        """
        workers = list(getattr(self, "workers", {}).values())
        for proc in workers:
            if proc.is_alive():
                proc.terminate()
        give_up = time.monotonic() + self.terminate_grace_period
        for proc in workers:
            proc.join(timeout=max(0.0, give_up - time.monotonic()))
        for proc in workers:
            if proc.is_alive():
                self.log.warning("Worker pid=%s did not exit on SIGTERM; killing it", proc.pid)
                proc.kill()
                proc.join()
            proc.close()
        self.workers = {}
        if hasattr(self, "activity_queue"):
            self.activity_queue.close()
            self.result_queue.close()

    def _process_workloads(self, workload_list):
        if not workload_list:
            return
        # Register the whole batch before any of it is sent: a worker can report a workload while the
        # batch is still being written, and a result for a key we do not know yet would be dropped.
        taken_from = [self._take_queued(workload) for workload in workload_list]
        for workload in workload_list:
            self._begin_dispatch(workload)
        with self._unread_messages:
            self._unread_messages.value += len(workload_list)

        sender = _BatchSender(self.activity_queue, workload_list)
        sender.start()
        try:
            # A put blocked on the full activity pipe completes only once workers take workloads, and
            # they only do while the result pipe has room: keep reading results until the batch is out.
            while not sender.done.wait(0.001):
                self._read_results()
                # Only a live worker can take the pending write. Workers are otherwise started after
                # the batch, which never comes with the spawn start method (none exist before the first
                # batch) or once every worker has died; spawn starts one per call, so keep calling.
                self._check_workers()
        except BaseException:
            # Interrupted, e.g. SIGTERM raising SystemExit: finish the put in progress, so end() does not
            # queue its shutdown messages behind a half-written workload, then give back what was not
            # sent. With no live worker nothing can take the pending write: give up on it at once.
            sender.stop()
            while not sender.done.wait(0.01) and self._any_worker_alive():
                self._read_results()
            self._undo_dispatches(workload_list[sender.sent :], taken_from[sender.sent :])
            raise
        if sender.error is not None:
            # The put failed (an unpicklable workload, a closed queue): it and everything after it
            # stay queued, with the counters as before, and the caller sees the error.
            self._undo_dispatches(workload_list[sender.sent :], taken_from[sender.sent :])
            raise sender.error
        self._check_workers()

    def _take_queued(self, workload) -> dict:
        """Remove a workload from the executor's queue it waits in, and return that queue."""
        key, _ = _key_and_failure_state(workload)
        # A valid workload will exist in exactly one of these dicts.
        for queue in (self.queued_tasks, self.queued_callbacks):
            if queue.pop(key, None) is not None:
                return queue
        raise KeyError(f"Workload {key} was not found in any queue")

    def _undo_dispatches(self, unsent: list, queues: list[dict]) -> None:
        """Give back workloads that were registered but never sent: they stay queued, as before."""
        for workload, queue in zip(unsent, queues, strict=True):
            key, _ = _key_and_failure_state(workload)
            self._end_dispatch(key, None, None, report=False)
            queue[key] = workload
        with self._unread_messages:
            self._unread_messages.value -= len(unsent)

    def _any_worker_alive(self) -> bool:
        return any(proc.is_alive() for proc in self.workers.values())


class _BatchSender(threading.Thread):
    """
    Write a batch of workloads into the activity queue, off the main thread.

    The main thread keeps reading results meanwhile. One thread per batch, not per put: a batch that
    fits in the pipe costs a single thread start. Forking a worker while it runs is safe: the only
    lock it takes is the activity queue's write lock, a process-shared semaphore that workers never
    take, and it pickles each workload before taking it.
    """

    def __init__(self, queue: SimpleQueue, workloads: list) -> None:
        super().__init__(name="LocalExecutor-batch-sender", daemon=True)
        self.queue = queue
        self.workloads = workloads
        # How many workloads were written completely; final once ``done`` is set.
        self.sent = 0
        self.error: Exception | None = None
        self.done = threading.Event()
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            for workload in self.workloads:
                if self._stopping.is_set():
                    return
                self.queue.put(workload)
                self.sent += 1
        except Exception as e:
            self.error = e
        finally:
            self.done.set()

    def stop(self) -> None:
        """Send nothing after the put in progress."""
        self._stopping.set()

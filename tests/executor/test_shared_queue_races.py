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
Two races of the shared activity queue that a model check found and no earlier test covered.

Both need an instant the tests cannot hit by chance, so each test sets up that instant on purpose,
without changing what the executor does:

- ``end()`` puts one ``None`` for each worker that ``is_alive()`` when it gets to it. An idle
  worker takes the first one and exits before ``end()`` looks at it, so it is skipped: one
  ``None`` short, the busy worker never gets one and ``end()`` waits for it forever. The test
  slows ``is_alive()`` in the executor's process (a descheduled scheduler) and puts the busy
  worker first in the order ``end()`` walks the workers.
- A worker killed inside ``with unread_messages:`` (between reading a workload and counting it)
  leaves that lock held by a dead process, and the executor's next ``with
  self._unread_messages:`` never returns. The test kills a process of the executor's while it
  holds that lock, which is the state such a kill leaves.

Each worker having its own pipes and no shared lock fixes both.
"""

from __future__ import annotations

import multiprocessing.process
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest
from harness import dispatch, key_of, make_workload, new_executor, run_scenario, wait_for_states, wait_until

OWN_QUEUE_PATCH = "0007-share-no-lock-or-pipe-between-localexecutor-processes.patch"


def end_races_an_idle_worker_for_its_shutdown_message() -> dict:
    executor = new_executor(2)
    started_dir = tempfile.mkdtemp()
    gate = Path(tempfile.mkdtemp(), "go")
    busy = make_workload("busy", fake={"started_dir": started_dir, "wait_for": str(gate)})
    dispatch(executor, [busy])
    assert wait_until(lambda: bool(os.listdir(started_dir)), timeout=30), "busy never started"
    (busy_pid,) = (int(name.rsplit(".", 1)[1]) for name in os.listdir(started_dir))
    assert busy_pid in executor.workers, "the workload ran outside a worker"
    # The busy worker first, the idle one after it: end() walks the workers in this order.
    executor.workers = {busy_pid: executor.workers[busy_pid]} | {
        pid: proc for pid, proc in executor.workers.items() if pid != busy_pid
    }
    real_is_alive = multiprocessing.process.BaseProcess.is_alive

    def descheduled_is_alive(self: multiprocessing.process.BaseProcess) -> bool:
        time.sleep(0.3)
        return real_is_alive(self)

    multiprocessing.process.BaseProcess.is_alive = descheduled_is_alive  # type: ignore[method-assign]
    # The busy worker finishes only after every shutdown message has been sent.
    threading.Timer(2.0, gate.touch).start()
    started = time.monotonic()
    executor.end()
    multiprocessing.process.BaseProcess.is_alive = real_is_alive  # type: ignore[method-assign]
    return {
        "busy": str(executor.event_buffer.get(key_of(busy), ("missing",))[0]),
        "end_returned": time.monotonic() - started < 20,
    }


@pytest.mark.fixed_by(OWN_QUEUE_PATCH)
def test_end_does_not_lose_a_shutdown_message_to_an_idle_worker():
    # Fork only: with spawn, the unpatched executor starts a worker per workload, so there is no
    # idle worker to take the message.
    outcome = run_scenario(end_races_an_idle_worker_for_its_shutdown_message, deadline=15)
    assert outcome == {"busy": "success", "end_returned": True}


def worker_killed_holding_the_unread_counter() -> dict:
    executor = new_executor(2)
    counter = getattr(executor, "_unread_messages", None)
    if counter is not None:
        # The lock is a semaphore in shared memory: a forked child that takes it and is killed leaves it
        # taken, exactly as a worker killed inside ``with unread_messages:`` does.
        pid = os.fork()
        if pid == 0:
            counter.get_lock().acquire()
            os.kill(os.getpid(), signal.SIGSTOP)
            os._exit(0)
        os.waitpid(pid, os.WUNTRACED)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    after = make_workload("after")
    dispatch(executor, [after])
    states = wait_for_states(executor, [key_of(after)], timeout=20)
    executor.end()
    return states


@pytest.mark.fixed_by(OWN_QUEUE_PATCH)
def test_a_process_killed_holding_a_shared_counter_lock_does_not_stop_dispatch():
    assert run_scenario(worker_killed_holding_the_unread_counter, deadline=30) == {"after": "success"}

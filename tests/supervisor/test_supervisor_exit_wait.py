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
The supervisor sees its process exit at once, once the process has closed its sockets.

Each socket's EOF unregisters it from the selector; when the process has not been reaped by
then, the next ``_service_subprocess()`` used to ``select()`` on an empty selector, which
nothing wakes: the exit was seen ``[workers] min_heartbeat_interval`` later, the worker and its
slot held that long. These tests drive a real forked process through ``WatchedSubprocess``.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
import uuid
from pathlib import Path
from unittest import mock

import pytest
import structlog

from airflow.sdk.api.datamodels._generated import TaskInstanceState
from airflow.sdk.execution_time.supervisor import ActivitySubprocess, WatchedSubprocess

EXIT_WAIT_PATCH = "0010-wait-for-the-task-process-once-its-sockets-are-closed.patch"

# What ``_monitor_subprocess`` passes at the defaults (``[workers] min_heartbeat_interval``).
HEARTBEAT_INTERVAL = 5.0
# Far below that, and far above a fork, an exit and a reap on a loaded two-CPU machine.
REAP_BOUND = 1.0


class _Silent(WatchedSubprocess):
    """A supervised process that sends no request."""

    def _handle_request(self, msg, log, req_id):
        raise AssertionError(f"unexpected request {msg!r}")


def _close_sockets_then(exit_after: float, marks: Path | None = None):
    """The child: close every descriptor (the supervisor sees EOF on each), then exit later."""

    def child() -> None:
        os.closerange(0, 4096)
        time.sleep(exit_after)
        if marks is not None:
            # CLOCK_MONOTONIC is one clock for every process of the machine.
            marks.write_text(repr(time.monotonic()))
        os._exit(0)

    return child


def _start(target) -> _Silent:
    return _Silent.start(target=target, logger=structlog.get_logger(), id=uuid.uuid4())


def _supervise(proc: _Silent, max_wait_time: float, deadline: float) -> float:
    """``_monitor_subprocess``'s loop: until exited and every socket closed; when that was."""
    while proc._exit_code is None or proc._open_sockets:
        if time.monotonic() > deadline:
            raise AssertionError(f"still supervising {proc.pid}: exit code {proc._exit_code}")
        proc._service_subprocess(max_wait_time=max_wait_time)
    return time.monotonic()


@pytest.mark.fixed_by(EXIT_WAIT_PATCH)
@pytest.mark.timeout(30)
def test_exit_after_sockets_closed_is_seen_at_once():
    marks = Path(tempfile.mkdtemp(), "exited")
    proc = _start(_close_sockets_then(0.3, marks))
    done = _supervise(proc, HEARTBEAT_INTERVAL, time.monotonic() + 20)
    late = done - float(marks.read_text())
    assert proc._exit_code == 0
    assert late < REAP_BOUND, f"the exit was seen {late:.2f} s after it happened"


@pytest.mark.fixed_by(EXIT_WAIT_PATCH)
@pytest.mark.timeout(30)
def test_process_reaped_elsewhere_ends_supervision():
    proc = _start(_close_sockets_then(0.1))
    # Someone else reaps it (a SIGCHLD handler, a stray waitpid): psutil then gets no status.
    os.waitpid(proc.pid, 0)
    _supervise(proc, 1.0, time.monotonic() + 5)
    assert proc._exit_code == -1


class _SilentTask(ActivitySubprocess):
    """A supervised task process that sends no request (the test records what it reported)."""

    def _handle_request(self, msg, log, req_id):
        raise AssertionError(f"unexpected request {msg!r}")


@pytest.mark.fixed_by(EXIT_WAIT_PATCH)
@pytest.mark.timeout(30)
def test_task_reaped_elsewhere_keeps_the_state_it_reported():
    client = mock.Mock()
    # ActivitySubprocess.start() would send the process a task to run; the plain fork is enough here.
    proc = WatchedSubprocess.start.__func__(
        _SilentTask,
        target=_close_sockets_then(0.1),
        logger=structlog.get_logger(),
        id=uuid.uuid4(),
        client=client,
    )
    # What a SucceedTask request leaves once its API call went through; the task runner then exits 0.
    proc._terminal_state = TaskInstanceState.SUCCESS
    os.waitpid(proc.pid, 0)  # a Celery worker's SIGCHLD handler, apache/airflow#70117
    _supervise(proc, 1.0, time.monotonic() + 5)
    assert proc.final_state == TaskInstanceState.SUCCESS
    # A task failed now would be sent to finish(), which the API server refuses for a succeeded one.
    proc.update_task_state_if_needed()
    client.task_instances.finish.assert_not_called()


@pytest.mark.timeout(30)
def test_process_running_on_with_sockets_closed_is_still_serviced_and_killed():
    proc = _start(_close_sockets_then(60))
    deadline = time.monotonic() + 10
    while proc._open_sockets:
        assert time.monotonic() < deadline
        proc._service_subprocess(max_wait_time=0.5)
    # Waiting for the process stays bounded by the timeout: the caller still gets to heartbeat.
    for _ in range(3):
        started = time.monotonic()
        assert proc._service_subprocess(max_wait_time=0.5) is None
        assert time.monotonic() - started < 0.5 + REAP_BOUND
    proc.kill(signal.SIGTERM, escalation_delay=5.0)
    assert proc._exit_code == -signal.SIGTERM

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
"""A task's exception reaches the scheduler as a summary that cannot fail to pickle or tear a frame."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from harness import airflow_line, dispatch, key_of, make_workload, new_executor, run_scenario, wait_for_states

PICKLING_PATCH = "0007-share-no-lock-or-pipe-between-localexecutor-processes.patch"


def _holds_a_lock(message: str) -> Exception:
    """Pickles its message but not its attributes, as an exception holding a client or a socket."""
    exc = RuntimeError(message)
    exc.lock = threading.Lock()  # type: ignore[attr-defined]
    return exc


def _raise_for(task_id: str) -> None:
    """Make the runner the workers inherit (forked) raise an unpicklable exception for ``task_id``."""
    from airflow.executors import local_executor
    from airflow.executors.base_executor import BaseExecutor

    def check(workload: Any) -> None:
        if workload.ti.task_id == task_id:
            raise _holds_a_lock("the real error: HTTP 503 from the API")

    if airflow_line() in ("3.3", "3.4"):
        plain = BaseExecutor.run_workload

        def run_workload(workload: Any, **kwargs: Any) -> Any:
            check(workload)
            return plain(workload, **kwargs)

        BaseExecutor.run_workload = staticmethod(run_workload)  # type: ignore[method-assign, unused-ignore]
    else:
        plain_work = local_executor._execute_work  # type: ignore[attr-defined, unused-ignore]

        def execute_work(log: Any, workload: Any, *rest: Any) -> Any:
            check(workload)
            return plain_work(log, workload, *rest)

        local_executor._execute_work = execute_work  # type: ignore[attr-defined, unused-ignore]


def fail_with_an_unpicklable_exception() -> dict[str, Any]:
    _raise_for("unpicklable")
    executor = new_executor(1)
    bad, nxt = (
        make_workload("unpicklable", fake={"no_fork": True}),
        make_workload("next", fake={"no_fork": True}),
    )
    dispatch(executor, [bad])
    states = wait_for_states(executor, [key_of(bad)], timeout=30)
    info = executor.event_buffer.get(key_of(bad), (None, None))[1]
    dispatch(executor, [nxt])
    states.update(wait_for_states(executor, [key_of(nxt)], timeout=30))
    executor.end()
    return {"states": states, "info": str(info)}


@pytest.mark.fixed_by(PICKLING_PATCH)
def test_an_exception_that_cannot_be_pickled_fails_its_key_with_its_repr() -> None:
    outcome = run_scenario(fail_with_an_unpicklable_exception, start_method="fork", deadline=120)
    assert outcome["states"] == {"unpicklable": "failed", "next": "success"}, outcome
    assert "the real error: HTTP 503 from the API" in outcome["info"], outcome


@pytest.mark.fixed_by(PICKLING_PATCH)
def test_a_result_frame_fits_in_one_atomic_pipe_write() -> None:
    # The executor reads a worker's results only after poll() and never waits for the rest of a frame:
    # that is safe because a worker writes each one whole, in one write of at most PIPE_BUF bytes,
    # which a pipe takes entirely or not at all, so a worker killed at any instant tears none. The
    # longest key and an error far larger than a pipe, with characters UTF-8 needs 2 bytes for.
    import select
    import struct
    from multiprocessing.reduction import ForkingPickler

    from airflow.executors import local_executor
    from airflow.models.taskinstancekey import TaskInstanceKey
    from airflow.utils.state import TaskInstanceState

    key = TaskInstanceKey("d" * 250, "t" * 250, "r" * 250, 2**31 - 1, 2**31 - 1)
    info = local_executor._summary(RuntimeError("é" * (1 << 20)))
    frame = struct.pack("!i", 0) + ForkingPickler.dumps((key, TaskInstanceState.UP_FOR_RETRY, info))
    assert len(frame) <= select.PIPE_BUF, len(frame)

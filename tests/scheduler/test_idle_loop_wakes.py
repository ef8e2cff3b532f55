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
The scheduler's idle sleep ends when an executor has news.

A loop that queued nothing and processed no event sleeps up to ``scheduler_idle_sleep_time``. A task
that ends meanwhile frees its executor's slot, and the next task waits for the rest of that sleep.
Here one scheduler loop runs with every database step stood in for, and an executor whose news
arrives 50 ms into a 2 s idle sleep.
"""

from __future__ import annotations

import contextlib
import inspect
import multiprocessing
import threading
import time
from typing import Any
from unittest import mock

import pytest

from airflow.executors.base_executor import BaseExecutor
from airflow.jobs import scheduler_job_runner
from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

WAKE_PATCH = "0012-wake-the-idle-scheduler-when-an-executor-has-news.patch"

IDLE_SLEEP = 2.0
NEWS_AFTER = 0.05
# Far below IDLE_SLEEP, with room for the loop's own steps on a loaded two-CPU machine (0.64 s seen at a
# load average of 30), so a sleep that ignores the news cannot pass.
WOKEN_WITHIN = 1.0

pytestmark = pytest.mark.timeout(60)


class NewsExecutor(BaseExecutor):
    """An executor whose results pipe gets a frame ``NEWS_AFTER`` seconds after ``start()``."""

    def start(self) -> None:
        self.reader, writer = multiprocessing.Pipe(duplex=False)
        self.timer = threading.Timer(NEWS_AFTER, writer.send, args=("done",))
        self.timer.start()

    def event_waitables(self) -> list[Any]:
        return [self.reader]


def _nothing(self: Any, *args: Any, **kwargs: Any) -> int:
    return 0  # nothing scheduled, no event processed, nothing adopted


class OneLoop(SchedulerJobRunner):
    """The scheduler's loop with no database: one idle loop, every other step of it does nothing."""

    locals().update(
        (name, _nothing)
        for name, value in vars(SchedulerJobRunner).items()
        if inspect.isfunction(value) and name not in ("__init__", "_run_scheduler_loop")
    )

    def __init__(self, executors: list[BaseExecutor], idle_sleep: float) -> None:
        # BaseJobRunner.__init__ wants a Job with a database row: only what the loop reads is set.
        # 3.1's loop reads its executors from the job, later lines' from the runner (no stand-in for either).
        self.job = mock.MagicMock(executors=executors)
        if "executors" in inspect.signature(SchedulerJobRunner.__init__).parameters:
            self.executors = executors
        self.num_runs = 1
        self.only_idle = False
        self._scheduler_idle_sleep_time = idle_sleep

    def __getattr__(self, name: str) -> Any:
        return mock.MagicMock(return_value=0)  # whatever else a line's loop reads


def _idle_loop(executors: list[BaseExecutor], idle_sleep: float = IDLE_SLEEP) -> float:
    """How long one idle loop of the scheduler takes; the first loop of a process also imports."""
    session = mock.MagicMock()
    session.scalars.return_value = []
    patches = [
        mock.patch.object(scheduler_job_runner, "create_session", lambda: contextlib.nullcontext(session)),
        mock.patch.object(scheduler_job_runner, "perform_heartbeat", mock.MagicMock()),
    ]
    if hasattr(scheduler_job_runner, "with_row_locks"):
        patches.append(mock.patch.object(scheduler_job_runner, "with_row_locks", mock.MagicMock()))
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        for executor in executors:
            executor.start()
        began = time.monotonic()
        OneLoop(executors, idle_sleep)._run_scheduler_loop()
        return time.monotonic() - began


@pytest.fixture(autouse=True)
def warm_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    # Airflow's own unit-test mode skips the idle sleep altogether.
    monkeypatch.setenv("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
    # A process's first loop takes most of a second to import and compile what it needs: news due
    # within it would be there before the sleep begins.
    _idle_loop([BaseExecutor(parallelism=1)], idle_sleep=0)


@pytest.mark.fixed_by(WAKE_PATCH)
def test_idle_scheduler_wakes_when_an_executor_has_news() -> None:
    quiet = BaseExecutor(parallelism=1)
    took = _idle_loop([quiet, NewsExecutor(parallelism=1)])
    assert took < WOKEN_WITHIN, f"the idle loop slept {took:.2f} s past news {NEWS_AFTER} s in"


def test_idle_scheduler_without_news_sleeps_the_whole_idle_sleep() -> None:
    took = _idle_loop([BaseExecutor(parallelism=1)])
    assert took >= IDLE_SLEEP

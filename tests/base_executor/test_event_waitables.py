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
``wait_for_executor_events``: the scheduler's idle sleep, ended by whichever executor has news first.

Executors that cannot say when they have news (the default ``event_waitables()``) leave it a plain
sleep; one that can ends it for all of them.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any

import pytest

from airflow.executors import base_executor
from airflow.executors.base_executor import BaseExecutor

WAKE_PATCH = "0012-wake-the-idle-scheduler-when-an-executor-has-news.patch"

SLEEP = 1.0
NEWS_AFTER = 0.05
WOKEN_WITHIN = 0.5  # far below SLEEP on a loaded two-CPU machine

pytestmark = pytest.mark.timeout(60)


class PipeExecutor(BaseExecutor):
    """An executor whose news is a frame on a pipe, as LocalExecutor's results are."""

    def __init__(self) -> None:
        super().__init__(parallelism=1)
        self.reader, self.writer = multiprocessing.Pipe(duplex=False)

    def event_waitables(self) -> list[Any]:
        return [self.reader]


def _wait(executors: list[BaseExecutor], timeout: float) -> float:
    """How long the scheduler's idle sleep over ``executors`` lasts (before the fix: a plain sleep)."""
    wait = getattr(base_executor, "wait_for_executor_events", None)
    began = time.monotonic()
    if wait is None:
        time.sleep(timeout)
    else:
        wait(executors, timeout)
    return time.monotonic() - began


@pytest.mark.fixed_by(WAKE_PATCH)
def test_news_from_any_executor_ends_the_sleep() -> None:
    quiet, busy = PipeExecutor(), PipeExecutor()
    timer = threading.Timer(NEWS_AFTER, busy.writer.send, args=("done",))
    timer.start()
    try:
        took = _wait([BaseExecutor(parallelism=1), quiet, busy], SLEEP)
    finally:
        timer.cancel()
    assert took < WOKEN_WITHIN, f"slept {took:.2f} s past news {NEWS_AFTER} s in"


def test_executors_without_news_sleep_the_whole_time() -> None:
    assert BaseExecutor(parallelism=1).event_waitables() == ()
    assert _wait([BaseExecutor(parallelism=1)], SLEEP / 4) >= SLEEP / 4
    assert _wait([BaseExecutor(parallelism=1), PipeExecutor()], SLEEP / 4) >= SLEEP / 4


def test_no_executor_sleeps_the_whole_time() -> None:
    assert _wait([], SLEEP / 4) >= SLEEP / 4

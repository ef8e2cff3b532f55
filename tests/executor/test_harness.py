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
"""The harness itself: a scenario forked from the zygote is what a fresh interpreter would be."""

from __future__ import annotations

import multiprocessing
import os
import sys

import harness
import pytest
from harness import SCENARIO_DIR, ScenarioError, run_scenario


def describe_self() -> dict:
    """What a scenario sees of its process."""
    from airflow.executors.local_executor import LocalExecutor

    return {
        "pid": os.getpid(),
        "parent": os.getppid(),
        "session": os.getsid(0),
        "group": os.getpgid(0),
        "cwd": os.getcwd(),
        "dir": os.environ.get(SCENARIO_DIR),
        "test": os.environ.get("PYTEST_CURRENT_TEST"),
        "start_method": multiprocessing.get_start_method(),
        # 3.1 and 3.2 read the start method into the class when the module is imported.
        "is_mp_using_fork": getattr(LocalExecutor, "is_mp_using_fork", None),
        "argv1": sys.argv[1][:1],
    }


def worker_title() -> str:
    """The command line a worker shows (``ps``, and what the chaos probe finds workers by)."""
    from pathlib import Path

    from harness import dispatch, key_of, make_workload, new_executor, wait_for_states

    executor = new_executor(1)
    workload = make_workload("a")
    dispatch(executor, [workload])
    wait_for_states(executor, [key_of(workload)], timeout=60)
    (pid,) = executor.workers
    title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    executor.end()
    return title


def read_a_pipe_nobody_writes() -> None:
    """Block for good, as a deadlocked executor would."""
    read_end, _write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.read(read_end, 1)  # the child holds the write end too: EOF never comes
        os._exit(0)
    os.read(read_end, 1)


def test_a_forked_scenario_is_set_up_like_a_fresh_interpreter(start_method):
    seen = run_scenario(describe_self, start_method=start_method)
    zygote = harness._zygote
    assert zygote is not None and not zygote.broken, "the scenario was not forked from the zygote"
    assert seen["parent"] == zygote.proc.pid
    assert seen["session"] == seen["group"] == seen["pid"]  # killable as a group, apart from the zygote
    assert seen["cwd"] == seen["dir"]  # the watchdog finds own-session workers by this directory
    assert seen["test"] == os.environ["PYTEST_CURRENT_TEST"]
    assert seen["start_method"] == start_method
    assert seen["is_mp_using_fork"] in (None, start_method == "fork")
    assert seen["argv1"] == "{"  # the request, as harness.py gets it on its command line


def test_a_forked_scenario_s_workers_set_their_process_title(start_method):
    # setproctitle finds the command line's memory from the environment's: a fork that rebuilt its
    # environment left every worker with the zygote's command line.
    assert "LocalExecutor" in run_scenario(worker_title, start_method=start_method)


def test_a_hung_forked_scenario_is_caught_and_the_zygote_serves_the_next():
    with pytest.raises(ScenarioError, match="deadlocked"):
        run_scenario(read_a_pipe_nobody_writes, deadline=30)
    zygote = harness._zygote
    assert zygote is not None and not zygote.broken
    assert run_scenario(describe_self)["parent"] == zygote.proc.pid


def test_no_zygote_starts_a_fresh_interpreter(monkeypatch):
    monkeypatch.setenv(harness.NO_ZYGOTE, "1")
    seen = run_scenario(describe_self)
    assert seen["parent"] == os.getpid()
    assert seen["session"] == seen["pid"]
    assert seen["cwd"] == seen["dir"]

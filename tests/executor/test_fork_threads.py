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
The executor forks its workers from a process with one thread.

A fork copies only the thread that calls it: a lock another thread held at that instant (the logging
module's, an allocator's, the import lock) stays held in the child by no one, and the child hangs the
first time it takes it. Workers are forked at start() and again whenever one is replaced, from
sync(), in the middle of a scheduler's run: no thread of the executor's may be alive then.
"""

from __future__ import annotations

import warnings

import pytest
from harness import (
    dispatch,
    key_of,
    make_workload,
    new_executor,
    record_forks,
    run_scenario,
    wait_for_states,
)

NO_THREAD_PATCH = "0009-keep-localexecutor-workers-busy-between-scheduler-loops.patch"


def forks_through_a_run_with_workers_killed(tmp: str) -> dict:
    recorder = record_forks()
    with warnings.catch_warnings(record=True) as caught:
        # Python 3.12+ warns in the parent of a fork made while other threads run (3.11 does not).
        warnings.simplefilter("always", DeprecationWarning)
        executor = new_executor(4)
        started = recorder.forks
        items = [make_workload(f"t{i}", fake={"sleep": 0.05}) for i in range(24)]
        # Two of them SIGKILL the worker that took them, before they start: each worker is replaced.
        for i in (3, 11):
            items[i].ti.executor_config["fake"]["die_before_fork_once"] = f"{tmp}/died-{i}"
        states = {}
        for at in range(0, len(items), 6):
            batch = items[at : at + 6]
            dispatch(executor, batch)
            states.update(wait_for_states(executor, [key_of(w) for w in batch], timeout=30))
        executor.end()
    threaded = [w for w in caught if "multi-threaded" in str(w.message)]
    return {
        "forks at start": started,
        "replacements": recorder.forks - started,
        "forks with threads": recorder.with_threads,
        "fork warnings": [str(w.message)[:200] for w in threaded],
        "states": sorted(set(states.values())),
    }


@pytest.mark.fixed_by(NO_THREAD_PATCH)
def test_no_thread_is_alive_when_the_executor_forks_a_worker(tmp_path):
    # fork only: spawn and forkserver start a fresh interpreter with an exec (no at-fork handler, no
    # copy of this process's threads), and the executor uses spawn under forkserver.
    outcome = run_scenario(
        forks_through_a_run_with_workers_killed, start_method="fork", deadline=120, tmp=str(tmp_path)
    )
    assert outcome["forks at start"] == 4
    assert outcome["replacements"] >= 1, "no worker was replaced: the check saw no fork mid-run"
    assert outcome["forks with threads"] == [], "\n".join(
        f"forked with {f['threads']} alive, from:\n{f['at']}" for f in outcome["forks with threads"]
    )
    assert outcome["fork warnings"] == []
    assert outcome["states"] == ["success"]

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
"""A workload that cannot be sent stays queued and leaves every counter as it was."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import pytest
from harness import dispatch, key_of, make_workload, new_executor, queued, run_scenario, wait_for_states

UNDO_PATCH = "0005-undo-a-failed-put-and-spawn-workers-while-one-is-blocked.patch"
BLOCKED_PUT_PATCH = "0004-keep-draining-results-while-a-workload-put-is-blocked.patch"


def failed_put(earlier_dispatch: bool) -> dict:
    executor = new_executor(2)
    gate = Path(tempfile.mkdtemp(), "go")
    earlier = make_workload("k", fake={"wait_for": str(gate)})
    if earlier_dispatch:
        # A resumed attempt reuses the key while the earlier dispatch has not reported yet.
        dispatch(executor, [earlier])
    broken = make_workload("k", fake={"unpicklable": threading.Lock()}, same_ti_as=earlier)
    executor.queue_workload(broken, session=None)
    slots_before = executor.slots_available
    error = None
    try:
        executor._process_workloads([broken])
    except Exception as e:
        error = type(e).__name__
    outcome = {
        "error": error,
        "still_queued": queued(executor).get(key_of(broken)) is broken,
        "slots_unchanged": executor.slots_available == slots_before,
    }
    gate.touch()
    # The executor still works, and the failed put left no slot behind once the earlier one ended.
    queued(executor).pop(key_of(broken))
    if earlier_dispatch:
        outcome["earlier"] = wait_for_states(executor, [key_of(earlier)], timeout=10)["k"]
    after = make_workload("after")
    dispatch(executor, [after])
    outcome["after"] = wait_for_states(executor, [key_of(after)], timeout=10)["after"]
    outcome["slots_at_rest"] = executor.slots_available
    executor.end()
    return outcome


@pytest.mark.fixed_by(UNDO_PATCH, introduced_by=BLOCKED_PUT_PATCH)
@pytest.mark.parametrize(
    "earlier_dispatch",
    [
        pytest.param(False, id="no-earlier-dispatch"),
        pytest.param(True, id="earlier-dispatch-still-running"),
    ],
)
def test_process_workloads_undoes_dispatch_when_put_fails(earlier_dispatch):
    """A failed put undoes only its own dispatch, so an earlier dispatch of the same key stays running."""
    outcome = run_scenario(failed_put, deadline=60, earlier_dispatch=earlier_dispatch)
    assert outcome.pop("error") == "TypeError"
    assert outcome.pop("still_queued")
    assert outcome.pop("slots_unchanged")
    if earlier_dispatch:
        assert outcome.pop("earlier") == "success"
    assert outcome == {"after": "success", "slots_at_rest": 2}

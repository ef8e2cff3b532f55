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
"""Callbacks and connection tests run on the same workers as tasks, driven by heartbeat() (3.3, 3.4)."""

from __future__ import annotations

import time
import uuid

import pytest
from harness import airflow_line, make_workload, new_executor, run_scenario


def _callback(name: str, fake: dict) -> object:
    from airflow.executors import workloads

    # What ExecuteCallback.make builds from a deadline callback's row, without the database.
    return workloads.ExecuteCallback(
        callback={
            "id": str(uuid.uuid4()),
            "fetch_method": "import_path",
            "data": {"path": name, "fake": fake},
        },
        dag_rel_path="dags/lepatch_dag.py",
        token="t" * 900,
        bundle_info=workloads.BundleInfo(name="dags-folder", version=None),
        log_path=f"executor_callbacks/lepatch_dag/manual/{name}",
    )


def through_heartbeat() -> dict:
    from airflow.executors import workloads

    if airflow_line() not in ("3.3", "3.4"):
        return {"skip": f"{airflow_line()} has no callback or connection-test workloads"}
    executor = new_executor(2)
    items = {
        "callback": _callback("lepatch.callbacks.notify", {}),
        "failing callback": _callback("lepatch.callbacks.broken", {"fail_bytes": 64}),
        "connection test": workloads.TestConnection.make(
            connection_test_id=uuid.uuid4(), connection_id="lepatch_conn", timeout=10
        ),
        "task": make_workload("task"),
    }
    for workload in items.values():
        executor.queue_workload(workload, session=None)
    keys = {
        name: executor.get_workload_key(w) if hasattr(executor, "get_workload_key") else w.key
        for name, w in items.items()
    }
    terminal = {"success", "failed"}
    # The scheduler's loop: heartbeat() hands over what is queued (tasks and callbacks by open slots,
    # connection tests on their own) and reads what the workers reported.
    give_up = time.monotonic() + 30
    while time.monotonic() < give_up:
        executor.heartbeat()
        if all(str(executor.event_buffer.get(k, ("",))[0]) in terminal for k in keys.values()):
            break
        time.sleep(0.02)
    states = {name: str(executor.event_buffer.get(k, ("missing",))[0]) for name, k in keys.items()}
    still_running = sorted(name for name, k in keys.items() if k in executor.running)
    executor.end()
    return {"states": states, "still_running": still_running, "workers_left": len(executor.workers)}


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_callbacks_and_connection_tests_run_on_real_workers(start_method):
    outcome = run_scenario(through_heartbeat, start_method=start_method, deadline=60)
    if "skip" in outcome:
        pytest.skip(outcome["skip"])
    assert outcome == {
        "states": {
            "callback": "success",
            "failing callback": "failed",
            "connection test": "success",
            "task": "success",
        },
        "still_running": [],
        "workers_left": 0,
    }

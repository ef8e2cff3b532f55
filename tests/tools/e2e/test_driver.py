"""Pieces of the e2e driver that need no Airflow."""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tools.measure.e2e import cli, driver, session
from tools.measure.e2e.stack import StackError


def test_urgent_raises_the_calling_thread_only_and_restores_it() -> None:
    seen: dict[str, int] = {}

    def probe() -> None:
        before = os.getpriority(os.PRIO_PROCESS, 0)
        with driver._urgent():
            seen["inside"] = os.getpriority(os.PRIO_PROCESS, 0)
            seen["main"] = os.getpriority(os.PRIO_PROCESS, main_tid)
        seen["before"], seen["after"] = before, os.getpriority(os.PRIO_PROCESS, 0)

    main_tid = threading.get_native_id()
    main_before = os.getpriority(os.PRIO_PROCESS, 0)
    t = threading.Thread(target=probe)
    t.start()
    t.join()
    assert seen["after"] == seen["before"]
    assert seen["main"] == main_before  # Linux nice is per thread: the rest of the driver is untouched
    if os.geteuid() == 0:
        assert seen["inside"] == -20
    else:  # not allowed to raise it: left as it was, and no error
        assert seen["inside"] == seen["before"]


def test_queued_timeout_runs_two_waves_of_long_tasks() -> None:
    spec = driver.SCENARIOS["queued-timeout"]().dag(parallelism=2)
    assert spec.file.is_file() and spec.file.name == "lepatch_e2e_long.py"
    assert (spec.dag_id, spec.n_tasks) == ("lepatch_e2e_long", 4)
    text = spec.file.read_text()
    assert f'DAG_ID = "{spec.dag_id}"' in text and driver.QT_TASKS_ENV in text
    assert "queued-timeout" in driver.SCENARIOS and "queued-timeout" not in driver.DEFAULT_SCENARIOS
    assert driver.SCENARIOS["queued-timeout"]().deadline(120.0) == 3 * driver.QT_TASK_SECONDS
    # Three rounds of the stuck-in-queued check fit in one task: the third fails a task.
    assert 3 * (driver.QT_QUEUED_TIMEOUT + driver.QT_CHECK_INTERVAL) < driver.QT_TASK_SECONDS


def test_stuck_in_queued_counts_the_schedulers_requeues_and_failures(tmp_path: Path) -> None:
    log = tmp_path / "scheduler.log"
    ti = "<TaskInstance: lepatch_e2e_long.long_02 e2e [queued]>"
    log.write_text(
        f"[info] {driver.QT_REQUEUED}. task_instance={ti}\n"
        f"[info] {driver.QT_REQUEUED}. task_instance={ti}\n"
        f"[info] {driver.QT_FAILED}. task_instance={ti}\n"
        "[info] Executor reports execution of lepatch_e2e_long.long_00 exited with status success\n"
    )
    assert driver.stuck_in_queued(log) == (2, 1)
    assert driver.stuck_in_queued(tmp_path / "missing.log") == (0, 0)


def test_scenario_env_puts_the_operators_airflow_env_last(tmp_path: Path) -> None:
    opts = cli.parse_options(
        [
            "--scenario",
            "queued-timeout",
            "--parallelism",
            "2",
            "--min-heartbeat-interval",
            "1",
            "--airflow-env",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME=0",
            "--airflow-env",
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL=3",
        ]
    )
    env = driver.scenario_env(
        opts, "queued-timeout", driver.SCENARIOS["queued-timeout"]().dag(parallelism=2), tmp_path
    )
    assert env == {
        driver.QT_TASKS_ENV: "4",
        "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": f"{driver.QT_CHECK_INTERVAL:g}",
        "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "3",
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0",
    }
    throughput = driver.scenario_env(
        opts, "throughput", driver.SCENARIOS["throughput"]().dag(tasks=30), tmp_path
    )
    assert throughput[driver.TP_TASKS_ENV] == "30"
    assert driver.QT_TASKS_ENV not in throughput


def test_events_before_the_trigger_are_logged_at_zero() -> None:
    # A stack that fails to start ends the scenario before the trigger started the run's clock;
    # what the scenario logs then (its components' CPU) must not hide that failure behind an assert.
    said: list[str] = []
    opts = cli.parse_options(["--line", "3.3"])
    run = driver.Run("throughput", None, None, opts, said.append)  # type: ignore[arg-type]
    run.event("cpu: scheduler 0.0 s")
    assert run.events == [(0.0, "cpu: scheduler 0.0 s")]
    run.watcher.start_clock(run.watcher.clock() - 2.0)
    assert 2.0 <= run.t() < 10.0


class _DeadStack:
    """A stack that never comes up; its stop gets a Ctrl-C, as a second Ctrl-C in the cleanup would."""

    stopped = 0

    def __init__(self, cfg: object, say: object) -> None:
        self.api, self.launched_at = "http://127.0.0.1:9", None
        self.procs: dict[str, object] = {}

    def launch(self) -> None:
        raise StackError("api-server exited (1) during launch")

    def stop(self) -> dict[str, object]:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)  # where a handler would raise, if one were installed
        _DeadStack.stopped += 1
        return {"leftover_pids_killed": {"pids": [7]}}


def test_a_scenario_whose_stack_fails_is_a_failure_and_its_stack_is_stopped_shielded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launched_with = signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(driver, "AirflowStack", _DeadStack)
    said: list[str] = []
    opts = cli.parse_options(["--scenario", "throughput", "--tasks", "3"])
    shared = session.Shared(tmp_path, "stamp", argparse.Namespace(path=tmp_path / "venv"))  # type: ignore[arg-type]
    try:
        r = driver.run_scenario("throughput", opts, shared, tmp_path, said.append)
    finally:
        signal.signal(signal.SIGINT, launched_with)
    assert (r.passed, r.failures, r.run_state, r.stop) == (
        False,
        ["api-server exited (1) during launch"],
        None,
        {"leftover_pids_killed": {"pids": [7]}},
    )
    assert _DeadStack.stopped == 1 and "  killed leftover processes: [7]" in said
    assert said[0] == "\n== throughput (3 tasks, sqlite, parallelism 8, deadline 120 s)"
    assert r.timings == {"deadline_s": 120.0} and r.extra["api_stall"]["counts"]["failed"] is None

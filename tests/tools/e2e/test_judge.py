"""Scenario verdicts from task states and the driver's kill, one line per failure."""

from __future__ import annotations

from tools.measure.e2e import judge
from tools.measure.e2e.judge import Kill
from tools.measure.e2e.watch import TaskSnap, WatchResult


def _tasks(n: int = 3, **override: tuple[str, int]) -> dict[str, TaskSnap]:
    out = {f"t{i}": TaskSnap(f"t{i}", f"id{i}", "success", 1) for i in range(n)}
    for k, (state, tries) in override.items():
        out[k] = TaskSnap(k, f"id-{k}", state, tries, pid=None)
    return out


def _result(final: bool, state: str) -> WatchResult:
    return WatchResult(final=final, run_state=state, elapsed=5.0, last=None, transitions=[], api_errors=0)


def test_clean_passes() -> None:
    assert judge.judge("clean", _result(True, "success"), 120, _tasks(), {}, None, n_tasks=3) == []


def test_clean_with_a_retry_fails() -> None:
    out = judge.judge("clean", _result(True, "success"), 120, _tasks(t1=("success", 2)), {}, None, n_tasks=3)
    assert out == ["tasks retried in a clean run: t1"]


def test_killed_queued_task_left_queued_fails_naming_it() -> None:
    kill = Kill(4.2, 1234, "t1", "id-t1", 1, "queued", "")
    tasks = _tasks(t1=("queued", 1))
    out = judge.judge("kill-queued", _result(False, "running"), 90, tasks, {}, kill, n_tasks=3)
    assert out[0].startswith("run not final after 90 s (run state running); 2 success, 1 queued; not done: ")
    assert "t1 (killed) queued try 1, no pid" in out[0]
    assert "was neither failed nor re-dispatched (queued since the kill at +4.2 s)" in out[1]


def test_killed_task_retried_passes() -> None:
    kill = Kill(4.2, 1234, "t1", "id-t1", 1, "running", "")
    tries = {"t1": [{"try_number": 1, "state": "failed"}, {"try_number": 2, "state": "success"}]}
    out = judge.judge(
        "kill-running", _result(True, "success"), 90, _tasks(t1=("success", 2)), tries, kill, n_tasks=3
    )
    assert out == []


def test_killed_task_failed_without_retry_passes_but_others_must_succeed() -> None:
    kill = Kill(4.2, 1234, "t1", "id-t1", 1, "running", "")
    tasks = _tasks(t1=("failed", 1), t2=("upstream_failed", 1))
    out = judge.judge("kill-running", _result(True, "failed"), 90, tasks, {}, kill, n_tasks=3)
    assert out == ["tasks not successful: t2 upstream_failed try 1, no pid"]


def test_kill_scenario_without_a_kill_fails() -> None:
    out = judge.judge("kill-queued", _result(True, "success"), 90, _tasks(), {}, None, n_tasks=3)
    assert out == ["the driver never killed a worker (see events)"]


def test_idle_reader_run_that_never_started_fails() -> None:
    tasks = _tasks(0, a=("queued", 1), b=("queued", 1))
    out = judge.judge("kill-idle-reader", _result(False, "running"), 90, tasks, {}, None, n_tasks=2)
    assert out == [
        "run not final after 90 s (run state running); 2 queued; not done: a queued try 1, no pid, "
        "b queued try 1, no pid"
    ]


def test_sigterm_running_passes_when_the_running_tasks_finished_on_their_first_try() -> None:
    tasks = _tasks(t2=("success", 2))  # queued at the SIGTERM, reset by the new scheduler: try 2 is fine
    out = judge.judge(
        "sigterm-running",
        _result(True, "success"),
        90,
        tasks,
        {},
        None,
        n_tasks=3,
        running_at_sigterm=["id0"],
    )
    assert out == []


def test_sigterm_running_task_cut_short_or_run_again_fails_naming_it() -> None:
    tasks = _tasks(t1=("success", 2), t2=("failed", 1))
    out = judge.judge(
        "sigterm-running",
        _result(True, "failed"),
        90,
        tasks,
        {},
        None,
        n_tasks=3,
        running_at_sigterm=["id-t1", "id-t2"],
    )
    assert out == [
        "tasks not successful: t2 failed try 1, no pid",
        "run ended failed, expected success",
        "tasks running at the SIGTERM did not finish on their first try: "
        "t1 success try 2, no pid, t2 failed try 1, no pid",
    ]


def test_queued_timeout_with_a_task_failed_by_the_stuck_in_queued_check_fails() -> None:
    tasks = _tasks(4, t3=("failed", 1))
    out = judge.judge("queued-timeout", _result(True, "failed"), 240, tasks, {}, None, n_tasks=4)
    assert out == ["tasks not successful: t3 failed try 1, no pid", "run ended failed, expected success"]
    assert judge.judge("queued-timeout", _result(True, "success"), 240, _tasks(4), {}, None, n_tasks=4) == []

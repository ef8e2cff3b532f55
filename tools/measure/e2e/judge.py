"""The verdict on one scenario, from what the API reported and what the driver killed (pure).

A failure is one line that names the task, its state, try and pid, so the summary table
says what went wrong without opening the logs.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from tools.measure.e2e.watch import Json, TaskSnap, WatchResult

# Task instances of tests/e2e/dags/lepatch_e2e.py (lepatch_e2e_orphan.py has one,
# lepatch_e2e_throughput.py --tasks).
N_TASKS = 30
NOT_DONE = frozenset(
    {None, "none", "scheduled", "queued", "running", "up_for_retry", "restarting", "deferred"}
)


@dataclass
class Kill:
    """What the driver killed and what the API said about the task at that moment."""

    t: float
    pid: int
    task_id: str | None
    ti_id: str | None
    try_number: int | None
    state_at_kill: str | None
    detail: str


def judge(
    scenario: str,
    watch: WatchResult,
    deadline: float,
    tasks: dict[str, TaskSnap],
    tries: dict[str, list[Json]],
    kill: Kill | None,
    n_tasks: int = N_TASKS,
    running_at_sigterm: Collection[str] = (),
) -> list[str]:
    """Why the scenario failed, one line per reason; empty when it passed.

    ``running_at_sigterm``: the task instance ids that ran when sigterm-running signalled the
    scheduler; each must end ``success`` on the try it was on (``end()`` lets it finish).
    """
    failures: list[str] = []
    killed = kill.task_id if kill else None
    if scenario in ("kill-running", "kill-queued", "kill-orphan") and kill is None:
        failures.append("the driver never killed a worker (see events)")
    if not watch.final:
        stuck = sorted(
            (ts for ts in tasks.values() if ts.state in NOT_DONE),
            key=lambda ts: (ts.task_id != killed, ts.task_id),
        )
        named = ", ".join(_describe_task(ts, killed) for ts in stuck[:4])
        more = f" and {len(stuck) - 4} more" if len(stuck) > 4 else ""
        failures.append(
            f"run not final after {deadline:g} s (run state {watch.run_state}); "
            f"{_counts_text(tasks)}" + (f"; not done: {named}{more}" if stuck else "")
        )
    if len(tasks) != n_tasks:
        failures.append(f"expected {n_tasks} task instances, the API lists {len(tasks)}")
    others_bad = [ts for ts in tasks.values() if ts.task_id != killed and ts.state != "success"]
    if others_bad and watch.final:
        failures.append(
            "tasks not successful: "
            + ", ".join(_describe_task(ts, killed) for ts in sorted(others_bad, key=lambda t: t.task_id))
        )
    if scenario in ("clean", "throughput", "queued-timeout"):
        again = sorted(ts.task_id for ts in tasks.values() if ts.try_number > 1)
        if again:
            failures.append(f"tasks retried in a clean run: {', '.join(again)}")
    if (
        scenario
        in ("clean", "kill-idle-reader", "sigterm-running", "kill-orphan", "throughput", "queued-timeout")
        and watch.final
        and watch.run_state != "success"
    ):
        failures.append(f"run ended {watch.run_state}, expected success")
    cut = sorted(
        (
            ts
            for ts in tasks.values()
            if ts.ti_id in running_at_sigterm and (ts.state, ts.try_number) != ("success", 1)
        ),
        key=lambda ts: ts.task_id,
    )
    if cut and watch.final:
        failures.append(
            "tasks running at the SIGTERM did not finish on their first try: "
            + ", ".join(_describe_task(ts, None) for ts in cut)
        )
    if kill is not None and kill.task_id is not None:
        failures += _judge_killed(kill, tasks.get(kill.task_id), tries.get(kill.task_id, []), watch.final)
    return failures


def _judge_killed(kill: Kill, ts: TaskSnap | None, tries: list[Json], final: bool) -> list[str]:
    """The killed task must have been failed (its try ended) or re-dispatched, never left hanging."""
    if ts is None:
        return [f"the killed task {kill.task_id} is missing from the run"]
    killed_try = kill.try_number or 1
    first = next((d for d in tries if int(d.get("try_number") or 0) == killed_try), None)
    retried = ts.try_number > killed_try
    if ts.state in NOT_DONE and not retried:
        return [
            f"killed task {_describe_task(ts, None)} was neither failed nor re-dispatched "
            f"({ts.state} since the kill at {kill.t:+.1f} s)"
        ]
    if retried and first is not None and first.get("state") not in ("failed", "up_for_retry"):
        return [f"killed task {kill.task_id}: try {killed_try} ended {first.get('state')}, expected failed"]
    if ts.state not in ("success", "failed") and final:
        return [f"killed task {kill.task_id} ended {ts.state}"]
    return []


def _describe_task(ts: TaskSnap, killed: str | None) -> str:
    mark = " (killed)" if ts.task_id == killed else ""
    pid = f", pid {ts.pid}" if ts.pid else ", no pid"
    return f"{ts.task_id}{mark} {ts.state or 'none'} try {ts.try_number}{pid}"


def _counts_text(tasks: dict[str, TaskSnap]) -> str:
    counts: dict[str, int] = {}
    for ts in tasks.values():
        counts[ts.state or "none"] = counts.get(ts.state or "none", 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

"""``tools.measure.chaos``'s orphaned-task-process invariant, judged over fake observations.

A task process (what the worker forks for a task, as task-sdk's ``supervise``) must be dead
when its key's terminal state is reported, and none may be alive once ``end()`` returned.
Stages from patch 0009's on claim it; earlier ones have it counted, not failing.
"""

from __future__ import annotations

import json
from typing import Any

from tools.measure import bench, chaos

KILL = {"kind": "kill_running", "at_ms": 50, "pick": 0, "fired_ms": 51.0, "pid": 11, "task": "c"}


def _sched() -> dict[str, Any]:
    tasks = [
        {"task_id": "a", "pad": 2048, "fail_bytes": 0, "sleep_ms": 0},
        {"task_id": "b", "pad": 2048, "fail_bytes": 4096, "sleep_ms": 0},
        {"task_id": "c", "pad": 2048, "fail_bytes": 0, "sleep_ms": 300},
    ]
    return {"seed": 1, "run": 2, "tasks": tasks, "faults": [], "end_bound_s": 5.0}


def _obs(c_at_report: str = "gone", c_after_end: str = "gone", **over: Any) -> dict[str, Any]:
    """c's worker (pid 11) was killed running it; its task process is 21."""
    obs: dict[str, Any] = {
        "run": 2,
        "dispatched": ["a", "b", "c"],
        "not_taken": [],
        "events": [["a", "success", None, 0.1], ["b", "failed", "b", 0.1], ["c", "failed", None, 0.2]],
        "tokens": [["b", "b"]],
        "faults": [KILL],
        "started": [["a", 11], ["b", 12], ["c", 11]],
        "done": [["a", 11], ["b", 12]],
        "end_s": 0.1,
        "at_report": [
            ["a", 20, "success", 0.1, "gone"],
            ["b", 22, "failed", 0.1, "Z"],
            ["c", 21, "failed", 0.2, c_at_report],
        ],
        "after_end": [["a", 20, "gone"], ["b", 22, "X"], ["c", 21, c_after_end]],
        "task_exits": [["a", 20, 0.05], ["b", 22, 0.06]],
    }
    obs.update(over)
    return obs


def test_a_clean_observation_passes():
    v = chaos.check(_sched(), _obs())
    assert v.ok, v.problems()
    assert v.orphans == [] and v.orphans_judged
    # Gone, a zombie and a dead process all count as dead.
    assert chaos.check(_sched(), _obs(c_at_report="Z", c_after_end="X")).ok


def test_a_task_process_alive_when_its_key_is_reported_is_an_orphan():
    obs = _obs(c_at_report="S", task_exits=[["a", 20, 0.05], ["b", 22, 0.06], ["c", 21, 0.35]])
    v = chaos.check(_sched(), obs)
    assert v.orphans == [
        "c: task process 21 alive (S) when the key was reported failed; it ran on 150 ms more"
    ]
    assert not v.ok
    assert "orphan: " + v.orphans[0] in v.problems()
    # The other invariants are untouched by it: c may be reported failed, its worker was killed.
    assert not (v.lost or v.misattributed or v.hang or v.error)


def test_a_task_process_alive_after_end_is_an_orphan():
    v = chaos.check(_sched(), _obs(c_at_report="S", c_after_end="R"))
    assert v.orphans == [
        "c: task process 21 alive (S) when the key was reported failed;"
        " it was still running when the run was over",
        "c: task process 21 alive (R) after end() returned",
    ]
    assert not v.ok


def test_a_stage_before_0009_counts_orphans_without_failing():
    v = chaos.check(_sched(), _obs(c_at_report="S"), orphans_claimed=False)
    assert len(v.orphans) == 1 and v.ok and v.problems() == []
    summary = chaos.StageSummary(bench.Stage(8, "0008-x.patch", b""), [v], 1.0)
    assert summary.ok and summary.orphans == 1 and not summary.orphans_claimed
    doc = json.loads(json.dumps(summary.to_json()))
    assert doc["orphan_task_processes"] == 1 and doc["orphans_claimed"] is False
    assert doc["verdicts"][0]["orphans"] == v.orphans


def test_an_observation_without_task_processes_judges_nothing():
    obs = _obs()
    for name in ("at_report", "after_end", "task_exits"):
        del obs[name]
    v = chaos.check(_sched(), obs)
    assert v.ok and not v.orphans_judged
    table = chaos.render([chaos.StageSummary(bench.Stage(9, "0009-x.patch", b""), [v], 1.0)])
    assert "orphans" not in table


def test_the_stage_that_claims_it_is_found_by_name_in_the_series():
    names = [f"000{k}-something.patch" for k in range(1, 9)]
    assert chaos.orphans_claimed_from(names) is None
    names.append("0009-kill-a-dead-localexecutor-workers-task-processes.patch")
    assert chaos.orphans_claimed_from(names) == 9
    assert chaos.orphans_claimed_from(["0001-kill-a-dead-localexecutor-workers-task-processes.patch"]) == 1


def test_the_table_counts_orphans_and_marks_unclaimed_stages():
    old = chaos.check(_sched(), _obs(c_at_report="S"), orphans_claimed=False)
    new = chaos.check(_sched(), _obs(c_at_report="S", c_after_end="S"))
    summaries = [
        chaos.StageSummary(bench.Stage(8, "0008-x.patch", b""), [old], 1.0),
        chaos.StageSummary(bench.Stage(9, "0009-x.patch", b""), [new], 1.0),
    ]
    header, row8, row9 = chaos.render(summaries).splitlines()
    assert header.split()[-1] == "orphans"
    assert row8.split()[-1] == "1*" and row9.split()[-1] == "2"
    assert summaries[0].ok and not summaries[1].ok and summaries[1].failing == [new]
    note = chaos.render_orphans_note(summaries, 9)
    assert "bound 0" in note and "claimed from stage 9" in note and "* = a stage before it" in note

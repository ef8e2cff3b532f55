"""kill-orphan: marks parsing, the overlap of two tries, and the scenario's verdict (no Airflow)."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_options import e2e_options

from tools.measure.e2e import driver, judge, orphan
from tools.measure.e2e.judge import Kill
from tools.measure.e2e.orphan import Mark
from tools.measure.e2e.watch import Json, TaskSnap, WatchResult

KILL = 1000.0


def _marks(try_number: int, pid: int, start: float, n: int) -> list[Mark]:
    return [Mark(try_number, pid, start + i) for i in range(n)]


def _text(marks: list[Mark]) -> str:
    return "".join(f"{m.try_number} {m.pid} {m.t:.3f}\n" for m in marks)


def test_parse_marks_skips_torn_and_foreign_lines() -> None:
    text = "1 4242 1000.125\n\n1 4242 1001.5 extra\nnot a mark\n2 x 1002.0\n2 4343 1003.250\n1 42"
    assert orphan.parse_marks(text) == [Mark(1, 4242, 1000.125), Mark(2, 4343, 1003.25)]


def test_read_marks_of_a_missing_file_is_empty(tmp_path: Path) -> None:
    assert orphan.read_marks(tmp_path / "none.txt") == []
    p = tmp_path / "marks.txt"
    p.write_text(_text(_marks(1, 7, KILL, 2)))
    assert orphan.read_marks(p) == _marks(1, 7, KILL, 2)


def test_overlap_is_the_span_both_tries_marked() -> None:
    a = _marks(1, 1, 0.0, 11)  # 0 .. 10
    assert orphan.overlap(a, _marks(2, 2, 4.0, 20)) == 6.0  # 4 .. 23
    assert orphan.overlap(a, _marks(2, 2, 10.0, 3)) == 0.0  # touches at one instant
    assert orphan.overlap(a, _marks(2, 2, 12.0, 3)) == 0.0  # after
    assert orphan.overlap(a, []) == 0.0
    assert orphan.overlap([], a) == 0.0
    assert orphan.overlap(_marks(2, 2, 3.0, 2), a) == 1.0  # inside


def test_figures_of_an_orphan_that_ran_beside_its_retry() -> None:
    # Try 1 marked from kill-2 to kill+37 (the orphan), try 2 from kill+7 for 40 s.
    marks = _marks(2, 20, KILL + 7, 40) + _marks(1, 10, KILL - 2, 40)
    fig = orphan.figures(marks, KILL)
    assert fig.killed_marks == 40 and fig.killed_marks_after_kill == 37
    assert (fig.killed_pids, fig.retry_pids, fig.retry_marks) == ((10,), (20,), 40)
    assert fig.killed_lived_after_kill_s == 37.0
    assert fig.retry_started_after_kill_s == 7.0
    assert fig.overlap_s == 30.0
    assert fig.killed_marks_during_retry == 31  # kill+7 .. kill+37
    assert "overlap 30.0 s" in fig.text()
    assert fig.as_json()["overlap_s"] == 30.0


def test_figures_when_the_kill_took_the_task_process_along() -> None:
    marks = _marks(1, 10, KILL - 1.9, 2) + _marks(2, 20, KILL + 7.03, 40)
    fig = orphan.figures(marks, KILL)
    assert fig.killed_lived_after_kill_s == -0.9
    assert fig.retry_started_after_kill_s == 7.03
    assert (fig.overlap_s, fig.killed_marks_after_kill, fig.killed_marks_during_retry) == (0.0, 0, 0)
    assert fig.text() == (
        "try 1 last marked at kill -0.9 s (0 marks after the kill), try 2 first marked at kill +7.0 s, "
        "overlap 0.0 s (0 try-1 marks during try 2)"
    )


def test_figures_without_a_retry() -> None:
    fig = orphan.figures(_marks(1, 10, KILL - 1, 40), KILL)
    assert fig.retry_started_after_kill_s is None and fig.retry_marks == 0
    assert fig.overlap_s == 0.0 and fig.killed_marks_during_retry == 0
    assert "try 2 first marked at kill -," in fig.text()


def test_judge_marks() -> None:
    clean = orphan.figures(_marks(1, 10, KILL - 1.5, 2) + _marks(2, 20, KILL + 7, 40), KILL)
    assert orphan.judge_marks(clean, True, "success") == []
    side_by_side = orphan.figures(_marks(1, 10, KILL - 2, 40) + _marks(2, 20, KILL + 7, 40), KILL)
    assert orphan.judge_marks(side_by_side, True, "success") == [
        "try 1 (pid 10) kept running +37.0 s after its worker was SIGKILLed; "
        "try 2 (pid 20) ran beside it for 30.0 s"
    ]
    # A single try-1 mark at the very instant try 2 starts is overlap too, even with a zero span.
    touching = orphan.figures(_marks(1, 10, KILL - 2, 10) + _marks(2, 20, KILL + 7, 5), KILL)
    assert touching.overlap_s == 0.0 and touching.killed_marks_during_retry == 1
    assert orphan.judge_marks(touching, True, "success") != []
    no_retry = orphan.figures(_marks(1, 10, KILL - 1, 2), KILL)
    assert orphan.judge_marks(no_retry, False, "running") == []  # the deadline is judge.judge's to report
    assert orphan.judge_marks(no_retry, True, "success") == [
        "the run succeeded but try 2 left no marks; cannot tell the overlap"
    ]
    assert orphan.judge_marks(orphan.figures([], KILL), False, "running") == [
        "no marks from try 1: the task never wrote the marks file"
    ]
    assert orphan.judge_marks(None, True, "success") == [
        "no worker was killed, so nothing to measure (see events)"
    ]


def _watch(final: bool, state: str) -> WatchResult:
    return WatchResult(final=final, run_state=state, elapsed=60.0, last=None, transitions=[], api_errors=0)


@pytest.mark.parametrize(
    ("final", "state", "want"),
    [
        (True, "success", []),
        (True, "failed", ["run ended failed, expected success"]),
    ],
)
def test_judge_kill_orphan_run_state(final: bool, state: str, want: list[str]) -> None:
    kill = Kill(15.0, 99, "mark", "id-mark", 1, "running", "")
    tasks = {"mark": TaskSnap("mark", "id-mark", "success" if state == "success" else "failed", 2)}
    tries: dict[str, list[Json]] = {
        "mark": [{"try_number": 1, "state": "failed"}, {"try_number": 2, "state": tasks["mark"].state}]
    }
    assert judge.judge("kill-orphan", _watch(final, state), 150, tasks, tries, kill, n_tasks=1) == want


def test_judge_kill_orphan_without_a_kill_or_past_the_deadline() -> None:
    tasks = {"mark": TaskSnap("mark", "id-mark", "up_for_retry", 1)}
    out = judge.judge("kill-orphan", _watch(False, "running"), 150, tasks, {}, None, n_tasks=1)
    assert out[0] == "the driver never killed a worker (see events)"
    assert out[1].startswith("run not final after 150 s (run state running)")


def test_kill_orphan_gets_its_own_dag_and_a_longer_deadline() -> None:
    assert driver.SCENARIOS["kill-orphan"]().dag().file.is_file()
    assert driver.SCENARIOS["kill-orphan"]().dag().n_tasks == 1
    assert driver.SCENARIOS["kill-running"]().dag() == driver.MAIN_DAG
    assert driver.SCENARIOS["kill-orphan"]().deadline(120.0) == driver.ORPHAN_DEADLINE
    assert driver.SCENARIOS["kill-orphan"]().deadline(400.0) == 400.0
    assert driver.SCENARIOS["kill-running"]().deadline(120.0) == 120.0


def test_summary_table_prints_the_orphan_figures(tmp_path: Path) -> None:
    opts = e2e_options(stage=8, parallelism=8, scenarios=["kill-orphan"], out=tmp_path)
    fig = orphan.figures(_marks(1, 10, KILL - 2, 40) + _marks(2, 20, KILL + 7, 40), KILL)
    r = driver.ScenarioResult(
        name="kill-orphan",
        passed=False,
        failures=orphan.judge_marks(fig, True, "success"),
        run_state="running",
        final=False,
        timings={"deadline_s": 150.0, "ready_s": 20.0},
        counts={},
        kill=None,
        events=[],
        health_at_end=None,
        stop={},
        timeline="",
        logs="",
        extra={"orphan_summary": fig.text()},
    )
    lines = driver.summary_table(opts, "stage 8 of 3.3", [r]).splitlines()
    assert ">150s" in lines[2] and "kept running +37.0 s" in lines[2]
    assert lines[3] == f"kill-orphan: {fig.text()}"

"""CPU per finished task by component over the throughput run's window, from synthetic snapshots,
and the ceiling it sets: the split, the diff, reaped children counted once, medians and the table."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from e2e_options import e2e_options

from tools.measure.e2e import cputime, driver, looptrace, procfs
from tools.measure.e2e.cputime import SCHED_CHILDREN, SCHEDULER, TASKS, WORKERS, CpuFigures, Root, Snapshot

IDLE = "airflow worker -- LocalExecutor: <idle>"
BUSY = "airflow worker -- LocalExecutor: 0191c7a4-0000-7000-8000-000000000001"


def st(pid: int, ppid: int, own: float = 0.0, reaped: float = 0.0, start: float | None = None) -> procfs.Cpu:
    """A process with ``own`` seconds of its own CPU and ``reaped`` of its reaped children's."""
    return procfs.Cpu(pid, ppid, float(pid if start is None else start), own, reaped)


ROOTS = [
    Root("api-server", 30),
    Root("scheduler", 10, cputime.LOCAL_SCHEDULER),
    Root("dag-processor", 60),
    Root("postgres", 40),
]


def _start() -> Snapshot:
    return Snapshot(
        100.0,
        (
            st(1, 0, 500.0),  # init: not ours
            st(10, 1, 100.0),  # the scheduler
            st(11, 10, 5.0),  # worker
            st(12, 10, 6.0, 2.0),  # worker, has reaped a task before the window
            st(13, 10, 1.0),  # serve_logs
            st(20, 11, 10.0),  # a task process of worker 11, reaped in the window
            st(50, 12, 30.0, start=1),  # a task process of worker 12 whose pid is reused later
            st(30, 1, 40.0),  # api-server
            st(31, 30, 3.0),  # its child
            st(40, 1, 2.0, 100.0),  # postmaster, reaped backends of earlier runs
            st(41, 40, 50.0),  # a backend, gone at the end
            st(60, 1, 20.0),  # dag-processor
            st(99, 1, 1000.0),  # unrelated load
        ),
        {11: IDLE, 12: IDLE, 13: "airflow serve-logs"},
    )


def _end() -> Snapshot:
    return Snapshot(
        130.0,
        (
            st(1, 0, 600.0),
            st(10, 1, 150.0),  # +50
            # +20 own; reaped task 20 at 40 s and task 21 (born and reaped in the window) at 70 s
            st(11, 10, 25.0, 110.0),
            # +4 own; reaped the old pid 50 at 35 s
            st(12, 10, 10.0, 37.0),
            st(13, 10, 1.5),  # +0.5
            st(22, 12, 15.0),  # a live task process (new)
            st(23, 22, 5.0),  # what it started
            st(24, 11, 1.0),  # exited, not reaped yet: still its own times
            st(50, 12, 4.0, start=2),  # pid 50 again: a new task process
            st(30, 1, 55.0),  # +15
            st(31, 30, 4.0),  # +1
            # reaped backend 41 at 60 s and backend 42 (born and reaped in the window) at 20 s
            st(40, 1, 3.0, 180.0),
            st(43, 40, 7.0),  # a live backend (new)
            st(60, 1, 26.0),  # +6
            st(99, 1, 5000.0),
        ),
        {11: BUSY, 12: IDLE, 13: "airflow serve-logs"},
    )


def test_window_splits_the_stack_by_component_and_counts_each_reaped_child_once() -> None:
    got = cputime.window(_start(), _end(), ROOTS)
    assert got[SCHEDULER] == pytest.approx(50.0)
    assert got[WORKERS] == pytest.approx(20.0 + 4.0)
    # task 20: 40 - 10; task 21: 70; old pid 50: 35 - 30; new pid 50: 4; 22 and 23: 15 + 5; zombie 24: 1
    assert got[TASKS] == pytest.approx(30.0 + 70.0 + 5.0 + 4.0 + 20.0 + 1.0)
    assert got[SCHED_CHILDREN] == pytest.approx(0.5)
    assert got["api-server"] == pytest.approx(16.0)
    # postmaster +1; backend 41: 60 - 50; backend 42: 20; backend 43: 7
    assert got["postgres"] == pytest.approx(1.0 + 10.0 + 20.0 + 7.0)
    assert got["dag-processor"] == pytest.approx(6.0)
    assert set(got) == {SCHEDULER, WORKERS, TASKS, SCHED_CHILDREN, "api-server", "postgres", "dag-processor"}


def test_window_is_the_difference_not_the_cumulative_cpu() -> None:
    same = cputime.window(_start(), _start(), ROOTS)
    assert all(v == pytest.approx(0.0) for v in same.values())
    # What the scheduler had used before the trigger is not in the window.
    assert cputime.window(_start(), _end(), ROOTS)[SCHEDULER] != pytest.approx(150.0)


def test_a_child_that_was_there_and_one_born_in_the_window_reaped_by_the_same_parent() -> None:
    roots = [Root("dag-processor", 1)]
    start = Snapshot(0.0, (st(1, 0, 1.0), st(2, 1, 3.0)))
    # 2 ended at 5 s, 3 ran 2 s and ended, both reaped by 1: 1's cutime is 7
    end = Snapshot(1.0, (st(1, 0, 1.0, 7.0),))
    assert cputime.window(start, end, roots) == {"dag-processor": pytest.approx(2.0 + 2.0)}


def test_a_grandchild_gone_with_its_parent_is_taken_off_the_ancestor_still_there() -> None:
    roots = [Root("scheduler", 10, cputime.LOCAL_SCHEDULER)]
    start = Snapshot(0.0, (st(10, 1), st(11, 10), st(20, 11, 2.0), st(21, 20, 1.0)), {11: BUSY})
    # 20 reaped 21 (then at 3 s) and ended at 4 s own: worker 11's cutime is 7 s
    end = Snapshot(1.0, (st(10, 1), st(11, 10, 0.0, 7.0)), {11: IDLE})
    assert cputime.window(start, end, roots)[TASKS] == pytest.approx(7.0 - 2.0 - 1.0)


def test_a_worker_the_scheduler_reaped_counts_as_workers_with_its_tasks() -> None:
    roots = [Root("scheduler", 10, cputime.LOCAL_SCHEDULER)]
    start = Snapshot(0.0, (st(10, 1, 1.0), st(11, 10, 2.0, 3.0), st(20, 11, 1.0)), {11: IDLE})
    end = Snapshot(1.0, (st(10, 1, 1.5, 9.0),))  # worker 11 exited (9 s in all, its tasks' included)
    got = cputime.window(start, end, roots)
    assert got[SCHEDULER] == pytest.approx(0.5)
    # Its tasks' part cannot be told apart from its own once it is reaped: all of it is workers'.
    assert got[WORKERS] == pytest.approx(9.0 - 5.0 - 1.0)
    assert got.get(TASKS, 0.0) == pytest.approx(0.0)


def test_a_root_that_is_gone_counts_nothing_rather_than_less_than_nothing() -> None:
    roots = [Root("api-server", 30)]
    start = Snapshot(0.0, (st(30, 1, 10.0), st(31, 30, 1.0)))
    end = Snapshot(1.0, (st(1, 0, 99.0),))
    assert cputime.window(start, end, roots) == {}


def test_celery_workers_and_their_pool_children_are_workers_what_those_fork_tasks() -> None:
    roots = [Root(WORKERS, 70, cputime.WORKER_POOL), Root("scheduler", 10, cputime.LOCAL_SCHEDULER)]
    start = Snapshot(0.0, (st(10, 1), st(70, 1, 5.0), st(71, 70, 1.0), st(80, 71, 0.5)))
    end = Snapshot(1.0, (st(10, 1, 2.0), st(70, 1, 6.0), st(71, 70, 3.0, 4.0), st(81, 71, 1.0)))
    got = cputime.window(start, end, roots)
    assert got[WORKERS] == pytest.approx(1.0 + 2.0)
    assert got[TASKS] == pytest.approx((4.0 - 0.5) + 1.0)
    assert got[SCHEDULER] == pytest.approx(2.0)


def test_take_reads_the_titles_of_the_schedulers_children_only() -> None:
    stats = [st(10, 1), st(11, 10), st(12, 10), st(20, 11), st(30, 1)]
    asked: list[int] = []

    def title(pid: int) -> str:
        asked.append(pid)
        if pid == 12:
            raise procfs.ProcGone(pid)
        return IDLE

    snap = cputime.take(
        [Root("scheduler", 10, cputime.LOCAL_SCHEDULER), Root("api-server", 30)], lambda: stats, title
    )
    assert sorted(asked) == [11, 12]
    assert dict(snap.titles) == {11: IDLE}
    assert snap.stats == tuple(stats)
    # An untitled child of the scheduler (gone before its title was read) is not a worker.
    assert cputime.categorise(snap, [Root("scheduler", 10, cputime.LOCAL_SCHEDULER)])[(12, 12)] == (
        SCHED_CHILDREN,
        SCHED_CHILDREN,
    )


def test_take_reads_this_machine() -> None:
    me = os.getpid()
    snap = cputime.take([Root("driver", me)])
    assert any(s.pid == me and s.created > 0 for s in snap.stats)


def test_cores_is_the_affinity_set_lowered_by_a_cgroup_quota(tmp_path: Path) -> None:
    own = tmp_path / "cgroup"
    own.write_text("0::/lepatch/job\n")
    (tmp_path / "fs" / "lepatch" / "job").mkdir(parents=True)
    quota = tmp_path / "fs" / "lepatch" / "job" / "cpu.max"

    def cores() -> float:
        return cputime.cores(lambda: {0, 1, 2, 3}, tmp_path / "fs", own)

    assert cores() == 4.0  # no cpu.max
    quota.write_text("max 100000\n")
    assert cores() == 4.0
    quota.write_text("150000 100000\n")
    assert cores() == 1.5
    quota.write_text("800000 100000\n")
    assert cores() == 4.0
    assert 0 < cputime.cores() <= len(os.sched_getaffinity(0))


# -- the ceiling --------------------------------------------------------------------------------------


def _figs(
    tasks_per_s: float, cpu: dict[str, float], executor: float | None = 1.0, tasks: int = 200
) -> CpuFigures:
    return CpuFigures(tasks, tasks_per_s, 40.0, 2.0, cpu, executor)


CPU = {SCHEDULER: 20.0, WORKERS: 10.0, TASKS: 30.0, "api-server": 16.0, "dag-processor": 4.0}  # 80 s


def test_ceiling_is_cores_over_cpu_per_task_and_the_fraction_is_the_runs_share_of_it() -> None:
    f = _figs(4.0, CPU)
    assert f.total_s == pytest.approx(80.0)
    assert f.per_task(f.total_s) == pytest.approx(0.4)
    assert f.ceiling == pytest.approx(2.0 / 0.4)  # 5 tasks/s on 2 cores
    assert f.fraction == pytest.approx(4.0 / 5.0)
    assert CpuFigures(0, None, 1.0, 2.0, {}).ceiling is None
    assert CpuFigures(10, None, 1.0, 2.0, CPU).fraction is None


def test_figures_from_snapshots_and_back_through_json() -> None:
    f = cputime.figures(_start(), _end(), ROOTS, tasks=100, tasks_per_s=2.5, executor_s=3.0, n_cores=2)
    assert f.window_s == pytest.approx(30.0)
    assert f.total_s == pytest.approx(50 + 24 + 130 + 0.5 + 16 + 38 + 6)
    j = f.as_json()
    assert j["total_cpu_s_per_task"] == pytest.approx(f.total_s / 100, abs=1e-5)
    assert j["fraction_of_ceiling"] == pytest.approx(2.5 / (2 / (f.total_s / 100)), abs=1e-3)
    back = CpuFigures.from_json(j)
    assert back.cpu_s == pytest.approx(f.cpu_s) and back.executor_s == 3.0 and back.tasks == 100
    assert "ceiling on 2 cores" in f.text() and "executor heartbeat 30.0" in f.text()


def test_median_row_takes_each_figure_over_the_rounds() -> None:
    runs = [
        _figs(4.0, CPU, executor=1.0),
        _figs(5.0, {**CPU, TASKS: 50.0}, executor=None),  # a round without the loop trace
        _figs(3.0, {**CPU, TASKS: 10.0}, executor=3.0),
    ]
    row = cputime.median_row("full series", runs)
    assert row.runs == 3
    assert row.tasks_per_s == pytest.approx(4.0)
    assert row.total == pytest.approx(0.4)  # totals 0.3, 0.4, 0.5 s per task
    assert row.per_task[TASKS] == pytest.approx(0.15)
    assert row.ceiling == pytest.approx(5.0)  # 2 / 0.4
    assert row.fraction == pytest.approx(0.8)  # 4/5, 5/4, 3/(2/0.3)
    assert row.executor == pytest.approx(2.0 / 200)  # the two rounds that have it
    assert row.workers == pytest.approx(0.05)
    assert row.executor_workers == pytest.approx((2.0 + 10.0) / 200)
    assert cputime.median_row("stage 0", []).runs == 0


def test_largest_other_leaves_out_the_workers_and_the_executors_share_of_the_scheduler() -> None:
    row = cputime.median_row("x", [_figs(4.0, {SCHEDULER: 30.0, WORKERS: 50.0, "api-server": 25.0}, 10.0)])
    assert row.largest_other() == pytest.approx(("api-server", 0.125))  # scheduler without executor: 20 s
    row = cputime.median_row("x", [_figs(4.0, {SCHEDULER: 30.0, WORKERS: 50.0, "api-server": 25.0}, None)])
    assert row.largest_other() == pytest.approx((SCHEDULER, 0.15))


def test_the_table_reads_near_the_ceiling_and_idle_cores_and_gives_ratios_to_the_first_row() -> None:
    base = cputime.median_row("stage 0", [_figs(2.0, CPU, executor=2.0)])  # 40 % of the ceiling
    full = cputime.median_row("full series", [_figs(4.8, {**CPU, WORKERS: 15.0}, executor=1.0)])
    none = cputime.median_row("stage 9", [])
    text = cputime.compare([base, full, none], "throughput: CPU")
    lines = text.splitlines()
    assert lines[0] == "throughput: CPU"
    assert "2 cores" in lines[1]
    head, row0, row1, row2 = lines[2:]
    assert head.split()[:6] == ["executor", "runs", "tasks/s", "CPU", "ms", "ceiling"]
    assert "workers" in head and "api" in head and "dag-proc" in head and "postgres" not in head
    assert row0.startswith("stage 0") and "40%" in row0 and "60% of the cores idle" in row0
    assert "1.00x" in row0
    # full: 85 s / 200 tasks = 425 ms, ceiling 4.71, 4.8 tasks/s: 102 % of it
    assert "425.0" in row1 and "4.71" in row1 and "102%" in row1
    assert "near the ceiling: the rest is other components' CPU, most of it task processes (35%)" in row1
    assert "tasks 35%" in row1
    assert " 5.0   0.50x" in row1  # exec: 5 ms per task against 10
    assert " 75.0   1.50x" in row1  # workers: 75 ms against 50
    assert " 80.0   1.33x" in row1  # exec+workers: 80 ms against 60
    assert row2.startswith("stage 9") and "(no CPU figures)" in row2


# -- in the driver ------------------------------------------------------------------------------------


def test_the_throughput_scenario_always_traces_the_schedulers_loops() -> None:
    assert driver.traces_loops(e2e_options(scenarios=["throughput"]))
    assert driver.traces_loops(e2e_options(scenarios=["clean", "throughput"]), "throughput")
    assert not driver.traces_loops(e2e_options(scenarios=["clean", "throughput"]), "clean")
    assert not driver.traces_loops(e2e_options(scenarios=["clean"]))
    assert driver.traces_loops(e2e_options(scenarios=["clean"], trace_loops=True), "clean")
    env = driver.scenario_env(e2e_options(), "throughput", driver.SCENARIOS["throughput"]().dag(), Path("/h"))
    assert env[looptrace.ENV] == "/h/" + looptrace.TRACE_FILE


def _report(stage: int | None, fig: CpuFigures | None, passed: bool = True) -> dict[str, Any]:
    tp = {"tasks": 200, "ended": 200, "wall_s": 40.0, "tasks_per_s": 5.0, "q2s_p50_s": 1.0}
    tp.update(q2s_p95_s=2.0, q2s_max_s=3.0, run_wall_s=41.0)
    extra: dict[str, Any] = {"throughput": tp}
    if fig is not None:
        extra["cpu"] = fig.as_json()
    return {"stage": stage, "scenarios": [{"name": "throughput", "passed": passed, "extra": extra}]}


def test_compare_tables_add_the_cpu_table_of_the_passed_rounds() -> None:
    opts = e2e_options(compare=[0, None], rounds=2)
    reports = [
        _report(0, _figs(2.0, CPU)),
        _report(None, _figs(4.0, CPU, executor=0.5)),
        _report(0, _figs(2.0, {**CPU, TASKS: 1000.0}), passed=False),  # a failed round: left out
        _report(None, _figs(4.0, {**CPU, WORKERS: 30.0}, executor=1.5)),
    ]
    rows = driver.cpu_rows(opts.executor, reports, "throughput")
    assert [r.label for r in rows] == ["stage 0", "full series"]
    assert [r.runs for r in rows] == [1, 2]
    assert rows[0].per_task[TASKS] == pytest.approx(0.15)
    assert rows[1].workers == pytest.approx(0.1)  # 10 and 30 s over 200 tasks
    tables = driver.compare_tables(opts, reports)
    assert set(tables) == {"throughput", "throughput cpu"}
    assert tables["throughput cpu"].startswith("throughput: CPU per finished task and the ceiling")
    assert "ratios to stage 0; medians of 2 rounds" in tables["throughput cpu"].splitlines()[0]
    assert driver.cpu_rows(opts.executor, [_report(0, None), _report(None, None)], "throughput") == []

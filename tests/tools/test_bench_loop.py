"""The scheduler-loop model of ``tools.measure.bench_loop`` against a fake executor on a fake clock, and its
place in ``tools.measure.bench`` (plans, rows, targets, ``--extra``, ``--loop-only``).

Nothing here starts an executor: the probe that does runs inside the stage venvs
(``nox -s bench -- --loop-only --quick``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from tools.measure import bench, bench_loop
from tools.shared.errors import ToolError
from tools.shared.pins import PRIMARY


class Clock:
    """Fake monotonic time: only ``sleep`` moves it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Workload:
    def __init__(self, key: str, duration: float) -> None:
        self.key = key
        self.duration = duration


class FakeExecutor:
    """BaseExecutor's bookkeeping with ``parallelism`` workers that run workloads for their duration.

    ``holds_slots`` is the series (a dispatched key stays in ``running`` until its result is read in
    ``sync()``); without it, unpatched 3.3.2 (nothing counts a dispatched workload, a surplus waits
    in the pipe for the next free worker).
    """

    def __init__(self, clock: Clock, parallelism: int, holds_slots: bool) -> None:
        self.clock = clock
        self.parallelism = parallelism
        self.holds_slots = holds_slots
        self.queued_tasks: dict[str, Workload] = {}
        self.running: set[str] = set()
        self.event_buffer: dict[str, tuple[str, Any]] = {}
        self.backlog: list[tuple[float, Workload]] = []  # the pipe: (time sent, workload)
        self.busy: dict[str, float] = {}  # key -> end time
        self.heartbeats = 0
        self.max_busy = 0

    @property
    def slots_available(self) -> int:
        return self.parallelism - len(self.running) - len(self.queued_tasks)

    @property
    def slots_occupied(self) -> int:
        return len(self.running) + len(self.queued_tasks)

    def queue_workload(self, workload: Workload, session: Any) -> None:
        assert session is None
        self.queued_tasks[workload.key] = workload

    def _start(self, at: float) -> None:
        while self.backlog and len(self.busy) < self.parallelism:
            sent, w = self.backlog.pop(0)
            self.busy[w.key] = max(at, sent) + w.duration
            self.event_buffer[w.key] = ("running", None)
        self.max_busy = max(self.max_busy, len(self.busy))

    def _advance(self) -> list[str]:
        """Finish what has ended by now (in order), each freeing its worker for the backlog."""
        done = []
        while self.busy:
            key, end = min(self.busy.items(), key=lambda kv: kv[1])
            if end > self.clock.now:
                break
            del self.busy[key]
            done.append(key)
            self._start(end)
        return done

    def heartbeat(self) -> None:
        self.heartbeats += 1
        for key, w in list(self.queued_tasks.items()):
            if self.holds_slots:
                self.running.add(key)
            self.backlog.append((self.clock.now, w))
        self.queued_tasks.clear()
        self._start(self.clock.now)
        # sync(): results are read here and only here.
        for key in self._advance():
            self.running.discard(key)
            self.event_buffer[key] = ("success", None)

    def get_event_buffer(self) -> dict[str, tuple[str, Any]]:
        events, self.event_buffer = self.event_buffer, {}
        return events


def _loop(
    clock: Clock, executor: FakeExecutor, durations: list[float], **kw: Any
) -> bench_loop.SchedulerLoop:
    workloads = [(f"t{i}", Workload(f"t{i}", d)) for i, d in enumerate(durations)]
    return bench_loop.SchedulerLoop(
        executor,
        workloads,
        parallelism=executor.parallelism,
        key_of=lambda w: w.key,
        is_terminal=lambda state: state == "success",
        clock=clock,
        sleep=clock.sleep,
        **kw,
    )


def test_a_freed_slot_waits_for_the_idle_sleep_and_one_more_loop():
    """The issue's reading, in the model: results are read in heartbeat(), after slots_available."""
    clock = Clock()
    executor = FakeExecutor(clock, 2, holds_slots=True)
    record = _loop(clock, executor, [0.5, 0.5, 0.5, 0.5], idle_sleep=1.0).run(timeout=60)
    # t0 queues two; the loop sleeps (idle) until 1.0; then heartbeat() reads both results (not idle),
    # and only the next loop, still at 1.0, sees the freed slots and queues the other two.
    assert record.queued_at == {"t0": 0.0, "t1": 0.0, "t2": 1.0, "t3": 1.0}
    assert record.finished_at == {"t0": 1.0, "t1": 1.0, "t2": 2.0, "t3": 2.0}
    assert record.full_loops >= 1 and record.idle_loops == 2
    assert clock.sleeps == [1.0, 1.0]
    assert record.max_in_flight == 2
    assert not record.timed_out


def test_unpatched_bookkeeping_queues_ahead_of_the_workers():
    clock = Clock()
    executor = FakeExecutor(clock, 2, holds_slots=False)
    record = _loop(clock, executor, [0.5, 0.5, 0.5, 0.5], idle_sleep=1.0).run(timeout=60)
    # Nothing counts a dispatched workload: every task is queued at once and waits in the "pipe".
    assert record.queued_at == {"t0": 0.0, "t1": 0.0, "t2": 0.0, "t3": 0.0}
    assert record.max_in_flight == 4
    assert executor.max_busy == 2  # the workers still run two at a time
    assert record.finished_at == {"t0": 1.0, "t1": 1.0, "t2": 1.0, "t3": 1.0}


def test_max_tis_per_query_and_loop_cost():
    clock = Clock()
    executor = FakeExecutor(clock, 8, holds_slots=True)
    loop = _loop(clock, executor, [0.1] * 5, idle_sleep=1.0, max_tis_per_query=3, loop_cost=0.01)
    assert loop.do_scheduling() == 3  # min(max_tis_per_query, parallelism - occupied, free slots)
    assert clock.sleeps == [0.01]
    executor.heartbeat()
    assert loop.do_scheduling() == 2  # only two were left
    assert [t for t, _ in loop.waiting] == []


def test_loop_gives_up_at_its_timeout():
    clock = Clock()
    executor = FakeExecutor(clock, 1, holds_slots=True)
    record = _loop(clock, executor, [100.0, 1.0], idle_sleep=1.0).run(timeout=5)
    assert record.timed_out
    assert record.unfinished == 1
    assert clock.now <= 6.0


def test_plan_tasks_is_seeded_and_within_bounds():
    tasks = bench_loop.plan_tasks(200, 7)
    assert tasks == bench_loop.plan_tasks(200, 7)
    assert tasks != bench_loop.plan_tasks(200, 8)
    assert len({t.task_id for t in tasks}) == 200
    assert all(0.2 <= t.duration <= 3.0 and 0.05 <= t.lag <= 0.3 for t in tasks)
    assert min(t.duration for t in tasks) < 0.5 and max(t.duration for t in tasks) > 2.5


def test_summarize_and_quantile():
    record = bench_loop.LoopRecord(
        started=10.0,
        queued_at={"a": 10.0, "b": 10.0, "c": 11.0},
        finished_at={"a": 12.0, "b": 13.0, "c": 14.0},
    )
    summary = bench_loop.summarize(record, {"a": 10.1, "b": 10.2, "c": 13.0})
    assert summary.tasks_per_s == pytest.approx(3 / 4.0)
    assert summary.start_p50_ms == pytest.approx(200.0)
    assert summary.start_p95_ms == pytest.approx(1820.0)  # 200 + 0.9 * (2000 - 200)
    # Every task is ready at the loop's start (10.0): waits 100, 200 and 3000 ms.
    assert summary.ready_p50_ms == pytest.approx(200.0)
    assert summary.ready_p95_ms == pytest.approx(2720.0)  # 200 + 0.9 * (3000 - 200)
    with pytest.raises(ValueError, match="never recorded a start"):
        bench_loop.summarize(record, {"a": 10.1})
    assert bench_loop.quantile([5.0], 0.95) == 5.0
    with pytest.raises(ValueError):
        bench_loop.quantile([], 0.5)


def test_refill_pairs_each_freed_slot_with_the_next_task_queued():
    record = bench_loop.LoopRecord(queued_at={"a": 0.0, "b": 0.0, "c": 1.0, "d": 2.5, "e": 0.1})
    # Two slots; results ready at 0.5 and 2.0 free the slots "c" (queued 1.0)... the sorted pairing:
    # queued after the first two: [0.1, 1.0, 2.5] vs ready [0.5, 2.0]: gaps 0 (queued ahead), 0 -> 0, ...
    assert bench_loop.refill_p50_ms(record, [0.5, 2.0], 2) == pytest.approx(0.0)
    record = bench_loop.LoopRecord(queued_at={"a": 0.0, "b": 0.0, "c": 1.0, "d": 2.5})
    assert bench_loop.refill_p50_ms(record, [0.5, 2.0], 2) == pytest.approx(500.0)
    assert bench_loop.refill_p50_ms(bench_loop.LoopRecord(), [], 2) == 0.0


# --------------------------------------------------------------------------------------
# bench: the loop figure in the plan, the table and the targets
# --------------------------------------------------------------------------------------


def test_loop_specs_share_seeds_across_stages_and_spread_runs_over_rounds():
    cfg = bench.Config(rounds=2, loop=((200, 16), (30, 8)), loop_runs=3)
    per: dict[str, int] = {}
    for r in range(cfg.rounds):
        for spec in bench.plan_round(cfg, r)["stage"]:
            if spec["kind"] != "loop":
                continue
            name = spec["id"].split("@")[0]
            per[name] = per.get(name, 0) + spec["runs"]
            assert spec["idle_sleep"] == 1.0 and spec["max_tis_per_query"] == 16
            assert spec["wait"] >= 60
            assert bench.row_fields(name)[0] == (f"{name}_tps", "stage", "tasks_per_s")
    assert per == {"loop_200_p16": 3, "loop_30_p8": 3}
    # The plan of a round is the same for every stage: one seed per (configuration, round).
    assert bench.plan_round(cfg, 0) == bench.plan_round(cfg, 0)


def test_loop_only_plans_and_rows_nothing_else():
    cfg = bench.Config.quick()
    cfg.loop_only = True
    plan = bench.plan_round(cfg, 0)
    assert plan["peers"] == [] and {s["kind"] for s in plan["stage"]} == {"loop"}
    assert [r.id for r in bench.rows(cfg)] == [
        "loop_48_p8_tps",
        "loop_48_p8_p50",
        "loop_48_p8_p95",
        "loop_48_p8_ready50",
        "loop_48_p8_ready95",
        "loop_48_p8_refill",
    ]
    assert bench.rows(cfg)[0].better == "higher"
    assert sum(s["n"] for s in plan["stage"]) <= 100  # --quick stays small


def _args(**over: Any) -> argparse.Namespace:
    ns = dict(
        quick=True,
        runs=None,
        rounds=None,
        loop_only=True,
        loop=None,
        loop_runs=None,
        idle_sleep=None,
        loop_cost=None,
        no_loop=False,
    )
    ns.update(over)
    return argparse.Namespace(**ns)


def test_config_from_args():
    cfg = bench.config_from_args(_args(loop="100@4,10@2", loop_runs=4, rounds=2, idle_sleep=0.5))
    assert cfg.loop == ((100, 4), (10, 2)) and cfg.loop_runs == 4 and cfg.rounds == 2
    assert cfg.idle_sleep == 0.5 and cfg.loop_only
    assert bench.config_from_args(_args(rounds=5)).rounds == 1  # never more rounds than runs
    assert bench.config_from_args(_args(loop_only=False, no_loop=True)).loop == ()
    with pytest.raises(ToolError, match="exclude"):
        bench.config_from_args(_args(no_loop=True))
    with pytest.raises(ToolError, match="TASKS@PARALLELISM"):
        bench.parse_loop("200x16")
    with pytest.raises(ToolError, match="TASKS@PARALLELISM"):
        bench.parse_loop("0@4")


def test_parse_extra(tmp_path: Path):
    file = tmp_path / "local_executor.py"
    file.write_text("# a prototype\n")
    stage = bench.parse_extra(f"proto={file}")
    assert (stage.column, stage.short, stage.k) == ("proto", "proto", bench.EXTRA_K)
    assert stage.source == b"# a prototype\n"
    for bad, match in (
        ("proto", "NAME=PATH"),
        (f"9x={file}", "start with a letter"),
        (f"base={file}", "taken"),
        (f"proto={tmp_path / 'missing.py'}", "not a file"),
    ):
        with pytest.raises(ToolError, match=match):
            bench.parse_extra(bad)
    assert bench.Stage(3, "0003-x.patch", b"").column == "3"


def _loop_results() -> bench.Results:
    res = bench.Results()
    res.add(
        "0",
        {
            "id": "loop_48_p8@0",
            "tasks_per_s": [4.0],
            "start_p50_ms": [4000.0],
            "start_p95_ms": [9000.0],
            "ready_p95_ms": [12000.0],
            "loops": [{"loops": 30, "idle": 5, "full": 0, "max_in_flight": 48, "makespan_s": 12.0}],
        },
    )
    res.add("8", {"id": "loop_48_p8@0", "tasks_per_s": [3.0], "start_p50_ms": [8.0], "start_p95_ms": [200.0]})
    res.add(
        "proto",
        {
            "id": "loop_48_p8@0",
            "tasks_per_s": [3.96],
            "start_p50_ms": [9.0],
            "start_p95_ms": [900.0],
            "ready_p95_ms": [10000.0],
        },
    )
    res.add("x", {"id": "loop_48_p8@0", "outcome": "hang: 3 of 48 tasks unfinished after 60s"})
    return res


def test_loop_results_table_and_targets():
    cfg = bench.Config.quick()
    cfg.loop_only = True
    res = _loop_results()
    table = bench.render(res, bench.rows(cfg), [("0", "base"), ("8", "8"), ("proto", "proto"), ("x", "x")])
    lines = {line.split(" (")[0].strip(): line for line in table.splitlines()[1:]}
    assert "4.00 (1.00)" in lines["scheduler loop 48 tasks p8"]
    assert "3.00 (0.75)" in lines["scheduler loop 48 tasks p8"]
    assert "3.96 (0.99)" in lines["scheduler loop 48 tasks p8"]
    assert lines["scheduler loop 48 tasks p8"].rstrip().endswith("hang")
    assert "8.00 (0.00)" in lines["queued -> started p50"]
    assert ("loop_48_p8", "x") in res.blocked
    eight = "\n".join(bench.loop_targets(res, cfg, "8"))
    assert "MISS 48 tasks p8: tasks/s >= 0.97x base: ratio 0.75" in eight
    assert "ok   48 tasks p8: queued->started p95 <= base: ratio 0.02" in eight
    assert "info 48 tasks p8: ready->started p95: ratio -" in eight  # no ready figures recorded
    proto = "\n".join(bench.loop_targets(res, cfg, "proto"))
    assert "ok   48 tasks p8: tasks/s >= 0.97x base: ratio 0.99" in proto
    assert "info 48 tasks p8: ready->started p95: ratio 0.83" in proto
    assert "n/a " in "\n".join(bench.loop_targets(res, cfg, "x"))
    details = bench.render_loop_details(res, [("0", "base"), ("8", "8")])
    assert details == (
        "  loop_48_p8 base: 30 loops, 5 idle (slept), 0 with no free slot while tasks waited, "
        "at most 48 queued or running"
    )


def test_bench_json_names_extra_columns():
    cfg = bench.Config.quick()
    cfg.loop_only = True
    stages = [bench.Stage(0, "base", b"a"), bench.Stage(bench.EXTRA_K, "/tmp/p.py", b"b", label="proto")]
    b = bench.Bench(PRIMARY, stages, cfg, results=_loop_results())
    doc = json.loads(json.dumps(b.to_json(1.0, [])))
    assert doc["stages"][1] == {
        "k": -1,
        "column": "proto",
        "patch": "/tmp/p.py",
        "sha256": doc["stages"][1]["sha256"],
        "extra": True,
    }
    assert doc["details"]["0"]["loop_48_p8"][0]["max_in_flight"] == 48
    row = next(r for r in doc["rows"] if r["id"] == "loop_48_p8_tps")
    assert row["better"] == "higher" and row["cells"]["proto"]["ratio_to_base"] == 0.99

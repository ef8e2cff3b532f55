"""A model of Airflow's scheduler loop driving an executor: the ``loop`` figure of ``python -m tools bench``.

Standard library only: ``tools/measure/bench_probe.py`` imports this file inside each stage venv (where
the ``tools`` package is not importable) and drives a real ``LocalExecutor`` with it; the tests
drive it with a fake executor and a fake clock.

What one iteration does, and in which order, is what apache-airflow-core 3.3.2 does for one
executor (``airflow/jobs/scheduler_job_runner.py``, ``airflow/executors/base_executor.py``):

1. ``_do_scheduling()`` (scheduler_job_runner.py:1804). Its database work is modelled as
   ``loop_cost`` seconds of sleep, before the critical section; then
   - ``total_free_executor_slots = executor.slots_available``; nothing is queued when it is
     ``<= 0`` (1959-1963);
   - ``max_tis = min(max_tis_per_query, parallelism - executor.slots_occupied)`` (1174-1178);
   - ``executor_slots_available = executor.slots_available``, decremented per task instance
     queued (781, 949-958);
   - ``executor.queue_workload(workload)`` for each (1145). A task's "queued" time is taken
     here: the scheduler sets the task instance to QUEUED in the same critical section.
2. ``executor.heartbeat()`` (1816): ``trigger_tasks(parallelism - len(running))``, which calls
   ``_process_workloads``, then ``sync()`` (base_executor.py:348-364).
3. ``_process_executor_events()`` (1821): ``executor.get_event_buffer()`` (1329); the number of
   events (any state, RUNNING included) is what counts as "finished events" (1391).
4. ``idle = not num_queued_tis and not num_finished_events``; an idle loop sleeps
   ``min(scheduler_idle_sleep_time, next_event)`` (1869-1874). ``next_event`` is the time to
   the next timer (the shortest default interval is 10 s), so the sleep is modelled as
   ``idle_sleep`` (``[scheduler] scheduler_idle_sleep_time``, default 1 s).

Every task is ready at the start (one DAG run of independent tasks, no pool or
``max_active_tasks`` limit in the way: the e2e DAG's ``max_active_tasks_per_dag`` is 256).
What a task does in the worker (sleep its duration, then the supervisor's shutdown lag before
the worker reports) is the probe's runner; the start of the task is recorded by the task itself.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LoopTask:
    task_id: str
    duration: float  # seconds the task itself runs
    lag: float  # seconds from the task's end to its worker's result (the supervisor shutting down)


def plan_tasks(
    n: int,
    seed: int,
    duration: tuple[float, float] = (0.2, 3.0),
    lag: tuple[float, float] = (0.05, 0.3),
) -> list[LoopTask]:
    """``n`` tasks with durations and lags drawn uniformly from the ranges: a pure function of ``seed``."""
    rng = random.Random(seed)
    return [
        LoopTask(f"loop_{seed}_{i}", round(rng.uniform(*duration), 3), round(rng.uniform(*lag), 3))
        for i in range(n)
    ]


@dataclass
class LoopRecord:
    """What the loop saw: monotonic times by task id, and how its iterations went."""

    started: float = 0.0  # the loop's start
    queued_at: dict[str, float] = field(default_factory=dict)
    finished_at: dict[str, float] = field(default_factory=dict)  # terminal event processed
    loops: int = 0
    idle_loops: int = 0
    full_loops: int = 0  # slots_available <= 0 while tasks were still waiting to be queued
    max_in_flight: int = 0  # queued and not finished, as the loop saw it
    timed_out: bool = False

    @property
    def unfinished(self) -> int:
        return len(self.queued_at) - len(self.finished_at)


class SchedulerLoop:
    """Drive ``executor`` as ``SchedulerJobRunner._run_scheduler_loop`` does, until every task ended.

    ``workloads`` are ``(task_id, workload)`` in priority order; ``key_of(workload)`` is the
    executor's key for it; ``is_terminal(state)`` tells a terminal event from RUNNING.
    """

    def __init__(
        self,
        executor: Any,
        workloads: Sequence[tuple[str, Any]],
        *,
        parallelism: int,
        key_of: Callable[[Any], Hashable],
        is_terminal: Callable[[Any], bool],
        idle_sleep: float = 1.0,
        max_tis_per_query: int = 16,
        loop_cost: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.executor = executor
        self.waiting = list(workloads)
        self.task_of = {key_of(w): task_id for task_id, w in workloads}
        self.parallelism = parallelism
        self.is_terminal = is_terminal
        self.idle_sleep = idle_sleep
        self.max_tis_per_query = max_tis_per_query
        self.loop_cost = loop_cost
        self.clock = clock
        self.sleep = sleep
        self.record = LoopRecord()

    def do_scheduling(self) -> int:
        """Queue what the executor has room for; return how many (scheduler_job_runner.py:1959)."""
        if self.loop_cost:
            self.sleep(self.loop_cost)
        if not self.waiting or self.executor.slots_available <= 0:
            if self.waiting:
                self.record.full_loops += 1
            return 0
        occupied = int(self.executor.slots_occupied)
        if self.max_tis_per_query == 0:
            max_tis = self.parallelism - occupied
        else:
            max_tis = min(self.max_tis_per_query, self.parallelism - occupied)
        if max_tis <= 0:
            return 0
        take = min(max_tis, int(self.executor.slots_available), len(self.waiting))
        batch, self.waiting = self.waiting[:take], self.waiting[take:]
        for task_id, workload in batch:
            self.record.queued_at[task_id] = self.clock()
            self.executor.queue_workload(workload, session=None)
        return take

    def process_events(self) -> int:
        """Pop the event buffer (scheduler_job_runner.py:1329); return how many events it held."""
        events = self.executor.get_event_buffer()
        now = self.clock()
        for key, (state, _) in events.items():
            task_id = self.task_of.get(key)
            if task_id is not None and self.is_terminal(state):
                self.record.finished_at.setdefault(task_id, now)
        return len(events)

    def step(self) -> bool:
        """One iteration; True when it was idle (and slept)."""
        queued = self.do_scheduling()
        self.executor.heartbeat()
        events = self.process_events()
        rec = self.record
        rec.loops += 1
        rec.max_in_flight = max(rec.max_in_flight, len(rec.queued_at) - len(rec.finished_at))
        idle = not queued and not events
        if idle:
            rec.idle_loops += 1
            self.sleep(self.idle_sleep)
        return idle

    def run(self, timeout: float) -> LoopRecord:
        rec = self.record
        total = len(self.waiting)
        rec.started = self.clock()
        give_up = rec.started + timeout
        while len(rec.finished_at) < total:
            if self.clock() > give_up:
                rec.timed_out = True
                break
            self.step()
        return rec


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile; exact for one sample."""
    ordered = sorted(xs)
    if not ordered:
        raise ValueError("quantile of no samples")
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


@dataclass(frozen=True)
class LoopSummary:
    tasks_per_s: float
    start_p50_ms: float
    start_p95_ms: float
    makespan_s: float
    # From the loop's start, when every task is ready, to the task's start: the whole wait, the
    # time a task waits to be queued included. The e2e table's scheduled-to-start.
    ready_p50_ms: float
    ready_p95_ms: float


def summarize(record: LoopRecord, started: dict[str, float]) -> LoopSummary:
    """Throughput (tasks over the time until the last terminal event was processed), and
    queued-to-start and ready-to-start percentiles (start = the time the task itself recorded in
    the worker; every task is ready when the loop starts)."""
    if not record.finished_at:
        raise ValueError("no task finished")
    missing = sorted(set(record.queued_at) - set(started))
    if missing:
        raise ValueError(f"{len(missing)} queued tasks never recorded a start, e.g. {missing[0]}")
    waits = [(started[t] - record.queued_at[t]) * 1000 for t in record.queued_at]
    whole = [(started[t] - record.started) * 1000 for t in record.queued_at]
    makespan = max(record.finished_at.values()) - record.started
    return LoopSummary(
        tasks_per_s=len(record.finished_at) / makespan if makespan > 0 else float("inf"),
        start_p50_ms=quantile(waits, 0.50),
        start_p95_ms=quantile(waits, 0.95),
        makespan_s=makespan,
        ready_p50_ms=quantile(whole, 0.50),
        ready_p95_ms=quantile(whole, 0.95),
    )


def refill_p50_ms(record: LoopRecord, results_ready: Sequence[float], parallelism: int) -> float:
    """Median time from a slot being freed (a task's result ready in its worker) to the next queueing.

    The k-th result frees the slot that the (parallelism + k)-th task queued is put into; a task
    queued before that result (unpatched 3.3.2 queues ahead of its workers) waited 0 for it.
    """
    queued = sorted(record.queued_at.values())[parallelism:]
    ready = sorted(results_ready)
    gaps = [max(0.0, (q - r) * 1000) for q, r in zip(queued, ready, strict=False)]
    return quantile(gaps, 0.5) if gaps else 0.0

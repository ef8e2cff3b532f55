"""The throughput scenario's CPU per finished task, by component, and the ceiling it sets (pure but ``take``).

Two snapshots of every process's CPU times (psutil) bound the window: one when the DAG run is
triggered, one when the driver sees the run final (before the stack stops). A component's CPU in the
window is the difference of its CPU at the two instants, where a component's CPU at an instant is,
over its processes, their own time (user + system, every thread) and what they reaped (children_user
+ children_system: children that exited and were waited for, with everything those had reaped in
turn). Components:

scheduler
    the scheduler process's own threads; the executor runs in them (its ``heartbeat()`` is a call
    in the scheduler's loop), so the executor's CPU is part of this figure.
workers+supervisors
    the LocalExecutor's worker processes (the scheduler's children with a worker title). In
    Airflow 3 a worker runs task-sdk's supervisor in-process for each workload, so the two are one
    figure. With ``--executor celery``: the ``airflow celery worker`` processes and their prefork
    pool children, which run the supervisor the same way.
task processes
    what the workers forked: their live trees and what the workers reaped.
sched-children
    the scheduler's other children (``serve_logs``).
api-server, dag-processor, triggerer, postgres
    each one's whole tree, live and reaped (PostgreSQL: the postmaster, its backends and background
    processes; the server is shared by every run of an invocation, so only the window's difference
    means anything).

A process that is there at the first snapshot and gone at the second has been reaped meanwhile
(or it is a zombie no more): its time at the first snapshot is taken off the component that
reaped it, the one of its nearest ancestor that is still there, since its whole time is in that
ancestor's cutime now. A process that started and was reaped inside the window is in its reaper's
cutime at the end and nowhere at the start, so it counts once. What the scheduler itself reaps (a
worker that exited, with its task processes) cannot be split and counts as workers+supervisors.
Process identity is pid and psutil's create time, so a reused pid is a new process.

Not counted: the driver (it polls the REST API every ``TP_POLL_INTERVAL``; what that costs the
api-server is counted there), the ``airflow dags trigger`` CLI process, anything else on the
machine, and a process reparented to init (its time reaches none of the trees).

The ceiling is ``cores / (CPU-s per task summed over the components)``: the tasks/s this machine
would reach if every core did nothing but this work at this cost per task. ``cores`` is the
driver's affinity set (the stack inherits it), lowered to a cgroup v2 ``cpu.max`` quota if one is
set. The run's tasks/s over the ceiling is close to the share of the cores the stack kept busy
(the CPU window, trigger to the driver's last poll, is a few seconds longer than the throughput
wall, first queued to last ended, so the fraction reads a little high).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.measure.e2e import procfs

if TYPE_CHECKING:
    from tools.measure.e2e.stack import AirflowStack, Postgres

SCHEDULER = "scheduler"
WORKERS = "workers+supervisors"
TASKS = "task processes"
SCHED_CHILDREN = "sched-children"
# The table's column order; a component no row has gets no column.
ORDER = (SCHEDULER, WORKERS, TASKS, "api-server", "dag-processor", "triggerer", "postgres", SCHED_CHILDREN)
SHORT = {
    WORKERS: "workers",
    TASKS: "tasks",
    "api-server": "api",
    "dag-processor": "dag-proc",
    SCHED_CHILDREN: "sched-ch",
}
# From this fraction of the ceiling on, a stage has no idle cores to speak of: what it could gain
# is in the other components' CPU, and the table names the largest.
NEAR_CEILING = 0.85

# How a root's tree is split (see the module's docstring).
TREE = "tree"  # everything to the root's component
LOCAL_SCHEDULER = "scheduler"  # own -> scheduler; worker children -> workers; below them -> tasks
WORKER_POOL = "worker-pool"  # own and direct children -> workers; below the children -> tasks

Key = tuple[int, float]  # pid, create time: a reused pid is another process


@dataclass(frozen=True)
class Root:
    component: str
    pid: int
    kind: str = TREE


@dataclass(frozen=True)
class Snapshot:
    t: float  # time.monotonic() when it was read
    stats: tuple[procfs.Cpu, ...]
    titles: Mapping[int, str] = field(default_factory=dict)  # the LocalExecutor scheduler's children


def _key(s: procfs.Cpu) -> Key:
    return (s.pid, s.created)


def take(
    roots: Iterable[Root],
    stats: Callable[[], list[procfs.Cpu]] = procfs.cpu_all,
    title: Callable[[int], str] = procfs.cmdline,
) -> Snapshot:
    """Every process's CPU times now, and the titles that tell a LocalExecutor worker from another child."""
    t = time.monotonic()
    got = tuple(stats())
    titles: dict[int, str] = {}
    for root in roots:
        if root.kind != LOCAL_SCHEDULER:
            continue
        for s in got:
            if s.ppid == root.pid:
                with contextlib.suppress(procfs.ProcGone):
                    titles[s.pid] = title(s.pid)
    return Snapshot(t, got, titles)


def _by_parent(snap: Snapshot) -> dict[int, list[procfs.Cpu]]:
    out: dict[int, list[procfs.Cpu]] = {}
    for s in snap.stats:
        out.setdefault(s.ppid, []).append(s)
    return out


def categorise(snap: Snapshot, roots: Iterable[Root]) -> dict[Key, tuple[str, str]]:
    """Each process of the roots' trees: the component its own time counts to, and the component of
    what it reaped."""
    kids = _by_parent(snap)
    by_pid = {s.pid: s for s in snap.stats}
    out: dict[Key, tuple[str, str]] = {}

    def below(pid: int, own: str, reaped: str) -> None:
        todo = list(kids.get(pid, []))
        while todo:
            s = todo.pop()
            out[_key(s)] = (own, reaped)
            todo.extend(kids.get(s.pid, []))

    for root in roots:
        top = by_pid.get(root.pid)
        if top is None:
            continue
        if root.kind == TREE:
            out[_key(top)] = (root.component, root.component)
            below(top.pid, root.component, root.component)
        elif root.kind == LOCAL_SCHEDULER:
            out[_key(top)] = (SCHEDULER, WORKERS)
            for child in kids.get(top.pid, []):
                if procfs.is_worker_title(snap.titles.get(child.pid, "")):
                    out[_key(child)] = (WORKERS, TASKS)
                    below(child.pid, TASKS, TASKS)
                else:
                    out[_key(child)] = (SCHED_CHILDREN, SCHED_CHILDREN)
                    below(child.pid, SCHED_CHILDREN, SCHED_CHILDREN)
        elif root.kind == WORKER_POOL:
            out[_key(top)] = (WORKERS, WORKERS)
            for child in kids.get(top.pid, []):
                out[_key(child)] = (WORKERS, TASKS)
                below(child.pid, TASKS, TASKS)
        else:
            raise ValueError(f"unknown root kind {root.kind!r}")
    return out


def window(start: Snapshot, end: Snapshot, roots: Sequence[Root]) -> dict[str, float]:
    """CPU seconds each component used between the two snapshots."""
    now = categorise(end, roots)
    before = categorise(start, roots)
    out: dict[str, float] = {}

    def add(component: str, seconds: float) -> None:
        out[component] = out.get(component, 0.0) + seconds

    for s in end.stats:
        if (cat := now.get(_key(s))) is not None:
            add(cat[0], s.own)
            add(cat[1], s.reaped)
    then = {s.pid: s for s in start.stats}
    for s in start.stats:
        k = _key(s)
        if k not in before:
            continue
        if k in now:
            # Its end categories, not its start ones: a worker's title changes, not what it is.
            add(now[k][0], -s.own)
            add(now[k][1], -s.reaped)
            continue
        # Gone: all of its time is in the cutime of its nearest ancestor still there.
        parent = then.get(s.ppid)
        while parent is not None and _key(parent) not in now:
            parent = then.get(parent.ppid)
        if parent is not None:
            add(now[_key(parent)][1], -(s.own + s.reaped))
        # No ancestor left (the component's root itself is gone): its time reached nobody we read.
    return out


def cores(
    affinity: Callable[[], set[int]] = lambda: os.sched_getaffinity(0),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    own_cgroup: Path = Path("/proc/self/cgroup"),
) -> float:
    """The cores this process may run on: its affinity set, lowered by a cgroup v2 CPU quota."""
    n = float(len(affinity()))
    try:
        line = next(ln for ln in own_cgroup.read_text().splitlines() if ln.startswith("0::"))
        quota, period = (cgroup_root / line[3:].lstrip("/") / "cpu.max").read_text().split()
    except (OSError, StopIteration, ValueError):
        return n
    if quota == "max":
        return n
    return min(n, int(quota) / int(period))


# -- one run ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuFigures:
    """One throughput run's CPU over its window, and what follows per finished task."""

    tasks: int  # task instances that ended
    tasks_per_s: float | None  # the run's throughput (throughput.Figures.tasks_per_s)
    window_s: float  # trigger -> run final, as the driver saw it
    cores: float
    cpu_s: dict[str, float]  # by component, over the window
    executor_s: float | None = None  # the scheduler thread's CPU in BaseExecutor.heartbeat (loop trace)

    def per_task(self, seconds: float | None) -> float | None:
        return None if seconds is None or not self.tasks else seconds / self.tasks

    @property
    def total_s(self) -> float:
        return sum(self.cpu_s.values())

    @property
    def ceiling(self) -> float | None:
        """tasks/s with every core busy at this CPU per task."""
        per = self.per_task(self.total_s)
        return self.cores / per if per else None

    @property
    def fraction(self) -> float | None:
        c = self.ceiling
        return self.tasks_per_s / c if c and self.tasks_per_s is not None else None

    def as_json(self) -> dict[str, Any]:
        per = {k: self.per_task(v) for k, v in self.cpu_s.items()}
        return {
            "tasks": self.tasks,
            "tasks_per_s": _round(self.tasks_per_s),
            "window_s": round(self.window_s, 3),
            "cores": self.cores,
            "cpu_s": {k: round(v, 3) for k, v in self.cpu_s.items()},
            "executor_s": _round(self.executor_s),
            # derived, for a reader of the report (from_json ignores them)
            "cpu_s_per_task": {k: _round(v, 5) for k, v in per.items()},
            "total_cpu_s_per_task": _round(self.per_task(self.total_s), 5),
            "ceiling_tasks_per_s": _round(self.ceiling),
            "fraction_of_ceiling": _round(self.fraction),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CpuFigures:
        return cls(
            tasks=int(d["tasks"]),
            tasks_per_s=d.get("tasks_per_s"),
            window_s=float(d["window_s"]),
            cores=float(d["cores"]),
            cpu_s={k: float(v) for k, v in d["cpu_s"].items()},
            executor_s=d.get("executor_s"),
        )

    def text(self) -> str:
        parts = (
            ", ".join(f"{k} {1000 * v / self.tasks:.1f}" for k, v in self.cpu_s.items()) if self.tasks else ""
        )
        return (
            f"CPU over {self.window_s:.1f} s: {self.total_s:.1f} s, "
            f"{_ms(self.per_task(self.total_s))} ms per finished task ({parts}; "
            f"executor heartbeat {_ms(self.per_task(self.executor_s))}); ceiling on {self.cores:g} cores "
            f"{_f(self.ceiling)} tasks/s, this run {_pct(self.fraction)} of it"
        )


def figures(
    start: Snapshot,
    end: Snapshot,
    roots: Sequence[Root],
    tasks: int,
    tasks_per_s: float | None,
    executor_s: float | None = None,
    n_cores: float | None = None,
) -> CpuFigures:
    used = window(start, end, roots)
    names = [k for k in ORDER if k in used] + sorted(set(used) - set(ORDER))
    return CpuFigures(
        tasks=tasks,
        tasks_per_s=tasks_per_s,
        window_s=end.t - start.t,
        cores=cores() if n_cores is None else n_cores,
        cpu_s={k: used[k] for k in names if used[k] or k in (SCHEDULER, WORKERS, TASKS)},
        executor_s=executor_s,
    )


def roots_of(stack: AirflowStack, pg: Postgres | None = None) -> list[Root]:
    """What to read for a stack: its components (a Celery stack's workers too) and the database server."""
    out: list[Root] = []
    for name, proc in stack.procs.items():
        if proc.popen is not None:
            out.append(Root(name, proc.pid, LOCAL_SCHEDULER if name == "scheduler" else TREE))
    workers = getattr(stack, "workers", None)  # --executor celery: a CeleryStack's ProcessGroup
    for proc in workers.procs if workers is not None else ():
        if proc.popen is not None:
            out.append(Root(WORKERS, proc.pid, WORKER_POOL))
    if pg is not None and pg.proc.popen is not None:
        out.append(Root("postgres", pg.proc.pid))
    return out


# -- several stages, one table ----------------------------------------------------------------------


@dataclass(frozen=True)
class CpuRow:
    """One stage: the medians over its passed rounds (each figure its own median)."""

    label: str
    runs: int
    tasks_per_s: float | None = None
    total: float | None = None  # CPU-s per task, every component
    ceiling: float | None = None
    fraction: float | None = None
    per_task: dict[str, float | None] = field(default_factory=dict)
    executor: float | None = None  # the executor's heartbeat CPU per task; None: no loop trace
    workers: float | None = None
    executor_workers: float | None = None  # None when the executor's figure is missing
    cores: float | None = None

    def largest_other(self) -> tuple[str, float] | None:
        """The component with the most CPU per task that is neither the executor nor its workers:
        the scheduler counts without its executor's heartbeat where the trace has it."""
        others = {k: v for k, v in self.per_task.items() if v is not None and k != WORKERS}
        if SCHEDULER in others and self.executor is not None:
            others[SCHEDULER] = max(0.0, others[SCHEDULER] - self.executor)
        if not others:
            return None
        name = max(others, key=lambda k: others[k])
        return name, others[name]

    def as_json(self) -> dict[str, Any]:
        big = self.largest_other()
        return {
            "label": self.label,
            "runs": self.runs,
            "tasks_per_s": _round(self.tasks_per_s),
            "cpu_s_per_task": _round(self.total, 5),
            "ceiling_tasks_per_s": _round(self.ceiling),
            "fraction_of_ceiling": _round(self.fraction),
            "cores": self.cores,
            "by_component_cpu_s_per_task": {k: _round(v, 5) for k, v in self.per_task.items()},
            "executor_cpu_s_per_task": _round(self.executor, 5),
            "workers_cpu_s_per_task": _round(self.workers, 5),
            "executor_and_workers_cpu_s_per_task": _round(self.executor_workers, 5),
            "largest_other": big[0] if big else None,
        }


def _median(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def median_row(label: str, figs: Sequence[CpuFigures]) -> CpuRow:
    """A stage's row: field by field, the median over its runs (a run missing a figure is left out of it)."""
    if not figs:
        return CpuRow(label, 0)
    names = [k for k in ORDER if any(k in f.cpu_s for f in figs)]
    names += sorted({k for f in figs for k in f.cpu_s} - set(names))

    def exec_workers(f: CpuFigures) -> float | None:
        if f.executor_s is None:
            return None
        return f.per_task(f.executor_s + f.cpu_s.get(WORKERS, 0.0))

    return CpuRow(
        label=label,
        runs=len(figs),
        tasks_per_s=_median(f.tasks_per_s for f in figs),
        total=_median(f.per_task(f.total_s) for f in figs),
        ceiling=_median(f.ceiling for f in figs),
        fraction=_median(f.fraction for f in figs),
        per_task={k: _median(f.per_task(f.cpu_s.get(k, 0.0)) for f in figs) for k in names},
        executor=_median(f.per_task(f.executor_s) for f in figs),
        workers=_median(f.per_task(f.cpu_s.get(WORKERS, 0.0)) for f in figs),
        executor_workers=_median(exec_workers(f) for f in figs),
        cores=_median(f.cores for f in figs),
    )


def reading(row: CpuRow) -> str:
    """What the fraction of the ceiling says about the stage."""
    if row.fraction is None:
        return "-"
    if row.fraction >= NEAR_CEILING:
        big = row.largest_other()
        if big is None or not row.total:
            return "near the ceiling"
        share = big[1] / row.total
        return f"near the ceiling: the rest is other components' CPU, most of it {big[0]} ({share:.0%})"
    return f"{1 - row.fraction:.0%} of the cores idle"


def compare(rows: Sequence[CpuRow], title: str) -> str:
    """The CPU table: per stage, CPU per finished task (ms) by component and the ceiling it sets, the
    largest component that is not the executor's, and the executor's and its workers' CPU per task as
    ratios to the first row."""
    names = [k for k in ORDER if any(k in r.per_task for r in rows)]
    names += sorted({k for r in rows for k in r.per_task} - set(names))
    base = rows[0] if rows else CpuRow("", 0)
    cores_seen = sorted({r.cores for r in rows if r.cores is not None})
    head = (
        f"{'executor':<14}{'runs':>5}{'tasks/s':>9}{'CPU ms':>8}{'ceiling':>9}{'of ceil':>8}"
        + "".join(f"{SHORT.get(k, k):>10}" for k in names)
        + f"  {'largest other':<16}{'exec':>7}{'x base':>8}{'workers':>9}{'x base':>8}"
        + f"{'exec+wk':>9}{'x base':>8}  reading"
    )
    out = [
        title,
        "CPU ms per finished task, trigger -> run final; ceiling = cores / CPU-s per task, tasks/s "
        f"({', '.join(f'{c:g}' for c in cores_seen) or '?'} cores); exec = the executor's heartbeat() in "
        "the scheduler (loop trace; - without it); workers = workers+supervisors (one process each)",
        head,
    ]
    for r in rows:
        if not r.runs:
            out.append(f"{r.label:<14}{0:>5}  (no CPU figures)")
            continue
        big = r.largest_other()
        largest = f"{SHORT.get(big[0], big[0])} {big[1] / r.total:.0%}" if big and r.total else "-"
        out.append(
            f"{r.label:<14}{r.runs:>5}{_f(r.tasks_per_s):>9}{_ms(r.total):>8}{_f(r.ceiling):>9}"
            f"{_pct(r.fraction):>8}"
            + "".join(f"{_ms(r.per_task.get(k)):>10}" for k in names)
            + f"  {largest:<16}"
            + "".join(
                f"{_ms(v):>{w}}{_x(v, b):>8}"
                for v, b, w in (
                    (r.executor, base.executor, 7),
                    (r.workers, base.workers, 9),
                    (r.executor_workers, base.executor_workers, 9),
                )
            )
            + f"  {reading(r)}"
        )
    return "\n".join(out)


def _round(v: float | None, digits: int = 3) -> float | None:
    return None if v is None else round(v, digits)


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{1000 * v:.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def _x(v: float | None, b: float | None) -> str:
    return "-" if v is None or not b else f"{v / b:.2f}x"

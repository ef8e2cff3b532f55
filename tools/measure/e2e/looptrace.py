"""``--trace-loops``: how often the real scheduler loops, and how long its executor's heartbeat blocks it.

The scheduler's CPU is what the throughput scenario shows the series costs on a machine whose cores
the task processes fill. Where it goes is Airflow's, not the executor's: every scheduler loop
examines the running DAG run's task instances, so the CPU follows the number of loops, and a
scheduler whose ``heartbeat()`` blocks on a full pipe (the unpatched executor, apache/airflow#70526)
loops less. The hook (``looptrace_hook.py``) records each loop from inside the scheduler; this module
installs it into the e2e venv for one session and sums up what it wrote.
"""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tools.measure.e2e import looptrace_hook

HOOK_NAME = "lepatch_looptrace"
ENV = looptrace_hook.ENV
TRACE_FILE = "looptrace.txt"


def install(site: Path) -> None:
    """Put the hook into ``site`` (inert in every process unless ``ENV`` is set)."""
    shutil.copyfile(looptrace_hook.__file__, site / f"{HOOK_NAME}.py")
    (site / f"{HOOK_NAME}.pth").write_text(f"import {HOOK_NAME}; {HOOK_NAME}.install()\n")


def uninstall(site: Path) -> None:
    for name in (f"{HOOK_NAME}.pth", f"{HOOK_NAME}.py"):
        (site / name).unlink(missing_ok=True)
    for cached in (site / "__pycache__").glob(f"{HOOK_NAME}.*.pyc"):
        cached.unlink(missing_ok=True)


@dataclass(frozen=True)
class LoopTrace:
    loops: int  # scheduler loops that started in the window
    busy_loops: int  # ... that queued at least one task instance (the scheduler does not sleep after those)
    queued: int  # task instances those loops queued
    scheduling_cpu_s: float  # CPU of _do_scheduling, summed over the loops
    heartbeat_s: float  # wall time in the executor's heartbeat(), summed
    heartbeat_max_s: float
    heartbeat_cpu_s: float
    window_s: float

    def text(self) -> str:
        per = f", {self.queued / self.busy_loops:.1f} queued per busy loop" if self.busy_loops else ""
        share = f" ({self.heartbeat_s / self.window_s:.0%} of the run)" if self.window_s > 0 else ""
        return (
            f"scheduler loops {self.loops} ({self.busy_loops} queued something{per}); "
            f"_do_scheduling CPU {self.scheduling_cpu_s:.2f} s; "
            f"executor heartbeat {self.heartbeat_s:.2f} s wall{share}, "
            f"longest {self.heartbeat_max_s:.2f} s, CPU {self.heartbeat_cpu_s:.2f} s"
        )

    def as_json(self) -> dict[str, float | int]:
        return asdict(self)


def summarise(path: Path, start: float, end: float) -> LoopTrace | None:
    """The records of calls that started in [start, end] (``time.monotonic()``); None without any."""
    if not path.exists():
        return None
    loops = busy = queued = 0
    sched_cpu = hb = hb_max = hb_cpu = 0.0
    seen = False
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) < 5 or parts[0] not in ("S", "H"):
            continue
        t0, t1, c0, c1 = (float(p) for p in parts[1:5])
        if not start <= t0 <= end:
            continue
        seen = True
        if parts[0] == "S":
            loops += 1
            sched_cpu += c1 - c0
            n = int(parts[5]) if len(parts) > 5 and parts[5].isdigit() else 0
            if n:
                busy += 1
                queued += n
        else:
            hb += t1 - t0
            hb_max = max(hb_max, t1 - t0)
            hb_cpu += c1 - c0
    if not seen:
        return None
    return LoopTrace(
        loops=loops,
        busy_loops=busy,
        queued=queued,
        scheduling_cpu_s=round(sched_cpu, 3),
        heartbeat_s=round(hb, 3),
        heartbeat_max_s=round(hb_max, 3),
        heartbeat_cpu_s=round(hb_cpu, 3),
        window_s=round(end - start, 3),
    )


def scheduler_states(path: Path) -> dict[str, list[tuple[float, float]]]:
    """
    The scheduler's traced calls by kind (``S`` scheduling, ``H`` heartbeat, ``W`` idle sleep), each a
    sorted list of (start, end) on the wall clock (seconds since the epoch, as the database's times);
    empty for a trace without its clock line (one written before the hook had it).
    """
    states: dict[str, list[tuple[float, float]]] = {"S": [], "H": [], "W": []}
    offset = None
    for line in path.read_text().splitlines() if path.exists() else ():
        parts = line.split()
        if parts[:1] == ["O"] and len(parts) == 2:
            offset = float(parts[1])
        elif len(parts) >= 5 and parts[0] in states and offset is not None:
            states[parts[0]].append((float(parts[1]) + offset, float(parts[2]) + offset))
    return {kind: sorted(spans) for kind, spans in states.items()} if offset is not None else {}


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def compare(stages: Sequence[tuple[str, Sequence[tuple[LoopTrace, float | None]]]], title: str) -> str:
    """One row per stage, medians over its traced runs (each with the scheduler process's CPU)."""
    lines = [
        title,
        f"{'executor':<14}{'runs':>5}{'loops':>7}{'busy':>6}{'per busy':>9}{'sched CPU':>10}"
        f"{'_do_sched CPU':>14}{'heartbeat':>10}{'longest':>9}{'of run':>8}",
    ]
    for label, runs in stages:
        if not runs:
            lines.append(f"{label:<14}{0:>5}  (no trace)")
            continue
        traces = [t for t, _ in runs]
        cpus = [c for _, c in runs if c is not None]
        busy = _median([t.busy_loops for t in traces])
        per = _median([t.queued / t.busy_loops for t in traces if t.busy_loops])
        share = _median([t.heartbeat_s / t.window_s for t in traces if t.window_s > 0])
        lines.append(
            f"{label:<14}{len(traces):>5}{_median([t.loops for t in traces]):>7.0f}{busy:>6.0f}{per:>9.1f}"
            f"{_median(cpus):>9.1f}s{_median([t.scheduling_cpu_s for t in traces]):>13.2f}s"
            f"{_median([t.heartbeat_s for t in traces]):>9.2f}s"
            f"{_median([t.heartbeat_max_s for t in traces]):>8.2f}s"
            f"{share:>8.0%}"
        )
    return "\n".join(lines)

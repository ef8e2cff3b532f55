"""Where a parallelism slot's time goes in a throughput run, from the task instances' own timestamps (pure).

The API's task-instance records (``scheduled_when``, ``queued_when``, ``start_date``, ``end_date``)
say, at every instant of the run's window (first task instance queued -> last one ended), how many
task instances are in each step; the ``parallelism`` slots are split among them:

handed over
    queued, not started: the scheduler queued the task instance and handed it to the executor, its
    task process has not reported its start (``ti_run``) yet.
running
    started, not ended (the task process's start to its reported end).
refill gap
    free slots (``parallelism`` minus the task instances in flight, queued to end) while task
    instances wait to be queued (scheduled, or for a DAG whose tasks are all ready from the start,
    not queued yet). A slot here is between one task's end and the next task's queueing: the
    supervisor's teardown, the worker's result, the scheduler's next loop (its idle sleep
    included) and its scheduling decision.
idle
    free slots with nothing waiting (the run's head and tail).

With the scheduler's loop trace (``looptrace.py``), the refill gap is split by what the scheduler was
doing meanwhile: scheduling (``_do_scheduling``: queueing task instances), heartbeating its executor,
sleeping (the loop's idle sleep), or elsewhere in its loop (events, timers, between the traced steps).

The four add up to ``parallelism`` at every instant while nothing exceeds it; each is averaged over
the window. ``in flight max`` is the most task instances between queued and end at any instant:
with a slot held per dispatch (the series) it never exceeds ``parallelism``, since the database
records a task's end before its executor frees the slot; the unpatched 3.1-3.3 release frees a slot
when the worker takes the workload, and goes past it. What the database cannot tell (which worker
ran which task, when the executor read a result) is not guessed: the gap is the whole interval from
an end to the next queueing.

A task instance that failed before it started (its task process never reported a start) has an
``end_date`` the scheduler writes when it processes the executor's failure event, after the
executor freed its slot and possibly after that slot was handed on: it is left out of the peak,
which then counts only what the database knows the executor held (``in flight max``), and the peak
with it is shown beside it (``in_flight_max_all``).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from tools.measure.e2e.throughput import parse_ts


@dataclass(frozen=True)
class SlotFigures:
    parallelism: int
    window_s: float  # first queued -> last ended (or last event seen)
    idle: float  # each: slots, averaged over the window
    handed_over: float
    running: float
    refill_gap: float
    in_flight_mean: float
    in_flight_max: int
    # The peak with the task instances that failed before they started (see the module's docstring).
    in_flight_max_all: int = 0
    failed_unstarted: int = 0
    # The refill gap while the scheduler was scheduling, heartbeating, sleeping (None: no loop trace).
    gap_scheduling: float | None = None
    gap_heartbeat: float | None = None
    gap_sleeping: float | None = None

    @property
    def over_parallelism(self) -> bool:
        return self.in_flight_max > self.parallelism

    def as_json(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    def text(self) -> str:
        over = "ABOVE" if self.over_parallelism else "within"
        return (
            f"slots (of {self.parallelism}, mean over {self.window_s:.1f}s): running {self.running:.1f}, "
            f"handed over {self.handed_over:.1f}, refill gap (end -> next queued) {self.refill_gap:.1f}, "
            f"idle {self.idle:.1f}; in flight (queued -> end) mean {self.in_flight_mean:.1f}, "
            f"max {self.in_flight_max} ({over} parallelism)"
            + (
                f"; {self.failed_unstarted} failed unstarted, max {self.in_flight_max_all} with them"
                if self.failed_unstarted
                else ""
            )
            + (
                f"; the gap while the scheduler schedules {self.gap_scheduling:.1f}, heartbeats "
                f"{self.gap_heartbeat:.1f}, sleeps {self.gap_sleeping:.1f}, is elsewhere in its loop "
                f"{self.gap_elsewhere:.1f}"
                if self.gap_elsewhere is not None
                else ""
            )
        )

    @property
    def gap_elsewhere(self) -> float | None:
        parts = (self.gap_scheduling, self.gap_heartbeat, self.gap_sleeping)
        return None if None in parts else max(self.refill_gap - sum(p or 0.0 for p in parts), 0.0)


def _overlap(spans: Sequence[tuple[float, float]], a: float, b: float) -> float:
    """Seconds of [a, b) inside ``spans`` (sorted, disjoint: one thread's calls)."""
    i, total = max(bisect.bisect_right(spans, (a, float("inf"))) - 1, 0), 0.0
    while i < len(spans) and spans[i][0] < b:
        total += max(min(spans[i][1], b) - max(spans[i][0], a), 0.0)
        i += 1
    return total


def figures(
    tis: Iterable[dict[str, Any]],
    parallelism: int,
    scheduler: dict[str, list[tuple[float, float]]] | None = None,
) -> SlotFigures | None:
    """The slot split of one run; None without a task instance that was queued.

    ``scheduler``: ``looptrace.scheduler_states()`` of the run, to split the refill gap by what the
    scheduler was doing.
    """
    # Per task instance: when it became ready (scheduled_when, else the window's start), queued,
    # started, ended; a step it never reached lasts to the window's end.
    rows: list[tuple[datetime | None, datetime, datetime | None, datetime | None]] = []
    unstarted_failed: set[int] = set()
    for d in tis:
        q = parse_ts(d.get("queued_when"))
        if q is None:
            continue
        sch, s, e = (parse_ts(d.get(k)) for k in ("scheduled_when", "start_date", "end_date"))
        if s is None and d.get("state") == "failed":
            unstarted_failed.add(len(rows))
        rows.append((sch, q, s, e))
    if not rows:
        return None
    t0 = min(q for _, q, _, _ in rows)
    stamps = [t for row in rows for t in row if t is not None]
    t_end = max(stamps)
    window = (t_end - t0).total_seconds()

    def at(t: datetime | None, default: float) -> float:
        return default if t is None else min(max((t - t0).total_seconds(), 0.0), window)

    # Step changes: (time, d_waiting, d_handed, d_running, d_uncertain); every interval is [from, to).
    changes: list[tuple[float, int, int, int, int]] = []
    for n, (sch, q, s, e) in enumerate(rows):
        ready, queued = at(sch, 0.0), at(q, 0.0)
        ended = max(at(e, window), queued)
        # never started: handed over until it ended (or the window did)
        started = min(max(at(s, ended), queued), ended)
        u = 1 if n in unstarted_failed else 0
        changes += [
            (min(ready, queued), 1, 0, 0, 0),
            (queued, -1, 1, 0, u),
            (started, 0, -1, 1, 0),
            (ended, 0, 0, -1, -u),
        ]
    changes.sort()
    totals = {
        "idle": 0.0,
        "handed": 0.0,
        "running": 0.0,
        "gap": 0.0,
        "flight": 0.0,
        "S": 0.0,
        "H": 0.0,
        "W": 0.0,
    }
    epoch0 = t0.timestamp()
    waiting = handed = running = uncertain = 0
    peak = peak_all = 0
    prev = 0.0
    i = 0
    while i < len(changes):
        t = changes[i][0]
        span = t - prev
        if span > 0:
            flight = handed + running
            free = max(parallelism - flight, 0)
            gap = min(free, waiting)
            totals["handed"] += handed * span
            totals["running"] += running * span
            totals["gap"] += gap * span
            for kind, spans in (scheduler or {}).items() if gap else ():
                totals[kind] += gap * _overlap(spans, epoch0 + prev, epoch0 + t)
            totals["idle"] += (free - gap) * span
            totals["flight"] += flight * span
        # Apply every change at this instant before reading the peak: an end and a queueing at the
        # same timestamp are one slot handed on, not two in flight.
        while i < len(changes) and changes[i][0] == t:
            _, dw, dh, dr, du = changes[i]
            waiting, handed, running, uncertain = waiting + dw, handed + dh, running + dr, uncertain + du
            i += 1
        peak = max(peak, handed + running - uncertain)
        peak_all = max(peak_all, handed + running)
        prev = t
    scale = 1 / window if window > 0 else 0.0
    return SlotFigures(
        parallelism=parallelism,
        window_s=window,
        idle=totals["idle"] * scale,
        handed_over=totals["handed"] * scale,
        running=totals["running"] * scale,
        refill_gap=totals["gap"] * scale,
        in_flight_mean=totals["flight"] * scale,
        in_flight_max=peak,
        in_flight_max_all=peak_all,
        failed_unstarted=len(unstarted_failed),
        **({f"gap_{name}": totals[kind] * scale for kind, name in GAP_STATES.items()} if scheduler else {}),
    )


GAP_STATES = {"S": "scheduling", "H": "heartbeat", "W": "sleeping"}


def median_of(figs: Sequence[SlotFigures]) -> SlotFigures:
    """Field by field, the median of several rounds (the peak: the highest)."""
    return SlotFigures(
        parallelism=figs[0].parallelism,
        in_flight_max=max(f.in_flight_max for f in figs),
        in_flight_max_all=max(f.in_flight_max_all for f in figs),
        failed_unstarted=max(f.failed_unstarted for f in figs),
        **{
            k: statistics.median(getattr(f, k) for f in figs)
            for k in ("window_s", "idle", "handed_over", "running", "refill_gap", "in_flight_mean")
        },
        **{
            f"gap_{name}": statistics.median(split)
            for name in GAP_STATES.values()
            if None not in (split := [getattr(f, f"gap_{name}") for f in figs])
        },
    )


def compare(rows: Sequence[tuple[str, Sequence[SlotFigures]]], title: str) -> str:
    """One row per stage: its rounds' median slot split, and the highest in-flight peak of any round."""
    head = (
        f"{'executor':<14}{'rounds':>7}{'running':>9}{'handed':>8}{'gap':>7}{'idle':>7}"
        f"{'flight':>8}{'max':>5}{'of':>5}  gap while the scheduler: schedules, heartbeats, sleeps, other"
    )
    out = [title, head]
    for label, figs in rows:
        if not figs:
            out.append(f"{label:<14}{0:>7}  (no figures)")
            continue
        m = median_of(figs)
        out.append(
            f"{label:<14}{len(figs):>7}{m.running:>9.1f}{m.handed_over:>8.1f}{m.refill_gap:>7.1f}"
            f"{m.idle:>7.1f}{m.in_flight_mean:>8.1f}{m.in_flight_max:>5}{m.parallelism:>5}"
            + (
                f"  {m.gap_scheduling:.1f}, {m.gap_heartbeat:.1f}, {m.gap_sleeping:.1f}, "
                f"{m.gap_elsewhere:.1f}"
                if m.gap_elsewhere is not None
                else "  (no loop trace)"
            )
            + ("  in flight ABOVE parallelism" if m.over_parallelism else "")
        )
    return "\n".join(out)

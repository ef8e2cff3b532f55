"""The timeline the e2e session prints for a run: what the driver did, and each task try's life.

    events (seconds from the trigger)
       +0.00  trigger run e2e-kill-running (airflow dags trigger)
       +6.12  SIGKILL worker 1234 (busy with python_05 try 1, running)
      +25.40  run success

    task        try state     queued   start     end  |0s                     25.4s|
    bash_00       1 success    +1.23   +2.05   +7.36  |  .######                  |
    python_05 *   1 failed     +1.25   +2.10  +19.80  |  .####################    |
    python_05 *   2 success   +21.90  +22.40  +25.10  |                      .####|
    events                                            |       ^                   |

Bars: ``.`` queued, ``#`` running, ``~`` still queued when the watch ended, ``>`` still
running when it ended; ``^`` marks the driver's events (kills, signals); ``*`` a task the
scenario killed. Pure functions: tests feed them rows and read the text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class TryRow:
    task_id: str
    try_number: int
    state: str | None
    queued: float | None  # seconds from the trigger
    start: float | None
    end: float | None
    marked: bool = False


def rel(ts: str | None, t0: datetime) -> float | None:
    """An API timestamp as seconds from ``t0`` (both timezone-aware)."""
    if not ts:
        return None
    # Python 3.10's fromisoformat does not take the API's "Z" suffix.
    parsed = datetime.fromisoformat(ts[:-1] + "+00:00" if ts.endswith("Z") else ts)
    return (parsed - t0).total_seconds()


def rows_from_api(
    tis: Iterable[dict[str, Any]],
    tries: dict[str, list[dict[str, Any]]],
    t0: datetime,
    marked: Iterable[str] = (),
) -> list[TryRow]:
    """One row per try: the current try from the task-instance list, earlier ones from ``tries``."""
    marked = set(marked)
    rows: list[TryRow] = []
    for ti in sorted(tis, key=lambda d: d["task_id"]):
        task_id = ti["task_id"]
        history = {int(d.get("try_number") or 0): d for d in tries.get(task_id, [])}
        history[int(ti.get("try_number") or 0)] = ti  # the live record wins for the current try
        for n in sorted(history):
            d = history[n]
            rows.append(
                TryRow(
                    task_id=task_id,
                    try_number=n,
                    state=d.get("state"),
                    queued=rel(d.get("queued_when"), t0),
                    start=rel(d.get("start_date"), t0),
                    end=rel(d.get("end_date"), t0),
                    marked=task_id in marked,
                )
            )
    return rows


def bar(row: TryRow, span: float, width: int) -> str:
    """The row's life on a ``width``-column axis covering [0, span] seconds."""
    cells = [" "] * width

    def col(t: float) -> int:
        return max(0, min(width - 1, int(t / span * width))) if span > 0 else 0

    def paint(a: float, b: float, ch: str) -> None:
        for i in range(col(a), col(b) + 1):
            cells[i] = ch

    if row.queued is not None:
        stop = row.start if row.start is not None else (row.end if row.end is not None else span)
        paint(row.queued, stop, "." if row.start is not None or row.end is not None else "~")
    if row.start is not None:
        paint(row.start, row.end if row.end is not None else span, "#" if row.end is not None else ">")
    return "".join(cells)


def event_axis(events: Sequence[tuple[float, str]], span: float, width: int) -> str:
    cells = [" "] * width
    for t, _ in events:
        if 0 <= t <= span and span > 0:
            cells[max(0, min(width - 1, int(t / span * width)))] = "^"
    return "".join(cells)


def _fmt_t(t: float | None) -> str:
    return "-" if t is None else f"{t:+.2f}"


def format_timeline(
    rows: Sequence[TryRow],
    events: Sequence[tuple[float, str]],
    span: float,
    width: int = 48,
) -> str:
    """The whole timeline as text: the driver's events, then one bar per task try."""
    span = max(span, 0.01)
    out = ["events (seconds from the trigger)"]
    for t, text in sorted(events, key=lambda e: e[0]):
        out.append(f"  {t:+8.2f}  {text}")
    name_w = max([len(r.task_id) + (2 if r.marked else 0) for r in rows] + [len("events")])
    axis_l, axis_r = "0s", f"{span:.1f}s"
    header_axis = axis_l + " " * max(1, width - len(axis_l) - len(axis_r)) + axis_r
    out.append("")
    out.append(f"{'task':<{name_w}} try {'state':<14}{'queued':>8}{'start':>8}{'end':>8}  |{header_axis}|")
    for r in rows:
        name = r.task_id + (" *" if r.marked else "")
        out.append(
            f"{name:<{name_w}} {r.try_number:>3} {(r.state or 'none'):<14}"
            f"{_fmt_t(r.queued):>8}{_fmt_t(r.start):>8}{_fmt_t(r.end):>8}  |{bar(r, span, width)}|"
        )
    if events:
        out.append(f"{'events':<{name_w}} {'':<18}{'':>24}  |{event_axis(events, span, width)}|")
    return "\n".join(out)


def summarize(rows: Sequence[TryRow]) -> str:
    """``30 tasks: 29 success, 1 queued (1 retried)`` from the latest try of each task."""
    latest: dict[str, TryRow] = {}
    for r in rows:
        if r.task_id not in latest or r.try_number > latest[r.task_id].try_number:
            latest[r.task_id] = r
    counts: dict[str, int] = {}
    for r in latest.values():
        counts[r.state or "none"] = counts.get(r.state or "none", 0) + 1
    retried = sum(1 for r in latest.values() if r.try_number > 1)
    parts = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    extra = f" ({retried} retried)" if retried else ""
    return f"{len(latest)} tasks: {parts}{extra}"

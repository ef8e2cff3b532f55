"""The soak's invariants, judged afterwards from the tasks' own records (pure: no stack, no network).

Evidence comes from three places, none of them the executor: the attempt records each task's
callable appended (``tests/e2e/dags/lepatch_e2e_soak.py``: start, marks, child, end, with pid and
monotonic time), the task instances' final rows in the metadata database, and what /proc and the
loop trace showed the driver. The rules:

terminal
    Every task instance of every triggered run is in a terminal state at the end (and every run
    is final). One that is not was lost: queued or running with nobody to finish it.
overlap
    No two attempts (distinct processes) of one task instance were alive at the same instant. An
    attempt is alive from its ``start`` record to its last record (``end``, or the last ``mark``
    of a killed one): a lower bound on its life, so an overlap found is certain.
duplicate-try
    No try number of one task instance ran in two processes.
lost-try
    A task instance the database calls ``success`` has an attempt of its final try that returned
    (its ``end`` record, not raised); and no attempt ran a try the database never reached.
rerun
    A try that returned (its ``end`` record, not raised) is not followed by another try of the same
    task instance, unless the driver killed that try's task process or worker (``hit``: the try's
    uuid, which the records carry, to what hit it): then its result may be lost before it was
    reported, and running it again is what Airflow promises (at least once). Without such a fault
    the task ran twice for nothing, e.g. a result dropped across a scheduler restart. A
    ``restart-scheduler`` SIGTERM is such a fault for the tries its workers held only when the
    scheduler had already stopped looping by itself (``shutdown_hits``): its executor's ``end()`` was
    waiting for them, and a signal then is Airflow's "signal again if you don't want to wait", which
    ends the workers (3.4's ``LocalExecutor.end()``, the series' patch 1); a first SIGTERM must wait.
left-alive
    No task process, nor a child it forked past the child's own lifetime, is alive at the end, or
    after the scheduler above it exited (what the driver saw, passed in as ``LeftAlive``).
loop-blocked
    No scheduler loop was blocked longer than ``loop_bound_s``: the gap between one
    ``_do_scheduling`` call's end and the next one's start in the loop trace, and from the last
    one to when that scheduler was signalled, exited or the soak ended (a loop that never came
    back writes no record). The default bound is Airflow's ``[scheduler]
    scheduler_health_check_threshold`` (30 s): a scheduler blocked longer is one Airflow's own
    health check calls unhealthy. The start-up (launch to the first loop) is not judged.
stop-bound
    SIGTERM stops the scheduler within ``--stop-bound`` (30 s, as the e2e ``sigterm-running``
    scenario); the driver sees it and passes it in with ``observed``.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

INVARIANTS = (
    "terminal",
    "overlap",
    "duplicate-try",
    "lost-try",
    "rerun",
    "left-alive",
    "loop-blocked",
    "stop-bound",
)
TERMINAL_TI = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})
FINAL_RUN = frozenset({"success", "failed"})
LOOP_BOUND_S = 30.0  # Airflow's [scheduler] scheduler_health_check_threshold

TiKey = tuple[str, str, str, int]  # dag_id, run_id, task_id, map_index


@dataclass(frozen=True)
class Violation:
    invariant: str
    t: float  # seconds after the stage's start, when it first showed
    what: str  # the task instance or process it is about
    evidence: str

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        return f"{self.t:7.1f}s  {self.invariant:<14}{self.what}: {self.evidence}"


@dataclass
class Attempt:
    """One process's run of one try of one task instance, as its records tell it."""

    key: TiKey
    try_number: int
    pid: int
    pst: int  # /proc starttime: tells the process from a later one with the same pid
    start: float  # monotonic
    last: float  # monotonic of its last record
    ended: bool = False
    raised: bool = False
    child: tuple[int, int, float] | None = None  # pid, starttime, monotonic time it is meant to end
    ti_id: str = ""  # the try's uuid

    def span(self, t0: float) -> str:
        end = "ended" if self.ended else "last seen"
        return f"try {self.try_number} pid {self.pid} [{self.start - t0:.2f}s, {end} {self.last - t0:.2f}s]"


@dataclass(frozen=True)
class TiRow:
    """A task instance as the database has it at the end."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    state: str | None
    try_number: int

    @property
    def key(self) -> TiKey:
        return (self.dag_id, self.run_id, self.task_id, self.map_index)


@dataclass(frozen=True)
class LeftAlive:
    """A process of a task the driver found alive where nothing should be."""

    t: float  # monotonic
    pid: int
    title: str
    where: str  # e.g. "1.0 s after scheduler 1234 exited (SIGTERM)"


@dataclass
class Incarnation:
    """One scheduler process: when it was launched and when it stopped being expected to loop."""

    pid: int
    launched: float  # monotonic
    until: float  # signalled, exited, or the check at the end
    how: str  # "sigterm", "exited 1", "end of soak"
    loops: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of each _do_scheduling


def parse_records(text: str) -> list[dict[str, Any]]:
    """Every well-formed JSON line; torn or foreign lines are skipped."""
    out = []
    for line in text.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and {"ev", "run_id", "task_id", "try", "pid", "mono"} <= d.keys():
            out.append(d)
    return out


def read_records(path: Path) -> list[dict[str, Any]]:
    try:
        return parse_records(path.read_text(errors="replace"))
    except FileNotFoundError:
        return []


def attempts(records: Iterable[dict[str, Any]]) -> list[Attempt]:
    """The records grouped by process and try, in the order their first record came."""
    by: dict[tuple[Any, ...], Attempt] = {}
    for r in records:
        key: TiKey = (
            str(r.get("dag_id", "")),
            str(r["run_id"]),
            str(r["task_id"]),
            int(r.get("map_index", -1)),
        )
        ident = (key, int(r["try"]), int(r["pid"]), int(r.get("pst", 0)))
        mono = float(r["mono"])
        a = by.get(ident)
        if a is None:
            a = by[ident] = Attempt(
                key, ident[1], ident[2], ident[3], mono, mono, ti_id=str(r.get("ti_id", ""))
            )
        a.start = min(a.start, mono)
        a.last = max(a.last, mono)
        if r["ev"] == "end":
            a.ended = True
            a.raised = bool(r.get("raised"))
        elif r["ev"] == "child":
            a.child = (int(r["child"]), int(r.get("child_pst", 0)), float(r["until"]))
    return list(by.values())


def _trace_spans(path: Path, kind: str) -> list[tuple[float, float]]:
    """The ``kind`` records of a loop trace file (``looptrace_hook``) as (start, end), sorted."""
    out = []
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == kind:
            try:
                out.append((float(parts[1]), float(parts[2])))
            except ValueError:
                continue
    return sorted(out)


def read_loops(path: Path) -> list[tuple[float, float]]:
    """The ``S`` (``_do_scheduling``) records of a loop trace file."""
    return _trace_spans(path, "S")


def read_loop_exits(path: Path) -> list[float]:
    """When the scheduler stopped looping (``X`` records of a loop trace: ``_run_scheduler_loop`` ended)."""
    return sorted(end for _, end in _trace_spans(path, "X"))


def shutdown_hits(
    held: Iterable[str], loop_exits: Sequence[float], t_sig: float, t0: float
) -> dict[str, str]:
    """The tries a scheduler's SIGTERM at ``t_sig`` hit: those its workers held (their uuids), when its loop
    had already ended before the signal (it was in its executors' ``end()``, so the SIGTERM was Airflow's
    second signal: the workers are terminated, a try's unreported result is lost). None otherwise: a first
    SIGTERM ends the loop, and ``end()`` then waits for the running tries."""
    before = [t for t in loop_exits if t < t_sig]
    if not before:
        return {}
    why = (
        f"restart-scheduler at {t_sig - t0:.1f}s: a second signal (the scheduler had stopped looping "
        f"at {before[-1] - t0:.1f}s and was ending its executor), which terminates the workers"
    )
    return {ti: why for ti in held if ti}


def _ti(key: TiKey) -> str:
    return f"{key[1]}/{key[2]}" + (f"[{key[3]}]" if key[3] >= 0 else "")


def check_terminal(
    tis: Sequence[TiRow],
    runs: dict[str, str | None],
    by_key: dict[TiKey, list[Attempt]],
    t0: float,
    t_end: float,
) -> list[Violation]:
    out = []
    for run_id, state in sorted(runs.items()):
        if state not in FINAL_RUN:
            out.append(Violation("terminal", t_end - t0, run_id, f"DAG run still {state} at the end"))
    for ti in tis:
        if ti.state in TERMINAL_TI:
            continue
        mine = sorted(by_key.get(ti.key, []), key=lambda a: a.start)
        seen = f"; its tries ran: {', '.join(a.span(t0) for a in mine)}" if mine else "; no try ever started"
        t = mine[-1].last if mine else t_end
        out.append(
            Violation("terminal", t - t0, _ti(ti.key), f"{ti.state} on try {ti.try_number} at the end{seen}")
        )
    return out


def check_overlap(by_key: dict[TiKey, list[Attempt]], t0: float) -> list[Violation]:
    out = []
    for key, mine in by_key.items():
        mine = sorted(mine, key=lambda a: a.start)
        for i, a in enumerate(mine):
            for b in mine[i + 1 :]:
                if (a.pid, a.pst) == (b.pid, b.pst) or b.start >= a.last:
                    continue
                both = min(a.last, b.last) - b.start
                out.append(
                    Violation(
                        "overlap",
                        b.start - t0,
                        _ti(key),
                        f"{b.span(t0)} started while {a.span(t0)} was alive; both for >= {both:.2f} s",
                    )
                )
    return out


def check_duplicate(by_key: dict[TiKey, list[Attempt]], t0: float) -> list[Violation]:
    out = []
    for key, mine in by_key.items():
        by_try: dict[int, list[Attempt]] = defaultdict(list)
        for a in mine:
            by_try[a.try_number].append(a)
        for n, same in sorted(by_try.items()):
            if len(same) > 1:
                same.sort(key=lambda a: a.start)
                out.append(
                    Violation(
                        "duplicate-try",
                        same[1].start - t0,
                        _ti(key),
                        f"try {n} ran in {len(same)} processes: " + ", ".join(a.span(t0) for a in same),
                    )
                )
    return out


def check_lost(
    tis: Sequence[TiRow], by_key: dict[TiKey, list[Attempt]], t0: float, t_end: float
) -> list[Violation]:
    out = []
    for ti in tis:
        mine = by_key.get(ti.key, [])
        if ti.state == "success" and not any(
            a.try_number == ti.try_number and a.ended and not a.raised for a in mine
        ):
            ran = ", ".join(a.span(t0) for a in sorted(mine, key=lambda a: a.start)) or "none"
            out.append(
                Violation(
                    "lost-try",
                    (max((a.last for a in mine), default=t_end)) - t0,
                    _ti(ti.key),
                    f"success on try {ti.try_number}, but no attempt of that try returned (attempts: {ran})",
                )
            )
        beyond = [a for a in mine if a.try_number > ti.try_number]
        for a in beyond:
            out.append(
                Violation(
                    "lost-try",
                    a.start - t0,
                    _ti(ti.key),
                    f"{a.span(t0)} ran, but the database's last try is {ti.try_number} ({ti.state})",
                )
            )
    return out


def check_rerun(by_key: dict[TiKey, list[Attempt]], t0: float, hit: Mapping[str, str]) -> list[Violation]:
    out = []
    for key, mine in by_key.items():
        for a in mine:
            if not a.ended or a.raised or a.ti_id in hit:
                continue
            later = sorted((b for b in mine if b.try_number > a.try_number), key=lambda b: b.start)
            if later:
                b = later[0]
                out.append(
                    Violation(
                        "rerun",
                        b.start - t0,
                        _ti(key),
                        f"{a.span(t0)} returned, no fault hit it, yet {b.span(t0)} ran",
                    )
                )
    return out


def recorded_processes(atts: Iterable[Attempt], grace: float = 1.0) -> list[tuple[int, int, float, str]]:
    """Every process the records name: (pid, starttime, monotonic time after which it must be gone, what)."""
    out = []
    for a in atts:
        out.append((a.pid, a.pst, a.last, f"task process of {_ti(a.key)} try {a.try_number}"))
        if a.child:
            cpid, cpst, until = a.child
            out.append((cpid, cpst, until + grace, f"child forked by {_ti(a.key)} try {a.try_number}"))
    return out


def check_left_alive(found: Sequence[LeftAlive], t0: float) -> list[Violation]:
    return [Violation("left-alive", x.t - t0, f"pid {x.pid}", f"{x.title!r} alive {x.where}") for x in found]


def loop_gaps(inc: Incarnation) -> list[tuple[float, float]]:
    """(start, length) of each stretch between one loop's end and the next one's start (or ``until``)."""
    loops = [(s, e) for s, e in inc.loops if inc.launched <= s <= inc.until]
    gaps = [(a[1], b[0] - a[1]) for a, b in itertools.pairwise(loops)]
    if loops:
        gaps.append((loops[-1][1], inc.until - loops[-1][1]))
    return gaps


def check_loops(incs: Sequence[Incarnation], t0: float, bound: float = LOOP_BOUND_S) -> list[Violation]:
    out = []
    for inc in incs:
        for start, length in loop_gaps(inc):
            if length > bound:
                out.append(
                    Violation(
                        "loop-blocked",
                        start - t0,
                        f"scheduler {inc.pid}",
                        f"no scheduler loop for {length:.1f} s from {start - t0:.1f}s (bound {bound:g} s; "
                        f"that scheduler ended: {inc.how} at {inc.until - t0:.1f}s)",
                    )
                )
        if not inc.loops and inc.until - inc.launched > 2 * bound:
            out.append(
                Violation(
                    "loop-blocked",
                    inc.launched - t0,
                    f"scheduler {inc.pid}",
                    f"never looped in {inc.until - inc.launched:.1f} s ({inc.how})",
                )
            )
    return out


@dataclass
class Verdict:
    violations: list[Violation]
    attempts: int
    tis: int
    states: dict[str, int]

    def by_invariant(self) -> dict[str, int]:
        return {k: sum(1 for v in self.violations if v.invariant == k) for k in INVARIANTS}

    def first(self) -> Violation | None:
        return min(self.violations, key=lambda v: v.t, default=None)


def check(
    records: Iterable[dict[str, Any]],
    tis: Sequence[TiRow],
    runs: dict[str, str | None],
    t0: float,
    t_end: float,
    left_alive: Sequence[LeftAlive] = (),
    incarnations: Sequence[Incarnation] = (),
    loop_bound: float = LOOP_BOUND_S,
    observed: Sequence[Violation] = (),
    hit: Mapping[str, str] | None = None,
) -> Verdict:
    """Every rule over one stage's history; the violations in time order."""
    atts = attempts(records)
    by_key: dict[TiKey, list[Attempt]] = defaultdict(list)
    for a in atts:
        by_key[a.key].append(a)
    found = [
        *check_terminal(tis, runs, by_key, t0, t_end),
        *check_overlap(by_key, t0),
        *check_duplicate(by_key, t0),
        *check_lost(tis, by_key, t0, t_end),
        *check_rerun(by_key, t0, hit or {}),
        *check_left_alive(left_alive, t0),
        *check_loops(incarnations, t0, loop_bound),
        *observed,
    ]
    states: dict[str, int] = defaultdict(int)
    for ti in tis:
        states[ti.state or "none"] += 1
    return Verdict(
        sorted(found, key=lambda v: (v.t, v.invariant)), len(atts), len(tis), dict(sorted(states.items()))
    )

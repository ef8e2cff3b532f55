"""The ``scale`` scenario's evidence and verdict: what the BashOperator jobs recorded (pure).

``tests/e2e/dags/lepatch_e2e_scale.py`` has ``--tasks`` BashOperator jobs; each try's job writes a
file of its own, ``<task_id>.<try>.<pid>``, with ``s <wall> <pid> <starttime>`` at its start, ``m
<wall>`` once a second and ``e <wall>`` at its end. From those files, what the driver saw live
(``AliveAtRetry``) and after the stack stopped (``left``), and the task instances' final states,
the scenario judges four things, each counted per stage:

not-terminal
    A task instance not in a terminal state when the run's deadline passed (or the run not final).
overlap
    Two tries of one task alive at once, from the jobs' own records: try m's job started before the
    last record of an earlier try's job (its end, or a killed job's last mark: a lower bound on
    its life, so an overlap found is certain).
alive-after-retry
    A process of a failed try alive after its retry started: when a try's start file appeared, the
    driver looked at once whether each earlier try's job (its recorded pid with the same /proc
    starttime) was still alive.
left
    Anything alive after the stack was stopped: a job a record names (pid and starttime), or a
    process of the stack the stop had to kill.

Two more keep a run from passing for want of evidence: ``no-job``, a task instance none of whose
tries started a job (nothing ran, so nothing could overlap), and ``kills``, fewer worker kills
landed than asked for.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CHECKS = ("not-terminal", "overlap", "alive-after-retry", "left", "no-job", "kills")
TERMINAL = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})


@dataclass
class JobTry:
    """One try's job as its file tells it."""

    task_id: str
    try_number: int
    pid: int
    pst: int  # /proc starttime of the job (0: its start line is missing)
    start: float | None  # wall time of its start record
    last: float  # wall time of its last record
    ended: bool

    def span(self, t0: float) -> str:
        start = "?" if self.start is None else f"{self.start - t0:.1f}s"
        end = "ended" if self.ended else "last mark"
        return f"try {self.try_number} pid {self.pid} [{start}, {end} {self.last - t0:.1f}s]"


def parse_name(name: str) -> tuple[str, int, int] | None:
    """``job_0001.2.4711`` -> (task id, try, pid); None for a file that is not a job's."""
    parts = name.rsplit(".", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return parts[0], int(parts[1]), int(parts[2])


def parse_job(name: str, text: str) -> JobTry | None:
    """A job's file; torn lines are skipped. None when the name is not a job's or nothing is readable."""
    ident = parse_name(name)
    if ident is None:
        return None
    task_id, try_number, pid = ident
    start: float | None = None
    pst = 0
    times: list[float] = []
    ended = False
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] not in ("s", "m", "e") or len(parts) < 2:
            continue
        try:
            t = float(parts[1].replace(",", "."))
        except ValueError:
            continue
        times.append(t)
        if parts[0] == "s":
            start = t
            if len(parts) >= 4 and parts[3].isdigit():
                pst = int(parts[3])
        elif parts[0] == "e":
            ended = True
    if not times:
        return None
    return JobTry(task_id, try_number, pid, pst, start, max(times), ended)


def read_jobs(directory: Path) -> list[JobTry]:
    out = []
    try:
        paths = sorted(directory.iterdir())
    except FileNotFoundError:
        return []
    for p in paths:
        try:
            job = parse_job(p.name, p.read_text(errors="replace"))
        except OSError:
            continue
        if job is not None:
            out.append(job)
    return out


def kill_thresholds(tasks: int, kills: int) -> list[int]:
    """The kills spread over the run: kill i once this many tasks have started a job (first tries)."""
    return [max(1, math.ceil((i + 1) * tasks / (kills + 1))) for i in range(kills)]


@dataclass(frozen=True)
class AliveAtRetry:
    """What the driver saw when a retry's job started: an earlier try's job still alive."""

    t: float  # wall time the driver looked
    task_id: str
    try_number: int  # the earlier try
    pid: int
    retry: int  # the try whose job had started
    retry_start: float  # its recorded start (wall)


@dataclass(frozen=True)
class Violation:
    check: str
    task_id: str
    evidence: str

    def text(self) -> str:
        return f"{self.check:<18}{self.task_id}: {self.evidence}"


def overlaps(jobs: Iterable[JobTry], t0: float = 0.0) -> list[Violation]:
    """Every pair of tries of one task whose jobs' records overlap (the earlier one's last record at
    or after the later one's start)."""
    by: dict[str, list[JobTry]] = defaultdict(list)
    for j in jobs:
        by[j.task_id].append(j)
    out = []
    for task_id in sorted(by):
        tries = sorted(by[task_id], key=lambda j: (j.try_number, j.start or j.last))
        for later in tries:
            if later.start is None:
                continue
            for earlier in tries:
                if earlier.try_number >= later.try_number or earlier.last < later.start:
                    continue
                out.append(
                    Violation(
                        "overlap",
                        task_id,
                        f"{earlier.span(t0)} still recording {earlier.last - later.start:.1f} s after "
                        f"{later.span(t0)} started",
                    )
                )
    return out


@dataclass
class Verdict:
    tis: int
    states: dict[str, int]
    jobs: int  # job tries recorded
    retried: int  # tasks with a job of try 2 or later
    kills: int
    counts: dict[str, int]
    violations: list[Violation] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.violations

    def failures(self, limit: int = 8) -> list[str]:
        """The summary's failure lines: one per check that broke, with its first cases."""
        out = []
        for check in CHECKS:
            of = [v for v in self.violations if v.check == check]
            if of:
                first = "; ".join(f"{v.task_id}: {v.evidence}" for v in of[:2])
                out.append(f"{check}: {len(of)} ({first})"[:400])
        return out[:limit]

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["violations"] = [asdict(v) for v in self.violations[:200]]
        d["violations_total"] = len(self.violations)
        return d


def judge(
    states: Mapping[str, str | None],
    n_tasks: int,
    run_final: bool,
    jobs: Sequence[JobTry],
    alive_at_retry: Sequence[AliveAtRetry],
    left: Sequence[str],
    kills: int,
    t0: float = 0.0,
    kills_asked: int = 0,
) -> Verdict:
    """The verdict: ``states`` task id -> final state (the API's), ``left`` one line per process
    found alive after the stack was stopped."""
    vs: list[Violation] = []
    for task_id in sorted(states):
        if states[task_id] not in TERMINAL:
            vs.append(Violation("not-terminal", task_id, f"{states[task_id] or 'none'} at the end"))
    if len(states) < n_tasks:
        vs.append(Violation("not-terminal", "-", f"the API lists {len(states)} of {n_tasks} task instances"))
    if not run_final:
        vs.append(Violation("not-terminal", "-", "the run was not final by its deadline"))
    vs += overlaps(jobs, t0)
    for a in alive_at_retry:
        vs.append(
            Violation(
                "alive-after-retry",
                a.task_id,
                f"try {a.try_number}'s job pid {a.pid} alive {a.t - a.retry_start:.1f} s after "
                f"try {a.retry} started (at {a.retry_start - t0:.1f}s)",
            )
        )
    vs += [Violation("left", "-", what) for what in left]
    ran = {j.task_id for j in jobs}
    vs += [
        Violation("no-job", task_id, f"{states[task_id] or 'none'}, and no try of it started a job")
        for task_id in sorted(states)
        if task_id not in ran
    ]
    if kills < kills_asked:
        vs.append(Violation("kills", "-", f"{kills} of {kills_asked} worker kills landed"))
    by_state: dict[str, int] = defaultdict(int)
    for s in states.values():
        by_state[s or "none"] += 1
    counts = {c: sum(1 for v in vs if v.check == c) for c in CHECKS}
    return Verdict(
        tis=len(states),
        states=dict(sorted(by_state.items())),
        jobs=len(jobs),
        retried=len({j.task_id for j in jobs if j.try_number > 1}),
        kills=kills,
        counts=counts,
        violations=vs,
    )


COLS = {
    "not-terminal": "not-term",
    "overlap": "overlap",
    "alive-after-retry": "alive",
    "left": "left",
    "no-job": "no-job",
    "kills": "kills<",
}


def table(title: str, rows: Sequence[tuple[str, Mapping[str, Any] | None, float | None]]) -> str:
    """One line per stage (label, the verdict's JSON or None, the run's seconds or None)."""
    head = (
        f"{'stage':<13}{'TIs':>5}{'success':>8}{'failed':>7}{'other':>6}{'jobs':>6}{'retried':>8}"
        f"{'kills':>6}{'run':>8} |" + "".join(f"{COLS[c]:>9}" for c in CHECKS) + " | verdict"
    )
    lines = [title, head]
    for label, v, run_s in rows:
        if v is None:
            lines.append(f"{label:<13}{'no verdict (the stack did not run)':>40}")
            continue
        st = v["states"]
        other = sum(n for s, n in st.items() if s not in ("success", "failed"))
        run = f"{run_s:.0f}s" if run_s is not None else "-"
        lines.append(
            f"{label:<13}{v['tis']:>5}{st.get('success', 0):>8}{st.get('failed', 0):>7}{other:>6}"
            f"{v['jobs']:>6}{v['retried']:>8}{v['kills']:>6}{run:>8} |"
            + "".join(f"{v['counts'].get(c, 0):>9}" for c in CHECKS)
            + f" | {'PASS' if not any(v['counts'].values()) else 'FAIL'}"
        )
    return "\n".join(lines)

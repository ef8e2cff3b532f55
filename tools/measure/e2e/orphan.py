"""The kill-orphan scenario's evidence: what the task processes wrote to the marks file (pure).

``tests/e2e/dags/lepatch_e2e_orphan.py`` has one task that appends ``<try_number> <pid> <time>``
(``time.time()``) to the marks file once a second, and writes nothing else while it loops. The
driver SIGKILLs the worker running try 1 and notes the wall-clock time of the kill. From the
marks alone it then tells:

- how long try 1's process went on marking after its worker died (an orphan task process);
- when try 2 began, counted from the kill;
- how long both tries were marking at once (``max(0, min(last1, last2) - max(first1, first2))``),
  and how many of try 1's marks fall at or after try 2's first one.

The scenario passes only if the two tries never overlapped (and the run ended ``success``,
which :func:`tools.measure.e2e.judge.judge` checks).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Mark:
    try_number: int
    pid: int
    t: float  # time.time() in the task process


def parse_marks(text: str) -> list[Mark]:
    """Every well-formed ``<try> <pid> <time>`` line; torn or foreign lines are skipped."""
    out: list[Mark] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        try:
            out.append(Mark(int(parts[0]), int(parts[1]), float(parts[2])))
        except ValueError:
            continue
    return out


def read_marks(path: Path) -> list[Mark]:
    try:
        return parse_marks(path.read_text(errors="replace"))
    except FileNotFoundError:
        return []


def of_try(marks: list[Mark], try_number: int) -> list[Mark]:
    return sorted((m for m in marks if m.try_number == try_number), key=lambda m: m.t)


def overlap(a: list[Mark], b: list[Mark]) -> float:
    """Seconds during which both sets of marks were being written (0 when either is empty)."""
    if not a or not b:
        return 0.0
    first_a, last_a = min(m.t for m in a), max(m.t for m in a)
    first_b, last_b = min(m.t for m in b), max(m.t for m in b)
    return max(0.0, min(last_a, last_b) - max(first_a, first_b))


@dataclass(frozen=True)
class Figures:
    killed_try: int
    kill_wall: float  # time.time() right before the SIGKILL
    killed_marks: int  # marks of the killed try, in all
    killed_marks_after_kill: int
    killed_pids: tuple[int, ...]
    retry_marks: int
    retry_pids: tuple[int, ...]
    killed_lived_after_kill_s: float | None  # last mark of the killed try minus the kill
    retry_started_after_kill_s: float | None  # first mark of the retry minus the kill
    overlap_s: float
    killed_marks_during_retry: int  # marks of the killed try at or after the retry's first mark

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        k, r = self.killed_try, self.killed_try + 1
        return (
            f"try {k} last marked at kill {_secs(self.killed_lived_after_kill_s)} "
            f"({self.killed_marks_after_kill} marks after the kill), "
            f"try {r} first marked at kill {_secs(self.retry_started_after_kill_s)}, "
            f"overlap {self.overlap_s:.1f} s ({self.killed_marks_during_retry} try-{k} marks during try {r})"
        )


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1f} s"


def figures(marks: list[Mark], kill_wall: float, killed_try: int = 1) -> Figures:
    killed = of_try(marks, killed_try)
    retry = of_try(marks, killed_try + 1)
    first_retry = retry[0].t if retry else None
    return Figures(
        killed_try=killed_try,
        kill_wall=kill_wall,
        killed_marks=len(killed),
        killed_marks_after_kill=sum(1 for m in killed if m.t > kill_wall),
        killed_pids=tuple(sorted({m.pid for m in killed})),
        retry_marks=len(retry),
        retry_pids=tuple(sorted({m.pid for m in retry})),
        killed_lived_after_kill_s=round(killed[-1].t - kill_wall, 2) if killed else None,
        retry_started_after_kill_s=round(first_retry - kill_wall, 2) if first_retry is not None else None,
        overlap_s=round(overlap(killed, retry), 2),
        killed_marks_during_retry=(
            sum(1 for m in killed if m.t >= first_retry) if first_retry is not None else 0
        ),
    )


def judge_marks(fig: Figures | None, run_final: bool, run_state: str | None) -> list[str]:
    """Why the marks fail the scenario; empty when the tries never ran side by side."""
    if fig is None:
        return ["no worker was killed, so nothing to measure (see events)"]
    out: list[str] = []
    k, r = fig.killed_try, fig.killed_try + 1
    if fig.killed_marks == 0:
        out.append(f"no marks from try {k}: the task never wrote the marks file")
    if fig.overlap_s > 0 or fig.killed_marks_during_retry > 0:
        out.append(
            f"try {k} (pid {_pids(fig.killed_pids)}) kept running {_secs(fig.killed_lived_after_kill_s)} "
            f"after its worker was SIGKILLed; try {r} (pid {_pids(fig.retry_pids)}) ran beside it "
            f"for {fig.overlap_s:.1f} s"
        )
    if fig.retry_marks == 0 and run_final and run_state == "success":
        out.append(f"the run succeeded but try {r} left no marks; cannot tell the overlap")
    return out


def _pids(pids: tuple[int, ...]) -> str:
    return ",".join(map(str, pids)) or "?"

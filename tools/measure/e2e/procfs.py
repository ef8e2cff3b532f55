"""Processes as the e2e session and the chaos probe see them: psutil, plus what it does not give.

LocalExecutor forks its workers from the scheduler and names them through setproctitle:

    airflow worker -- LocalExecutor: <idle>        waiting for a workload
    airflow worker -- LocalExecutor: <ti uuid>     running one (the title is the task instance id)

A busy worker is the task's supervisor: it forks the task process as its child right before it
tells the API server that the task started, so a busy worker without a child has taken its
workload while the task instance is still ``queued``.

Unpatched, idle workers share one input queue whose reads are serialised by a lock. The one that
holds the lock sleeps in the kernel's pipe read (``/proc/PID/wchan`` is ``pipe_read``, or
``anon_pipe_read`` on newer kernels); the others sleep on the lock's futex. That tells the e2e
session which idle worker to kill to take the lock down with it. With an input queue per worker
every idle worker sleeps in its own pipe read.

psutil lists the processes and gives their parents and CPU times. Read from /proc here, and nowhere
else in the tools: where threads sleep (``wchan``) and a signal's disposition (``SigCgt``/``SigIgn`` of
``/proc/PID/status``), which psutil does not give; a process's state, parent, session and start time
(``stat``), whose start time in clock ticks after boot is the identity the e2e DAGs' jobs and the
chaos probe's task processes record about themselves (bash reads ``/proc/$$/stat``; psutil's
``create_time()`` adds the boot time in wall seconds, which moves when the clock is set); the title,
which kill-queued reads for every worker each millisecond, racing its fork (psutil's ``cmdline()``
costs 8 to 20 times the read, measured with 330 processes). Signals go by pid; nothing matches
process names globally. The standard library alone is imported at load: the chaos probe loads this
file by path in a stage venv.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

WORKER_TITLE_PREFIX = "airflow worker -- LocalExecutor"
IDLE_MARK = "<idle>"
# A process's state when it is no longer running: not there (or its pid taken by another), a zombie, dead.
DEAD = ("gone", "Z", "X")


class ProcGone(Exception):
    """The process exited while we looked at it."""


def _psutil() -> Any:
    # why on first use: `python -m tools` imports this module for every command, and nox's own
    # interpreter has psutil only once `nox -s e2e` or `nox -s soak` has installed it.
    import psutil

    return psutil


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:  # no such file, or ESRCH while the process is being reaped
        raise ProcGone(path) from e


def cmdline(pid: int) -> str:
    """The process title (setproctitle rewrites argv, so this is what ``ps`` shows)."""
    return _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()


def wchan(pid: int) -> str:
    """The kernel function the main thread sleeps in; ``0`` while it runs."""
    return _read(f"/proc/{pid}/wchan").decode(errors="replace").strip()


def thread_wchans(pid: int) -> list[str]:
    """Where each thread of ``pid`` sleeps; empty when it is gone."""
    out = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcGone):
                out.append(_read(f"/proc/{pid}/task/{tid}/wchan").decode(errors="replace").strip())
    return out


def or_gone(read: Callable[[int], str], pid: int) -> str:
    """``read(pid)``, or "gone": for a message."""
    try:
        return read(pid)
    except ProcGone:
        return "gone"


def title_of(pid: int) -> str:
    """The title for a message (80 characters at most), or "gone"."""
    return or_gone(cmdline, pid)[:80]


def signal_disposition(pid: int, sig: int = signal.SIGCHLD) -> str:
    """``caught``, ``ignored`` or ``default``: what ``pid`` does with ``sig``."""
    text = _read(f"/proc/{pid}/status").decode(errors="replace")
    masks = dict(re.findall(r"^(SigCgt|SigIgn):\s*([0-9a-f]+)$", text, re.M))
    bit = 1 << (int(sig) - 1)
    for mask, what in (("SigCgt", "caught"), ("SigIgn", "ignored")):
        if int(masks.get(mask, "0"), 16) & bit:
            return what
    return "default"


@dataclass(frozen=True)
class Stat:
    pid: int
    state: str  # R, S, D, T (stopped), Z ...
    ppid: int
    sid: int
    # Field 22, clock ticks after boot: with the pid, it tells a process from one that reuses its pid.
    starttime: int = 0


def stat(pid: int) -> Stat:
    raw = _read(f"/proc/{pid}/stat").decode(errors="replace")
    # The command name is in parentheses and may itself contain spaces or parentheses.
    rest = raw[raw.rindex(")") + 2 :].split()  # rest[0] is field 3
    return Stat(pid, rest[0], int(rest[1]), int(rest[3]), int(rest[19]))


def all_stats() -> list[Stat]:
    out = []
    for pid in _psutil().pids():
        with contextlib.suppress(ProcGone):
            out.append(stat(pid))
    return out


def state(pid: int, starttime: int = 0) -> str:
    """``pid``'s state letter; "gone" when it is not there, or is not the process that started at
    ``starttime`` (0: not known, the pid alone)."""
    try:
        st = stat(pid)
    except ProcGone:
        return "gone"
    return st.state if st.starttime == starttime or not starttime else "gone"


def alive_as(pid: int, starttime: int) -> bool:
    """Whether ``pid`` is still the process that started at ``starttime`` (0: any), and not a zombie."""
    return state(pid, starttime) not in DEAD


def alive(pids: Iterable[int]) -> list[int]:
    """Those of ``pids`` still there and not zombies."""
    return [pid for pid in pids if state(pid) not in DEAD]


def ancestors(pid: int) -> list[int]:
    """``pid``'s parent, grandparent, ... up to init; empty when ``pid`` is gone."""
    ps = _psutil()
    try:
        return [p.pid for p in ps.Process(pid).parents()]
    except ps.NoSuchProcess:
        return []


def titles() -> list[str]:
    """Every process's title ("gone" for one that exited meanwhile)."""
    return [or_gone(cmdline, pid) for pid in _psutil().pids()]


def children(pid: int, stats: Iterable[Stat] | None = None) -> list[int]:
    """Direct children (this kernel has no /proc/PID/task/TID/children, so scan ppids)."""
    return [s.pid for s in (stats if stats is not None else all_stats()) if s.ppid == pid]


def descendants(pid: int, stats: Iterable[Stat] | None = None) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), in no particular order."""
    by_parent: dict[int, list[int]] = {}
    for s in stats if stats is not None else all_stats():
        by_parent.setdefault(s.ppid, []).append(s.pid)
    out: list[int] = []
    todo = list(by_parent.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(by_parent.get(child, []))
    return out


def session_members(sids: Iterable[int]) -> list[int]:
    """Every live process in the given sessions, including orphans reparented to init."""
    wanted = set(sids)
    return [s.pid for s in all_stats() if s.sid in wanted and s.state != "Z"]


@dataclass(frozen=True)
class Cpu:
    """One process's CPU time (psutil's ``cpu_times()``), by the identity psutil gives it."""

    pid: int
    ppid: int
    created: float  # create_time(): the same for one process within this driver (psutil caches it)
    own: float  # seconds its threads ran (user + system)
    reaped: float  # what its reaped children ran, with what they had reaped in turn


def cpu_all() -> list[Cpu]:
    """Every process's CPU time now."""
    out = []
    for p in _psutil().process_iter(["ppid", "create_time", "cpu_times"]):
        ppid, created, t = p.info["ppid"], p.info["create_time"], p.info["cpu_times"]
        if t is not None and ppid is not None and created is not None:  # None: not allowed to read
            out.append(Cpu(p.pid, ppid, created, t.user + t.system, t.children_user + t.children_system))
    return out


# -- worker classification ------------------------------------------------------------------


def classify_wchan(name: str) -> str:
    """Reduce a wchan to what matters for a queue: pipe_read, pipe_write, futex, running, other."""
    if name in ("", "0"):
        return "running"
    if "pipe_read" in name:
        return "pipe_read"
    if "pipe_write" in name:
        return "pipe_write"
    if name.startswith("futex"):
        return "futex"
    return "other"


def worker_busy_with(title: str) -> str | None:
    """The task instance id a worker runs, or None when it is idle (or not a worker)."""
    if not title.startswith(WORKER_TITLE_PREFIX):
        return None
    _, _, tail = title.partition(": ")
    tail = tail.strip()
    if not tail or tail == IDLE_MARK:
        return None
    return tail


def is_worker_title(title: str) -> bool:
    return title.startswith(WORKER_TITLE_PREFIX)


@dataclass(frozen=True)
class Worker:
    pid: int
    title: str
    wchan: str
    children: tuple[int, ...]

    @property
    def busy_with(self) -> str | None:
        return worker_busy_with(self.title)

    @property
    def idle(self) -> bool:
        return self.busy_with is None

    @property
    def wait(self) -> str:
        return classify_wchan(self.wchan)


def workers_of(scheduler_pid: int) -> list[Worker]:
    """The LocalExecutor workers forked by this scheduler, with title, wchan and children."""
    stats = all_stats()
    out = []
    for pid in children(scheduler_pid, stats):
        try:
            title = cmdline(pid)
            if not is_worker_title(title):
                continue
            out.append(Worker(pid, title, wchan(pid), tuple(children(pid, stats))))
        except ProcGone:
            continue
    return sorted(out, key=lambda w: w.pid)


class NoLockHolder(Exception):
    pass


def find_read_lock_holder(workers: Iterable[Worker]) -> tuple[Worker, bool]:
    """The idle worker to kill for the idle-reader scenario, and whether a shared lock exists.

    With one shared input queue exactly one idle worker sits in the pipe read (holding the
    queue's read lock) and every other idle one on the lock's futex: that reader is returned
    with ``True``. With a queue per worker (the series) every idle worker reads its own pipe
    and none waits on a futex: there is no lock to take down, the first reader is returned
    with ``False``. Anything else is a state the scenario cannot use, and we say so.
    """
    idle = [w for w in workers if w.idle]
    readers = [w for w in idle if w.wait == "pipe_read"]
    futexes = [w for w in idle if w.wait == "futex"]
    if len(readers) == 1 and len(futexes) == len(idle) - 1:
        return readers[0], True
    if len(idle) > 1 and len(readers) == len(idle):
        return readers[0], False
    table = ", ".join(f"{w.pid}:{w.wchan or '?'}" for w in idle) or "no idle workers"
    raise NoLockHolder(
        f"expected one idle worker in a pipe read and the others on a futex (shared queue) or all "
        f"in pipe reads (a queue each), found {table}"
    )


# -- signals ---------------------------------------------------------------------------------


def send(pid: int, sig: int) -> bool:
    """Signal one pid; False if it is already gone."""
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def wait_stopped(pid: int, timeout: float = 2.0) -> bool:
    """Wait until a SIGSTOPped process is really stopped (its syscalls, e.g. a fork, returned)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = state(pid)
        if now in ("T", "t"):
            return True
        if now == "gone":
            return False
        time.sleep(0.0005)
    return False


def kill_pids(pids: Iterable[int], sig: int = signal.SIGKILL) -> list[int]:
    """Signal each pid in turn; returns the ones that were still there."""
    return [pid for pid in pids if send(pid, sig)]

"""What /proc says about LocalExecutor's worker processes, for the e2e session.

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

Everything here reads /proc and sends signals by pid; nothing matches process names globally.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

WORKER_TITLE_PREFIX = "airflow worker -- LocalExecutor"
IDLE_MARK = "<idle>"


class ProcGone(Exception):
    """The process exited while we looked at it."""


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError) as e:
        raise ProcGone(path) from e
    except OSError as e:  # ESRCH while the process is being reaped
        raise ProcGone(path) from e


def cmdline(pid: int) -> str:
    """The process title (setproctitle rewrites argv, so this is what ``ps`` shows)."""
    raw = _read(f"/proc/{pid}/cmdline")
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def wchan(pid: int) -> str:
    """The kernel function the main thread sleeps in; ``0`` while it runs."""
    return _read(f"/proc/{pid}/wchan").decode(errors="replace").strip()


TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Stat:
    pid: int
    state: str  # R, S, D, T (stopped), Z ...
    ppid: int
    pgid: int
    sid: int
    # Clock ticks of proc(5) fields 14-17: utime, stime, cutime, cstime (its threads, then its
    # reaped children).
    ticks: tuple[int, int, int, int] = (0, 0, 0, 0)
    # Field 22, clock ticks after boot: with the pid, it tells a process from one that reuses its pid.
    starttime: int = 0

    def cpu_seconds(self, reaped_children: bool = True) -> float:
        """CPU time it used (all its threads), plus what its reaped children used if asked."""
        used = sum(self.ticks) if reaped_children else self.ticks[0] + self.ticks[1]
        return used / TICKS


def stat(pid: int) -> Stat:
    raw = _read(f"/proc/{pid}/stat").decode(errors="replace")
    # The command name is in parentheses and may itself contain spaces or parentheses.
    rest = raw[raw.rindex(")") + 2 :].split()  # rest[0] is field 3
    u, s, cu, cs = (int(x) for x in rest[11:15])
    return Stat(
        pid=pid,
        state=rest[0],
        ppid=int(rest[1]),
        pgid=int(rest[2]),
        sid=int(rest[3]),
        ticks=(u, s, cu, cs),
        starttime=int(rest[19]),
    )


def cpu_seconds(pid: int, reaped_children: bool = True) -> float:
    return stat(pid).cpu_seconds(reaped_children)


def tree_cpu_seconds(pid: int, stats: Iterable[Stat] | None = None) -> float:
    """CPU time of ``pid`` and everything below it, live or reaped (a process that exited and was
    never waited for is not counted: its time reaches nobody)."""
    stats = list(stats if stats is not None else all_stats())
    by_pid = {s.pid: s for s in stats}
    return sum(by_pid[p].cpu_seconds() for p in [pid, *descendants(pid, stats)] if p in by_pid)


def all_pids() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def all_stats() -> list[Stat]:
    out = []
    for pid in all_pids():
        with contextlib.suppress(ProcGone):
            out.append(stat(pid))
    return out


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
        try:
            if stat(pid).state in ("T", "t"):
                return True
        except ProcGone:
            return False
        time.sleep(0.0005)
    return False


def kill_pids(pids: Iterable[int], sig: int = signal.SIGKILL) -> list[int]:
    """Signal each pid in turn; returns the ones that were still there."""
    return [pid for pid in pids if send(pid, sig)]

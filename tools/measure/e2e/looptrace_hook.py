"""Loaded by a ``.pth`` file in the e2e venv: time the scheduler's loop from inside the scheduler.

Copied into the venv's site-packages as ``lepatch_looptrace`` by ``tools.measure.e2e.looptrace`` (only for
``--trace-loops``), so it must import nothing but the standard library. It does nothing unless
``LEPATCH_E2E_LOOPTRACE`` names a file and the process is ``airflow scheduler``; then, as Airflow's
modules are imported, it wraps ``SchedulerJobRunner._do_scheduling`` (once per scheduler loop) and
``BaseExecutor.heartbeat`` (the executor's turn in the loop) to append one line per call to that file:

``S <start> <end> <cpu start> <cpu end> <task instances queued>`` (a loop),
``H <start> <end> <cpu start> <cpu end>`` (a heartbeat) and
``W <start> <end> <cpu start> <cpu end>`` (the loop's idle sleep: ``time.sleep`` in the scheduler's
module, or ``wait_for_executor_events`` where the series has it), after one
``O <wall clock - monotonic>`` line that puts them on the database's clock; and once, when
``SchedulerJobRunner._run_scheduler_loop`` returns or raises (the scheduler stops looping and its
executors' ``end()`` follows), ``X <start> <end> <cpu start> <cpu end>``: from then on the scheduler is
shutting down, and a signal it gets is Airflow's "signal again" (the driver's soak reads it).

Times are ``time.monotonic()`` (one clock for every process on the machine, so the driver can cut the
records at its trigger), CPU is the calling thread's.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

ENV = "LEPATCH_E2E_LOOPTRACE"

# module -> (class, method, record kind)
TARGETS = {
    "airflow.jobs.scheduler_job_runner": ("SchedulerJobRunner", "_do_scheduling", "S"),
    "airflow.executors.base_executor": ("BaseExecutor", "heartbeat", "H"),
}


def _timed(
    fn: Callable[..., Any], kind: str, fd: int, pid: int, *, raised: bool = False
) -> Callable[..., Any]:
    """Wrap ``fn`` to write a ``kind`` record when it returns (and, with ``raised``, when it raises)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0, c0 = time.monotonic(), time.thread_time()
        returned, result = False, None
        try:
            result = fn(*args, **kwargs)
            returned = True
            return result
        finally:
            if (returned or raised) and os.getpid() == pid:  # not in a worker the scheduler forked
                t1, c1 = time.monotonic(), time.thread_time()
                extra = f" {result}" if kind == "S" and returned else ""
                # One unbuffered O_APPEND write per record: never torn, never flushed twice after a fork.
                os.write(fd, f"{kind} {t0:.4f} {t1:.4f} {c0:.4f} {c1:.4f}{extra}\n".encode())

    return wrapper


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, name: str, fd: int, pid: int):
        self.inner = inner
        self.name = name
        self.fd = fd
        self.pid = pid

    def __getattr__(self, name: str) -> Any:
        # get_source, get_code, is_package...: the module's loader is this one now (tracebacks ask it).
        return getattr(self.inner, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        cls_name, meth, kind = TARGETS[self.name]
        cls = getattr(module, cls_name)
        setattr(cls, meth, _timed(getattr(cls, meth), kind, self.fd, self.pid))
        if kind != "S":
            return
        if (loop := getattr(cls, "_run_scheduler_loop", None)) is not None:
            cls._run_scheduler_loop = _timed(loop, "X", self.fd, self.pid, raised=True)
        names = vars(module)  # the loop looks both up in its module's namespace
        if (wait := names.get("wait_for_executor_events")) is not None:
            names["wait_for_executor_events"] = _timed(wait, "W", self.fd, self.pid)
        elif isinstance(clock := names.get("time"), ModuleType):
            names["time"] = _SleepTimed(clock, _timed(clock.sleep, "W", self.fd, self.pid))


class _SleepTimed:
    """The scheduler module's ``time``, with its ``sleep`` (the loop's idle sleep) timed."""

    def __init__(self, inner: ModuleType, sleep: Callable[[float], None]) -> None:
        self._inner = inner
        self.sleep = sleep

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, fd: int):
        self.fd = fd
        self.pid = os.getpid()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in TARGETS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, fullname, self.fd, self.pid)
        return spec


def install(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> bool:
    """Start tracing if this process is the scheduler and a trace file is named; True if it did."""
    argv = sys.argv if argv is None else argv
    path = (os.environ if environ is None else environ).get(ENV)
    if not path or argv[1:2] != ["scheduler"]:
        return False
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    os.write(fd, f"O {time.time() - time.monotonic():.6f}\n".encode())
    sys.meta_path.insert(0, _Finder(fd))
    return True

#
# Licensed to the Apache Software Foundation (ASF) under one
# or more contributor license agreements.  See the NOTICE file
# distributed with this work for additional information
# regarding copyright ownership.  The ASF licenses this file
# to you under the Apache License, Version 2.0 (the
# "License"); you may not use this file except in compliance
# with the License.  You may obtain a copy of the License at
#
#   http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing,
# software distributed under the License is distributed on an
# "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY
# KIND, either express or implied.  See the License for the
# specific language governing permissions and limitations
# under the License.
"""
Drive a real LocalExecutor without a database, in a child process a watchdog can kill.

A scenario is a plain function in a test module. ``run_scenario`` runs it in a new
process group (``python harness.py``), so the executor, its workers and anything they
block on can be killed as a whole; pytest-timeout alone would leave blocked workers
behind. Workers that start sessions of their own leave that group, so the scenario also
runs in a directory of its own, which every process it starts inherits as its working
directory: that is how the watchdog finds (and kills) those too. The watchdog fails the
scenario on its deadline, or much sooner when it sees a deadlock: every thread of every
process of the scenario asleep in a pipe read/write, a futex or a child wait, for
``stuck_after`` seconds, while the output does not grow. Nothing in such a scenario can
ever move again, so there is no point waiting any longer.

A fresh interpreter spends seconds of CPU importing Airflow before a scenario does anything,
and a test run starts hundreds of scenarios. So each test session starts one "zygote",
``python harness.py --zygote``, that imports Airflow once and forks every scenario from
there; the fork is given what a fresh ``harness.py`` would have (its own session, the
scenario directory, the output file, no ``local_executor`` imported yet). A scenario that
needs a different environment, or a zygote that is gone, gets a fresh interpreter;
``LEPATCH_NO_ZYGOTE=1`` always does.

Workloads are real ``ExecuteTask`` models. The task runner is replaced by ``fake_run``,
which acts out the behaviour a workload carries in ``ti.executor_config["fake"]``
(sleep, fail with an exception of a given size, wait for a file, fork a task process
that leaves marks in a file, ...). The replacement is installed in the scenario process
before the executor forks its workers, and, for the spawn start method, when a spawned
worker imports this file as its ``__mp_main__``.

The API differences between the pinned release lines are handled here, in one place:
3.3 and 3.4 run workloads through ``BaseExecutor.run_workload``; 3.1 and 3.2 call the
module-level ``_execute_work(log, workload[, team_conf])``. 3.4 keys task workloads by
the task instance's uuid (``get_workload_key``), the others by ``ti.key``: scenarios
name keys with ``label(key)``, the task id they were made with.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# Kernel wait channels of a thread that only another process can wake: a pipe read or
# write, a futex (locks, semaphores, joins), a wait for a child. If every thread of every
# process in the group sits in one of these, nothing will ever run again. Sleeps and
# poll/select are absent on purpose: they time out by themselves. Names vary by kernel
# version (pipe_write, anon_pipe_write, futex_wait_queue_me, futex_do_wait, ...).
BLOCKED_WCHAN_PREFIXES = ("pipe_", "anon_pipe_", "futex_", "do_wait", "wait_woken")

# The environment variable naming the scenario's own directory, every scenario process's working
# directory (inherited, whatever its process group or session; unlike the environment, which
# setproctitle() overwrites in /proc).
SCENARIO_DIR = "LEPATCH_SCENARIO_DIR"


# How much longer a scenario with spawned workers may take: each one imports Airflow first.
SPAWN_SLOWDOWN = 3
# wait_for_states: seconds without a key ending before it starts checking whether anything still runs.
QUIET_BEFORE_LOOKING = 0.25
# Seconds between two looks of the watchdog at /proc: a look reads every process's stat (milliseconds of
# CPU the scenario needs); twenty looks per ``stuck_after`` second are plenty to tell "blocked" apart.
WATCH_INTERVAL = 0.05
# Set to 1 to start every scenario in a fresh interpreter rather than forking it from the zygote.
NO_ZYGOTE = "LEPATCH_NO_ZYGOTE"
# Set to 1 to fail every scenario whose process (the executor's) forked while a thread Airflow started
# was alive: a child of such a fork may inherit a lock that thread held, held by no one.
FORK_CHECK = "LEPATCH_FORK_CHECK"
# Modules the zygote imports for its forks: what every scenario imports, except local_executor itself,
# which 3.1 and 3.2 read the start method from when it is imported (the scenario sets it first).
ZYGOTE_PRELOAD = (
    "airflow",
    "airflow.executors.base_executor",
    "airflow.executors.workloads",
    "airflow.models.taskinstancekey",
    "airflow.utils.state",
)


class ScenarioError(AssertionError):
    """The scenario failed, hung, or overran its deadline; the message says which and shows why."""


def environment() -> dict[str, str]:
    """The variables a scenario process needs: no database, a private AIRFLOW_HOME."""
    env = dict(os.environ)
    if "AIRFLOW_HOME" not in env:  # made only when needed: the test runner's home is normally set
        env["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="lepatch-airflow-home-")
    env.setdefault("AIRFLOW__API_AUTH__JWT_SECRET", "lepatch-test-secret-not-for-production")
    env.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    return env


# --------------------------------------------------------------------------------------
# Parent side: run a scenario in its own process group under a watchdog.
# --------------------------------------------------------------------------------------


@dataclass
class _Thread:
    pid: int
    tid: int
    name: str
    state: str
    wchan: str


# (pid, start time, directory) -> whether that process works in that scenario directory.
_in_dir: dict[tuple[str, str, str], bool] = {}


def _works_in(entry: str, started: str, directory: str) -> bool:
    key = (entry, started, directory)
    if key not in _in_dir:
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:  # gone, or not ours to look at
            return False
        _in_dir[key] = cwd == directory
    return _in_dir[key]


def _group_threads(pgid: int, directory: str | None = None) -> list[_Thread]:
    """Threads of the processes in group ``pgid`` or, with ``directory``, working in that directory."""
    threads = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            # comm may contain spaces and parentheses; the fields after the last ")" do not.
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) != pgid and not (directory and _works_in(entry, fields[19], directory)):
                continue
            name = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            for tid in os.listdir(f"/proc/{entry}/task"):
                tstat = Path(f"/proc/{entry}/task/{tid}/stat").read_text()
                tstate = tstat[tstat.rindex(")") + 2]
                wchan = Path(f"/proc/{entry}/task/{tid}/wchan").read_text().strip()
                threads.append(_Thread(int(entry), int(tid), name.strip()[:80], tstate, wchan))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue  # the process went away while we looked at it
    return threads


def _deadlocked(threads: list[_Thread]) -> bool:
    live = [t for t in threads if t.state not in ("Z", "X")]
    return bool(live) and all(t.state == "S" and t.wchan.startswith(BLOCKED_WCHAN_PREFIXES) for t in live)


def _describe(threads: list[_Thread]) -> str:
    return "\n".join(f"  pid {t.pid} tid {t.tid} {t.state} {t.wchan:<22} {t.name}" for t in threads)


def _kill_group(pgid: int, directory: str) -> None:
    """Kill the scenario's group, then every process left that works in its directory (own sessions)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    for _ in range(50):
        left = {t.pid for t in _group_threads(pgid, directory) if t.state not in ("Z", "X")}
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def run_scenario(
    func: Callable[..., Any],
    *,
    start_method: str = "fork",
    deadline: float = 60.0,
    stuck_after: float = 1.0,
    **kwargs: Any,
) -> Any:
    """
    Run ``func(**kwargs)`` in a child process group and return what it returned (JSON).

    ``func`` must be a module-level function of a test module. Raise ScenarioError when it
    raises, hangs (``stuck_after`` seconds deadlocked) or runs past ``deadline`` seconds.
    """
    module_file = sys.modules[func.__module__].__file__
    assert module_file, f"cannot locate the module of {func!r}"
    # A spawned worker imports Airflow before it takes anything (seconds on a loaded runner); the
    # deadlock check, not the deadline, is what ends a hung scenario early.
    deadline *= SPAWN_SLOWDOWN if start_method != "fork" else 1
    with tempfile.TemporaryDirectory(prefix="lepatch-scenario-") as tmp:
        tmp = os.path.realpath(tmp)
        result_file = Path(tmp, "result.json")
        out_file = Path(tmp, "output.txt")
        request = {
            "module": module_file,
            "func": func.__name__,
            "kwargs": kwargs,
            "start_method": start_method,
            "result_file": str(result_file),
        }
        # Output goes to a file, never a pipe: a pipe we did not read would be one more
        # thing for the child to block on.
        out_file.touch()
        proc = _start(json.dumps(request), environment(), tmp, out_file)
        pgid = proc.pid
        started = time.monotonic()
        # (time, every thread blocked, output size) samples of the last ``stuck_after`` seconds. A
        # thread polling with a short timeout is caught running now and then, so a deadlock is "blocked
        # in nearly every sample", not "in every sample".
        window: deque[tuple[float, bool, int]] = deque()
        failure = ""
        try:
            while proc.poll() is None:
                now = time.monotonic()
                if now - started > deadline:
                    failure = f"did not finish within its {deadline:.0f}s deadline:\n" + _describe(
                        _group_threads(pgid, tmp)
                    )
                    break
                threads = _group_threads(pgid, tmp)
                window.append((now, _deadlocked(threads), out_file.stat().st_size))
                while now - window[0][0] > stuck_after:
                    window.popleft()
                spans = now - window[0][0] >= stuck_after * 0.9
                blocked = sum(sample[1] for sample in window) >= 0.75 * len(window)
                silent = window[0][2] == window[-1][2]
                if spans and blocked and silent and window[-1][1]:
                    failure = (
                        f"deadlocked after {now - started:.1f}s: every process of the group "
                        f"has been blocked for {stuck_after:.1f}s:\n" + _describe(threads)
                    )
                    break
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(WATCH_INTERVAL)
        finally:
            # Workers outlive a scenario that raised or was abandoned; never leave them behind.
            _kill_group(pgid, tmp)
            proc.wait()
        output = out_file.read_text(errors="replace")
        tail = "\n".join(line[:300] for line in output.splitlines()[-40:])
        if failure:
            raise ScenarioError(f"{func.__name__} {failure}\n--- output (tail) ---\n{tail}")
        if not result_file.exists():
            raise ScenarioError(
                f"{func.__name__} exited with code {proc.returncode} without a result\n"
                f"--- output (tail) ---\n{tail}"
            )
        payload = json.loads(result_file.read_text())
        if "error" in payload:
            raise ScenarioError(f"{func.__name__} raised:\n{payload['error']}")
        return payload["result"]


def _start(request: str, env: dict[str, str], directory: str, out_file: Path) -> Any:
    """Start a scenario in a session of its own: a fork of the zygote if it can, else a fresh interpreter."""
    global _zygote
    scenario_env = {**env, SCENARIO_DIR: directory}
    if env.get(NO_ZYGOTE) != "1" and _zygote_lock.acquire(blocking=False):
        # why: the zygote forks one scenario at a time; a second one at once gets a fresh interpreter.
        try:
            if _zygote is None or _fixed(_zygote.env) != _fixed(env):
                if _zygote is not None:
                    _zygote.close()
                _zygote = _Zygote(env)
            forked = _zygote.fork(request, scenario_env, directory, out_file)
            if forked is not None:
                return forked
        except BaseException:
            _zygote_lock.release()
            raise
        _zygote_lock.release()
    with out_file.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, str(HERE / "harness.py"), request],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=scenario_env,
            cwd=directory,
            start_new_session=True,
        )


# pytest names the running test in the environment: the one variable a fork may get changed.
_PER_TEST_VARIABLES = ("PYTEST_CURRENT_TEST",)


def _fixed(env: dict[str, str]) -> dict[str, str]:
    """What Airflow may have read while the zygote imported it: the environment but for per-test names."""
    return {k: v for k, v in env.items() if k not in _PER_TEST_VARIABLES}


class _Zygote:
    """The parent's end of ``harness.py --zygote``: requests on its stdin, replies on a pipe of its own."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        replies, self._replies_w = os.pipe()
        self._replies = replies
        self._buffer = b""
        # why: what Airflow prints while the zygote imports it would corrupt replies sent on stdout.
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "harness.py"), "--zygote", str(self._replies_w)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # why: per-test names last, so that changing them in a fork leaves environ[0] as it is.
            env={**_fixed(env), **{k: env[k] for k in _PER_TEST_VARIABLES if k in env}},
            pass_fds=(self._replies_w,),
            start_new_session=True,
        )
        os.close(self._replies_w)
        self.broken = False

    def fork(self, request: str, env: dict[str, str], directory: str, out_file: Path) -> _Forked | None:
        """Have the zygote fork a scenario with ``env``; None when it cannot (a fresh interpreter runs it)."""
        if self.broken:
            return None
        order = {"request": request, "dir": directory, "out": str(out_file), "env": env}
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(order).encode() + b"\n")
            self.proc.stdin.flush()
            # The first reply waits for the zygote's imports: about as long as a fresh interpreter's.
            reply = self.reply(timeout=120.0)
        except (OSError, EOFError, TimeoutError):
            reply = None
        if reply is None or "pid" not in reply:
            self.close()
            return None
        return _Forked(self, reply["pid"])

    def reply(self, timeout: float) -> dict[str, Any] | None:
        """The zygote's next reply line; None if none came within ``timeout``; EOFError if it is gone."""
        give_up = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = max(0.0, give_up - time.monotonic())
            if not select.select([self._replies], [], [], left)[0]:
                return None
            chunk = os.read(self._replies, 4096)
            if not chunk:
                raise EOFError("the zygote is gone")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        if self.proc.returncode is not None:
            return
        self.broken = True
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        os.close(self._replies)
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


class _Forked:
    """A scenario the zygote forked: the part of ``Popen`` that ``run_scenario`` uses."""

    def __init__(self, zygote: _Zygote, pid: int) -> None:
        self.zygote, self.pid = zygote, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.wait(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                # The zygote reaps its fork and reports the exit status, or is gone (with its fork).
                reply = self.zygote.reply(3600.0 if timeout is None else timeout)
            except EOFError:
                reply = {"exit": -signal.SIGKILL}
                self.zygote.broken = True
            if reply is None:
                raise subprocess.TimeoutExpired(f"scenario {self.pid}", timeout or 0)
            self.returncode = int(reply["exit"])
            _zygote_lock.release()
        return self.returncode


_zygote: _Zygote | None = None
# Held from a fork's request until its exit is read: one scenario at a time per zygote.
_zygote_lock = threading.Lock()


def _zygote_main(replies: int) -> None:
    """``harness.py --zygote FD``: import Airflow, then fork a scenario per request line, one at a time."""
    for name in ZYGOTE_PRELOAD:
        importlib.import_module(name)
    # A fork of a process with threads holds only the forking thread (and maybe its locks, held by no
    # one); a preload that imported local_executor would fix 3.1's and 3.2's start method too soon.
    fit = threading.active_count() == 1 and "airflow.executors.local_executor" not in sys.modules

    def send(reply: dict[str, Any]) -> None:
        data = json.dumps(reply).encode() + b"\n"
        while data:
            data = data[os.write(replies, data) :]

    for line in sys.stdin.buffer:
        if not fit:
            send({"unfit": "the zygote has threads or imported local_executor"})
            continue
        order = json.loads(line)
        ready_r, ready_w = os.pipe()
        # why: buffered output (Airflow logs while it is imported) would land in the scenario's file.
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(ready_r)
                os.close(replies)
                _become_scenario(order)
                os.close(ready_w)
                _child_main(json.loads(order["request"]))
            finally:
                os._exit(70)
        os.close(ready_w)
        os.read(ready_r, 1)  # EOF once the fork is in its own session and directory (or dead)
        os.close(ready_r)
        send({"pid": pid})
        _, status = os.waitpid(pid, 0)
        send({"exit": os.waitstatus_to_exitcode(status)})


def _become_scenario(order: dict[str, Any]) -> None:
    """In a fork of the zygote: what ``Popen(..., cwd=dir, start_new_session=True)`` gives a fresh one."""
    os.setsid()
    os.chdir(order["dir"])
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(order["out"], os.O_WRONLY | os.O_APPEND)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)
    # Only what differs (the per-test names), in place: setproctitle finds the command line's memory by
    # walking back from environ[0], so the block the zygote was started with must stay where it is.
    for name in set(os.environ) - set(order["env"]):
        del os.environ[name]
    for name, value in order["env"].items():
        if os.environ.get(name) != value:
            os.environ[name] = value
    sys.argv = [str(HERE / "harness.py"), order["request"]]


# --------------------------------------------------------------------------------------
# Child side: the fake task runner and helpers scenarios use.
# --------------------------------------------------------------------------------------


def airflow_line() -> str:
    """Which pinned API the installed Airflow has: "3.4", "3.3", "3.2" or "3.1"."""
    import inspect

    from airflow.executors import local_executor
    from airflow.executors.base_executor import BaseExecutor

    if hasattr(BaseExecutor, "get_workload_key"):
        return "3.4"
    if hasattr(BaseExecutor, "run_workload"):
        return "3.3"
    if len(inspect.signature(local_executor._execute_work).parameters) == 3:
        return "3.2"
    return "3.1"


def fake_run(workload: Any) -> None:
    """Act out ``workload.ti.executor_config["fake"]`` in a worker, instead of running a task."""
    if (ti := getattr(workload, "ti", None)) is not None:
        spec = (ti.executor_config or {}).get("fake", {})
    elif (callback := getattr(workload, "callback", None)) is not None:
        spec = callback.data.get("fake") or {}  # a callback carries its fake in its data
    else:
        spec = {}  # a connection test: it succeeds
    if (die_once := spec.get("die_before_fork_once")) and not os.path.exists(die_once):
        # A worker killed after it took the workload, before anything of it ran (once: the marker).
        Path(die_once).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    # task-sdk's supervisor starts the task process before the task runs anything: so does this, first,
    # the way this line's task-sdk does (task_process_layout()), unless told not to (a fork of a worker
    # that imported Airflow costs milliseconds of CPU in copy-on-write faults: a thousand of them are
    # most of what a pipe-filling test spends).
    queue = getattr(ti, "queue", None) if ti is not None else None
    if not spec.get("no_fork"):
        spawned, own_group = task_process_layout(queue)
        if spawned:
            _spawn("/bin/true", ["true"], own_group)
        else:
            forked = os.fork()
            if forked == 0:
                # A task process that forks in turn (a multiprocessing pool with fork) runs the at-fork
                # hooks it inherited from its worker.
                for _ in range(spec.get("task_process_forks", 0)):
                    if (grandchild := os.fork()) == 0:
                        os._exit(0)
                    os.waitpid(grandchild, 0)
                os._exit(0)
            os.waitpid(forked, 0)
    if spec.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Announce the start only once the workload is set up as asked, so a test reacting to it never
    # races the setup (a SIGTERM sent before SIG_IGN was in place would kill a "stubborn" worker).
    if started_dir := spec.get("started_dir"):
        Path(started_dir, f"{workload.ti.task_id}.{os.getpid()}").touch()
    if marks := spec.get("marks"):
        _run_task_process(
            marks, spec.get("mark_as", workload.ti.task_id), spec.get("mark_for", 30.0), spec, queue
        )
    if wait_for := spec.get("wait_for"):
        give_up = time.monotonic() + spec.get("wait_timeout", 60)
        while not os.path.exists(wait_for) and time.monotonic() < give_up:
            time.sleep(0.01)
    if left_for := spec.get("leave_behind"):
        # A process the task leaves running (a daemon it started), holding all it inherited from the worker.
        if (left := os.fork()) == 0:
            time.sleep(left_for)
            os._exit(0)
        Path(spec["started_dir"], f"left_behind.{left}").touch()
    if seconds := spec.get("sleep"):
        time.sleep(seconds)
    if fail_bytes := spec.get("fail_bytes"):
        raise RuntimeError("x" * fail_bytes)
    if spec.get("fail_unloadable"):
        raise NeedsResponse("HTTP 503 from the API", response=None)


class NeedsResponse(Exception):
    """Pickles (its args are only the message) but does not unpickle, as ``httpx.HTTPStatusError``."""

    def __init__(self, message: str, response: Any) -> None:
        super().__init__(message)
        self.response = response


MARK_INTERVAL = 0.05  # seconds between two marks of a task process


def task_process_layout(queue: str | None = None) -> tuple[bool, bool]:
    """How this line's task-sdk starts a task process: (without ``fork()``, in a process group of its own).

    task-sdk 1.3 and 1.4 put it in its own process group (``os.setpgid(0, 0)``); 1.4 spawns it with
    ``posix_spawn`` on macOS and with ``[core] execute_tasks_new_python_interpreter``, and starts a task
    routed to another runtime's coordinator (``[sdk] queue_to_coordinator``) with subprocess: no at-fork
    handler runs for either. 1.1 and 1.2 fork it into the worker's process group.
    """
    import inspect

    from airflow.sdk.execution_time import supervisor

    own_group = "new_process_group" in inspect.signature(supervisor.WatchedSubprocess.start).parameters
    uses_exec = getattr(supervisor, "_task_process_uses_exec", None)
    spawned = bool(uses_exec is not None and uses_exec())
    if queue is not None and not spawned:
        try:
            from airflow.sdk.execution_time import coordinator
        except ImportError:
            return False, own_group
        chosen = coordinator.get_coordinator_manager().for_queue(queue)
        spawned = type(chosen).__name__ != "_PythonCoordinator"
    return spawned, own_group


def _spawn(path: str, argv: list[str], own_group: bool) -> int:
    """``posix_spawn`` and wait, in a process group of its own (as ``setpgid(0, 0)``) if asked."""
    if own_group:
        pid = os.posix_spawn(path, argv, os.environ, setpgroup=0)
    else:
        pid = os.posix_spawn(path, argv, os.environ)
    return os.waitpid(pid, 0)[1]


def _mark(marks: str, tag: str, seconds: float | str) -> None:
    fd = os.open(marks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    give_up = time.monotonic() + float(seconds)
    while time.monotonic() < give_up:
        # One write per line, O_APPEND: lines of different processes never mix.
        os.write(fd, f"{tag} {os.getpid()} {time.monotonic():.6f}\n".encode())
        time.sleep(MARK_INTERVAL)


def _run_task_process(
    marks: str, tag: str, seconds: float, spec: dict[str, Any], queue: str | None = None
) -> None:
    """
    Start a task process and wait for it, as task-sdk's ``supervise`` does on this line.

    The task process is quiet: it writes nothing to the worker, only a line ``tag pid monotonic``
    to ``marks`` every ``MARK_INTERVAL`` seconds for ``seconds``. With ``spec["mark_detached"]`` it
    leaves that work to a process of its own and exits at once, as a task that starts something in
    the background and returns. With ``spec["mark_in_own_session"]`` it leaves that work to a
    process in a session of its own and waits for it, as BashOperator's SubprocessHook does (and with
    ``spec["exit_with_worker"]`` exits as soon as its worker is gone, leaving that process orphaned).
    """
    spawned, own_group = task_process_layout(queue)
    if spawned and not (spec.get("mark_detached") or spec.get("mark_in_own_session")):
        # The spawned interpreter imports this file alone (not Airflow) to mark.
        code = "import sys; sys.path.insert(0, sys.argv[1]); import harness; harness._mark(*sys.argv[2:])"
        argv = [sys.executable, "-c", code, str(HERE), marks, tag, str(seconds)]
        _spawn(sys.executable, argv, own_group)
        return
    child = os.fork()
    if child == 0:
        try:
            if own_group:
                os.setpgid(0, 0)
            if spec.get("mark_detached") and os.fork() != 0:
                os._exit(0)
            if spec.get("mark_in_own_session"):
                grandchild = os.fork()
                if grandchild != 0:
                    # With "exit_with_worker", as a task process whose log line to its dead worker fails.
                    worker = os.getppid()
                    while not os.waitpid(grandchild, os.WNOHANG)[0]:
                        if spec.get("exit_with_worker") and os.getppid() != worker:
                            os._exit(1)
                        time.sleep(0.01)
                    os._exit(0)
                os.setsid()
                if spec.get("fork_on_usr1"):
                    # One more process of the task when the test says: the child marks on as its parent did.
                    signal.signal(signal.SIGUSR1, lambda *_: os.fork())
            _mark(marks, tag, seconds)
        finally:
            os._exit(0)
    os.waitpid(child, 0)


def read_marks(marks: str) -> list[tuple[str, int, float]]:
    """The ``(tag, pid, monotonic time)`` lines task processes wrote to ``marks``, in file order."""
    try:
        text = Path(marks).read_text()
    except FileNotFoundError:
        return []
    lines = []
    # The last piece is "" or a line still being written: only complete lines count.
    for line in text.split("\n")[:-1]:
        tag, pid, when = line.split()
        lines.append((tag, int(pid), float(when)))
    return lines


def install_fake_runner() -> None:
    """Replace the task runner in this process, so the workers forked (or spawned) from it inherit it."""
    from airflow.executors import local_executor

    line = airflow_line()
    if line in ("3.3", "3.4"):
        from airflow.executors.base_executor import BaseExecutor

        def run_workload(workload: Any, **_: Any) -> int:
            fake_run(workload)
            return 0

        BaseExecutor.run_workload = staticmethod(run_workload)  # type: ignore[method-assign, unused-ignore]
    else:

        def execute_work(log: Any, workload: Any, *_: Any) -> None:
            fake_run(workload)

        local_executor._execute_work = execute_work  # type: ignore[attr-defined, unused-ignore]


def make_workload(
    task_id: str,
    *,
    fake: dict[str, Any] | None = None,
    pad: int = 900,
    same_ti_as: Any = None,
    priority_weight: int = 1,
    queue: str = "default",
) -> Any:
    """
    A realistic ``ExecuteTask`` (about 1.7 KB pickled with the default ``pad``).

    ``pad`` sizes the token the way a real JWT and paths size a real workload. ``same_ti_as``
    (another workload) makes this one a new dispatch of the same task instance, as a resumed
    deferral is: the same key on every line (3.4 keys by the task instance's uuid).
    """
    from airflow.executors import workloads

    ti_fields = workloads.TaskInstance.model_fields
    ti_kwargs: dict[str, Any] = {
        "id": same_ti_as.ti.id if same_ti_as is not None else uuid.uuid4(),
        "dag_version_id": uuid.uuid4(),
        "task_id": task_id,
        "dag_id": "lepatch_dag",
        "run_id": "manual__2026-11-30T00:00:00+00:00",
        "try_number": 1,
        "map_index": -1,
        "pool_slots": 1,
        "queue": queue,
        "priority_weight": priority_weight,
        "executor_config": {"fake": fake or {}},
    }
    if "hostname" in ti_fields:
        ti_kwargs["hostname"] = None
    ti = workloads.TaskInstance(**{k: v for k, v in ti_kwargs.items() if k in ti_fields})
    return workloads.ExecuteTask(
        ti=ti,
        dag_rel_path="dags/lepatch_dag.py",
        token="t" * pad,
        bundle_info=workloads.BundleInfo(name="dags-folder", version=None),
        log_path=f"dag_id=lepatch_dag/run_id=manual/task_id={task_id}/attempt=1.log",
    )


# Executor key -> the task id it was made with (a 3.4 key is the task instance's uuid).
_LABELS: dict[Any, str] = {}


def key_of(workload: Any) -> Any:
    """The key the executor uses for ``workload`` (its events, ``running``, its queues)."""
    from airflow.executors.base_executor import BaseExecutor

    get_key = getattr(BaseExecutor, "get_workload_key", None)
    if get_key is not None:
        from airflow.executors.local_executor import LocalExecutor

        key = LocalExecutor.get_workload_key(workload)
    else:
        key = workload.ti.key
    _LABELS[key] = workload.ti.task_id
    return key


def label(key: Any) -> str:
    """The task id of a key made by ``key_of`` (or any key that carries one)."""
    return _LABELS.get(key) or key.task_id


def queued(executor: Any) -> dict[Any, Any]:
    """The executor's queued task workloads by key (``executor_queues`` on 3.4)."""
    queues = getattr(executor, "executor_queues", None)
    if queues is not None:
        from airflow.executors.workloads import WorkloadType

        tasks: dict[Any, Any] = queues[WorkloadType.EXECUTE_TASK]
        return tasks
    tasks = executor.queued_tasks
    return tasks


def new_executor(parallelism: int) -> Any:
    from airflow.executors.local_executor import LocalExecutor

    executor = LocalExecutor(parallelism=parallelism)
    executor.start()
    return executor


def airflow_threads() -> list[str]:
    """The threads besides this one that Airflow's code started (a test's own timers do not count)."""
    names = []
    for thread in threading.enumerate():
        if thread is threading.current_thread():
            continue
        target = getattr(thread, "_target", None)
        module = getattr(target, "__module__", None) or type(thread).__module__
        if module.startswith("airflow"):
            names.append(thread.name)
    return names


class ForkRecorder:
    """Count this process's forks, and keep each one made while a thread Airflow started was alive."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.forks = 0
        self.with_threads: list[dict[str, Any]] = []

    def before(self) -> None:
        if os.getpid() != self.pid:  # a worker's own forks (its task processes) are its business
            return
        self.forks += 1
        if names := airflow_threads():
            stack = traceback.format_stack(limit=10)[:-1]
            self.with_threads.append({"threads": names, "at": "".join(stack)})


def record_forks() -> ForkRecorder:
    """Record every fork of this process from now on (an at-fork handler stays for good)."""
    recorder = ForkRecorder()
    os.register_at_fork(before=recorder.before)
    return recorder


def dispatch(executor: Any, items: Iterable[Any]) -> None:
    """Queue workloads and hand them to the executor in one batch, as ``trigger_tasks`` does."""
    batch = list(items)
    for workload in batch:
        key_of(workload)  # so label() can name its key in the events
        executor.queue_workload(workload, session=None)
    executor._process_workloads(batch)


def heartbeat(executor: Any) -> None:
    """What the scheduler's heartbeat does: hand over what waits in the executor's queues, then sync()."""
    trigger = getattr(executor, "trigger_workloads", None) or executor.trigger_tasks  # 3.4 renamed it
    trigger(executor.parallelism - len(executor.running))
    executor.sync()


def wait_for_states(
    executor: Any, keys: Iterable[Any], timeout: float = 30.0, stall_after: float = 2.0
) -> dict[str, str]:
    """
    Call ``sync()`` until every key has a terminal state in the event buffer; "missing" for the rest.

    Gives up before ``timeout`` once nothing can arrive any more: no key ended for ``stall_after``
    seconds while every other process of the scenario sat blocked (a pipe, a lock, a wait), so no
    worker is running, starting or writing anything. That is how a lost workload looks.
    """
    import multiprocessing

    from airflow.utils.state import TaskInstanceState

    terminal = {TaskInstanceState.SUCCESS, TaskInstanceState.FAILED}
    if multiprocessing.get_start_method() != "fork":
        timeout *= SPAWN_SLOWDOWN  # workers start slowly; a lost workload is still caught by the stall
    pending = set(keys)
    states: dict[str, str] = {}
    give_up = time.monotonic() + timeout
    quiet_since = time.monotonic()
    while pending and time.monotonic() < give_up:
        heartbeat(executor)
        for key in list(pending):
            if key in executor.event_buffer and executor.event_buffer[key][0] in terminal:
                states[label(key)] = str(executor.event_buffer[key][0])
                pending.discard(key)
                quiet_since = time.monotonic()
        # Reading /proc for every thread costs milliseconds of CPU the workers need; while keys keep
        # ending nothing is stalled, so look only once none has ended for a while.
        quiet = time.monotonic() - quiet_since
        if quiet > QUIET_BEFORE_LOOKING and not _others_blocked():
            quiet_since = time.monotonic()
        elif quiet > stall_after:
            break
        time.sleep(0.005)
    for key in pending:
        states[label(key)] = "missing"
    return states


def _others_blocked() -> bool:
    """Every process of this scenario's group but this one is blocked (true when there is none)."""
    me = os.getpid()
    others = [t for t in _group_threads(os.getpgid(0), os.environ.get(SCENARIO_DIR)) if t.pid != me]
    return not others or _deadlocked(others)


def terminal_states(executor: Any) -> dict[str, str]:
    return {label(key): str(state) for key, (state, _) in executor.event_buffer.items()}


def wait_until(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.01) -> bool:
    import multiprocessing

    if multiprocessing.get_start_method() != "fork":
        timeout *= SPAWN_SLOWDOWN
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def _child_main(request: dict[str, Any]) -> None:
    import multiprocessing

    # 3.1 and 3.2 read the start method when local_executor is imported: set it first.
    multiprocessing.set_start_method(request["start_method"], force=True)
    result_file = Path(request["result_file"])
    recorder = record_forks() if os.environ.get(FORK_CHECK) == "1" else None
    try:
        install_fake_runner()
        spec = importlib.util.spec_from_file_location("lepatch_scenario", request["module"])
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        result = getattr(module, request["func"])(**request["kwargs"])
        payload: dict[str, Any] = {"result": result}
        if recorder is not None and recorder.with_threads:
            first = recorder.with_threads[0]
            payload = {
                "error": f"{len(recorder.with_threads)} of {recorder.forks} forks of the executor's process "
                f"had {first['threads']} alive ({FORK_CHECK}=1); the first from:\n{first['at']}"
            }
    except BaseException:
        payload = {"error": traceback.format_exc()}
    result_file.write_text(json.dumps(payload, default=str))
    sys.stdout.flush()
    # Skip interpreter teardown: atexit handlers would join workers a scenario left behind.
    os._exit(0)


def smoke() -> int:
    """A no-database dispatch through the installed LocalExecutor: two tasks, one fails."""
    import multiprocessing

    for name, value in environment().items():
        os.environ.setdefault(name, value)
    multiprocessing.set_start_method("fork", force=True)
    install_fake_runner()
    executor = new_executor(parallelism=2)
    ok, bad = make_workload("smoke_ok"), make_workload("smoke_fail", fake={"fail_bytes": 64})
    dispatch(executor, [ok, bad])
    states = wait_for_states(executor, [key_of(ok), key_of(bad)], timeout=30)
    executor.end()
    expected = {"smoke_ok": "success", "smoke_fail": "failed"}
    print(json.dumps({"states": states, "expected": expected}))
    return 0 if states == expected else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["--smoke"]:
        sys.exit(smoke())
    if sys.argv[1:2] == ["--zygote"]:
        _zygote_main(int(sys.argv[2]))
        sys.exit(0)
    _child_main(json.loads(sys.argv[1]))
elif __name__ == "__mp_main__":
    # A worker started with the spawn method imports this file as its main module before it
    # unpickles its target: this is where it gets the fake runner the parent had.
    install_fake_runner()

"""``--executor celery``: a real CeleryExecutor for the e2e session (Redis broker, Celery workers).

The session starts Debian's ``redis-server`` on a free loopback port, with its own directory and
configuration file (no persistence, nothing shared with a system Redis), as the broker; PostgreSQL
(:class:`tools.measure.e2e.stack.Postgres`) is the metadata database and the Celery result backend.
:class:`CeleryStack` is the stack of :mod:`tools.measure.e2e.stack` with ``CeleryExecutor`` and
``airflow celery worker`` processes beside api-server, scheduler and dag-processor.

Every process started here leads its own session (``start_new_session``): the worker's prefork
pool children and their task processes (task-sdk 1.3 puts those in a process group of their own,
still in the session) are found by session id and killed by pid when the stack stops, whether it
stops normally, on an error or on Ctrl-C. Nothing is matched by name.

The task processes' supervisor (task-sdk's ``supervise()``) runs in the pool children; its
``Workload finished`` lines, which the stall count reads, are in the worker's log.

``--celery-reap-sigchld`` is an opt-in hook for apache/airflow#70117: each pool child gets a SIGCHLD
handler that reaps every child with ``waitpid(-1, WNOHANG)``, as a worker whose pool installs one
would. psutil's ``wait()`` then returns ``None`` for the task process, and an unpatched supervisor
waits for an exit code that never comes, holding its slot.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from tools.measure.e2e import procfs
from tools.measure.e2e.stack import (
    AirflowStack,
    Process,
    StackConfig,
    StackError,
    free_port,
    sweep_sessions,
    tail,
)

INSTALL_REDIS = "apt-get install redis-server"
# celery prints "<name>@<host> ready." once its pool is up and it consumes from the broker.
READY = re.compile(r"@\S+ ready\.")
REAP_MODULE = "lepatch_celery_reap"
REAP_LOG_ENV = "LEPATCH_CELERY_REAP_LOG"
# What patch 10's supervisor logs when psutil's wait() returned None (the process was reaped elsewhere).
REAPED_ELSEWHERE = "Process was reaped elsewhere"
WORKLOAD_FINISHED = re.compile(r"(?:Workload|Task) finished.*?(?:workload_id|task_instance_id)=([0-9a-f-]+)")


# -- Redis -------------------------------------------------------------------------------------


def find_redis_server() -> str | None:
    return shutil.which("redis-server")


def redis_config(port: int, root: Path) -> str:
    """A throwaway broker: loopback only, no persistence, its files in ``root``."""
    return "\n".join(
        [
            f"port {port}",
            "bind 127.0.0.1",
            "protected-mode yes",
            "daemonize no",
            "supervised no",
            f"dir {root}",
            f"pidfile {root / 'redis.pid'}",
            'logfile ""',
            'save ""',
            "appendonly no",
            "",
        ]
    )


def redis_ping(port: int, timeout: float = 1.0) -> bool:
    """True when a Redis on 127.0.0.1:``port`` answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class Redis:
    """``redis-server`` on a free 127.0.0.1 port, its config and data in a temporary directory."""

    def __init__(self, say: Callable[[str], None], binary: str | None = None):
        found = binary or find_redis_server()
        if not found or not Path(found).is_file():
            raise StackError(
                f"redis-server not found (--executor celery's broker); install it: {INSTALL_REDIS}"
            )
        self.binary = found
        self.say = say
        self.root = Path(tempfile.mkdtemp(prefix="lepatch-e2e-redis-"))
        self.port = free_port()
        self.config = self.root / "redis.conf"
        self.proc = Process("redis", [self.binary, str(self.config)], self.root / "redis.log")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 15.0) -> None:
        self.config.write_text(redis_config(self.port, self.root))
        self.proc.start(
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}, cwd=self.root
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.proc.alive():
                raise StackError(f"redis-server exited ({self.proc.exit_code()}):\n{tail(self.proc.log)}")
            if redis_ping(self.port):
                return
            time.sleep(0.05)
        raise StackError(f"redis-server not answering PING after {timeout:g} s:\n{tail(self.proc.log)}")

    def stop(self) -> None:
        if self.proc.popen is not None:
            self.proc.stop(signal.SIGTERM, timeout=10)
            sweep_sessions([self.proc.pid])
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Redis:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# -- process groups (the Celery workers) --------------------------------------------------------


class ProcessGroup:
    """Processes that each lead a session of their own, stopped together: SIGTERM to each leader,
    a bounded wait, SIGKILL, then every process still in one of their sessions (pool children,
    task processes, whatever those started) by pid. Also a context manager: stopped on the way out,
    an exception or a KeyboardInterrupt included."""

    def __init__(self) -> None:
        self.procs: list[Process] = []

    def start(self, name: str, argv: list[str], log: Path, env: dict[str, str], cwd: Path) -> Process:
        proc = Process(name, argv, log)
        self.procs.append(proc)  # before it starts: a Ctrl-C during Popen still finds it
        proc.start(env, cwd)
        return proc

    @property
    def sids(self) -> list[int]:
        return [p.pid for p in self.procs if p.popen is not None]

    def members(self) -> list[int]:
        """Every live process in the group's sessions."""
        return procfs.session_members(self.sids)

    def stop(self, timeout: float = 15.0) -> dict[str, Any]:
        sids = self.sids
        out: dict[str, Any] = {}
        for proc in self.procs:
            if proc.popen is None:
                continue
            was_alive = proc.alive()
            if was_alive:
                procfs.send(proc.pid, signal.SIGTERM)
        t0 = time.monotonic()
        for proc in self.procs:
            if proc.popen is None:
                continue
            left = max(0.0, timeout - (time.monotonic() - t0))
            graceful, _ = proc.stop(signal.SIGTERM, left)
            out[proc.name] = {"graceful": graceful, "seconds": round(time.monotonic() - t0, 2)}
        leftovers = sweep_sessions(sids)
        if leftovers:
            out["leftover_pids_killed"] = {"pids": leftovers}
        # SIGKILL is delivered asynchronously: return once the kernel has really ended them.
        deadline = time.monotonic() + 5.0
        while procfs.session_members(sids) and time.monotonic() < deadline:
            time.sleep(0.02)
        return out

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# -- SIGCHLD evidence ---------------------------------------------------------------------------


def sigchld_report(worker_pid: int) -> dict[str, Any]:
    """SIGCHLD in the worker's main process and in each prefork pool child (where supervise() runs)."""
    out: dict[str, Any] = {}
    try:
        out["main"] = procfs.signal_disposition(worker_pid)
    except procfs.ProcGone:
        return {"main": "gone"}
    pool: dict[str, int] = {}
    for child in procfs.children(worker_pid):
        try:
            d = procfs.signal_disposition(child)
        except procfs.ProcGone:
            continue
        pool[d] = pool.get(d, 0) + 1
    out["pool_children"] = pool
    return out


# -- the hook for apache/airflow#70117 ----------------------------------------------------------

REAP_HOOK = f'''"""--celery-reap-sigchld (tools/measure/e2e/celery.py): a SIGCHLD handler in each pool
child that reaps every child with waitpid(-1), as in apache/airflow#70117. Test use only."""
import os
import signal

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG
from celery.signals import worker_process_init

CELERY_CONFIG = dict(DEFAULT_CELERY_CONFIG)
_LOG = os.environ.get("{REAP_LOG_ENV}")


def _reap(signum, frame):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if _LOG:
            with open(_LOG, "a") as f:
                f.write(f"{{os.getpid()}} reaped {{pid}} status {{status}}\\n")


@worker_process_init.connect(weak=False)
def _install(**_):
    signal.signal(signal.SIGCHLD, _reap)
'''


def write_reap_hook(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{REAP_MODULE}.py"
    path.write_text(REAP_HOOK)
    return path


# The Celery task around supervise() ended (celery's own log lines), and the supervisor's success
# overtime: it kills a task process that reported success but has not exited after
# [core] task_success_overtime (20 s), which is how 3.3's supervisor ends a wait for an exit code
# that psutil will never give (the process reaped elsewhere), with an error.
CELERY_SUCCEEDED = re.compile(r"Task execute_workload\[[^\]]+\] succeeded in")
CELERY_RAISED = re.compile(r"Task execute_workload\[[^\]]+\] raised unexpected")
SUCCESS_OVERTIME = "Task success overtime reached"


def outcomes(worker_log: Path) -> dict[str, int]:
    """How the worker's Celery tasks ended, and how many supervisors hit the success overtime."""
    try:
        text = worker_log.read_text(errors="replace")
    except OSError:
        text = ""
    return {
        "celery_succeeded": len(CELERY_SUCCEEDED.findall(text)),
        "celery_raised": len(CELERY_RAISED.findall(text)),
        "success_overtime_kills": text.count(SUCCESS_OVERTIME),
        "reaped_elsewhere_warnings": text.count(REAPED_ELSEWHERE),
    }


def count_reaped(log: Path) -> int:
    try:
        return sum(1 for ln in log.read_text().splitlines() if " reaped " in ln)
    except OSError:
        return 0


def finished_ids(worker_log: Path) -> set[str]:
    """The task instances whose supervisor has returned (its ``Workload finished`` line)."""
    try:
        text = worker_log.read_text(errors="replace")
    except OSError:
        return set()
    return set(WORKLOAD_FINISHED.findall(text))


def lingering(ended_ids: Iterable[str], worker_log: Path) -> list[str]:
    """Task instances that ended (per the API) whose supervisor has not returned yet."""
    done = finished_ids(worker_log)
    return sorted(i for i in ended_ids if i not in done)


# -- the stack ------------------------------------------------------------------------------------


class CeleryStack(AirflowStack):
    """api-server, scheduler, dag-processor with CeleryExecutor, and ``airflow celery worker``s.

    ``cfg.parallelism`` is both ``[core] parallelism`` and each worker's ``--concurrency`` (prefork).
    """

    def __init__(
        self,
        cfg: StackConfig,
        say: Callable[[str], None],
        broker_url: str,
        workers: int = 1,
        reap_sigchld: bool = False,
    ):
        if not cfg.db_url:
            raise StackError("--executor celery needs PostgreSQL (the Celery result backend): --db postgres")
        self.broker_url = broker_url
        self.n_workers = workers
        self.reap_sigchld = reap_sigchld
        self.workers = ProcessGroup()
        super().__init__(cfg, say)

    @property
    def reap_log(self) -> Path:
        return self.cfg.home / "logs" / "reaped.txt"

    def _env(self) -> dict[str, str]:
        env = super()._env()
        db = self.cfg.db_url or ""
        env.update(
            {
                "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                "AIRFLOW__CELERY__BROKER_URL": self.broker_url,
                "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + db.replace("+psycopg2", ""),
                "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(self.cfg.parallelism),
                "AIRFLOW__CELERY__POOL": "prefork",
            }
        )
        env.update(self.cfg.extra_env)
        return env

    def worker_log(self, n: int = 1) -> Path:
        return self.cfg.home / "logs" / f"celery-worker-{n}.log"

    def worker_env(self) -> dict[str, str]:
        env = dict(self.env)
        if self.reap_sigchld:
            hooks = self.cfg.home / "hooks"
            write_reap_hook(hooks)
            env["PYTHONPATH"] = str(hooks)
            env["AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS"] = f"{REAP_MODULE}.CELERY_CONFIG"
            env[REAP_LOG_ENV] = str(self.reap_log)
        return env

    def launch(self) -> None:
        super().launch()
        env = self.worker_env()
        for n in range(1, self.n_workers + 1):
            argv = [
                str(self.cfg.venv / "bin" / "airflow"),
                "celery",
                "worker",
                "--concurrency",
                str(self.cfg.parallelism),
                "--celery-hostname",
                f"lepatch{n}@%h",
                "--skip-serve-logs",
            ]
            self.workers.start(f"celery-worker-{n}", argv, self.worker_log(n), env, self.cfg.home)

    def check_alive(self) -> None:
        super().check_alive()
        for proc in self.workers.procs:
            if not proc.alive():
                raise StackError(
                    f"{proc.name} (pid {proc.pid}) exited with code {proc.exit_code()}; "
                    f"last lines of {proc.log}:\n{tail(proc.log)}"
                )

    def _not_ready(self, dag_id: str) -> str | None:
        for proc in self.workers.procs:
            try:
                text = proc.log.read_text(errors="replace")
            except OSError:
                text = ""
            if not READY.search(text):
                return f"{proc.name} ready"
        h = self.health()
        if h is None:
            return "api-server"
        for part in ("metadatabase", "scheduler", "dag_processor"):
            if (h.get(part) or {}).get("status") != "healthy":
                return f"{part} healthy"
        try:
            dag = self.get(f"/api/v2/dags/{dag_id}")
        except OSError:
            return f"DAG {dag_id} parsed"
        if dag.get("is_paused"):
            return f"DAG {dag_id} unpaused"
        return None

    def stop(self, timeout: float = 20.0) -> dict[str, dict[str, Any]]:
        out = super().stop(timeout)
        # Celery's warm shutdown waits for running tasks; a lingering supervisor never ends: bounded.
        workers = self.workers.stop(timeout=15.0)
        for name, info in workers.items():
            out[name if name != "leftover_pids_killed" else "worker_leftover_pids_killed"] = info
        return out

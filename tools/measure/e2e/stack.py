"""A real Airflow on loopback for the e2e session: database, api-server, scheduler, dag-processor.

Every component is its own process (started with ``start_new_session``, so each is the leader
of its own session), with its own log file, so a crash is visible per process. ``stop()`` ends
them by pid: SIGTERM, a bounded wait, then SIGKILL; afterwards every process still in one of
those sessions (task processes that put themselves into their own process group, orphans
reparented to init) is killed by pid too. Nothing is matched by name.

The database is SQLite in the stack's home, or a PostgreSQL server (Debian's binaries) that the
session starts on 127.0.0.1 with its data in a temporary directory and stops again.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.measure.e2e import procfs
from tools.measure.e2e.watch import RestApi


class StackError(Exception):
    """A component failed to start or died; the message names it and quotes its log."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def tail(path: Path, lines: int = 25, width: int = 220) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join("    " + (ln if len(ln) <= width else ln[: width - 3] + "...") for ln in text[-lines:])


@dataclass
class Process:
    """One launched process: its argv, Popen handle and log file."""

    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    started: float = 0.0

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def start(self, env: dict[str, str], cwd: Path, user: str | None = None) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                user=user,
            )
        self.started = time.monotonic()

    def exit_code(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> tuple[bool, float]:
        """Signal, wait up to ``timeout``, then SIGKILL. Returns (stopped by ``sig``, seconds)."""
        if self.popen is None:
            return True, 0.0
        t0 = time.monotonic()
        if self.popen.poll() is not None:
            return True, 0.0
        procfs.send(self.pid, sig)
        try:
            self.popen.wait(timeout)
            return True, time.monotonic() - t0
        except subprocess.TimeoutExpired:
            procfs.send(self.pid, signal.SIGKILL)
            self.popen.wait(10)
            return False, time.monotonic() - t0


def sweep_sessions(sids: list[int], grace: float = 3.0) -> list[int]:
    """SIGTERM then SIGKILL, by pid, whatever still lives in these sessions; returns those pids."""
    left = procfs.session_members(sids)
    if not left:
        return []
    procfs.kill_pids(left, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and procfs.session_members(sids):
        time.sleep(0.1)
    procfs.kill_pids(procfs.session_members(sids), signal.SIGKILL)
    return left


# -- PostgreSQL --------------------------------------------------------------------------------


def find_pg_bindir() -> Path | None:
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name)
    )
    return candidates[-1].parent if candidates else None


def ensure_pg_installed(say: Callable[[str], None]) -> Path:
    """Debian's PostgreSQL server binaries; installed with apt-get when missing and we are root."""
    bindir = find_pg_bindir()
    if bindir:
        return bindir
    cmd = "apt-get update && apt-get install -y --no-install-recommends postgresql"
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise StackError(f"PostgreSQL server not found under /usr/lib/postgresql; install it: {cmd}")
    say(f"installing Debian's PostgreSQL server: {cmd}")
    subprocess.run(["apt-get", "update"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(
        ["apt-get", "install", "-y", "--no-install-recommends", "postgresql"],
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
    bindir = find_pg_bindir()
    if not bindir:
        raise StackError("apt-get installed postgresql but no initdb was found under /usr/lib/postgresql")
    return bindir


class Postgres:
    """A throwaway PostgreSQL server on 127.0.0.1, data in a temporary directory."""

    def __init__(self, say: Callable[[str], None]):
        self.say = say
        self.bindir = ensure_pg_installed(say)
        self.root = Path(tempfile.mkdtemp(prefix="lepatch-e2e-pg-"))
        self.port = free_port()
        # initdb and postgres refuse to run as root: run them as Debian's postgres user.
        self.user = "postgres" if os.geteuid() == 0 else None
        self.proc = Process("postgres", [], self.root / "postgres.log")
        self._dbs = 0

    def _as_user(self, argv: list[str]) -> None:
        r = subprocess.run(argv, user=self.user, capture_output=True, text=True, cwd=self.root)
        if r.returncode:
            raise StackError(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stderr or r.stdout}")

    def start(self) -> None:
        if self.user:
            shutil.chown(self.root, self.user)
        data = self.root / "data"
        self._as_user(
            [str(self.bindir / "initdb"), "-D", str(data), "-U", "airflow", "--auth=trust", "-E", "UTF8"]
        )
        self.proc.argv = [
            str(self.bindir / "postgres"),
            "-D",
            str(data),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-k",
            str(self.root),
            # A test database: durability buys nothing here and costs seconds per run.
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=200",
        ]
        self._launch()

    def _launch(self) -> None:
        self.proc.start(
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
            cwd=self.root,
            user=self.user,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not self.proc.alive():
                raise StackError(f"postgres exited ({self.proc.exit_code()}):\n{tail(self.proc.log)}")
            r = subprocess.run(
                [str(self.bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True,
            )
            if r.returncode == 0:
                return
            time.sleep(0.2)
        raise StackError(f"postgres not ready after 30 s:\n{tail(self.proc.log)}")

    def restart(self, down_s: float) -> tuple[float, float]:
        """Stop the server as ``pg_ctl stop -m fast`` does (SIGINT: every connection closed), keep it
        down ``down_s`` seconds, start it again on the same port and data; (seconds to stop, to be ready)."""
        t0 = time.monotonic()
        self.proc.stop(signal.SIGINT, timeout=20)
        stopped = time.monotonic() - t0
        time.sleep(down_s)
        t1 = time.monotonic()
        self._launch()
        return stopped, time.monotonic() - t1

    def new_database(self) -> str:
        """A fresh database per stack; returns its SQLAlchemy URL."""
        self._dbs += 1
        name = f"airflow_{self._dbs}"
        self._as_user(
            [str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "airflow", name]
        )
        return f"postgresql+psycopg2://airflow@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        # SIGINT is PostgreSQL's "fast" shutdown: roll back, close connections, exit.
        if self.proc.popen is not None:
            self.proc.stop(signal.SIGINT, timeout=20)
            sweep_sessions([self.proc.pid])
        shutil.rmtree(self.root, ignore_errors=True)


# -- Airflow -----------------------------------------------------------------------------------

COMPONENTS = ("api-server", "scheduler", "dag-processor")
# With StackConfig.split_api, the api-server that serves the execution API alone.
EXECUTION_API = "execution-api"
# The api-servers' logs (their access logs: what apistall counts), by component.
API_SERVERS = ("api-server", EXECUTION_API)


@dataclass
class StackConfig:
    venv: Path  # the venv with apache-airflow and the executor under test
    home: Path  # AIRFLOW_HOME, fresh per stack
    dag_file: Path
    db_url: str | None  # None: SQLite in home
    parallelism: int = 8
    task_seconds: float = 2.0
    task_queued_timeout: float = 30.0
    extra_env: dict[str, str] = field(default_factory=dict)
    # SQLite only: seconds a connection waits for the database lock before "database is locked"
    # (None: the driver's 5 s default).
    sqlite_busy_timeout: float | None = None
    # Connections each component's SQLAlchemy pool may hold (pool size; None: Airflow's 5, with 10
    # more as overflow).
    db_pool_size: int | None = None
    # The execution API (what task processes call: their starts, heartbeats, states) in an
    # api-server process of its own, `--apps execution`, beside the UI's and REST's `--apps core`:
    # each with its own event loop and database pool (what an operator can do instead of patch 11).
    split_api: bool = False


class AirflowStack:
    """db migrate, then api-server, scheduler and dag-processor as separate processes."""

    def __init__(self, cfg: StackConfig, say: Callable[[str], None]):
        self.cfg = cfg
        self.say = say
        self.api_port = free_port()
        self.api = f"http://127.0.0.1:{self.api_port}"
        self.execution_port = free_port() if cfg.split_api else self.api_port
        self.procs: dict[str, Process] = {}
        self._rest: RestApi | None = None
        self.env = self._env()
        self.launched_at: float | None = None
        self.ready_at: float | None = None
        self.retired: list[Process] = []  # components stopped and started again (restart())

    # The configuration is environment only, so every component (and every CLI call) shares it.
    def _env(self) -> dict[str, str]:
        c = self.cfg
        busy = f"?timeout={c.sqlite_busy_timeout:g}" if c.sqlite_busy_timeout else ""
        db = c.db_url or f"sqlite:///{c.home / 'airflow.db'}{busy}"
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("AIRFLOW") and k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
        }
        env.update(
            {
                "PATH": f"{c.venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                "VIRTUAL_ENV": str(c.venv),
                "AIRFLOW_HOME": str(c.home),
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": str(c.parallelism),
                "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "256",
                "AIRFLOW__CORE__DAGS_FOLDER": str(c.home / "dags"),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.execution_port}/execution/",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db,
                # Scheduler and api-server must sign and check tokens with the same secret.
                "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
                "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.api_port),
                "AIRFLOW__API__BASE_URL": f"{self.api}/",
                "AIRFLOW__API__WORKERS": "1",
                # The throughput DAG has hundreds of task instances: one page of the API for them.
                "AIRFLOW__API__MAXIMUM_PAGE_LIMIT": "1000",
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": f"{c.task_queued_timeout:g}",
                "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "LEPATCH_E2E_TASK_SECONDS": f"{c.task_seconds:g}",
            }
        )
        if c.db_pool_size is not None:
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_SIZE"] = str(c.db_pool_size)
        env.update(c.extra_env)
        return env

    def airflow(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        argv = [str(self.cfg.venv / "bin" / "airflow"), *args]
        try:
            r = subprocess.run(
                argv,
                env=self.env,
                cwd=self.cfg.home,
                capture_output=True,
                text=True,
                timeout=timeout,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired as e:
            raise StackError(f"`airflow {' '.join(args)}` did not finish in {timeout:g} s") from e
        if r.returncode:
            out = "\n".join((r.stdout + r.stderr).splitlines()[-25:])
            raise StackError(f"`airflow {' '.join(args)}` failed ({r.returncode}):\n{out}")
        return r

    def launch(self) -> None:
        home = self.cfg.home
        (home / "dags").mkdir(parents=True, exist_ok=True)
        shutil.copy(self.cfg.dag_file, home / "dags" / self.cfg.dag_file.name)
        self.airflow("db", "migrate")
        self.launched_at = time.monotonic()
        for name, argv in self.argvs().items():
            proc = Process(name, argv, home / "logs" / f"{name}.log")
            proc.start(self.env, home)
            self.procs[name] = proc

    def argvs(self) -> dict[str, list[str]]:
        """Each component's command line, by name."""
        airflow = str(self.cfg.venv / "bin" / "airflow")
        argvs = {name: [airflow, name] for name in COMPONENTS}
        if self.cfg.split_api:
            argvs["api-server"] += ["--apps", "core"]
            argvs[EXECUTION_API] = [airflow, "api-server", "--apps", "execution"]
            argvs[EXECUTION_API] += ["--port", str(self.execution_port)]
        return argvs

    def restart(self, name: str) -> Process:
        """Start component ``name`` again (the old process must have exited); same env and log."""
        old = self.procs[name]
        if old.alive():
            raise StackError(f"cannot restart {name}: pid {old.pid} is still running")
        proc = Process(name, old.argv, old.log)
        proc.start(self.env, self.cfg.home)
        self.retired.append(old)
        self.procs[name] = proc
        return proc

    @property
    def scheduler_pid(self) -> int:
        return self.procs["scheduler"].pid

    def check_alive(self) -> None:
        for proc in self.procs.values():
            if not proc.alive():
                raise StackError(
                    f"{proc.name} (pid {proc.pid}) exited with code {proc.exit_code()}; "
                    f"last lines of {proc.log}:\n{tail(proc.log)}"
                )

    def get(self, path: str, timeout: float = 5.0) -> dict[str, Any]:
        if self._rest is None or self._rest.base != self.api:
            self._rest = RestApi(self.api)
        return self._rest.get(path, timeout)

    def health(self) -> dict[str, Any] | None:
        try:
            return self.get("/api/v2/monitor/health")
        except (OSError, ValueError):
            return None

    def wait_ready(self, dag_id: str, timeout: float = 120.0) -> float:
        """Until the API answers, scheduler and dag-processor report healthy, the DAG is parsed and
        unpaused, and the executor has forked its workers. Returns seconds since launch."""
        assert self.launched_at is not None
        deadline = time.monotonic() + timeout
        missing: str | None = "api-server"
        while time.monotonic() < deadline:
            self.check_alive()
            missing = self._not_ready(dag_id)
            if missing is None:
                self.ready_at = time.monotonic()
                return self.ready_at - self.launched_at
            time.sleep(0.25)
        raise StackError(f"stack not ready after {timeout:g} s: waiting for {missing}")

    def _not_ready(self, dag_id: str) -> str | None:
        h = self.health()
        if h is None:
            return "api-server"
        for part in ("metadatabase", "scheduler", "dag_processor"):
            if (h.get(part) or {}).get("status") != "healthy":
                return f"{part} healthy"
        try:
            dag = self.get(f"/api/v2/dags/{dag_id}")
        except urllib.error.HTTPError:
            return f"DAG {dag_id} parsed"
        except OSError:
            return "api-server"
        if dag.get("is_paused"):
            return f"DAG {dag_id} unpaused"
        workers = procfs.workers_of(self.scheduler_pid)
        if len(workers) < self.cfg.parallelism or not all(w.idle for w in workers):
            return f"{self.cfg.parallelism} idle LocalExecutor workers (have {len(workers)})"
        return None

    def stop(self, timeout: float = 20.0) -> dict[str, dict[str, Any]]:
        """Stop every component by pid (SIGTERM, then SIGKILL); returns how each one ended."""
        out: dict[str, dict[str, Any]] = {}
        # A restarted component's old session may hold what its first process left behind.
        sids = [p.pid for p in [*self.procs.values(), *self.retired] if p.popen is not None]
        # Scheduler first, so it does not dispatch into a vanishing api-server.
        for name in ("scheduler", "dag-processor", EXECUTION_API, "api-server"):
            proc = self.procs.get(name)
            if proc is None or proc.popen is None:
                continue
            was_alive = proc.alive()
            graceful, secs = proc.stop(signal.SIGTERM, timeout)
            out[name] = {
                "was_alive": was_alive,
                "graceful": graceful,
                "seconds": round(secs, 2),
                "exit_code": proc.exit_code(),
            }
        leftovers = sweep_sessions(sids)
        if leftovers:
            out["leftover_pids_killed"] = {"pids": leftovers}
        return out

"""``nox -s e2e``: the executor under test in a real Airflow, with workers killed on purpose.

For each scenario the driver starts a fresh stack on loopback (``tools.measure.e2e.stack``: db migrate,
then api-server, scheduler and dag-processor as separate processes, LocalExecutor, SQLite or
PostgreSQL), triggers ``tests/e2e/dags/lepatch_e2e.py`` (30 short tasks, ``retries=1``) with the
CLI, polls the REST API until the run is final or its deadline passes (``tools.measure.e2e.watch``),
prints a timeline (``tools.measure.e2e.timeline``) and judges the outcome. Each scenario is a
``Scenario`` below, its docstring what it does and checks; ``clean``, ``kill-running``,
``kill-queued``, ``kill-idle-reader`` and ``sigterm-running`` run, in that order, when no
``--scenario`` is given. The session around them (the venv, the servers, the stages, the signals)
is ``tools.measure.e2e.session``'s, the soak's too.

The throughput scenario runs at Airflow's own database pool (no pool setting in the stack's
environment: 5 + 10 per engine, SQLAlchemy's 30 s pool_timeout), what operators run; the other
scenarios give each component's pool (api-server, scheduler, dag-processor; each engine, sync and
async) parallelism + 8 connections with Airflow's overflow of 10 (``--db-pool headroom``, see
``POOL_HEADROOM``). ``--db-pool airflow|headroom|N`` sets one pool for every scenario. Every scenario
counts the pool timeouts in each component's log (``throughput.count_pool_timeouts``).

``--compare-stages 0,9`` runs the selected scenarios once per stage (``full`` = the series
overlay) in one invocation, each stage's executor installed in turn, and ends with a table of
each stage's throughput figures as ratios to the first stage's, and a second one of its CPU per
finished task and ceiling (``cputime.compare``); ``--rounds N`` runs that cycle N times,
interleaved (0,9,0,9), and the tables hold each stage's medians.

Every process the session starts is stopped by pid, on success and failure alike. The JSON
report goes to ``build/e2e/report.json`` (and a timestamped copy); each stack's logs stay in
``build/e2e/<stamp>/<scenario>/``. Exit status 0 only if every selected scenario passed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from tools.measure.e2e import (
    apistall,
    cputime,
    looptrace,
    orphan,
    procfs,
    scale,
    session,
    slots,
    soak_faults,
    throughput,
    uipoll,
)
from tools.measure.e2e.judge import N_TASKS, Kill, judge
from tools.measure.e2e.stack import API_SERVERS, AirflowStack, Postgres, StackConfig, StackError, tail
from tools.measure.e2e.timeline import format_timeline, rows_from_api, summarize
from tools.measure.e2e.watch import FINAL_RUN_STATES, Json, RestApi, RunWatcher, TaskSnap, WatchResult
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT as LAYOUT

if TYPE_CHECKING:
    from tools.measure.e2e.venv import AirflowVenv

DAGS_DIR = LAYOUT.root / "tests" / "e2e" / "dags"
DAG_FILE = DAGS_DIR / "lepatch_e2e.py"
DAG_ID = "lepatch_e2e"
# sigterm-running: how many tasks must be running (at most parallelism) when the scheduler is signalled.
SIGTERM_RUNNING_TASKS = 4

# kill-orphan: the task marks for ORPHAN_SECONDS, its try 1 is killed after ORPHAN_MARKS_BEFORE_KILL
# marks, and the run gets at least ORPHAN_DEADLINE seconds (the retry alone runs ORPHAN_SECONDS).
ORPHAN_SECONDS = 40
ORPHAN_MARKS_BEFORE_KILL = 2
ORPHAN_DEADLINE = 150.0
MARKS_ENV = "LEPATCH_E2E_MARKS"
ORPHAN_MARKS_FILE = "orphan-marks.txt"  # in the scenario's home
# throughput: the DAG's task count comes from TP_TASKS_ENV; the run gets at least
# TP_DEADLINE_BASE + TP_DEADLINE_PER_TASK * tasks seconds. The watcher polls less often there
# (TP_POLL_INTERVAL), so that its 200-row API reads take less CPU from the stack it measures.
TP_TASKS_ENV = "LEPATCH_E2E_TP_TASKS"
TP_DEADLINE_BASE = 60.0
TP_DEADLINE_PER_TASK = 1.0
TP_POLL_INTERVAL = 2.0
TP_QUEUED_TIMEOUT = 600.0  # [scheduler] task_queued_timeout for throughput (30 s otherwise)
TP_SQLITE_BUSY_TIMEOUT = 60.0  # SQLite lock wait for throughput (the driver's default is 5 s)
# queued-timeout: 2 x parallelism tasks of QT_TASK_SECONDS, outlasting three rounds of the
# stuck-in-queued check (QT_QUEUED_TIMEOUT, checked every QT_CHECK_INTERVAL): the third fails a task.
QT_TASKS_ENV = "LEPATCH_E2E_LONG_TASKS"
QT_TASK_SECONDS = 80.0
QT_QUEUED_TIMEOUT = 15.0
QT_CHECK_INTERVAL = 5.0
# The scheduler's log lines for a stuck-in-queued requeue and for the failure that ends them.
QT_REQUEUED = "Task stuck in queued; will try to requeue"
QT_FAILED = "Task requeue attempts exceeded max; marking failed"
# With --db-pool headroom each component's database pool holds this many connections beyond
# parallelism. With Airflow's 5 + 10, 16 task supervisors starting at once (each PATCH .../run holds
# one) and a REST request's token check (issue 52) held the api-server 30 s; the timed-out starts
# failed their tasks and left some ``running`` in the API (2026-12-01, 2026-12-07: docs/e2e.md).
POOL_HEADROOM = 8
# --db-pool: "headroom" (parallelism + POOL_HEADROOM, the default of the scenarios not in
# AIRFLOW_POOL_SCENARIOS), "airflow" (Airflow's own settings: nothing set), or a pool size.
# Airflow's [database] sql_alchemy_pool_size and sql_alchemy_max_overflow defaults, and SQLAlchemy's
# pool_timeout, which Airflow does not set (only sql_alchemy_engine_args could).
DB_POOL_HEADROOM = "headroom"
DB_POOL_AIRFLOW = "airflow"
AIRFLOW_POOL_SIZE = 5
AIRFLOW_MAX_OVERFLOW = 10
SQLALCHEMY_POOL_TIMEOUT = 30.0
POOL_SIZE_ENV = "AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_SIZE"
MAX_OVERFLOW_ENV = "AIRFLOW__DATABASE__SQL_ALCHEMY_MAX_OVERFLOW"
ENGINE_ARGS_ENV = "AIRFLOW__DATABASE__SQL_ALCHEMY_ENGINE_ARGS"
# Above this many rows the printed timeline is only its summary line (the report keeps it all).
MAX_TIMELINE_ROWS = 40


@dataclass(frozen=True)
class DagSpec:
    file: Path
    dag_id: str
    n_tasks: int


MAIN_DAG = DagSpec(DAG_FILE, DAG_ID, N_TASKS)
ORPHAN_DAG = DagSpec(DAGS_DIR / "lepatch_e2e_orphan.py", "lepatch_e2e_orphan", 1)
THROUGHPUT_DAG_FILE = DAGS_DIR / "lepatch_e2e_throughput.py"
THROUGHPUT_DAG_ID = "lepatch_e2e_throughput"
LONG_DAG_FILE = DAGS_DIR / "lepatch_e2e_long.py"
LONG_DAG_ID = "lepatch_e2e_long"
DEFAULT_TP_TASKS = 200
SCALE_DAG_FILE = DAGS_DIR / "lepatch_e2e_scale.py"
SCALE_DAG_ID = "lepatch_e2e_scale"
SCALE_TASKS_ENV = "LEPATCH_E2E_SCALE_TASKS"
SCALE_DIR_ENV = "LEPATCH_E2E_SCALE_DIR"
SCALE_JOBS_DIR = "scale-jobs"  # in the scenario's home: a file per job try
SCALE_DEFAULT_KILLS = 10
# The jobs last 5-20 s (12.5 s on average); on two shared cores each task's start costs seconds of
# CPU, and the release fails a killed worker's task only by Airflow's heartbeat timeout.
SCALE_DEADLINE_BASE = 420.0
SCALE_DEADLINE_PER_TASK = 2.0
SCALE_TICK_S = 0.2


def scenario_env(opts: Options, name: str, dag: DagSpec, home: Path) -> dict[str, str]:
    """The environment a scenario's stack gets on top of the stack's own: what the scenario needs,
    then ``--min-heartbeat-interval`` and ``--trace-loops``, then ``--airflow-env`` (the operator's
    word is last)."""
    env = SCENARIOS[name]().env(dag, home)
    if opts.min_heartbeat_interval is not None:
        env["AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL"] = str(opts.min_heartbeat_interval)
    if traces_loops(opts, name):
        env[looptrace.ENV] = str(home / looptrace.TRACE_FILE)
    if opts.executor == "package":
        from tools.delivery import package

        env["AIRFLOW__CORE__EXECUTOR"] = package.EXECUTOR_CLASS
    env.update(opts.airflow_env)
    return env


def traces_loops(opts: Options, name: str | None = None) -> bool:
    """Whether the scheduler's loops are recorded (in scenario ``name``; None: in any of the session's).
    Always in throughput: the executor's CPU per task (its heartbeat's) comes from the trace."""
    names = opts.scenarios if name is None else [name]
    return opts.trace_loops or any(SCENARIOS[n].traces_loops for n in names)


def scenario_db_pool(opts: Options, name: str | None = None) -> str:
    """Scenario ``name``'s ``--db-pool``: the one given, else Airflow's own for throughput (it measures
    what operators run) and the headroom for the others (they judge the executor under kills, which a
    30 s pool stall of the api-server's would fail for a reason that is not the executor's). ``name``
    None: the session's, when all its scenarios have the same (else the headroom)."""
    if opts.db_pool is not None:
        return opts.db_pool
    if name is None:
        pools = {scenario_db_pool(opts, n) for n in opts.scenarios}
        return pools.pop() if len(pools) == 1 else DB_POOL_HEADROOM
    return DB_POOL_AIRFLOW if SCENARIOS[name].airflow_pool else DB_POOL_HEADROOM


def db_pool_size(opts: Options, name: str | None = None) -> int | None:
    """The pool size the stack sets for every component in scenario ``name`` (None: none, Airflow's 5)."""
    pool = scenario_db_pool(opts, name)
    if pool == DB_POOL_AIRFLOW:
        return None
    if pool == DB_POOL_HEADROOM:
        return opts.parallelism + POOL_HEADROOM
    return int(pool)


def pool_settings(opts: Options, name: str | None = None) -> Json:
    """Each component's pool in scenario ``name`` as the stack configures it: ``--db-pool`` (or the
    scenario's default), then what ``--airflow-env`` sets (pool size, max overflow, a ``pool_timeout``
    in the engine args)."""
    size = db_pool_size(opts, name)
    out: Json = {
        "db_pool": scenario_db_pool(opts, name),
        "pool_size": AIRFLOW_POOL_SIZE if size is None else size,
        "max_overflow": AIRFLOW_MAX_OVERFLOW,
        "pool_timeout_s": SQLALCHEMY_POOL_TIMEOUT,
    }
    env = opts.airflow_env
    for key, name in (("pool_size", POOL_SIZE_ENV), ("max_overflow", MAX_OVERFLOW_ENV)):
        with contextlib.suppress(KeyError, ValueError):
            out[key] = int(env[name])
    try:
        timeout = json.loads(env[ENGINE_ARGS_ENV]).get("pool_timeout")
    except (KeyError, ValueError, AttributeError):
        timeout = None
    if isinstance(timeout, (int, float)):
        out["pool_timeout_s"] = float(timeout)
    return out


def pool_text(opts: Options, name: str | None = None) -> str:
    """``db pool 24 + 10, timeout 30 s``, with `` (Airflow's)`` for Airflow's own; ``name`` None and
    scenarios with different pools: each one's, ``...; throughput: db pool 5 + 10, ...``."""
    if name is None and opts.db_pool is None:
        texts = {n: pool_text(opts, n) for n in opts.scenarios}
        if len(set(texts.values())) > 1:
            return "; ".join(f"{n}: {t}" for n, t in texts.items())
        name = opts.scenarios[0] if opts.scenarios else None
    ps = pool_settings(opts, name)
    text = f"db pool {ps['pool_size']} + {ps['max_overflow']}, timeout {ps['pool_timeout_s']:g} s" + (
        " (Airflow's)" if scenario_db_pool(opts, name) == DB_POOL_AIRFLOW else ""
    )
    return text + (" per api-server; the execution API in an api-server of its own" if opts.split_api else "")


def stage_label(stage: int | None, executor: str = "overlay") -> str:
    """How a stage is named in the comparison table: "stage 0", "stage 9", "full series"; with
    ``--executor celery`` only task-sdk's supervisor changes: "unpatched", "fixed"."""
    if executor == "celery":
        return "fixed" if stage is None else "unpatched"
    return "full series" if stage is None else f"stage {stage}"


# -- options and results -----------------------------------------------------------------------


@dataclass
class Options:
    line: pins.Line
    stage: int | None
    db: str
    parallelism: int
    scenarios: list[str]
    deadline: float
    stop_bound: float
    task_seconds: float
    out: Path
    tasks: int = DEFAULT_TP_TASKS  # the throughput and scale DAGs' task count
    kills: int = SCALE_DEFAULT_KILLS  # --kills: the scale scenario's worker SIGKILLs
    compare: list[int | None] = field(default_factory=list)  # --compare-stages; None = full series
    rounds: int = 1  # --rounds: the --compare-stages cycle, run this many times (interleaved)
    min_heartbeat_interval: int | None = None  # [workers] min_heartbeat_interval; None: Airflow's
    trace_loops: bool = False  # --trace-loops: record the scheduler's loops (tools/measure/e2e/looptrace.py)
    airflow_env: dict[str, str] = field(default_factory=dict)  # --airflow-env: for every stage's stack
    # --supervisor: task-sdk's supervisor.py from this stage (None: the series) whatever the executor's;
    # "" (default): the executor's own stage.
    supervisor: int | str | None = ""
    # --executor: "overlay" (the files above, in place of Airflow's) or "package" (the line's wheel of
    # tools.delivery.package pip-installed, chosen by [core] executor; Airflow's files stay the bases).
    executor: str = "overlay"
    # --install: how the full series gets in with the overlay or celery executor: "files" (the overlay's
    # files in place) or "wheels" (Airflow's own wheels rebuilt with them, tools.delivery.wheels).
    install: str = "files"
    # --celery-reap-sigchld: each Celery pool child reaps its children from a SIGCHLD handler (#70117).
    reap_sigchld: bool = False
    # --core: the apache-airflow-core release the venv gets, one the line covers ("": its pinned version).
    core: str = ""
    # --db-pool: DB_POOL_HEADROOM, DB_POOL_AIRFLOW or a pool size (digits), for every scenario; None
    # (default): each scenario's own (scenario_db_pool()).
    db_pool: str | None = None
    # --no-ui-poll turns it off: throughput polls the run as a UI's run page does (tools.measure.e2e.uipoll).
    ui_poll: bool = True
    # --split-api: the execution API in an api-server process of its own (StackConfig.split_api).
    split_api: bool = False

    @property
    def release(self) -> str:
        """The apache-airflow-core release the session runs."""
        return self.core or self.line.version

    @property
    def task_sdk(self) -> str:
        """The apache-airflow-task-sdk release that core release requires."""
        return self.line.core_sdk.get(self.release, self.line.sdk_version)


@dataclass
class ScenarioResult:
    name: str
    passed: bool
    failures: list[str]
    run_state: str | None
    final: bool
    timings: dict[str, float | None]
    counts: dict[str, int]
    kill: Kill | None
    events: list[tuple[float, str]]
    health_at_end: Json | None
    stop: Json
    timeline: str
    logs: str
    extra: Json = field(default_factory=dict)


# -- the killers --------------------------------------------------------------------------------


class Run:
    """One scenario's live context: stack, watcher, the driver's own events."""

    def __init__(
        self,
        name: str,
        stack: AirflowStack,
        api: RestApi,
        opts: Options,
        say: Callable[[str], None],
        dag: DagSpec = MAIN_DAG,
        deadline: float | None = None,
        home: Path | None = None,
        pg: Postgres | None = None,
    ):
        self.name = name
        self.home = home or Path(".")  # the scenario's directory (scale: its jobs' records)
        self.t0_wall = 0.0  # time.time() at the trigger
        self.stack = stack
        self.api = api
        self.opts = opts
        self.say = say
        self.dag = dag
        self.deadline = opts.deadline if deadline is None else deadline
        self.pg = pg  # the session's PostgreSQL, if the stack's database is there
        self.run_id = f"e2e-{name}"
        self.watcher = RunWatcher(api, dag.dag_id, self.run_id)
        self.events: list[tuple[float, str]] = []
        self.kill: Kill | None = None
        self.failures: list[str] = []  # what an action of the scenario (DURING/BEFORE) found wrong
        self.done = threading.Event()
        self.extra: Json = {}
        # What the runner learns as the scenario goes, for the scenario's own checks to read.
        self.trace: Path | None = None  # the scheduler's loop trace, when recorded
        self.supervisor_log = self.home / "logs" / "scheduler.log"  # where task-sdk's supervisor logs
        self.window: tuple[float, float] | None = None  # the loops' window, when not trigger to end
        self.timings: dict[str, float | None] = {}
        self.watch: WatchResult | None = None
        self.tasks: dict[str, TaskSnap] = {}
        self.tis: list[Json] = []
        self.stop_info: Json = {}
        self.api_logs: dict[str, str | None] = {}

    def t(self) -> float:
        """Seconds since the trigger; 0 before it (a stack that failed to start still logs its events)."""
        return self.watcher.now() if self.watcher.t0 is not None else 0.0

    def event(self, text: str, t: float | None = None) -> None:
        t = self.t() if t is None else t
        self.events.append((t, text))
        self.say(f"  {t:+8.2f}  {text}")

    def remaining(self) -> float:
        return self.deadline - self.t()

    def snap_for(self, ti_id: str) -> TaskSnap | None:
        last = self.watcher.last
        return last.by_ti_id(ti_id) if last else None

    def fresh_snap_for(self, ti_id: str) -> TaskSnap | None:
        """Ask the API now rather than trust the watcher's last poll."""
        try:
            tis = self.api.task_instances(self.dag.dag_id, self.run_id)
        except (OSError, ValueError, KeyError):
            return self.snap_for(ti_id)
        d = next((d for d in tis if d.get("id") == ti_id), None)
        return TaskSnap.from_api(d) if d else None


def kill_running(run: Run) -> None:
    """SIGKILL a worker whose task process runs and whose task instance the API calls running."""
    sched = run.stack.scheduler_pid
    while not run.done.is_set() and run.remaining() > 0:
        for w in procfs.workers_of(sched):
            if not w.busy_with or not w.children:
                continue
            ts = run.fresh_snap_for(w.busy_with)
            if ts is None or ts.state != "running":
                continue
            procfs.send(w.pid, signal.SIGKILL)
            run.kill = Kill(
                run.t(),
                w.pid,
                ts.task_id,
                ts.ti_id,
                ts.try_number,
                ts.state,
                f"task process {','.join(map(str, w.children))} left running",
            )
            run.event(
                f"SIGKILL worker {w.pid} while it ran {ts.task_id} try {ts.try_number} "
                f"(API: running, task pid {ts.pid})"
            )
            return
        time.sleep(0.05)
    run.event("no worker with a running task was caught before the deadline")


@contextlib.contextmanager
def _urgent() -> Iterator[None]:
    """Run the calling thread at the highest priority it may take (Linux nice is per thread).

    kill-queued races a worker from its title change to its fork, a few milliseconds; at
    parallelism 32 on two cores, 30 workers wake at once and a thread at nice 0 gets its turn
    only after they have all forked. Without the privilege to raise it, it stays as it is.
    """
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -20)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)


def kill_queued(run: Run) -> None:
    """Freeze a worker the instant it takes a workload; kill it only if it has not forked yet."""
    with _urgent():
        _kill_queued(run)


def _kill_queued(run: Run) -> None:
    sched = run.stack.scheduler_pid
    tried: set[tuple[int, str]] = set()
    missed = 0
    pids: list[int] = []
    refreshed = 0.0
    while not run.done.is_set() and run.remaining() > 0:
        now = time.monotonic()
        if now - refreshed > 0.1:  # new workers appear when the executor replaces dead ones
            pids = [w.pid for w in procfs.workers_of(sched)]
            refreshed = now
        # Stop every worker that took a workload since the last pass before looking at any of them:
        # with a wave of workloads (parallelism 32 takes the whole DAG at once) a worker looked at
        # one by one has long forked by the time its turn comes.
        caught: list[tuple[int, str]] = []
        for pid in pids:
            try:
                ti_id = procfs.worker_busy_with(procfs.cmdline(pid))
            except procfs.ProcGone:
                continue
            if ti_id is None or (pid, ti_id) in tried:
                continue
            tried.add((pid, ti_id))
            procfs.send(pid, signal.SIGSTOP)
            caught.append((pid, ti_id))
        if not caught:
            time.sleep(0.001)
            continue
        stopped = [(pid, ti_id) for pid, ti_id in caught if procfs.wait_stopped(pid)]
        stats = procfs.all_stats()
        victim: tuple[int, str] | None = None
        for pid, ti_id in stopped:
            if procfs.children(pid, stats):
                # Too late: the supervisor forked, it may have told the API the task started.
                missed += 1
            elif victim is None:
                victim = (pid, ti_id)
        for pid, _ in caught:
            if victim is None or pid != victim[0]:
                procfs.send(pid, signal.SIGCONT)
        if victim is None:
            continue
        pid, ti_id = victim
        t_kill = run.t()
        procfs.send(pid, signal.SIGKILL)
        ts = run.fresh_snap_for(ti_id)
        run.kill = Kill(
            t_kill,
            pid,
            ts.task_id if ts else None,
            ti_id,
            ts.try_number if ts else None,
            ts.state if ts else None,
            f"stopped before its supervisor forked (missed {missed} earlier workloads)",
        )
        run.extra["missed_after_fork"] = missed
        run.event(
            f"SIGKILL worker {pid}: took {ts.task_id if ts else ti_id} "
            f"try {ts.try_number if ts else '?'} "
            f"but had not forked its task (API: {ts.state if ts else '?'}; "
            f"{missed} other catches were already past the fork)",
            t_kill,
        )
        return
    run.extra["missed_after_fork"] = missed
    run.event(f"no worker caught between taking a workload and forking ({missed} caught too late)")


def kill_idle_reader(run: Run) -> None:
    """Before the trigger: SIGKILL the idle worker blocked in the input pipe's read (the lock holder)."""
    deadline = time.monotonic() + 10
    while True:
        workers = procfs.workers_of(run.stack.scheduler_pid)
        try:
            holder, shared = procfs.find_read_lock_holder(workers)
            break
        except procfs.NoLockHolder as e:
            if time.monotonic() > deadline:
                raise StackError(f"cannot pick the idle worker to kill: {e}") from e
            time.sleep(0.1)
    table = ", ".join(f"{w.pid}:{w.wait}" for w in workers)
    procfs.send(holder.pid, signal.SIGKILL)
    what = (
        "holding the input queue's read lock"
        if shared
        else "reading its own input pipe (no shared read lock: every idle worker is in a pipe read)"
    )
    run.extra.update(idle_workers_before_kill=table, shared_read_lock=shared, kill_monotonic=time.monotonic())
    run.kill = Kill(0.0, holder.pid, None, None, None, None, f"idle worker {what}; workers were {table}")
    run.say(f"  SIGKILL idle worker {holder.pid} {what} (wchan {holder.wchan}; workers {table})")


def kill_orphan(run: Run) -> None:
    """Once try 1 has marked a few times, SIGKILL the worker whose child is that task process."""
    marks = run.home / ORPHAN_MARKS_FILE
    sched = run.stack.scheduler_pid
    while not run.done.is_set() and run.remaining() > 0:
        first = orphan.of_try(orphan.read_marks(marks), 1)
        if len(first) < ORPHAN_MARKS_BEFORE_KILL:
            time.sleep(0.05)
            continue
        lineage = procfs.ancestors(first[-1].pid)
        for w in procfs.workers_of(sched):
            if not w.busy_with or w.pid not in lineage:
                continue
            ts = run.fresh_snap_for(w.busy_with)
            kill_wall = time.time()
            t_kill = run.t()
            procfs.send(w.pid, signal.SIGKILL)
            run.kill = Kill(
                t_kill,
                w.pid,
                ts.task_id if ts else None,
                w.busy_with,
                ts.try_number if ts else 1,
                ts.state if ts else None,
                f"after {len(first)} marks of try 1; task process {','.join(map(str, w.children))}",
            )
            run.extra.update(
                kill_wall=kill_wall,
                killed_worker=w.pid,
                killed_task_pids=list(w.children),
            )
            run.event(
                f"SIGKILL worker {w.pid} while it ran {ts.task_id if ts else w.busy_with} "
                f"try {ts.try_number if ts else '?'} (API: {ts.state if ts else '?'}; "
                f"task pid {','.join(map(str, w.children))}, {len(first)} marks so far)",
                t_kill,
            )
            return
        time.sleep(0.05)
    run.event("try 1 of the orphan task was never caught marking under a worker before the deadline")


def measure_orphan(run: Run, final: bool, run_state: str | None) -> list[str]:
    """After the run: wait for try 1's task process to be gone, then judge the marks file."""
    kill_wall = run.extra.get("kill_wall")
    if run.kill is None or kill_wall is None:
        return orphan.judge_marks(None, final, run_state)
    pids = [int(p) for p in run.extra.get("killed_task_pids", [])]
    # An orphan marks until its body ends, ORPHAN_SECONDS after it started; give it that, and a bit.
    give_up = time.monotonic() + max(0.0, float(kill_wall) + ORPHAN_SECONDS + 5 - time.time())
    alive = procfs.alive(pids)
    while alive and time.monotonic() < give_up:
        time.sleep(0.5)
        alive = procfs.alive(pids)
    fig = orphan.figures(
        orphan.read_marks(run.home / ORPHAN_MARKS_FILE), float(kill_wall), run.kill.try_number or 1
    )
    run.extra["orphan"] = fig.as_json()
    run.extra["killed_task_pids_alive_at_end"] = alive
    run.extra["orphan_summary"] = fig.text()
    run.event(f"marks: {fig.text()}" + (f"; task pids {alive} still alive" if alive else ""))
    return orphan.judge_marks(fig, final, run_state)


def sigterm_scheduler(run: Run) -> str | None:
    """SIGTERM the scheduler; a failure line if it is still there after --stop-bound seconds."""
    proc = run.stack.procs["scheduler"]
    if not proc.alive():
        return f"scheduler had already exited ({proc.exit_code()}) before SIGTERM"
    sched = proc.pid
    run.event(f"SIGTERM scheduler {sched}")
    t0 = time.monotonic()
    procfs.send(sched, signal.SIGTERM)
    popen = proc.popen
    assert popen is not None
    try:
        popen.wait(run.opts.stop_bound)
    except subprocess.TimeoutExpired:
        waits = [f"scheduler:{procfs.or_gone(procfs.wchan, sched)}"]
        waits += [f"{w.pid}:{w.wchan}" for w in procfs.workers_of(sched)]
        run.extra["scheduler_stop_seconds"] = None
        run.event(
            f"scheduler still alive {run.opts.stop_bound:g} s after SIGTERM "
            f"(wchans {', '.join(waits)}); SIGKILL"
        )
        procfs.send(sched, signal.SIGKILL)
        popen.wait(10)
        return (
            f"SIGTERM did not stop the scheduler within {run.opts.stop_bound:g} s "
            f"(hung; wchans {', '.join(waits)})"
        )
    secs = time.monotonic() - t0
    run.extra["scheduler_stop_seconds"] = round(secs, 2)
    run.event(f"scheduler exited {proc.exit_code()} {secs:.1f} s after SIGTERM")
    return None


def sigterm_running(run: Run) -> None:
    """SIGTERM the scheduler while tasks run; check what it leaves behind; start it again."""
    sched = run.stack.scheduler_pid
    want = min(run.opts.parallelism, SIGTERM_RUNNING_TASKS)
    seen: list[procfs.Worker] = []
    busy: list[procfs.Worker] = []
    while not run.done.is_set() and run.remaining() > 0:
        seen = procfs.workers_of(sched)
        busy = [w for w in seen if w.busy_with and w.children]
        if len(busy) >= want:
            break
        time.sleep(0.05)
    else:
        run.failures.append(f"fewer than {want} tasks were ever running at once; no SIGTERM sent")
        run.event(f"fewer than {want} tasks were ever running at once before the deadline")
        return
    workers = [w.pid for w in seen]
    below = procfs.descendants(sched)
    run.extra.update(
        running_at_sigterm=[w.busy_with for w in busy],
        workers_at_sigterm=workers,
        pids_below_scheduler_at_sigterm=below,
    )
    run.event(f"{len(busy)} tasks running on workers {', '.join(str(w.pid) for w in busy)}")
    problem = sigterm_scheduler(run)
    if problem:
        run.failures.append(problem)
    # Patched workers lead sessions of their own; unpatched ones share the scheduler's.
    left = sorted(set(procfs.alive(below)) | set(procfs.session_members([sched, *workers])))
    run.extra["left_behind"] = left
    if left:
        named = ", ".join(f"{pid} ({procfs.title_of(pid)})" for pid in left[:6])
        run.failures.append(f"{len(left)} process(es) left behind after the scheduler exited: {named}")
        run.event(f"left behind: {named}; SIGKILL")
        procfs.kill_pids(left)
    else:
        run.event(f"nothing left behind of the {len(below)} processes below the scheduler")
    secs = run.extra.get("scheduler_stop_seconds")
    run.extra["sigterm_summary"] = (
        f"SIGTERM with {len(busy)} tasks running: scheduler "
        + (
            f"exited {run.stack.procs['scheduler'].exit_code()} after {secs:.1f} s"
            if secs is not None
            else "hung"
        )
        + f", {len(left)} of {len(below)} processes below it left behind"
    )
    proc = run.stack.restart("scheduler")
    run.event(f"scheduler started again, pid {proc.pid}")


class ScaleWatch:
    """The scale scenario's eye on the jobs' directory while the run goes: which task has started a
    job (for the kills' spread), and, the moment a retry's job starts, whether an earlier try's job
    still lives."""

    def __init__(self, directory: Path, t0_wall: float):
        self.dir = directory
        self.t0_wall = t0_wall
        self.seen: dict[str, scale.JobTry] = {}  # file name -> its job as first read
        self.started: set[str] = set()  # tasks with a job of any try
        self.alive_at_retry: list[scale.AliveAtRetry] = []

    def poll(self) -> list[scale.AliveAtRetry]:
        """Read the files that appeared since the last poll; what a retry's start found alive."""
        try:
            names = [n for n in os.listdir(self.dir) if n not in self.seen]
        except FileNotFoundError:
            return []
        found = []
        for name in sorted(names, key=lambda n: scale.parse_name(n) or ("", 0, 0)):
            try:
                job = scale.parse_job(name, (self.dir / name).read_text(errors="replace"))
            except OSError:
                continue
            if job is None or job.start is None:
                continue  # not written yet: the next poll reads it
            self.seen[name] = job
            self.started.add(job.task_id)
            if job.try_number < 2:
                continue
            for earlier in self.seen.values():
                if earlier.task_id != job.task_id or earlier.try_number >= job.try_number:
                    continue
                if procfs.alive_as(earlier.pid, earlier.pst):
                    a = scale.AliveAtRetry(
                        time.time(), job.task_id, earlier.try_number, earlier.pid, job.try_number, job.start
                    )
                    found.append(a)
        self.alive_at_retry += found
        return found


def kill_scale(run: Run) -> None:
    """SIGKILL ``--kills`` busy workers spread over the run (the i-th once enough tasks have started
    a job), each one whose BashOperator job runs; meanwhile, watch each retry's start."""
    jobs = run.home / SCALE_JOBS_DIR
    watch = ScaleWatch(jobs, run.t0_wall)
    run.extra["scale_watch"] = watch
    thresholds = scale.kill_thresholds(run.dag.n_tasks, run.opts.kills)
    kills: list[Json] = []
    run.extra["scale_kills"] = kills
    sched = run.stack.scheduler_pid
    while not run.done.is_set() and run.remaining() > 0:
        last = run.watcher.last
        if last is not None and last.run_state in FINAL_RUN_STATES:
            watch.poll()
            break
        for a in watch.poll():
            run.event(
                f"{a.task_id}: try {a.try_number}'s job {a.pid} alive as try {a.retry} starts "
                f"({a.t - a.retry_start:.1f} s after its start)"
            )
        if len(kills) < len(thresholds) and len(watch.started) >= thresholds[len(kills)]:
            stats = procfs.all_stats()
            busy = [
                w
                for w in procfs.workers_of(sched)
                if w.busy_with and any(procfs.children(c, stats) for c in w.children)
            ]
            w = soak_faults.choose(len(kills) * 2654435761, busy, key=lambda w: w.pid)
            if w is not None:
                below = procfs.descendants(w.pid, stats)
                procfs.send(w.pid, signal.SIGKILL)
                kills.append(
                    {"t": round(run.t(), 2), "worker": w.pid, "ti_id": w.busy_with, "below": sorted(below)}
                )
                run.event(
                    f"kill {len(kills)} of {len(thresholds)} ({len(watch.started)} tasks started): SIGKILL "
                    f"worker {w.pid} running {w.busy_with} (below it: {', '.join(map(str, sorted(below)))})"
                )
        time.sleep(SCALE_TICK_S)
    if len(kills) < len(thresholds):
        run.event(f"only {len(kills)} of {len(thresholds)} kills landed before the run ended")


def measure_scale(run: Run, tasks: Mapping[str, TaskSnap], final: bool, stop_info: Json) -> list[str]:
    """After the stack stopped: the jobs' records, what was left alive (named, then killed), the verdict."""
    jobs_dir = run.home / SCALE_JOBS_DIR
    watch: ScaleWatch | None = run.extra.pop("scale_watch", None)
    jobs = scale.read_jobs(jobs_dir)
    left = [
        f"job {j.task_id} try {j.try_number} pid {j.pid} ({procfs.title_of(j.pid)})"
        for j in jobs
        if not j.ended and j.pst and procfs.alive_as(j.pid, j.pst)
    ]
    procfs.kill_pids([j.pid for j in jobs if not j.ended and j.pst and procfs.alive_as(j.pid, j.pst)])
    if killed := (stop_info.get("leftover_pids_killed") or {}).get("pids"):
        left.append(f"{len(killed)} process(es) of the stack the stop had to kill: {killed[:10]}")
    verdict = scale.judge(
        {tid: ts.state for tid, ts in tasks.items()},
        run.dag.n_tasks,
        final,
        jobs,
        watch.alive_at_retry if watch else [],
        left,
        len(run.extra.get("scale_kills", [])),
        t0=run.t0_wall,
        kills_asked=run.opts.kills,
    )
    run.extra["scale"] = verdict.as_json()
    c = verdict.counts
    run.extra["scale_summary"] = (
        f"{verdict.tis} task instances {verdict.states}, {verdict.jobs} job tries, {verdict.retried} tasks "
        f"retried, {verdict.kills} workers killed; not terminal {c['not-terminal']}, overlaps "
        f"{c['overlap']}, alive after retry {c['alive-after-retry']}, left {c['left']}, "
        f"without a job {c['no-job']}"
    )
    for v in verdict.violations[:20]:
        run.say(f"   {v.text()}")
    if len(verdict.violations) > 20:
        run.say(f"   ... {len(verdict.violations) - 20} more in the report")
    return verdict.failures()


def stuck_in_queued(scheduler_log: Path) -> tuple[int, int]:
    """How many times the scheduler's stuck-in-queued check requeued a task, and failed one."""
    try:
        text = scheduler_log.read_text(errors="replace")
    except OSError:
        return 0, 0
    return text.count(QT_REQUEUED), text.count(QT_FAILED)


def read_api_logs(logs: Path) -> dict[str, str | None]:
    """Each api-server's log in ``logs`` by name, in ``API_SERVERS``' order (None: no log): read once
    after the stack stopped, for every count a round takes from them."""
    return {name: throughput.read_log(logs / f"{name}.log") for name in API_SERVERS}


def component_pool_timeouts(logs: Path, texts: Mapping[str, str | None] | None = None) -> dict[str, int]:
    """Each component's database pool timeouts, from its log in ``logs``: the api-servers first, in
    ``API_SERVERS``' order, then the others by name. A log in ``texts`` (by component, as
    ``read_api_logs`` gives them) is not read again."""
    texts = texts or {}
    rank = {name: i for i, name in enumerate(API_SERVERS)}
    found = sorted(logs.glob("*.log"), key=lambda p: (rank.get(p.stem, len(rank)), p.stem))
    out = {}
    for p in found:
        text = texts[p.stem] if p.stem in texts else throughput.read_log(p)
        if text is not None:
            out[p.stem] = throughput.count_pool_timeouts(text)
    return out


# A task instance is left running with no process when two looks this far apart both find it so.
LEFT_RUNNING_RECHECK_S = 3.0


def _left_running(run: Run, tis: list[Json]) -> list[str]:
    """The task instances still ``running`` with no process naming them, in two looks a few seconds
    apart (a task process sets its title only after its start)."""
    first = apistall.running_without_process(tis, procfs.titles())
    if not first:
        return []
    time.sleep(LEFT_RUNNING_RECHECK_S)
    again = _safe(partial(run.api.task_instances, run.dag.dag_id, run.run_id)) or tis
    left = [ti for ti in apistall.running_without_process(again, procfs.titles()) if ti in first]
    if left:
        run.event(f"{len(left)} task instance(s) running with no process: {', '.join(left[:5])}")
    return left


def _api_stall(
    run: Run,
    home: Path,
    poller: uipoll.UiPoller | None,
    left: list[str] | None,
    supervisor_log: Path,
    api_logs: Mapping[str, str | None],
) -> None:
    """Issue 52's counts of the round into ``run.extra["api_stall"]`` (and its summary line);
    ``supervisor_log``: where task-sdk's supervisors log (its client's retry lines); ``api_logs``:
    the api-servers' logs as ``read_api_logs`` read them."""
    api = apistall.api_text_figures(*(api_logs.get(name) for name in API_SERVERS))
    fig = run.extra.get("throughput") or {}
    # The throughput figures count the api-server's log; --split-api's execution api-server has its own.
    others = [
        throughput.count_pool_timeouts(t) for n in API_SERVERS[1:] if (t := api_logs.get(n)) is not None
    ]
    timeouts = [n for n in (fig.get("pool_timeouts"), *others) if n is not None]
    retries = apistall.client_retries(supervisor_log)
    poll = (
        uipoll.summarise(uipoll.read_records(home / uipoll.RECORDS_FILE), poller.token_source)
        if poller
        else None
    )
    counts = apistall.RoundCounts(
        tasks_per_s=fig.get("tasks_per_s"),
        api_slow=api.slow if api else None,
        api_longest_s=api.longest_s if api else None,
        poll_longest_s=poll.longest_s if poll else None,
        poll_errors=poll.server_errors + poll.no_answer if poll else None,
        pool_timeouts=sum(timeouts) if timeouts else None,
        starts_retried=api.starts_retried if api else None,
        failed=fig.get("failed"),
        left_running=None if left is None else len(left),
        load=run.extra.get("load"),
    )
    run.extra["api_stall"] = {
        "counts": counts.as_json(),
        "api": api.as_json() if api else None,
        "poll": poll.as_json() if poll else None,
        "left_running": left,
        "client_retries": retries,
    }
    summary = (
        (
            f"api-server: {api.slow} requests of {uipoll.SLOW_REQUEST_S:g} s or more, longest "
            f"{_secs(api.longest_s)} ({api.longest_path or '-'}); task starts retried {api.starts_retried} "
            f"({api.start_repeats} repeats; the client's retry lines, any call, {_count(retries)})"
            if api
            else "api-server: no log"
        )
        + f"; left running with no process {_count(counts.left_running)}"
        + (f"; {poll.text()}" if poll else "")
    )
    run.extra["api_stall_summary"] = summary
    run.event(summary)


def _count(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} s"


# --executor celery: how long after the run the driver waits for every supervisor whose task ended
# to return ("Workload finished"), in multiples of [workers] min_heartbeat_interval (one stall each).
LINGER_GRACE_INTERVALS = 2.0


def celery_at_ready(run: Run) -> None:
    """Record what the Celery worker and its prefork pool children do with SIGCHLD (#70117's cause)."""
    from tools.measure.e2e.celery import CeleryStack, sigchld_report

    stack = run.stack
    assert isinstance(stack, CeleryStack)
    report = {p.name: sigchld_report(p.pid) for p in stack.workers.procs}
    run.extra["sigchld_at_ready"] = report
    run.say(
        "  SIGCHLD in the celery worker: "
        + "; ".join(
            f"{name}: main {r.get('main')}, pool children {r.get('pool_children')}"
            for name, r in report.items()
        )
        + (
            " (+ --celery-reap-sigchld: installed in each pool child as it starts)"
            if stack.reap_sigchld
            else ""
        )
    )


def celery_at_end(run: Run) -> list[str]:
    """Supervisors still running after their task ended (#70117: lingering), the SIGCHLD state, how
    often the hook reaped and how often the fixed supervisor saw a process reaped elsewhere."""
    from tools.measure.e2e import celery

    stack = run.stack
    assert isinstance(stack, celery.CeleryStack)
    log = stack.worker_log(1)
    tis = _safe(partial(run.api.task_instances, run.dag.dag_id, run.run_id))
    ended = [str(d["id"]) for d in tis if d.get("end_date") and d.get("id")]
    interval = run.opts.min_heartbeat_interval or throughput.DEFAULT_MIN_HEARTBEAT_INTERVAL
    grace = LINGER_GRACE_INTERVALS * interval + 3.0
    give_up = time.monotonic() + grace
    left = celery.lingering(ended, log)
    while left and time.monotonic() < give_up:
        time.sleep(0.5)
        left = celery.lingering(ended, log)
    run.extra["sigchld_at_end"] = {p.name: celery.sigchld_report(p.pid) for p in stack.workers.procs}
    ends = celery.outcomes(log)
    reaped = celery.count_reaped(stack.reap_log)
    # A supervisor without "Workload finished" either raised (the Celery task says so) or still runs.
    running = max(0, len(left) - ends["celery_raised"])
    run.extra["celery"] = {
        "ended": len(ended),
        "still_running": running,
        "not_returned": len(left),
        "not_returned_ids": left[:20],
        "reaped_by_hook": reaped,
        "reap_sigchld": stack.reap_sigchld,
        **ends,
    }
    summary = (
        f"celery: {len(ended)} tasks ended; {grace:g} s later {len(ended) - len(left)} supervisors had "
        f"returned, {running} still ran; celery tasks {ends['celery_succeeded']} succeeded, "
        f"{ends['celery_raised']} raised; "
        f"success-overtime kills {ends['success_overtime_kills']}; SIGCHLD hook reaped {reaped}; "
        f"'reaped elsewhere' warnings {ends['reaped_elsewhere_warnings']}"
    )
    run.extra["celery_summary"] = summary
    run.event(summary)
    out = []
    if running:
        out.append(f"{running} supervisor(s) still running {grace:g} s after their task ended (cf. #70117)")
    if ends["celery_raised"]:
        out.append(
            f"{ends['celery_raised']} Celery task(s) raised ({ends['success_overtime_kills']} after the "
            f"success overtime, {ends['reaped_elsewhere_warnings']} 'reaped elsewhere'; tracebacks in "
            "the worker's log)"
        )
    return out


# -- the scenarios -------------------------------------------------------------------------------


class Scenario:
    """One scenario: the DAG, deadline and stack settings it needs, what it does to the run and what
    it checks beyond ``judge``'s verdict. The runner makes one per run (what it gathers stays its own)
    and calls, in order: ``configure`` (the stack's settings), ``before`` (the stack ready),
    ``at_trigger`` (the run's clock started), ``during`` (while the watcher polls), ``run_over`` (the
    run final or past its deadline), ``at_end`` (after the verdict, the stack up), ``cleanup`` (always,
    before the stop), ``after_stop`` (the logs complete); ``at_end`` and ``after_stop`` return failures."""

    name: ClassVar[str]
    default: ClassVar[bool] = True  # run when no --scenario is given
    airflow_pool: ClassVar[bool] = False  # Airflow's own database pool unless --db-pool says otherwise
    traces_loops: ClassVar[bool] = False  # the loop trace always on (else only with --trace-loops)
    poll_interval: ClassVar[float | None] = None  # the watcher's, when not its own default
    judged: ClassVar[bool] = True  # by judge() from the API's task states, with each retried task's tries

    def dag(self, tasks: int = DEFAULT_TP_TASKS, parallelism: int = 8) -> DagSpec:
        return MAIN_DAG

    def deadline(self, deadline: float, tasks: int = DEFAULT_TP_TASKS) -> float:
        return deadline

    def env(self, dag: DagSpec, home: Path) -> dict[str, str]:
        return {TP_TASKS_ENV: str(dag.n_tasks)} if dag.file == THROUGHPUT_DAG_FILE else {}

    def title(self, dag: DagSpec, kills: int) -> str:
        return ""  # its size in its header line

    def configure(self, cfg: StackConfig) -> None: ...

    def before(self, run: Run) -> None: ...

    def at_trigger(self, run: Run) -> None: ...

    @staticmethod
    def during(run: Run) -> None: ...

    def run_over(self, run: Run) -> None: ...

    def at_end(self, run: Run) -> list[str]:
        return []

    def cleanup(self, run: Run) -> None: ...

    def after_stop(self, run: Run) -> list[str]:
        return []

    def compare(self, opts: Options, reports: Sequence[Json]) -> dict[str, str]:
        return {}  # its own tables at the end of a --compare-stages session


class Clean(Scenario):
    """The run succeeds, every task on its first try."""

    name = "clean"


class KillRunning(Scenario):
    """A worker is SIGKILLed while its task runs (the API says ``running``, the task process is
    the worker's child). The run must still end within the deadline, the killed task failed
    and retried rather than left ``running``, every other task successful."""

    name = "kill-running"
    during = staticmethod(kill_running)


class KillQueued(Scenario):
    """A worker is SIGKILLed after it took a workload but before the task started, so the task
    instance is still ``queued``. How that instant is caught deterministically: the driver polls
    each worker's proctitle in /proc every millisecond; a worker's title changes from
    ``<idle>`` to the task instance id right after ``input.get()`` returned. The driver then
    SIGSTOPs it at once (every worker that took one since its last pass, before it looks at any:
    at parallelism 32 the whole DAG arrives in one wave) and, once they are really stopped, looks
    for a child: the supervisor forks the task process *before* it tells the API server the task
    started, so a stopped worker with no child has provably not started its task. One such
    worker is SIGKILLed. The others get SIGCONT, and if every one already had a child the driver
    waits for the next workload (30 chances per run).
    The key must then be failed or re-dispatched, never left ``queued``."""

    name = "kill-queued"
    during = staticmethod(kill_queued)

    def dag(self, tasks: int = DEFAULT_TP_TASKS, parallelism: int = 8) -> DagSpec:
        """It needs workloads that reach workers one at a time, as running ones end: at parallelism
        30 or more the main DAG is one wave, every worker forks at once and a title read waits for the
        fork to finish (it needs the worker's memory map), so no worker is ever seen before its fork.
        There it runs the throughput DAG's no-op tasks, 4 x parallelism of them."""
        if parallelism >= MAIN_DAG.n_tasks:
            return DagSpec(THROUGHPUT_DAG_FILE, THROUGHPUT_DAG_ID, 4 * parallelism)
        return MAIN_DAG


class KillIdleReader(Scenario):
    """Before the trigger, the idle worker that holds the input queue's read lock (its wchan is a
    pipe read while the other idle workers sleep on a futex) is SIGKILLed. Every task must still
    run, and afterwards SIGTERM must stop the scheduler within ``--stop-bound`` seconds."""

    name = "kill-idle-reader"

    def before(self, run: Run) -> None:
        kill_idle_reader(run)
        time.sleep(1.0)  # let the scheduler's next sync see the dead worker

    def at_trigger(self, run: Run) -> None:
        if run.kill is not None:
            run.kill.t = round(run.extra.pop("kill_monotonic") - run.watcher.t0, 2)
            run.events.append((run.kill.t, f"SIGKILL {run.kill.detail.split(';')[0]} (pid {run.kill.pid})"))

    def at_end(self, run: Run) -> list[str]:
        problem = sigterm_scheduler(run)
        return [problem] if problem else []


class SigtermRunning(Scenario):
    """Once at least ``min(parallelism, 4)`` workers each have a task process (tasks running), the
    scheduler is SIGTERMed, as a deploy or ``kill`` does. It must exit within ``--stop-bound``
    seconds, and no process it had below it then (workers, task processes, what they started), nor
    any process left in its workers' sessions, may be alive once it has exited (checked by pid;
    whatever is left is named, then killed). The scheduler is then started again, as an operator
    would, and the run must end ``success``, every task that was running at the SIGTERM on its
    first try: ``end()`` lets a running task finish. A task queued but not started may run as try
    2 (the new scheduler resets what the old one had queued)."""

    name = "sigterm-running"
    during = staticmethod(sigterm_running)


class KillOrphan(Scenario):
    """Its own DAG, ``tests/e2e/dags/lepatch_e2e_orphan.py``: one task (``retries=1``, retry in 5 s)
    that appends ``<try> <pid> <time>`` to a marks file (``LEPATCH_E2E_MARKS``) once a second for
    40 s and writes no log meanwhile. Once try 1 has written two marks, the worker running it is
    SIGKILLed. The driver then waits for a final run state (at least 150 s) and for try 1's task
    process to be gone, and reads the marks (``tools.measure.e2e.orphan``): how long try 1 went on
    marking after the kill, when try 2 began, and how long both were marking at once. It passes
    only if they never overlapped and the run ended ``success``. Not in the default set (it adds
    a minute and a half, and runs into its deadline on the unpatched base, which retries only
    after the task heartbeat timeout): ask for it with ``--scenario kill-orphan``."""

    name = "kill-orphan"
    default = False
    during = staticmethod(kill_orphan)

    def dag(self, tasks: int = DEFAULT_TP_TASKS, parallelism: int = 8) -> DagSpec:
        return ORPHAN_DAG

    def deadline(self, deadline: float, tasks: int = DEFAULT_TP_TASKS) -> float:
        return max(deadline, ORPHAN_DEADLINE)

    def env(self, dag: DagSpec, home: Path) -> dict[str, str]:
        return {MARKS_ENV: str(home / ORPHAN_MARKS_FILE), "LEPATCH_E2E_ORPHAN_SECONDS": str(ORPHAN_SECONDS)}

    def at_end(self, run: Run) -> list[str]:
        assert run.watch is not None
        return measure_orphan(run, run.watch.final, run.watch.run_state)


class Throughput(Scenario):
    """Its own DAG, ``tests/e2e/dags/lepatch_e2e_throughput.py``: ``--tasks`` (default 200) no-op
    PythonOperator tasks, ``max_active_tasks`` as high, nothing killed. It passes when the run
    succeeds with every task on its first try; what it is for are its figures
    (``tools.measure.e2e.throughput``): wall time from the first task queued to the last one ended,
    tasks/s, and the queued-to-start (and scheduled-to-start) p50/p95 of the task instances; and
    (``tools.measure.e2e.cputime``) each component's CPU per finished task between the trigger and
    the run's end, the tasks/s ceiling that sets on this machine's cores, and the executor's own CPU
    per task (its ``heartbeat()``'s, from the loop trace, always on here).
    ``[scheduler] task_queued_timeout`` is 600 s there (30 s otherwise): the unpatched base's
    queue gets deeper than 30 s, and a requeue would change what is measured; with SQLite a
    connection waits up to 60 s for the database lock (5 s otherwise). A UI's run page polls the run
    meanwhile (``tools.measure.e2e.uipoll``; ``--no-ui-poll`` turns it off) and each round counts
    what issue 52 is about (``tools.measure.e2e.apistall``), one row per round with
    ``--compare-stages``. Not in the default set: ask for it with ``--scenario throughput``, e.g.
    ``--tasks 200 --parallelism 16``."""

    name = "throughput"
    default = False
    airflow_pool = True  # it measures what operators run
    traces_loops = True  # the executor's CPU per task (its heartbeat's) comes from the trace
    poll_interval = TP_POLL_INTERVAL

    def __init__(self) -> None:
        self.cpu_roots: list[cputime.Root] = []
        self.cpu_marks: list[cputime.Snapshot] = []  # the CPU window: at the trigger, at the run's end
        self.poller: uipoll.UiPoller | None = None
        self.tis: list[Json] = []
        self.dag_run: Json | None = None
        self.left_running: list[str] | None = None

    def dag(self, tasks: int = DEFAULT_TP_TASKS, parallelism: int = 8) -> DagSpec:
        return DagSpec(THROUGHPUT_DAG_FILE, THROUGHPUT_DAG_ID, tasks)

    def deadline(self, deadline: float, tasks: int = DEFAULT_TP_TASKS) -> float:
        return max(deadline, TP_DEADLINE_BASE + TP_DEADLINE_PER_TASK * tasks)

    def configure(self, cfg: StackConfig) -> None:
        # A slow stage's queue may well be 30 s deep; a requeue would change what is measured.
        cfg.task_queued_timeout = max(cfg.task_queued_timeout, TP_QUEUED_TIMEOUT)
        # 16 workers' task processes and a loaded machine: 5 s of SQLite lock wait is not enough.
        cfg.sqlite_busy_timeout = TP_SQLITE_BUSY_TIMEOUT

    def title(self, dag: DagSpec, kills: int) -> str:
        return f"{dag.n_tasks} tasks, "

    def before(self, run: Run) -> None:
        self.cpu_roots = cputime.roots_of(run.stack, run.pg)
        self.cpu_marks.append(cputime.take(self.cpu_roots))

    def at_trigger(self, run: Run) -> None:
        if not run.opts.ui_poll:
            return
        # The run's page is open as the run starts: the CLI's trigger takes seconds to return.
        self.poller = uipoll.UiPoller(run.stack.api, run.dag.dag_id, run.run_id, run.t)
        self.poller.start()
        run.event(
            f"UI poller: {len(self.poller.paths)} endpoints every {self.poller.interval:g} s, "
            f"token {self.poller.token_source or 'none'}"
        )

    def run_over(self, run: Run) -> None:
        self.cpu_marks.append(cputime.take(self.cpu_roots))
        # the executor's heartbeat CPU over the CPU window itself
        run.window = (self.cpu_marks[0].t, self.cpu_marks[1].t)

    def at_end(self, run: Run) -> list[str]:
        if run.tis:
            self.tis = run.tis
            with contextlib.suppress(OSError, ValueError, KeyError):  # the api-server gave no answer
                self.dag_run = run.api.run(run.dag.dag_id, run.run_id)
        self.left_running = _left_running(run, run.tis)
        return []

    def cleanup(self, run: Run) -> None:
        if self.poller is not None:
            uipoll.write_records(run.home / uipoll.RECORDS_FILE, self.poller.stop())

    def after_stop(self, run: Run) -> list[str]:
        # After the stop: a worker's supervisor logs "Workload finished" only once it returns, which
        # for a stalled one is seconds after the run ended; the access log has every request.
        if self.tis:
            fig = throughput.figures(
                self.tis,
                self.dag_run,
                scheduler_log=run.supervisor_log,
                min_heartbeat_interval=run.opts.min_heartbeat_interval,
                api_log_text=run.api_logs[API_SERVERS[0]],
            )
            run.extra["throughput"] = fig.as_json()
            run.extra["throughput_summary"] = fig.text()
            run.event(f"throughput: {fig.text()}")
            states = looptrace.scheduler_states(run.trace) if run.trace is not None else None
            if slot_fig := slots.figures(self.tis, run.opts.parallelism, states):
                run.extra["slots"] = slot_fig.as_json()
                run.event(slot_fig.text())
            if len(self.cpu_marks) == 2:
                loops = run.extra.get("loops")
                cpu = cputime.figures(
                    self.cpu_marks[0],
                    self.cpu_marks[1],
                    self.cpu_roots,
                    fig.ended,
                    fig.tasks_per_s,
                    executor_s=loops["heartbeat_cpu_s"] if loops else None,
                )
                run.extra["cpu"] = cpu.as_json()
                run.extra["cpu_s"] = {k: round(v, 2) for k, v in cpu.cpu_s.items()}
                run.extra["cpu_summary"] = cpu.text()
                run.event(cpu.text())
        _api_stall(run, run.home, self.poller, self.left_running, run.supervisor_log, run.api_logs)
        return []


class QueuedTimeout(Scenario):
    """Its own DAG, ``tests/e2e/dags/lepatch_e2e_long.py``: twice ``--parallelism`` tasks of 80 s
    (``retries=0``) with ``[scheduler] task_queued_timeout`` 15 s, checked every 5 s. What is
    queued behind the first wave waits a whole task for a worker, so the scheduler's
    stuck-in-queued check revokes it and sets it back to scheduled; the third time it fails it. The
    run passes when it succeeds, every task on its first try; the scheduler log's requeues and
    failures by that check are reported. With the series each dispatch holds a slot and nothing is
    taken beyond them, so what waits for a worker stays scheduled, not queued. Not in the default set
    (about three minutes): ask for it with ``--scenario queued-timeout --parallelism 2``."""

    name = "queued-timeout"
    default = False

    def dag(self, tasks: int = DEFAULT_TP_TASKS, parallelism: int = 8) -> DagSpec:
        return DagSpec(LONG_DAG_FILE, LONG_DAG_ID, 2 * parallelism)

    def deadline(self, deadline: float, tasks: int = DEFAULT_TP_TASKS) -> float:
        return max(deadline, 3 * QT_TASK_SECONDS)  # its two waves of tasks and one more

    def env(self, dag: DagSpec, home: Path) -> dict[str, str]:
        return {
            QT_TASKS_ENV: str(dag.n_tasks),
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": f"{QT_CHECK_INTERVAL:g}",
        }

    def configure(self, cfg: StackConfig) -> None:
        cfg.task_seconds = QT_TASK_SECONDS
        cfg.task_queued_timeout = QT_QUEUED_TIMEOUT

    def after_stop(self, run: Run) -> list[str]:
        requeued, failed = stuck_in_queued(run.home / "logs" / "scheduler.log")
        run.extra["stuck_in_queued"] = {"requeued": requeued, "failed": failed}
        run.event(f"stuck in queued (scheduler log): {requeued} requeued, {failed} failed")
        return []


class Scale(Scenario):
    """--tasks BashOperator jobs, --kills busy workers SIGKILLed; its jobs' own records are the
    evidence (no API call per retried task), judged by ``scale.judge``."""

    name = "scale"
    default = False
    poll_interval = TP_POLL_INTERVAL
    judged = False
    during = staticmethod(kill_scale)

    def dag(self, tasks: int = DEFAULT_TP_TASKS, parallelism: int = 8) -> DagSpec:
        return DagSpec(SCALE_DAG_FILE, SCALE_DAG_ID, tasks)

    def deadline(self, deadline: float, tasks: int = DEFAULT_TP_TASKS) -> float:
        return max(deadline, SCALE_DEADLINE_BASE + SCALE_DEADLINE_PER_TASK * tasks)

    def env(self, dag: DagSpec, home: Path) -> dict[str, str]:
        return {SCALE_TASKS_ENV: str(dag.n_tasks), SCALE_DIR_ENV: str(home / SCALE_JOBS_DIR)}

    def configure(self, cfg: StackConfig) -> None:
        (cfg.home / SCALE_JOBS_DIR).mkdir(parents=True, exist_ok=True)  # the jobs write into it
        # Airflow's own task_queued_timeout (600 s): 500 tasks at 64 queue deeper than the e2e's 30 s.
        cfg.task_queued_timeout = max(cfg.task_queued_timeout, TP_QUEUED_TIMEOUT)

    def title(self, dag: DagSpec, kills: int) -> str:
        return f"{dag.n_tasks} tasks, {kills} worker kills, "

    def after_stop(self, run: Run) -> list[str]:
        o = run.opts
        failures = measure_scale(run, run.tasks, bool(run.watch and run.watch.final), run.stop_info)
        label = stage_label(o.stage, o.executor)
        title = (
            f"scale: {run.dag.n_tasks} BashOperator jobs at parallelism {o.parallelism}, "
            f"{o.kills} worker kills, {o.line.label}, {o.db}"
        )
        run.say("\n" + scale.table(title, [(label, run.extra["scale"], run.timings.get("run_s"))]))
        return failures

    def compare(self, opts: Options, reports: Sequence[Json]) -> dict[str, str]:
        return {self.name: scale_table(opts, reports)}


# By name, in the order they run when no --scenario is given (kill-orphan, throughput,
# queued-timeout and scale only when asked for).
SCENARIOS: dict[str, type[Scenario]] = {
    s.name: s
    for s in (
        Clean,
        KillRunning,
        KillQueued,
        KillIdleReader,
        SigtermRunning,
        KillOrphan,
        Throughput,
        QueuedTimeout,
        Scale,
    )
}
DEFAULT_SCENARIOS = tuple(name for name, s in SCENARIOS.items() if s.default)
AIRFLOW_POOL_SCENARIOS = frozenset(name for name, s in SCENARIOS.items() if s.airflow_pool)


# -- one scenario --------------------------------------------------------------------------------


def run_scenario(
    name: str, o: Options, shared: session.Shared, workdir: Path, say: Callable[[str], None]
) -> ScenarioResult:
    """One scenario on a fresh stack (on the session's servers), stopped before it returns."""
    pg = shared.pg
    sc = SCENARIOS[name]()
    home = workdir / name
    dag = sc.dag(o.tasks, o.parallelism)
    deadline = sc.deadline(o.deadline, o.tasks)
    cfg = StackConfig(
        venv=shared.venv.path,
        home=home,
        dag_file=dag.file,
        db_url=pg.new_database() if pg else None,
        parallelism=o.parallelism,
        task_seconds=o.task_seconds,
        extra_env=scenario_env(o, name, dag, home),
        db_pool_size=db_pool_size(o, name),
        split_api=o.split_api,
    )
    sc.configure(cfg)
    stack: AirflowStack
    if o.executor == "celery":
        from tools.measure.e2e.celery import CeleryStack

        assert shared.redis is not None
        stack = CeleryStack(cfg, say, shared.redis.url, reap_sigchld=o.reap_sigchld)
    else:
        stack = AirflowStack(cfg, say)
    api = RestApi(stack.api)
    run = Run(name, stack, api, o, say, dag=dag, deadline=deadline, home=home, pg=pg)
    run.trace = home / looptrace.TRACE_FILE if traces_loops(o, name) else None
    # where task-sdk's supervisor logs ("Workload finished", its client's retries): the executor's worker
    run.supervisor_log = (
        home / "logs" / ("celery-worker-1.log" if o.executor == "celery" else "scheduler.log")
    )
    if sc.poll_interval is not None:
        run.watcher.interval = sc.poll_interval
    timings = run.timings
    timings["deadline_s"] = deadline
    failures: list[str] = []
    health = None
    tries: dict[str, list[Json]] = {}
    t0_wall = datetime.now(timezone.utc)
    say(f"\n== {name} ({sc.title(dag, o.kills)}{o.db}, parallelism {o.parallelism}, deadline {deadline:g} s)")
    try:
        timings["migrate_s"], timings["ready_s"] = session.launch(stack, dag.dag_id)
        say(
            f"  stack ready {timings['ready_s']:.1f} s after launch "
            f"(db migrate {timings['migrate_s']:.1f} s), "
            f"api {stack.api}, scheduler pid {stack.scheduler_pid}"
        )
        if o.executor == "celery":
            celery_at_ready(run)
        sc.before(run)
        t0_wall = datetime.now(timezone.utc)
        run.watcher.start_clock()
        run.t0_wall = time.time()
        sc.at_trigger(run)
        stack.airflow("dags", "trigger", dag.dag_id, "--run-id", run.run_id)
        run.event(
            f"airflow dags trigger {dag.dag_id} --run-id {run.run_id} (returned after {run.t():.1f} s)",
            0.0,
        )
        watch = run.watch = _watch(run, sc, failures)
        # The machine's 1-minute load average as the run ends: the figures are read beside it.
        run.extra["load"] = round(os.getloadavg()[0], 1)
        sc.run_over(run)
        timings["run_s"] = round(watch.elapsed, 2) if watch.final else None
        timings["first_running_s"] = next(
            (round(tr.t, 2) for tr in watch.transitions if tr.state == "running"), None
        )
        if watch.final:
            run.event(f"run {watch.run_state}", watch.elapsed)
        else:
            run.event(f"deadline: run still {watch.run_state}", watch.elapsed)
        health = api.health()
        run.event(f"health endpoint: {_health_text(health)}")
        run.tasks = {ts.task_id: ts for ts in (watch.last.tasks.values() if watch.last else [])}
        run.tis = _safe(partial(api.task_instances, dag.dag_id, run.run_id))
        if run.tis:
            run.tasks = {d["task_id"]: TaskSnap.from_api(d) for d in run.tis}
        if sc.judged:
            for task_id, ts in run.tasks.items():
                if ts.try_number > 1 or (run.kill and run.kill.task_id == task_id):
                    tries[task_id] = _safe(partial(api.tries, dag.dag_id, run.run_id, task_id))
            failures += judge(
                name,
                watch,
                deadline,
                run.tasks,
                tries,
                run.kill,
                n_tasks=dag.n_tasks,
                running_at_sigterm=run.extra.get("running_at_sigterm", ()),
            )
        failures += run.failures
        failures += sc.at_end(run)
    except (StackError, ToolError) as e:
        failures.append(str(e))
    finally:
        run.done.set()
        try:
            sc.cleanup(run)
            # a Ctrl-C goes straight to the stop, without waiting for the supervisors
            if o.executor == "celery" and not isinstance(sys.exc_info()[1], KeyboardInterrupt):
                failures += celery_at_end(run)
            _loops(run)
        finally:
            # also on a Ctrl-C while the figures above are read: nothing of the stack stays up
            run.stop_info = session.stop(stack, say)
        run.api_logs = read_api_logs(home / "logs")
        run.extra["pool_timeouts"] = component_pool_timeouts(home / "logs", run.api_logs)
        if any(run.extra["pool_timeouts"].values()):
            run.event(
                "database pool timeouts (the components' logs): "
                + ", ".join(f"{k} {v}" for k, v in run.extra["pool_timeouts"].items())
            )
    failures += sc.after_stop(run)
    ended = run.watch
    span = max([ended.elapsed if ended else 0.0] + [t for t, _ in run.events] + [1.0])
    rows = rows_from_api(
        [_ts_dict(ts) for ts in run.tasks.values()],
        tries,
        t0_wall,
        marked=[run.kill.task_id] if run.kill and run.kill.task_id else [],
    )
    timeline = format_timeline(rows, run.events, span)
    if rows:
        timeline += "\n" + summarize(rows)
    say("")
    if len(rows) > MAX_TIMELINE_ROWS:
        say(f"({len(rows)} task tries: the timeline is in the report)\n{summarize(rows)}")
    else:
        say(timeline)
    passed = not failures
    say(f"-- {name}: {'PASS' if passed else 'FAIL'}")
    for f in failures:
        say(f"   {f}")
    if not passed and (p := stack.procs.get("scheduler")) is not None:
        say(f"   last lines of {p.log}:\n{tail(p.log, 12)}")
    return ScenarioResult(
        name=name,
        passed=passed,
        failures=failures,
        run_state=ended.run_state if ended else None,
        final=bool(ended and ended.final),
        timings=timings,
        counts=(ended.last.count() if ended and ended.last else {}),
        kill=run.kill,
        events=run.events,
        health_at_end=health,
        stop=run.stop_info,
        timeline=timeline,
        logs=str(home / "logs"),
        extra=run.extra,
    )


def _loops(run: Run) -> None:
    """The scheduler's loops from the trigger to the run's end (or the scenario's window)."""
    if run.trace is None or run.watcher.t0 is None:
        return
    start, end = run.watcher.t0, time.monotonic()
    if run.watch and run.watch.final:
        end = run.watcher.t0 + run.watch.elapsed
    start, end = run.window or (start, end)
    if loops := looptrace.summarise(run.trace, start, end):
        run.extra["loops"] = loops.as_json()
        run.event(loops.text())


def _watch(run: Run, sc: Scenario, failures: list[str]) -> WatchResult:
    result: list[WatchResult] = []
    th = threading.Thread(
        target=lambda: result.append(run.watcher.watch(run.deadline, run.done)), daemon=True
    )
    th.start()
    try:
        sc.during(run)
        while th.is_alive():
            th.join(0.5)
            try:
                run.stack.check_alive()
            except StackError as e:
                failures.append(str(e))
                run.done.set()
                break
    finally:
        run.done.set()
        th.join(30)
    if not result:
        raise StackError("the run watcher did not return")
    return result[0]


def _safe(fn: Callable[[], list[Json]]) -> list[Json]:
    """The API's answer, or nothing when the api-server does not give one."""
    try:
        return fn()
    except (OSError, ValueError, KeyError):
        return []


def _ts_dict(ts: TaskSnap) -> Json:
    return {
        "task_id": ts.task_id,
        "id": ts.ti_id,
        "state": ts.state,
        "try_number": ts.try_number,
        "queued_when": ts.queued_when,
        "start_date": ts.start_date,
        "end_date": ts.end_date,
        "pid": ts.pid,
    }


def _health_text(h: Json | None) -> str:
    if not h:
        return "no answer"
    return ", ".join(f"{k} {(v or {}).get('status')}" for k, v in h.items() if (v or {}).get("status"))


# -- the session ---------------------------------------------------------------------------------


class E2e:
    """The e2e as the session runner's workload: the selected scenarios at each stage, that stage's
    executor installed in turn."""

    def __init__(self, opts: Options):
        self.opts = opts
        self.out = opts.out
        self.needs = session.Needs(
            postgres=opts.db == "postgres", redis=opts.executor == "celery", trace_loops=traces_loops(opts)
        )

    def stages(self, workdir: Path) -> list[session.Stage]:
        o = self.opts
        label = partial(stage_label, executor=o.executor)
        return session.plan(
            workdir, o.compare or [o.stage], label, o.rounds if o.compare else 1, nest_single=False
        )

    def venv(self, say: Callable[[str], None]) -> AirflowVenv:
        from tools.measure.e2e.venv import AirflowVenv

        o = self.opts
        return AirflowVenv(o.line, o.out, say, celery=o.executor == "celery", core=o.release)

    def begin(self, say: Callable[[str], None]) -> None:
        if self.opts.db == "sqlite" and self.opts.parallelism > 16:
            say(
                f"warning: SQLite at parallelism {self.opts.parallelism}: "
                "the scheduler may die with 'database is locked'"
            )

    def run_stage(self, st: session.Stage, shared: session.Shared, say: Callable[[str], None]) -> Json:
        """The selected scenarios with ``st.stage``'s executor installed; returns that stage's report."""
        from tools.measure.e2e.venv import resolve_source

        opts = replace(self.opts, stage=st.stage)
        venv, workdir = shared.venv, st.home
        workdir.mkdir(parents=True, exist_ok=True)
        if opts.executor == "package":
            source = venv.install_package(opts.out / "dist")
            how = (
                f"uv pip install beside apache-airflow-core {opts.release} and task-sdk {opts.task_sdk} "
                "(Airflow's files checked: as released)"
            )
        elif opts.install == "wheels" and opts.stage is None:
            source = venv.install_wheels(opts.out / "wheels")
            how = f"uv pip install --no-deps of the patched wheels ({source.origin})"
        elif opts.executor == "celery":
            source = venv.install_supervisor(fixed=opts.stage is None)
            how = source.origin if opts.stage is None else "pinned bases (restored)"
        else:
            source = resolve_source(opts.line, opts.stage, opts.supervisor, opts.release)
            how = venv.install_executor(source)
        say(
            f"e2e {opts.line.name} (apache-airflow {opts.release}, task-sdk {opts.task_sdk}): "
            f"executor = {source.label}, sha256 {source.sha256[:12]}, installed via {how}; "
            f"db {opts.db}; parallelism {opts.parallelism}; "
            f"{pool_text(opts)}" + "".join(f"; {name}={value}" for name, value in opts.airflow_env.items())
        )
        t_stage = time.monotonic()
        try:
            results = [run_scenario(name, opts, shared, workdir, say) for name in opts.scenarios]
        finally:
            if opts.executor == "package":
                venv.uninstall_package()
        report = {
            "line": opts.line.name,
            "version": opts.release,
            "task_sdk": opts.task_sdk,
            "stage": opts.stage,
            "executor_kind": opts.executor,
            "executor": {
                "label": source.label,
                "sha256": source.sha256,
                "sources_sha256": {
                    path: hashlib.sha256(data).hexdigest() for path, data in source.sources.items()
                },
                "origin": source.origin,
                "installed_via": how,
            },
            "db": opts.db,
            "parallelism": opts.parallelism,
            "tasks": opts.tasks if "throughput" in opts.scenarios else None,
            "deadline_s": opts.deadline,
            "stop_bound_s": opts.stop_bound,
            "task_seconds": opts.task_seconds,
            "min_heartbeat_interval": opts.min_heartbeat_interval,
            "db_pool": {name: pool_settings(opts, name) for name in opts.scenarios},
            "airflow_env": opts.airflow_env,
            "started": shared.stamp,
            "session_s": round(time.monotonic() - t_stage, 1),
            "passed": all(r.passed for r in results),
            "scenarios": [asdict(r) for r in results],
        }
        session.write_report(workdir / "report.json", report, also=opts.out / "report.json")
        say("\n" + summary_table(opts, source.label, results))
        return report

    def finish(
        self, shared: session.Shared, reports: list[Json], session_s: float, say: Callable[[str], None]
    ) -> int:
        """One stage: its report is the session's; more: ``compare.json`` with the comparison tables."""
        opts = self.opts
        passed = all(r["passed"] for r in reports)
        path = shared.workdir / "report.json"
        if opts.compare:
            path = shared.workdir / "compare.json"
            tables = compare_tables(opts, reports)
            combined = {
                "compare_stages": [stage_label(s, opts.executor) for s in opts.compare],
                "rounds": opts.rounds,
                "db_pool": {name: pool_settings(opts, name) for name in opts.scenarios},
                "airflow_env": opts.airflow_env,
                "started": shared.stamp,
                "session_s": session_s,
                "passed": passed,
                "tables": tables,
                "cpu_per_task": {
                    name: [r.as_json() for r in rows]
                    for name in opts.scenarios
                    if (rows := cpu_rows(opts.executor, reports, name))
                },
                "stages": reports,
            }
            session.write_report(path, combined, also=opts.out / "report.json")
            for text in tables.values():
                say("\n" + text)
        say(f"report: {LAYOUT.rel(path)} (also {LAYOUT.rel(opts.out / 'report.json')})")
        return 0 if passed else 1


def run_session(opts: Options, say: Callable[[str], None] = print) -> int:
    """One invocation: the selected scenarios at ``opts.stage``, or at each of ``opts.compare``."""
    return session.run(E2e(opts), say)


def _stage_runs(reports: Sequence[Json], name: str) -> list[tuple[int | None, list[Json | None], list[Json]]]:
    """Per stage, in the order first run: scenario ``name``'s result in each round, and the passed ones."""
    out: list[tuple[int | None, list[Json | None], list[Json]]] = []
    for stage in dict.fromkeys(rep["stage"] for rep in reports):
        runs = [
            next((s for s in rep["scenarios"] if s["name"] == name), None)
            for rep in reports
            if rep["stage"] == stage
        ]
        out.append((stage, runs, [sc for sc in runs if sc and sc["passed"]]))
    return out


def cpu_rows(executor: str, reports: Sequence[Json], name: str) -> list[cputime.CpuRow]:
    """Per stage, the medians of the CPU figures of its passed runs of ``name``; empty if no run has them."""
    rows = [
        cputime.median_row(
            stage_label(stage, executor),
            [cputime.CpuFigures.from_json(sc["extra"]["cpu"]) for sc in ok if sc["extra"].get("cpu")],
        )
        for stage, _, ok in _stage_runs(reports, name)
    ]
    return rows if any(r.runs for r in rows) else []


def compare_tables(opts: Options, reports: Sequence[Json]) -> dict[str, str]:
    """Per scenario with throughput figures: the stages side by side (each stage's median over its
    passed rounds; a failed run gives no figures), ratios to the first stage; then the CPU per task
    and the ceiling it sets, and the scheduler's loops."""
    out: dict[str, str] = {}
    stages = list(dict.fromkeys(rep["stage"] for rep in reports))
    for name in opts.scenarios:
        rows: list[throughput.StageRow] = []
        traced: list[tuple[str, list[tuple[looptrace.LoopTrace, float | None]]]] = []
        for stage, runs, ok in _stage_runs(reports, name):
            # A failed run's figures (a stack that died halfway) would only skew the median.
            figs = [
                throughput.Figures(**sc["extra"]["throughput"]) for sc in ok if sc["extra"].get("throughput")
            ]
            # Failed tasks and pool timeouts of every round: a failed round is where they are.
            every = [(sc or {}).get("extra", {}).get("throughput") or {} for sc in runs]
            rows.append(
                throughput.StageRow(
                    stage_label(stage, opts.executor),
                    len(ok) == len(runs),
                    (figs[0] if len(figs) == 1 else throughput.median_of(figs)) if figs else None,
                    tuple(f.wall_s for f in figs),
                    runs=len(runs),
                    runs_ok=len(ok),
                    failed=tuple(t.get("failed") for t in every),
                    pool_timeouts=tuple(t.get("pool_timeouts") for t in every),
                )
            )
            traced.append(
                (
                    stage_label(stage, opts.executor),
                    [
                        (
                            looptrace.LoopTrace(**sc["extra"]["loops"]),
                            sc["extra"].get("cpu_s", {}).get("scheduler"),
                        )
                        for sc in ok
                        if sc["extra"].get("loops")
                    ],
                )
            )
        if any(
            sc["extra"].get("throughput") for rep in reports for sc in rep["scenarios"] if sc["name"] == name
        ):
            n = len(reports) // max(len(stages), 1)
            title = (
                f"{name}: {opts.tasks} no-op tasks at parallelism {opts.parallelism}, "
                f"{opts.line.label}"
                + (f" on apache-airflow-core {opts.release}" if opts.release != opts.line.version else "")
                + f", {opts.db}, {pool_text(opts, name)}"
                + (", CeleryExecutor, task-sdk's supervisor" if opts.executor == "celery" else "")
                + f"; ratios to {rows[0].label}"
                + (f"; medians of {n} rounds" if n > 1 else "")
            )
            out[name] = throughput.compare(rows, title)
            slot_rows = [
                (
                    stage_label(stage, opts.executor),
                    [slots.SlotFigures(**sc["extra"]["slots"]) for sc in ok if sc["extra"].get("slots")],
                )
                for stage, _, ok in _stage_runs(reports, name)
            ]
            if any(figs for _, figs in slot_rows):
                out[f"{name} slots"] = slots.compare(
                    slot_rows, f"{name}: where the slots' time goes (slots.py)"
                )
            if cpu := cpu_rows(opts.executor, reports, name):
                out[f"{name} cpu"] = cputime.compare(
                    cpu,
                    f"{name}: CPU per finished task and the ceiling it sets on this machine; "
                    f"ratios to {cpu[0].label}" + (f"; medians of {n} rounds" if n > 1 else ""),
                )
        if any(runs for _, runs in traced):
            out[f"{name} loops"] = looptrace.compare(traced, f"{name}: the scheduler's loops (loop trace)")
        if table := api_stall_table(opts, reports, name):
            out[f"{name} api"] = table
        out.update(SCENARIOS[name]().compare(opts, reports))
    return out


def scale_table(opts: Options, reports: Sequence[Json]) -> str:
    """The scale scenario's verdict, one line per stage and round."""
    rows: list[tuple[str, Json | None, float | None]] = []
    for stage, runs, _ in _stage_runs(reports, "scale"):
        for n, sc in enumerate(runs, 1):
            label = stage_label(stage, opts.executor) + (f" r{n}" if len(runs) > 1 else "")
            rows.append(
                (
                    label,
                    ((sc or {}).get("extra") or {}).get("scale"),
                    ((sc or {}).get("timings") or {}).get("run_s"),
                )
            )
    return scale.table(
        f"scale: {opts.tasks} BashOperator jobs at parallelism {opts.parallelism}, "
        f"{opts.kills} worker kills, {opts.line.label}, {opts.db}; checks counted per stage",
        rows,
    )


def api_stall_table(opts: Options, reports: Sequence[Json], name: str) -> str | None:
    """Issue 52's counts of every round of scenario ``name``, the stages side by side; None when no
    round has them."""
    stages: list[tuple[str, list[apistall.RoundCounts | None]]] = []
    for stage, runs, _ in _stage_runs(reports, name):
        counts: list[apistall.RoundCounts | None] = []
        for sc in runs:
            got = ((sc or {}).get("extra") or {}).get("api_stall")
            counts.append(
                replace(apistall.RoundCounts.from_json(got["counts"]), passed=bool(sc and sc["passed"]))
                if got
                else None
            )
        stages.append((stage_label(stage, opts.executor), counts))
    if not any(c for _, runs in stages for c in runs):
        return None
    poll = (
        f"a UI's run page polled every {uipoll.UI_REFRESH_INTERVAL:g} s ({len(uipoll.ENDPOINTS)} endpoints)"
        if opts.ui_poll
        else "no UI poller"
    )
    return apistall.rounds_table(
        stages,
        f"{name}: the api-server under {poll}, per round; {opts.tasks} tasks at parallelism "
        f"{opts.parallelism}, {opts.line.label}, {opts.db}, {pool_text(opts, name)}",
    )


def summary_table(opts: Options, label: str, results: Iterable[ScenarioResult]) -> str:
    lines = [
        f"e2e {opts.line.name} ({opts.release}, task-sdk {opts.task_sdk}), {label}, {opts.db}, "
        f"parallelism {opts.parallelism}, {pool_text(opts)}",
        f"{'scenario':<18}{'result':<8}{'run':<10}{'ready':>7}{'run time':>10}  detail",
    ]
    for r in results:
        deadline = r.timings.get("deadline_s") or opts.deadline
        run_t = f"{r.timings['run_s']:.1f}s" if r.timings.get("run_s") is not None else f">{deadline:g}s"
        ready = f"{r.timings['ready_s']:.1f}s" if r.timings.get("ready_s") is not None else "-"
        detail = r.failures[0] if r.failures else ", ".join(f"{n} {s}" for s, n in r.counts.items())
        if len(detail) > 110:
            detail = detail[:107] + "..."
        lines.append(
            f"{r.name:<18}{'PASS' if r.passed else 'FAIL':<8}{(r.run_state or '-'):<10}"
            f"{ready:>7}{run_t:>10}  {detail}"
        )
    for r in results:
        for key in (
            "sigterm_summary",
            "orphan_summary",
            "throughput_summary",
            "cpu_summary",
            "api_stall_summary",
            "celery_summary",
            "scale_summary",
        ):
            if r.extra.get(key):
                lines.append(f"{r.name}: {r.extra[key]}")
    return "\n".join(lines)

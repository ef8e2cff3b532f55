"""``nox -s soak`` (``python -m tools soak``): a real stack under a continuous load and seeded faults.

For each stage (``--compare-stages 0,full``: the release as shipped, then the series, in one
invocation, with the same seed and so the same fault schedule) a fresh stack
(``tools.measure.e2e.stack``: api-server, scheduler and dag-processor, LocalExecutor at
``--parallelism``, on a PostgreSQL database of the session's server) runs for ``--duration``
seconds while:

- a thread triggers ``tests/e2e/dags/lepatch_e2e_soak.py`` through the REST API every
  ``--run-interval`` seconds (run ids ``soak-00000``, ...; a trigger the api-server does not answer is
  retried with the same id, so it is never made twice);
- the faults of ``soak_faults.schedule(seed, ...)`` land: SIGKILL a worker, SIGKILL a task
  process, SIGTERM the scheduler (bounded by ``--stop-bound``) and start it again, SIGSTOP the
  api-server's process group for a few seconds;
- a component that exits by itself is started again at once, as systemd's ``Restart=always`` would,
  and counted (Airflow's own failure, reported as such). When a scheduler has exited, whatever it
  had below it (workers, task processes, their children) that is still alive is named as left
  behind, then SIGKILLed, as systemd's ``KillMode=control-group`` would on a stop.

Then no more triggers or faults; the stage waits up to ``--drain`` seconds for every run to be
final (its own deadline: a hung stage is reported, not waited out), reads the task instances from
the database (psql, not the api-server, which may be what hangs), looks in /proc for any process
the tasks' records name, stops the stack, and ``soak_check.check`` judges the history. The report
(``build/e2e/<stamp>/soak.json``) lists each violation with its evidence; the table gives tasks
completed, faults by kind, violations by invariant, per stage.

The session around the stages (the venv, the loop trace hook, PostgreSQL, the signals, the
report) is ``tools.measure.e2e.session``'s, the e2e's too: every process it starts leads its own
session and is stopped by pid (``AirflowStack.stop``, ``Postgres.stop``) in ``finally`` blocks
that a second Ctrl-C or a SIGTERM cannot interrupt.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.measure.e2e import looptrace, procfs, session, soak_check, soak_faults, web
from tools.measure.e2e.cli import line_of, parse_stage, parse_stages
from tools.measure.e2e.driver import DAGS_DIR, POOL_HEADROOM, stage_label
from tools.measure.e2e.soak_check import Incarnation, LeftAlive, TiRow, Verdict, Violation
from tools.measure.e2e.soak_faults import Fault
from tools.measure.e2e.stack import AirflowStack, Postgres, StackConfig, StackError, tail
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import DEFAULT as LAYOUT

if TYPE_CHECKING:
    from tools.measure.e2e.venv import AirflowVenv

DAG_FILE = DAGS_DIR / "lepatch_e2e_soak.py"
DAG_ID = "lepatch_e2e_soak"
RECORDS_ENV = "LEPATCH_SOAK_RECORDS"
RECORDS_FILE = "attempts.jsonl"
TASKS_PER_RUN = 10  # the soak DAG's tasks
QUEUED_TIMEOUT_S = 600.0  # [scheduler] task_queued_timeout: Airflow's own default, not the e2e's 30 s
READY_TIMEOUT_S = 180.0
END_GRACE_S = 5.0  # a recorded process may still be exiting this long after it was due to be gone
TICK_S = 0.2
# A fault that finds no target (no task running, no worker while a scheduler starts) is tried again
# every tick for this long before it is counted as skipped.
DEFER_S = 30.0


@dataclass
class SoakOptions:
    line: pins.Line
    stages: list[int | None]
    seed: int
    duration: float
    rates: dict[str, float]
    parallelism: int = 16
    run_interval: float = 6.0
    drain: float = 120.0
    stop_bound: float = 30.0
    loop_bound: float = soak_check.LOOP_BOUND_S
    out: Path = LAYOUT.build / "e2e"


# -- the api-server and the database, as the soak uses them -----------------------------------


def trigger(api: str, run_id: str, timeout: float = 5.0) -> str:
    """POST one DAG run; "created", "exists" (an earlier try got through) or raises OSError."""
    try:
        web.call(
            f"{api}/api/v2/dags/{DAG_ID}/dagRuns",
            {"dag_run_id": run_id, "logical_date": None},
            timeout=timeout,
        )
        return "created"
    except urllib.error.HTTPError as e:
        if e.code == 409:
            return "exists"
        raise


def psql(pg: Postgres, db_url: str, sql: str) -> list[list[str]]:
    """Rows of one query, read straight from the database (tab-separated, no header)."""
    dbname = urllib.parse.urlparse(db_url).path.lstrip("/")
    argv = [str(pg.bindir / "psql"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "airflow", "-d", dbname]
    r = subprocess.run([*argv, "-At", "-F", "\t", "-c", sql], capture_output=True, text=True, timeout=60)
    if r.returncode:
        raise StackError(f"psql {dbname}: {r.stderr.strip() or r.stdout.strip()}")
    return [ln.split("\t") for ln in r.stdout.splitlines() if ln]


TI_COLUMNS = "select column_name from information_schema.columns where table_name = 'task_instance'"


def db_runs(pg: Postgres, db_url: str) -> dict[str, str | None]:
    rows = psql(pg, db_url, f"select run_id, state from dag_run where dag_id = '{DAG_ID}'")
    return {r[0]: (r[1] or None) for r in rows}


def db_tis(pg: Postgres, db_url: str) -> list[TiRow]:
    cols = {r[0] for r in psql(pg, db_url, TI_COLUMNS)}
    # why: 3.4 renamed task_instance.map_index to region_index (the task still sees ti.map_index).
    index = "map_index" if "map_index" in cols else "region_index"
    # why: 3.4 keeps each try's row in task_instance, archived (working_set NULL) when the next try's
    # row is made; the live one has working_set true.
    live = " and working_set" if "working_set" in cols else ""
    sql = (
        f"select dag_id, run_id, task_id, {index}, coalesce(state, ''), try_number "
        f"from task_instance where dag_id = '{DAG_ID}'{live}"
    )
    return [TiRow(r[0], r[1], r[2], int(r[3]), r[4] or None, int(r[5])) for r in psql(pg, db_url, sql)]


# -- one stage ---------------------------------------------------------------------------------


@dataclass
class StageResult:
    label: str
    stage: int | None
    executor_sha256: str
    runs_triggered: int = 0
    trigger_errors: int = 0
    faults: list[dict[str, Any]] = field(default_factory=list)  # each scheduled fault and what it hit
    restarts: dict[str, dict[str, int]] = field(default_factory=dict)  # component -> cause -> count
    airflow_faults: list[str] = field(default_factory=list)  # what Airflow itself did wrong
    drained_s: float | None = None  # seconds after --duration until every run was final; None: never
    verdict: Verdict | None = None
    error: str | None = None
    home: str = ""

    def injected(self) -> dict[str, int]:
        return {k: sum(1 for f in self.faults if f["kind"] == k and f["done"]) for k in soak_faults.KINDS}

    def skipped(self) -> int:
        return sum(1 for f in self.faults if not f["done"])

    def as_json(self) -> dict[str, Any]:
        v = self.verdict
        return {
            "label": self.label,
            "stage": self.stage,
            "executor_sha256": self.executor_sha256,
            "runs_triggered": self.runs_triggered,
            "trigger_errors": self.trigger_errors,
            "faults_injected": self.injected(),
            "faults_skipped": self.skipped(),
            "faults": self.faults,
            "restarts": self.restarts,
            "airflow_faults": self.airflow_faults,
            "drained_s": self.drained_s,
            "error": self.error,
            "home": self.home,
            "task_instances": v.tis if v else None,
            "states": v.states if v else None,
            "attempts": v.attempts if v else None,
            "violations_by_invariant": v.by_invariant() if v else None,
            "first_violation": (f.as_json() if v and (f := v.first()) else None),
            "violations": [x.as_json() for x in v.violations] if v else None,
        }


class StageSoak:
    """One stage's soak on a fresh stack; ``run()`` always stops the stack before it returns."""

    def __init__(
        self,
        opts: SoakOptions,
        venv_path: Path,
        home: Path,
        pg: Postgres,
        schedule: list[Fault],
        result: StageResult,
        say: Callable[[str], None],
    ):
        self.opts = opts
        self.home = home
        self.pg = pg
        self.schedule = schedule
        self.result = result
        self.say = say
        self.records = home / RECORDS_FILE
        self.db_url = pg.new_database()
        self.trace_n = 1
        cfg = StackConfig(
            venv=venv_path,
            home=home,
            dag_file=DAG_FILE,
            db_url=self.db_url,
            parallelism=opts.parallelism,
            task_queued_timeout=QUEUED_TIMEOUT_S,
            extra_env={RECORDS_ENV: str(self.records), looptrace.ENV: str(self._trace_file(1))},
            db_pool_size=opts.parallelism + POOL_HEADROOM,
        )
        self.stack = AirflowStack(cfg, say)
        self.t0 = 0.0
        self.stop_triggers = threading.Event()
        self.triggered: dict[str, float] = {}
        self.incarnations: list[Incarnation] = []
        self.left_alive: list[LeftAlive] = []
        self.observed: list[Violation] = []  # stop-bound: the driver's own observations
        self.hit: dict[str, str] = {}  # a try's uuid -> the fault that killed its task process or worker
        self.paused_until = 0.0
        self._pause_lock = threading.Lock()
        self._cont_timer: threading.Timer | None = None

    def _trace_file(self, n: int) -> Path:
        return self.home / f"looptrace-{n}.txt"

    def t(self) -> float:
        return time.monotonic() - self.t0

    def event(self, text: str) -> None:
        self.say(f"  {self.t():+8.1f}  {text}")

    def _restarted(self, name: str, cause: str) -> None:
        per = self.result.restarts.setdefault(name, {})
        per[cause] = per.get(cause, 0) + 1

    # -- the load

    def _trigger_loop(self) -> None:
        n = 0
        while not self.stop_triggers.is_set():
            due = self.t0 + n * self.opts.run_interval
            if due >= self.t0 + self.opts.duration:
                return
            if self.stop_triggers.wait(max(0.0, due - time.monotonic())):
                return
            run_id = f"soak-{n:05d}"
            while not self.stop_triggers.is_set():
                try:
                    trigger(self.stack.api, run_id)
                    self.triggered[run_id] = time.monotonic()
                    break
                except (OSError, ValueError):
                    self.result.trigger_errors += 1
                    if self.stop_triggers.wait(1.0):
                        return
            n += 1

    # -- the faults

    def _apply(self, fault: Fault) -> str | None:
        """Land one fault; what it hit, or None when it found no target."""
        sched = self.stack.procs["scheduler"]
        if fault.kind in (soak_faults.KILL_WORKER, soak_faults.KILL_TASK):
            if not sched.alive():
                return None
            workers = procfs.workers_of(sched.pid)
            if fault.kind == soak_faults.KILL_WORKER:
                busy = [w for w in workers if w.busy_with]
                w = soak_faults.choose(fault.pick, busy or workers, key=lambda w: w.pid)
                if w is None:
                    return None
                procfs.send(w.pid, signal.SIGKILL)
                if w.busy_with:
                    self.hit[w.busy_with] = f"{fault.kind} at {self.t():.1f}s"
                return f"SIGKILL worker {w.pid} ({'running ' + str(w.busy_with) if w.busy_with else 'idle'})"
            tasks = [(c, w) for w in workers for c in w.children]
            hit = soak_faults.choose(fault.pick, tasks, key=lambda cw: cw[0])
            if hit is None:
                return None
            procfs.send(hit[0], signal.SIGKILL)
            if hit[1].busy_with:
                self.hit[hit[1].busy_with] = f"{fault.kind} at {self.t():.1f}s"
            return f"SIGKILL task process {hit[0]} (worker {hit[1].pid}, ti {hit[1].busy_with})"
        if fault.kind == soak_faults.PAUSE_API:
            return self._pause_api(fault.pause_s)
        if fault.kind == soak_faults.RESTART_SCHEDULER:
            if not sched.alive():
                return None
            return self._restart_scheduler(sigterm=True)
        if fault.kind == soak_faults.RESTART_DB:
            return self._restart_db(fault.pause_s)
        raise ValueError(f"unknown fault kind {fault.kind}")

    def _pause_api(self, seconds: float) -> str | None:
        api = self.stack.procs["api-server"]
        if not api.alive():
            return None
        with self._pause_lock:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(api.pid, signal.SIGSTOP)
            self.paused_until = max(self.paused_until, time.monotonic() + seconds)
            if self._cont_timer is not None:
                self._cont_timer.cancel()
            self._cont_timer = threading.Timer(self.paused_until - time.monotonic(), self._resume_api)
            self._cont_timer.daemon = True
            self._cont_timer.start()
        return f"SIGSTOP api-server group {api.pid} for {seconds:.1f} s"

    def _restart_db(self, down_s: float) -> str | None:
        """Stop PostgreSQL (fast shutdown: every connection of every component closed), keep it down
        ``down_s``, start it again. What the components do meanwhile is theirs: one that exits is
        started again by ``_supervise`` and counted as Airflow's own failure."""
        if not self.pg.proc.alive():
            return None
        pid = self.pg.proc.pid
        stopped, ready = self.pg.restart(down_s)
        self._restarted("postgres", "fault")
        return (
            f"PostgreSQL {pid} stopped (fast) in {stopped:.1f} s, down {down_s:.1f} s, "
            f"ready again in {ready:.1f} s (pid {self.pg.proc.pid})"
        )

    def _resume_api(self) -> None:
        with self._pause_lock:
            api = self.stack.procs.get("api-server")
            if api is not None and api.popen is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(api.pid, signal.SIGCONT)
            self.paused_until = 0.0

    def _restart_scheduler(self, sigterm: bool) -> str:
        """SIGTERM (or, for one that exited by itself, only clean up after) the scheduler; what it left
        behind is named and killed; start it again."""
        proc = self.stack.procs["scheduler"]
        stats = procfs.all_stats()
        below = [(s.pid, s.starttime) for s in stats if s.pid in set(procfs.descendants(proc.pid, stats))]
        how = f"exited {proc.exit_code()}"
        forced = ""
        if sigterm:
            held = [w.busy_with for w in procfs.workers_of(proc.pid) if w.busy_with]
            t_sig = time.monotonic()
            procfs.send(proc.pid, signal.SIGTERM)
            assert proc.popen is not None
            try:
                proc.popen.wait(self.opts.stop_bound)
                how = f"SIGTERM, exited {proc.exit_code()} after {time.monotonic() - t_sig:.1f} s"
            except subprocess.TimeoutExpired:
                waits = ", ".join(f"{w.pid}:{w.wchan}" for w in procfs.workers_of(proc.pid))
                procfs.send(proc.pid, signal.SIGKILL)
                proc.popen.wait(10)
                how = f"SIGTERM hung {self.opts.stop_bound:g} s, SIGKILLed"
                self.observed.append(
                    Violation(
                        "stop-bound",
                        t_sig - self.t0,
                        f"scheduler {proc.pid}",
                        f"still alive {self.opts.stop_bound:g} s after SIGTERM "
                        f"(workers' wchans {waits or '-'})",
                    )
                )
            self.incarnations[-1].until = t_sig
            # A scheduler that had stopped looping by itself (e.g. its database went away) was waiting in
            # its executor's end(): this SIGTERM was its second signal, which ends the workers and the
            # tries they held. Those tries were hit, as by a kill-worker (the rerun invariant).
            exits = soak_check.read_loop_exits(self._trace_file(self.trace_n))
            if hits := soak_check.shutdown_hits(held, exits, t_sig, self.t0):
                for ti, why in hits.items():
                    self.hit.setdefault(ti, why)
                forced = f"; it had stopped looping by itself: {len(hits)} running tries ended with it"
        else:
            self.incarnations[-1].until = time.monotonic()
        self.incarnations[-1].how = how
        t_exit = time.monotonic()
        # Children the soak's fork task made on purpose may live out their own few seconds.
        allowed = {
            (a.child[0], a.child[1])
            for a in soak_check.attempts(soak_check.read_records(self.records))
            if a.child and a.child[2] > t_exit
        }
        left = {(p, st) for p, st in below if procfs.alive_as(p, st) and (p, st) not in allowed}
        # Unpatched workers stay in the scheduler's session; whatever is still there was below it.
        left |= {
            (s.pid, s.starttime)
            for s in procfs.all_stats()
            if s.sid == proc.pid and s.pid != proc.pid and s.state not in ("Z", "X")
        }
        for pid, _ in sorted(left):
            self.left_alive.append(
                LeftAlive(t_exit, pid, procfs.title_of(pid), f"after scheduler {proc.pid} exited ({how})")
            )
        procfs.kill_pids(sorted(p for p, _ in left))
        self.trace_n += 1
        self.stack.env[looptrace.ENV] = str(self._trace_file(self.trace_n))
        new = self.stack.restart("scheduler")
        self.incarnations.append(Incarnation(new.pid, new.started, 0.0, "end of soak"))
        self._restarted("scheduler", "fault" if sigterm else "exited")
        return (
            f"scheduler {proc.pid}: {how}{forced}; {len(left)} left behind"
            + (f" ({', '.join(str(p) for p, _ in sorted(left)[:6])}, killed)" if left else "")
            + f"; started again as {new.pid}"
        )

    # -- the components, as systemd would keep them

    def _supervise(self) -> None:
        for name in ("scheduler", "dag-processor", "api-server"):
            proc = self.stack.procs[name]
            if proc.alive():
                continue
            code = proc.exit_code()
            last = tail(proc.log, 3).strip().splitlines()
            said = last[-1].strip() if last else ""
            msg = f"{name} {proc.pid} exited by itself ({code}) at {self.t():.1f}s: {said}"
            self.result.airflow_faults.append(msg[:300])
            self.event(msg[:200] + "; started again")
            if name == "scheduler":
                self._restart_scheduler(sigterm=False)
            else:
                self.stack.restart(name)
                self._restarted(name, "exited")

    # -- the run

    def run(self) -> None:
        res = self.result
        try:
            _, ready = session.launch(self.stack, DAG_ID, READY_TIMEOUT_S)
            sched = self.stack.procs["scheduler"]
            self.incarnations.append(Incarnation(sched.pid, sched.started, 0.0, "end of soak"))
            self.t0 = time.monotonic()
            self.say(f"  stack ready after {ready:.1f} s: api {self.stack.api}, scheduler {sched.pid}")
            trig = threading.Thread(target=self._trigger_loop, daemon=True)
            trig.start()
            todo = list(self.schedule)
            while self.t() < self.opts.duration:
                self._supervise()
                waiting = []
                while todo and todo[0].t <= self.t():
                    fault = todo.pop(0)
                    hit = self._apply(fault)
                    if hit is None and self.t() < fault.t + DEFER_S:
                        waiting.append(fault)  # e.g. no worker yet: a scheduler is starting
                        continue
                    res.faults.append(
                        {**fault.as_json(), "at": round(self.t(), 2), "done": hit is not None, "hit": hit}
                    )
                    self.event(f"{fault.kind} (scheduled {fault.t:.1f}s): {hit or 'no target, skipped'}")
                todo[:0] = waiting
                time.sleep(TICK_S)
            for fault in todo:  # a long restart can push the last ones past the end
                res.faults.append(
                    {**fault.as_json(), "at": None, "done": False, "hit": "past the soak's end"}
                )
            self.stop_triggers.set()
            trig.join(10)
            self._resume_api()
            res.runs_triggered = len(self.triggered)
            self.event(
                f"soak over: {res.runs_triggered} runs triggered; draining (up to {self.opts.drain:g} s)"
            )
            res.drained_s = self._drain()
            self._end_check()
        except StackError as e:
            res.error = str(e)
            self.say(f"  error: {e}")
        finally:
            with session.shielded():  # no window between the two where a Ctrl-C skips the stop
                self.stop_triggers.set()
                self._resume_api()
                session.stop(self.stack, self.say)

    def _drain(self) -> float | None:
        deadline = time.monotonic() + self.opts.drain
        end = self.t()
        while True:
            self._supervise()
            try:
                runs = db_runs(self.pg, self.db_url)
            except StackError:
                runs = {}
            open_ = [r for r in self.triggered if runs.get(r) not in soak_check.FINAL_RUN]
            if not open_:
                secs = round(self.t() - end, 1)
                self.event(f"every run final {secs:.1f} s after the soak")
                return secs
            if time.monotonic() >= deadline:
                self.event(f"drain deadline: {len(open_)} run(s) not final ({', '.join(open_[:5])}...)")
                return None
            time.sleep(2.0)

    def _end_check(self) -> None:
        now = time.monotonic()
        self.incarnations[-1].until = now
        atts = soak_check.attempts(soak_check.read_records(self.records))
        for pid, pst, gone_by, what in soak_check.recorded_processes(atts):
            if now > gone_by + END_GRACE_S and procfs.alive_as(pid, pst):
                self.left_alive.append(LeftAlive(now, pid, procfs.title_of(pid), f"at the end ({what})"))
        for n, inc in enumerate(self.incarnations, 1):
            inc.loops = soak_check.read_loops(self._trace_file(n))
        try:
            tis = db_tis(self.pg, self.db_url)
            runs = db_runs(self.pg, self.db_url)
        except StackError as e:  # the tasks' own records are still worth judging
            self.result.error = f"the database was not read, terminal and lost-try not judged: {e}"
            self.say(f"  error: {self.result.error}")
            tis, runs = [], {}
        for r in self.triggered:
            runs.setdefault(r, None)
        verdict = soak_check.check(
            soak_check.read_records(self.records),
            tis,
            runs,
            self.t0,
            now,
            self.left_alive,
            self.incarnations,
            self.opts.loop_bound,
            self.observed,
            self.hit,
        )
        self.result.verdict = verdict


# -- the session -------------------------------------------------------------------------------


class Soak:
    """The soak as the session runner's workload: every stage with the same fault schedule, on the
    session's PostgreSQL, the scheduler's loops traced (the loop-blocked invariant reads them)."""

    needs = session.Needs(postgres=True, trace_loops=True)

    def __init__(self, opts: SoakOptions):
        self.opts = opts
        self.out = opts.out
        self.schedule = soak_faults.schedule(opts.seed, opts.duration, opts.rates)

    def stages(self, workdir: Path) -> list[session.Stage]:
        return session.plan(workdir, self.opts.stages, stage_label)

    def venv(self, say: Callable[[str], None]) -> AirflowVenv:
        from tools.measure.e2e.venv import AirflowVenv

        return AirflowVenv(self.opts.line, self.opts.out, say)

    def begin(self, say: Callable[[str], None]) -> None:
        o = self.opts
        rates = ", ".join(f"{k} {v:.3g}/min" for k, v in o.rates.items())
        say(
            f"soak {o.line.name} ({o.line.version}), postgres, parallelism {o.parallelism}, "
            f"{o.duration:g} s, a run of {TASKS_PER_RUN} tasks every {o.run_interval:g} s, seed {o.seed}: "
            f"{len(self.schedule)} faults scheduled ({rates}; "
            + ", ".join(f"{k} {n}" for k, n in soak_faults.counts(self.schedule).items())
            + ")"
        )

    def run_stage(self, st: session.Stage, shared: session.Shared, say: Callable[[str], None]) -> StageResult:
        from tools.measure.e2e.venv import resolve_source

        assert shared.pg is not None
        source = resolve_source(self.opts.line, st.stage)
        how = shared.venv.install_executor(source)
        say(f"\n== {st.label}: {source.label}, sha256 {source.sha256[:12]}, via {how}")
        res = StageResult(st.label, st.stage, source.sha256, home=str(st.home))
        StageSoak(self.opts, shared.venv.path, st.home, shared.pg, self.schedule, res, say).run()
        say(stage_text(res))
        return res

    def finish(
        self, shared: session.Shared, results: list[StageResult], session_s: float, say: Callable[[str], None]
    ) -> int:
        o = self.opts
        report = {
            "line": o.line.name,
            "version": o.line.version,
            "seed": o.seed,
            "duration_s": o.duration,
            "parallelism": o.parallelism,
            "run_interval_s": o.run_interval,
            "drain_s": o.drain,
            "loop_bound_s": o.loop_bound,
            "stop_bound_s": o.stop_bound,
            "rates_per_min": o.rates,
            "schedule": [f.as_json() for f in self.schedule],
            "stages": [r.as_json() for r in results],
        }
        path = shared.workdir / "soak.json"
        where = session.write_report(path, report)
        say("\n" + figures_table(o, results))
        say(where)
        # Only the series is judged: the release's violations are what the soak shows it fixes.
        ok = all(r.verdict and not r.verdict.violations and not r.error for r in results if r.stage is None)
        return 0 if ok else 1


def run_soak(opts: SoakOptions, say: Callable[[str], None] = print) -> int:
    return session.run(Soak(opts), say)


def stage_text(res: StageResult, limit: int = 25) -> str:
    if res.verdict is None:
        return f"-- {res.label}: no verdict ({res.error})"
    v = res.verdict
    lines = [
        f"-- {res.label}: {v.tis} task instances {v.states}, {v.attempts} attempts recorded, "
        f"{len(v.violations)} violations {v.by_invariant()}"
    ]
    if first := v.first():
        lines.append(f"   first: {first.invariant} at {first.t:.1f}s ({first.what})")
    lines += [f"   {x.text()}" for x in v.violations[:limit]]
    if len(v.violations) > limit:
        lines.append(f"   ... {len(v.violations) - limit} more in the report")
    if res.error:
        lines.append(f"   error: {res.error}")
    for msg in res.airflow_faults:
        lines.append(f"   airflow: {msg}")
    return "\n".join(lines)


# Short column names for the figures table (the report's JSON keeps the full ones).
KIND_COLS = {
    "kill-worker": "kill-wk",
    "kill-task": "kill-task",
    "restart-scheduler": "restart",
    "pause-api": "pause",
    "restart-db": "db",
}
INVARIANT_COLS = {
    "terminal": "terminal",
    "overlap": "overlap",
    "duplicate-try": "dup-try",
    "lost-try": "lost",
    "rerun": "rerun",
    "left-alive": "left",
    "loop-blocked": "loop",
    "stop-bound": "stop",
}


def figures_table(opts: SoakOptions, results: list[StageResult]) -> str:
    """Per stage: runs and task instances (by final state), faults injected by kind (and skipped:
    no target when they came), restarts, violations by invariant, the first one."""
    kinds = soak_faults.KINDS
    inv = soak_check.INVARIANTS
    head = (
        f"{'stage':<12}{'runs':>5}{'TIs':>6}{'success':>8}{'failed':>7}{'other':>6} |"
        + "".join(f"{KIND_COLS[k]:>10}" for k in kinds)
        + f"{'skipped':>8}{'restarts':>9} |"
        + "".join(f"{INVARIANT_COLS[k]:>9}" for k in inv)
        + " | first violation"
    )
    lines = [
        f"soak {opts.line.name} ({opts.line.version}), postgres, parallelism {opts.parallelism}, "
        f"{opts.duration:g} s, seed {opts.seed}: tasks | faults injected by kind | violations by invariant",
        head,
    ]
    for r in results:
        v = r.verdict
        st = v.states if v else {}
        other = sum(n for s, n in st.items() if s not in ("success", "failed"))
        inj = r.injected()
        rs = sum(sum(c.values()) for c in r.restarts.values())
        byi: dict[str, int] = v.by_invariant() if v else {}
        first = v.first() if v else None
        lines.append(
            f"{r.label:<12}{r.runs_triggered:>5}{(v.tis if v else 0):>6}{st.get('success', 0):>8}"
            f"{st.get('failed', 0):>7}{other:>6} |"
            + "".join(f"{inj[k]:>10}" for k in kinds)
            + f"{r.skipped():>8}{rs:>9} |"
            + "".join(f"{byi.get(k, '-'):>9}" for k in inv)
            + " | "
            + (f"{first.invariant} at {first.t:.1f}s" if first else ("none" if v else f"error: {r.error}"))
        )
    return "\n".join(lines)


# -- the command line ---------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--line", default=pins.PRIMARY.name, help="release line (default %(default)s)")
    p.add_argument(
        "--compare-stages",
        metavar="LIST",
        default="0,full",
        help="the stages run one after the other with the same schedule (default %(default)s)",
    )
    p.add_argument("--stage", help="one stage only (a number, or full)")
    p.add_argument("--seed", type=int, default=1, help="draws the fault schedule (default %(default)s)")
    p.add_argument(
        "--duration", type=float, default=600.0, help="seconds of load and faults (default %(default)s)"
    )
    p.add_argument(
        "--fault-rate",
        action="append",
        default=[],
        metavar="KIND=PER_MIN|TOTAL",
        help=(
            "faults per minute of one kind (repeatable; kinds: "
            + ", ".join(soak_faults.KINDS)
            + "), or one number: the total, spread as the defaults are ("
            + ", ".join(f"{k} {v:g}" for k, v in soak_faults.DEFAULT_RATES.items())
            + ")"
        ),
    )
    p.add_argument("--parallelism", type=int, default=16)
    p.add_argument("--run-interval", type=float, default=6.0, help="seconds between two triggered runs")
    p.add_argument("--drain", type=float, default=120.0, help="seconds after the soak for every run to end")
    p.add_argument(
        "--stop-bound", type=float, default=30.0, help="seconds SIGTERM may take to stop the scheduler"
    )
    p.add_argument(
        "--loop-bound",
        type=float,
        default=soak_check.LOOP_BOUND_S,
        help="longest scheduler loop gap allowed (default: Airflow's scheduler_health_check_threshold, 30 s)",
    )
    p.add_argument("--out", type=Path, default=LAYOUT.build / "e2e")


def options_from(args: argparse.Namespace) -> SoakOptions:
    line = line_of(args.line)
    if args.stage is not None:
        stages = [parse_stage(args.stage, "--stage")]
    else:
        stages = parse_stages(args.compare_stages)
    try:
        rates = soak_faults.parse_rates(args.fault_rate)
    except soak_faults.FaultRateError as e:
        raise ToolError(str(e)) from None
    if args.duration <= soak_faults.WARMUP_S:
        raise ToolError(f"--duration must be more than {soak_faults.WARMUP_S:g} s, got {args.duration:g}")
    if args.parallelism < 2:
        raise ToolError("--parallelism must be at least 2")
    if args.run_interval <= 0 or args.drain < 0:
        raise ToolError("--run-interval must be > 0 and --drain >= 0")
    return SoakOptions(
        line=line,
        stages=stages,
        seed=args.seed,
        duration=args.duration,
        rates=rates,
        parallelism=args.parallelism,
        run_interval=args.run_interval,
        drain=args.drain,
        stop_bound=args.stop_bound,
        loop_bound=args.loop_bound,
        out=args.out.resolve(),
    )


def _cmd_soak(args: argparse.Namespace) -> int:
    return run_soak(options_from(args))


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "soak",
        help="a real stack under load and seeded faults, the release against the series (docs/e2e.md)",
        description=(__doc__ or "").splitlines()[0],
    )
    add_arguments(p)
    p.set_defaults(func=_cmd_soak)

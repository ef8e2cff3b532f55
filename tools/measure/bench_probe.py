"""The measuring side of ``python -m tools bench``: run INSIDE a stage venv, never imported by the tools.

``python tools/measure/bench_probe.py REQUEST.json`` runs the measurements the request lists and
prints one JSON document: ``{"results": [...]}``, one entry per measurement, in order.

Every measurement runs through ``harness.run_scenario`` (tests/executor/harness.py): a
child process group under a watchdog, so a stage that deadlocks (unpatched base with a
batch bigger than the pipes hold) costs about a second and is reported as ``hang`` with
the watchdog's reason instead of hanging the benchmark. The scenario appends each finished
measurement to a progress file, so when the watchdog kills it, the measurements already
done are kept, the one in progress is the one that hung, and the rest run in a fresh child.

Measurement kinds (all no-op tasks, fork, realistic ~1.7 KB ``ExecuteTask`` workloads):

``dispatch``   n workloads in one ``_process_workloads`` batch into a started executor:
               ms inside ``_process_workloads``, and ms until every result was read by
               ``sync()`` called in a 1 ms loop.
``throughput`` n workloads, at most ``parallelism`` dispatched and not finished at a time
               (what the scheduler does), ``sync()`` every 1 ms: tasks per second.
``recovery``   every worker busy, SIGKILL one, dispatch one more workload at once: ms until
               the killed worker's key is reported failed (and how many ``sync()`` calls
               made after the worker was dead that took) and ms until the new workload runs
               (on a replacement worker).
``ppe``        the same no-op work through ``concurrent.futures.ProcessPoolExecutor``:
               ms until n results are back (``runs`` times), or tasks/s with
               ``parallelism`` in flight (``throughput`` in the spec).
``floor``      pickling n workloads and writing them to a pipe a reader process drains.
``loop``       n tasks of seeded random length (0.2-3 s, then 0.05-0.3 s of supervisor shutdown
               before the worker reports) run through a model of Airflow's scheduler loop
               (``tools/measure/bench_loop.py``: read ``slots_available``, queue that many,
               ``heartbeat()``, process the event buffer, sleep ``idle_sleep`` when idle):
               tasks/s, queued-to-start p50/p95 where start is the time the task itself
               recorded in the worker, and ready-to-start p50/p95 (from the loop's start).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil  # in every stage venv: Airflow depends on it

HARNESS_DIR = Path(__file__).resolve().parents[2] / "tests" / "executor"
if str(HARNESS_DIR) not in sys.path:
    sys.path.insert(0, str(HARNESS_DIR))

import harness  # noqa: E402


def _load_bench_loop() -> Any:
    """``bench_loop.py`` beside this file, by path: the stage venv has no ``tools`` package, and putting
    this folder on sys.path would let its module names (``model``, ``chaos``, ...) shadow installed ones."""
    name = "lepatch_bench_loop"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / "bench_loop.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is being made
    spec.loader.exec_module(module)
    return module


bench_loop = _load_bench_loop()

POLL = 0.001  # the scheduler-like loop: sync() then sleep 1 ms
SETTLE = 0.05  # let freshly forked workers reach their first read before timing
END_BUDGET = 5.0  # end() of an executor with nothing left to run takes milliseconds


class Abandon(Exception):
    """A measurement left the executor in a state later measurements must not inherit."""


# --------------------------------------------------------------------------------------
# Inside the scenario process (airflow importable, fake runner installed by the harness).
# --------------------------------------------------------------------------------------


class Watch:
    """Kill this scenario's whole process group when one step overruns its budget.

    The harness watchdog recognises a deadlock (everything asleep in a pipe or a lock) in
    about a second, but not a step that spins forever, e.g. ``end()`` polling ``join(0.05)``
    on a worker that never gets its poison pill. ``arm(seconds, what)`` before such a step;
    on overrun ``on_overrun(reason)`` records it (the reason names where the main thread is)
    and the group is killed, so the probe moves on to the next measurement in a fresh child.
    The thread sleeps in a futex wait, which the harness counts as blocked: it never hides
    a deadlock from the harness watchdog.
    """

    def __init__(
        self, on_overrun: Callable[[str], None], checkpoint: Callable[[str], None] = lambda phase: None
    ) -> None:
        self._on_overrun = on_overrun
        self.checkpoint = checkpoint  # save what was measured so far, naming the step about to run
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._what = ""
        self._main = threading.main_thread().ident
        threading.Thread(target=self._run, name="lepatch-watch", daemon=True).start()

    def arm(self, seconds: float, what: str) -> None:
        with self._cond:
            self._deadline, self._what = (
                time.monotonic() + seconds,
                f"{what} still running after {seconds:g}s",
            )
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._deadline = None
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while True:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                break
        frame = sys._current_frames().get(self._main or 0)
        where = (
            " <- ".join(
                f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
                for f in reversed(traceback.extract_stack(frame)[-3:])
            )
            if frame
            else "?"
        )
        try:
            self._on_overrun(f"hang: {self._what}, in {where}")
        finally:
            os.killpg(os.getpgid(0), signal.SIGKILL)


def _workloads(prefix: str, n: int) -> list[Any]:
    return [harness.make_workload(f"{prefix}_{i}") for i in range(n)]


def _terminal() -> set[Any]:
    from airflow.utils.state import TaskInstanceState

    return {TaskInstanceState.SUCCESS, TaskInstanceState.FAILED}


def _drain_events(executor: Any, terminal: set[Any]) -> int:
    """Pop the event buffer as the scheduler does; return how many events were terminal."""
    events = executor.get_event_buffer()
    return sum(1 for state, _ in events.values() if state in terminal)


def _dead(pid: int) -> bool:
    """A zombie or gone: nothing of it runs any more (its parent may not have reaped it yet)."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True


def _end(executor: Any, watch: Watch) -> None:
    # end() of unpatched 3.3.2 itself hangs now and then (a worker left without its poison
    # pill): keep the samples taken so far if the watchdog has to kill us in there.
    watch.checkpoint("end()")
    watch.arm(END_BUDGET, "end()")
    executor.end()
    watch.disarm()
    watch.checkpoint("")


def measure_dispatch(
    rec: dict[str, Any], watch: Watch, n: int, parallelism: int, runs: int, wait: float
) -> None:
    terminal = _terminal()
    batch = _workloads("d", n)
    rec["workload_bytes"] = len(pickle.dumps(batch[0]))
    dispatch_ms: list[float] = rec.setdefault("dispatch_ms", [])
    results_ms: list[float] = rec.setdefault("results_ms", [])
    for _ in range(runs):
        executor = harness.new_executor(parallelism)
        time.sleep(SETTLE)
        for workload in batch:
            executor.queue_workload(workload, session=None)
        watch.arm(wait, f"_process_workloads({n})")
        t0 = time.perf_counter()
        executor._process_workloads(batch)
        t1 = time.perf_counter()
        watch.disarm()
        done = 0
        give_up = time.monotonic() + wait
        while done < n and time.monotonic() < give_up:
            executor.sync()
            done += _drain_events(executor, terminal)
            if done < n:
                time.sleep(POLL)
        t2 = time.perf_counter()
        if done < n:
            raise Abandon(f"hang: {n - done} of {n} results never arrived within {wait:g}s")
        dispatch_ms.append((t1 - t0) * 1000)
        results_ms.append((t2 - t0) * 1000)
        _end(executor, watch)


def measure_throughput(
    rec: dict[str, Any], watch: Watch, n: int, parallelism: int, runs: int, wait: float
) -> None:
    terminal = _terminal()
    rates: list[float] = rec.setdefault("tasks_per_s", [])
    for run in range(runs):
        pending = _workloads(f"t{run}", n)
        pending.reverse()
        executor = harness.new_executor(parallelism)
        time.sleep(SETTLE)
        dispatched = done = 0
        watch.arm(wait + 10, f"throughput loop ({n} tasks)")
        t0 = time.perf_counter()
        give_up = time.monotonic() + wait
        while done < n and time.monotonic() < give_up:
            free = parallelism - (dispatched - done)
            if free > 0 and pending:
                chunk = [pending.pop() for _ in range(min(free, len(pending)))]
                for workload in chunk:
                    executor.queue_workload(workload, session=None)
                executor._process_workloads(chunk)
                dispatched += len(chunk)
            executor.sync()
            done += _drain_events(executor, terminal)
            time.sleep(POLL)
        elapsed = time.perf_counter() - t0
        watch.disarm()
        if done < n:
            raise Abandon(f"hang: {n - done} of {n} tasks unfinished after {wait:g}s")
        rates.append(n / elapsed)
        _end(executor, watch)


def measure_recovery(rec: dict[str, Any], watch: Watch, parallelism: int, runs: int, wait: float) -> None:
    from airflow.utils.state import TaskInstanceState

    rec["wait_s"] = wait
    failed_ms: list[float | None] = rec.setdefault("failed_ms", [])
    next_ms: list[float | None] = rec.setdefault("next_ms", [])
    syncs: list[int | None] = rec.setdefault("syncs_to_failed", [])
    for run in range(runs):
        started = tempfile.mkdtemp(prefix="lepatch-bench-started-")
        release = os.path.join(started, "release")
        busy = [
            harness.make_workload(f"busy{run}_{i}", fake={"started_dir": started, "wait_for": release})
            for i in range(parallelism)
        ]
        executor = harness.new_executor(parallelism)
        watch.arm(wait + 30, "recovery")
        harness.dispatch(executor, busy)

        def all_busy(d: str = started) -> bool:
            return len(os.listdir(d)) == parallelism

        if not harness.wait_until(all_busy, timeout=30):
            raise Abandon(f"n/a: only {len(os.listdir(started))} of {parallelism} busy tasks started")
        victim_task, victim_pid = sorted(os.listdir(started))[0].rsplit(".", 1)
        victim_key = next(harness.key_of(w) for w in busy if w.ti.task_id == victim_task)
        nxt = harness.make_workload(f"next{run}", fake={"started_dir": started})
        os.kill(int(victim_pid), signal.SIGKILL)
        t0 = time.perf_counter()
        harness.dispatch(executor, [nxt])
        t_failed: float | None = None
        t_next: float | None = None
        count = failed_syncs = 0
        give_up = time.monotonic() + wait
        while (t_failed is None or t_next is None) and time.monotonic() < give_up:
            # Count only the sync() calls made once the kernel has finished the worker off:
            # "within one sync()" means the first look after the death reports it.
            dead = _dead(int(victim_pid))
            executor.sync()
            count += 1 if dead else 0
            now = time.perf_counter()
            event = executor.event_buffer.get(victim_key)
            if t_failed is None and event is not None and event[0] == TaskInstanceState.FAILED:
                t_failed, failed_syncs = now, count
            if t_next is None and any(name.startswith(f"next{run}.") for name in os.listdir(started)):
                t_next = now
            time.sleep(POLL)
        watch.disarm()
        failed_ms.append(None if t_failed is None else (t_failed - t0) * 1000)
        next_ms.append(None if t_next is None else (t_next - t0) * 1000)
        syncs.append(None if t_failed is None else failed_syncs)
        Path(release).touch()
        if t_failed is None or t_next is None:
            # The executor lost track of a key or a slot; its end() cannot be trusted either.
            break
        _end(executor, watch)


def measure_ppe(
    rec: dict[str, Any], watch: Watch, n: int, parallelism: int, runs: int, throughput: bool
) -> None:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    batch = _workloads("p", n)
    samples: list[float] = rec.setdefault("tasks_per_s" if throughput else "results_ms", [])
    for _ in range(runs):
        # ``bool(workload)`` is the no-op task: the workload is pickled to the worker and
        # unpickled there, a small result comes back, as with the executor.
        watch.arm(60 + n / 100, "ProcessPoolExecutor")
        with ProcessPoolExecutor(parallelism, mp_context=multiprocessing.get_context("fork")) as pool:
            for f in [pool.submit(bool, w) for w in batch[:parallelism]]:
                f.result()
            time.sleep(SETTLE)
            t0 = time.perf_counter()
            if throughput:
                in_flight: set[Any] = set()
                queue = list(reversed(batch))
                done = 0
                while done < n:
                    while queue and len(in_flight) < parallelism:
                        in_flight.add(pool.submit(bool, queue.pop()))
                    finished, in_flight = wait(in_flight, timeout=0, return_when=FIRST_COMPLETED)
                    done += len(finished)
                    time.sleep(POLL)
                samples.append(n / (time.perf_counter() - t0))
            else:
                for f in [pool.submit(bool, w) for w in batch]:
                    f.result()
                samples.append((time.perf_counter() - t0) * 1000)
        watch.disarm()


def _drain(reader: Any, n: int) -> None:
    for _ in range(n):
        reader.recv_bytes()


def measure_floor(rec: dict[str, Any], watch: Watch, n: int, runs: int) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    batch = _workloads("f", n)
    samples: list[float] = rec.setdefault("dispatch_ms", [])
    for _ in range(runs):
        watch.arm(60 + n / 100, "pipe floor")
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_drain, args=(reader, n))
        proc.start()
        time.sleep(SETTLE)
        t0 = time.perf_counter()
        for workload in batch:
            writer.send(workload)
        proc.join()
        samples.append((time.perf_counter() - t0) * 1000)
        reader.close()
        writer.close()
        watch.disarm()


def _loop_task(workload: Any) -> None:
    """The task of the ``loop`` figure, run in the worker in place of the real task runner."""
    spec = (workload.ti.executor_config or {})["fake"]["loop"]
    # The start as the task sees it; CLOCK_MONOTONIC is one clock for every process of the machine.
    record = Path(spec["dir"], workload.ti.task_id)
    record.write_text(f"{time.monotonic()!r}\n")
    time.sleep(spec["duration"])  # the task
    time.sleep(spec["lag"])  # the supervisor's shutdown, before the worker reports the result
    with record.open("a") as f:
        f.write(f"{time.monotonic()!r}\n")  # the result is written right after this


def _install_loop_runner() -> None:
    """Replace the runner the harness installed, before the executor forks its workers (as harness does)."""
    from airflow.executors import local_executor

    # 3.3 and later run a workload through BaseExecutor.run_workload; 3.1 and 3.2 through _execute_work.
    if harness.airflow_line() in ("3.3", "3.4"):
        from airflow.executors.base_executor import BaseExecutor

        def run_workload(workload: Any, **_: Any) -> int:
            _loop_task(workload)
            return 0

        BaseExecutor.run_workload = staticmethod(run_workload)
    else:

        def execute_work(log: Any, workload: Any, *_: Any) -> None:
            _loop_task(workload)

        local_executor._execute_work = execute_work


def measure_loop(
    rec: dict[str, Any],
    watch: Watch,
    n: int,
    parallelism: int,
    runs: int,
    wait: float,
    seed: int,
    idle_sleep: float,
    loop_cost: float,
    max_tis_per_query: int,
    duration: list[float],
    lag: list[float],
) -> None:
    terminal = _terminal()
    rec["wait_s"] = wait
    tps: list[float] = rec.setdefault("tasks_per_s", [])
    p50: list[float] = rec.setdefault("start_p50_ms", [])
    p95: list[float] = rec.setdefault("start_p95_ms", [])
    refill: list[float] = rec.setdefault("refill_p50_ms", [])
    ready50: list[float] = rec.setdefault("ready_p50_ms", [])
    ready95: list[float] = rec.setdefault("ready_p95_ms", [])
    loops: list[dict[str, Any]] = rec.setdefault("loops", [])
    _install_loop_runner()
    for run in range(runs):
        tasks = bench_loop.plan_tasks(n, seed + run, (duration[0], duration[1]), (lag[0], lag[1]))
        started_dir = tempfile.mkdtemp(prefix="lepatch-bench-loop-")
        workloads = [
            (
                t.task_id,
                harness.make_workload(
                    t.task_id, fake={"loop": {"dir": started_dir, "duration": t.duration, "lag": t.lag}}
                ),
            )
            for t in tasks
        ]
        executor = harness.new_executor(parallelism)
        time.sleep(SETTLE)
        loop = bench_loop.SchedulerLoop(
            executor,
            workloads,
            parallelism=parallelism,
            key_of=harness.key_of,
            is_terminal=lambda state: state in terminal,
            idle_sleep=idle_sleep,
            max_tis_per_query=max_tis_per_query,
            loop_cost=loop_cost,
        )
        watch.arm(wait + 10, f"scheduler loop ({n} tasks, p{parallelism})")
        record = loop.run(timeout=wait)
        watch.disarm()
        if record.timed_out:
            raise Abandon(
                f"hang: {record.unfinished + len(loop.waiting)} of {n} tasks unfinished after {wait:g}s"
            )
        times = {name: Path(started_dir, name).read_text().split() for name in os.listdir(started_dir)}
        shutil.rmtree(started_dir, ignore_errors=True)
        started = {name: float(t[0]) for name, t in times.items()}
        ended = [float(t[1]) for t in times.values() if len(t) > 1]
        summary = bench_loop.summarize(record, started)
        refill.append(bench_loop.refill_p50_ms(record, ended, parallelism))
        tps.append(summary.tasks_per_s)
        p50.append(summary.start_p50_ms)
        p95.append(summary.start_p95_ms)
        ready50.append(summary.ready_p50_ms)
        ready95.append(summary.ready_p95_ms)
        loops.append(
            {
                "loops": record.loops,
                "idle": record.idle_loops,
                "full": record.full_loops,
                "max_in_flight": record.max_in_flight,
                "makespan_s": round(summary.makespan_s, 3),
            }
        )
        _end(executor, watch)


MEASURES: dict[str, Callable[..., None]] = {
    "dispatch": measure_dispatch,
    "throughput": measure_throughput,
    "recovery": measure_recovery,
    "ppe": measure_ppe,
    "floor": measure_floor,
    "loop": measure_loop,
}


def _append(progress: str, record: dict[str, Any]) -> None:
    with open(progress, "a") as f:
        f.write(json.dumps(record) + "\n")


def run_measurements(specs: list[dict[str, Any]], progress: str) -> int:
    """The scenario: run ``specs`` in order, appending each outcome to ``progress`` as it finishes."""
    rec: dict[str, Any] = {}
    watch = Watch(
        lambda reason: _append(progress, {**rec, "outcome": reason}),
        lambda phase: _append(progress, {**rec, "partial": phase}),
    )
    for spec in specs:
        args = {k: v for k, v in spec.items() if k not in ("kind", "id")}
        _append(progress, {"id": spec["id"], "started": True})
        rec.clear()
        rec["id"] = spec["id"]
        try:
            MEASURES[spec["kind"]](rec, watch, **args)
        except Abandon as exc:
            rec["outcome"] = str(exc)
        _append(progress, rec)
        if "outcome" in rec:
            # Leave the broken executor behind with the whole process group; the rest run fresh.
            raise Abandon(rec["outcome"])
    return len(specs)


# --------------------------------------------------------------------------------------
# The probe process: runs the scenarios, keeps what each managed before it died.
# --------------------------------------------------------------------------------------


def _read_progress(path: Path) -> tuple[dict[str, dict[str, Any]], list[str], dict[str, dict[str, Any]]]:
    """The finished measurements, the ids of those started (in order), the last checkpoint of each."""
    if not path.exists():
        return {}, [], {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    finished = {r["id"]: r for r in rows if not r.get("started") and "partial" not in r}
    partial = {r["id"]: r for r in rows if "partial" in r}
    return finished, [r["id"] for r in rows if r.get("started")], partial


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text)[:200]


def probe(specs: list[dict[str, Any]], stuck_after: float, deadline: float) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="lepatch-bench-") as tmp:
        progress = Path(tmp, "progress.jsonl")
        done: dict[str, dict[str, Any]] = {}
        remaining = list(specs)
        while remaining:
            try:
                harness.run_scenario(
                    run_measurements,
                    deadline=deadline,
                    stuck_after=stuck_after,
                    specs=remaining,
                    progress=str(progress),
                )
            except harness.ScenarioError as exc:
                finished, started, partial = _read_progress(progress)
                done.update(finished)
                # The measurement that was running when the child died is the one to blame;
                # what it measured before its last checkpoint is kept.
                current = next((i for i in reversed(started) if i not in done), None)
                if current is not None:
                    reason = _first_line(str(exc))
                    kind = "hang" if ("deadlocked" in reason or "deadline" in reason) else "error"
                    saved = dict(partial.get(current, {"id": current}))
                    phase = saved.pop("partial", "")
                    where = f" in {phase}" if phase else ""
                    done[current] = {**saved, "outcome": f"{kind}{where}: {reason}"}
            done.update(_read_progress(progress)[0])
            remaining = [s for s in remaining if s["id"] not in done]
        return [done[s["id"]] for s in specs]


def main(argv: list[str]) -> int:
    # SIGTERM from the driver (its bound ran out) unwinds through run_scenario, whose finally
    # kills the scenario's process group: nothing is left behind.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(1))
    request = json.loads(Path(argv[0]).read_text())
    results = probe(request["specs"], request.get("stuck_after", 1.5), request.get("deadline", 300.0))
    print(json.dumps({"results": results, "python": sys.version.split()[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

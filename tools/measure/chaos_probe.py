"""The acting side of ``python -m tools chaos``: run INSIDE a stage venv, never imported by the tools.

``python tools/measure/chaos_probe.py REQUEST.json`` plays the schedules of the request (made by
``tools.measure.chaos.schedule``) against the installed LocalExecutor and prints
``{"runs": [observation, ...]}``; ``tools.measure.chaos.check`` judges them. Nothing is judged
here: the probe records what happened, so the invariants are pure and unit-tested.

Each group of schedules with one start method runs through ``harness.run_scenario`` (a
child process group under the harness's deadlock watchdog). Inside, every run:

- builds realistic workloads whose size and result size the schedule gives; a failing
  task's exception message starts with a token naming its own task_id;
- records every ``change_state`` (the executor's only way to report a key), and every
  result message the parent unpickles that carries a token, with the key it came with;
- dispatches as the schedule says (one batch, ``parallelism`` at a time, or chunks) and
  calls ``sync()`` every ``poll_ms`` until every key is reported or the budget is spent;
- meanwhile a thread injects the faults: SIGKILL of an idle worker, of one running a task,
  of one caught writing its result (seen in ``/proc/PID/wchan``), SIGTERM to this process
  (the handler raises SystemExit, as the scheduler's does) in the middle of a batch;
- then times ``end()``.

Every task runs the way task-sdk's ``supervise`` does: the worker forks a quiet task process
that does the task's work (the sleep) and waits for it. The task process is named, by itself
and by its worker as soon as each can, by a file ``TASK.PID.STARTTIME.proc`` in the run's process
directory (STARTTIME from ``/proc/PID/stat``, so a reused pid is never taken for it), and
leaves ``TASK.PID.MONOTONIC_US.exit`` when it ends by itself. When a key is reported in a
terminal state (``change_state``, on entry), the state of each of its task processes in
``/proc`` is recorded (``at_report``), and so is the state of every task process once
``end()`` has returned (``after_end``): ``tools.measure.chaos.check`` judges whether one outlived
its worker.

Fired faults and finished runs are appended to a progress file as they happen, so a run
the watchdog kills still shows its faults, and the remaining runs go on in a fresh child.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import psutil  # in every stage venv: Airflow depends on it

HERE = Path(__file__).resolve().parent
HARNESS_DIR = HERE.parents[1] / "tests" / "executor"
if str(HARNESS_DIR) not in sys.path:
    sys.path.insert(0, str(HARNESS_DIR))

import harness  # noqa: E402


def _load(name: str, path: Path) -> Any:
    """A module of the tools by path (the stage venv has no ``tools`` package)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is being made
        spec.loader.exec_module(module)
    return sys.modules[name]


procfs = _load("lepatch_procfs", HERE / "e2e" / "procfs.py")


TOKEN = "lepatch-token:"
TERMINAL = ("success", "failed")
WRITE_WCHANS = ("pipe_write", "anon_pipe_write", "pipe_wait_writable")


# --------------------------------------------------------------------------------------
# Worker side: the task runner.
# --------------------------------------------------------------------------------------


def _task_process(procs: str, task: str, sleep_ms: int) -> None:
    """The task process: quiet (nothing to the worker), does the task's work, notes when it ends by itself."""
    try:
        me = os.getpid()
        # The worker names it too, but may be killed before it does.
        Path(procs, f"{task}.{me}.{procfs.stat(me).starttime}.proc").touch()
        if sleep_ms:
            time.sleep(sleep_ms / 1000)
        Path(procs, f"{task}.{me}.{int(time.monotonic() * 1e6)}.exit").touch()
    finally:
        os._exit(0)


def chaos_run(workload: Any) -> None:
    """Act out the ``chaos`` fake: mark start, fork a task process, wait for it, mark done, maybe fail."""
    spec = (workload.ti.executor_config or {}).get("fake", {}).get("chaos")
    if spec is None:
        harness_fake_run(workload)
        return
    task, pid = workload.ti.task_id, os.getpid()
    # Started first, as before task processes: until then the injector takes this worker for idle.
    Path(spec["dir"], f"{task}.{pid}.start").touch()
    # As supervise: the task process is a child of the worker, in the worker's session and group.
    child = os.fork()
    if child == 0:
        _task_process(spec["procs"], task, spec["sleep_ms"])
    # The task process names itself too, at once: this is for a task process that is quick to exit
    # (its start time stays readable until it is waited for).
    Path(spec["procs"], f"{task}.{child}.{procfs.stat(child).starttime}.proc").touch()
    os.waitpid(child, 0)
    Path(spec["dir"], f"{task}.{pid}.done").touch()
    if spec["fail_bytes"]:
        # The token ties the result to the key it was produced for; the rest sizes the result.
        raise RuntimeError(f"{TOKEN}{task}:" + "x" * spec["fail_bytes"])


harness_fake_run = harness.fake_run


def install_chaos_runner() -> None:
    """The harness installs its runner per release line; make that runner ours."""
    harness.fake_run = chaos_run
    harness.install_fake_runner()


def _spawned_workers_import_this_file() -> None:
    # A spawned worker runs its parent's __main__ file as __mp_main__ before unpickling its
    # target. Here __main__ is harness.py, which would install the harness's runner; point
    # spawn at this file instead, whose __mp_main__ branch installs ours.
    sys.modules["__main__"].__file__ = __file__


# --------------------------------------------------------------------------------------
# Parent side: observing.
# --------------------------------------------------------------------------------------


def _token(obj: Any) -> str | None:
    message = obj.args[0] if isinstance(obj, BaseException) and obj.args else None
    if isinstance(message, str) and message.startswith(TOKEN):
        return message[len(TOKEN) :].split(":", 1)[0]
    return None


def _is_key(obj: Any) -> bool:
    """A task key of any line: 3.1-3.3 key by ``ti.key`` (it has a task_id), 3.4 by the ti's uuid."""
    if hasattr(obj, "task_id"):
        return True
    try:
        return obj in harness._LABELS
    except TypeError:  # unhashable: no key
        return False


def hook_result_unpickling(seen: list[list[Any]]) -> None:
    """Record ``[token, task_id of the key in the same message]`` for every result unpickled.

    Every multiprocessing receive path (SimpleQueue, Queue, Connection) unpickles with
    ``ForkingPickler.loads``; this sees result messages whatever queue layout a stage uses.
    """
    from multiprocessing.reduction import ForkingPickler

    original = pickle.loads

    def loads(data: Any, *args: Any, **kwargs: Any) -> Any:
        obj = original(data, *args, **kwargs)
        if isinstance(obj, tuple):
            for item in obj:
                token = _token(item)
                if token is not None:
                    key = next((x for x in obj if _is_key(x)), None)
                    seen.append([token, harness.label(key) if key is not None else None])
        return obj

    ForkingPickler.loads = staticmethod(loads)


def record_change_state(executor: Any, events: list[list[Any]], t0: float, on_terminal: Any = None) -> None:
    """Record every state change of ``executor``'s keys, however the executor reaches it.

    At BaseExecutor, not on the instance: from patch 2 on, LocalExecutor ends a dispatch with
    ``super().change_state(...)``, which an instance attribute would never see. A terminal state
    is passed to ``on_terminal(task_id, state, t)`` first, before the executor records it.
    """
    from airflow.executors.base_executor import BaseExecutor

    executor._lepatch_record = (events, t0, on_terminal)
    if getattr(BaseExecutor.change_state, "_lepatch_recorder", False):
        return
    original = BaseExecutor.change_state

    def change_state(self: Any, key: Any, state: Any, *args: Any, **kwargs: Any) -> Any:
        record = getattr(self, "_lepatch_record", None)
        if record is not None:
            info = args[0] if args else kwargs.get("info")
            events, t0, on_terminal = record
            task, when = harness.label(key), round(time.monotonic() - t0, 4)
            deferred = False
            if on_terminal is not None and str(state) in TERMINAL:
                try:
                    on_terminal(task, str(state), when)
                except SystemExit:
                    # A SIGTERM while the probe looked: the executor must not lose the report for it.
                    deferred = True
            events.append([task, str(state), _token(info), when])
            if deferred:
                original(self, key, state, *args, **kwargs)
                raise SystemExit(0)
        return original(self, key, state, *args, **kwargs)

    change_state._lepatch_recorder = True  # type: ignore[attr-defined]
    BaseExecutor.change_state = change_state


def worker_pids() -> list[int]:
    """This process's live LocalExecutor workers (by process title; not the resource tracker)."""
    pids = []
    for child in psutil.Process().children():
        try:
            alive = child.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
            if alive and "LocalExecutor" in " ".join(child.cmdline()):
                pids.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return sorted(pids)


def markers(directory: str) -> tuple[list[list[Any]], list[list[Any]]]:
    """(started, done) as [task_id, pid] pairs."""
    started: list[list[Any]] = []
    done: list[list[Any]] = []
    for name in os.listdir(directory):
        task, pid, what = name.rsplit(".", 2)
        (started if what == "start" else done).append([task, int(pid)])
    return started, done


class TaskProcesses:
    """The task processes of one run, as named in its process directory; their states, when asked."""

    def __init__(self, directory: str, t0: float) -> None:
        self.directory = directory
        self.t0 = t0
        self.at_report: list[list[Any]] = []  # [task, pid, state reported, t, process state]

    def of(self, task: str | None = None) -> list[tuple[str, int, int]]:
        """(task, pid, start time) of each task process named so far (of ``task`` only, if given)."""
        out = []
        for name in os.listdir(self.directory):
            owner, pid, starttime, kind = name.rsplit(".", 3)
            if kind == "proc" and (task is None or owner == task):
                out.append((owner, int(pid), int(starttime)))
        return sorted(set(out))

    def on_terminal(self, task: str, state: str, when: float) -> None:
        for owner, pid, starttime in self.of(task):
            self.at_report.append([owner, pid, state, when, procfs.state(pid, starttime)])

    def states(self) -> list[list[Any]]:
        """[task, pid, process state] of every task process, now."""
        return [[task, pid, procfs.state(pid, starttime)] for task, pid, starttime in self.of()]

    def exits(self) -> list[list[Any]]:
        """[task, pid, t] of the task processes that ended by themselves (not killed)."""
        out = []
        for name in os.listdir(self.directory):
            task, pid, micros, kind = name.rsplit(".", 3)
            if kind == "exit":
                out.append([task, int(pid), round(int(micros) / 1e6 - self.t0, 4)])
        return sorted(out)


class Injector(threading.Thread):
    """Fires the schedule's faults at their times; waits in futex sleeps (invisible to the harness)."""

    def __init__(self, faults: list[dict[str, Any]], marker_dir: str, t0: float, record: Any) -> None:
        super().__init__(name="lepatch-chaos-injector", daemon=True)
        self.faults = faults
        self.marker_dir = marker_dir
        self.t0 = t0
        self.record = record
        self.stop = threading.Event()
        self.phase = "run"  # "run" while dispatching and syncing; anything else: fire nothing
        self.in_batch = False

    def run(self) -> None:
        for fault in self.faults:
            left = self.t0 + fault["at_ms"] / 1000 - time.monotonic()
            if left > 0 and self.stop.wait(left):
                pass
            if self.stop.is_set() or self.phase != "run":
                self.record({**fault, "skipped": "the run was over"})
                continue
            try:
                self.record(self.fire(fault))
            except Exception as exc:  # a fault that cannot be fired is reported, never fatal
                self.record({**fault, "skipped": f"{type(exc).__name__}: {exc}"})

    def _now_ms(self) -> float:
        return round((time.monotonic() - self.t0) * 1000, 1)

    def fire(self, fault: dict[str, Any]) -> dict[str, Any]:
        kind = fault["kind"]
        if kind == "sigterm":
            mid = self.in_batch
            os.kill(os.getpid(), signal.SIGTERM)
            return {**fault, "fired_ms": self._now_ms(), "mid_batch": mid}
        give_up = time.monotonic() + 1.0
        while True:
            candidates = self.candidates(kind)
            if candidates:
                pid, task, seen = candidates[fault["pick"] % len(candidates)]
                os.kill(pid, signal.SIGKILL)
                return {**fault, "fired_ms": self._now_ms(), "pid": pid, "task": task, "wchan": seen}
            if time.monotonic() > give_up or self.phase != "run" or self.stop.wait(0.01):
                return {**fault, "skipped": f"no worker in the state {kind} wants within 1s"}

    def candidates(self, kind: str) -> list[tuple[int, str | None, list[str]]]:
        """(pid, task it runs or last ran, wchans) of the workers in the state ``kind`` wants."""
        started, done = markers(self.marker_dir)
        finished = {(t, p) for t, p in done}
        open_tasks = {p: t for t, p in started if (t, p) not in finished}
        last_done = {p: t for t, p in done}
        out = []
        for pid in worker_pids():
            seen = procfs.thread_wchans(pid)
            writing = any(w.startswith(WRITE_WCHANS) for w in seen)
            if kind == "kill_running" and pid in open_tasks:
                out.append((pid, open_tasks[pid], seen))
            elif kind == "kill_idle" and pid not in open_tasks and not writing:
                out.append((pid, None, seen))
            elif kind == "kill_writing" and pid not in open_tasks and writing:
                # Its task is done and it is writing (any thread: a Queue feeder too): its result.
                out.append((pid, last_done.get(pid), seen))
        return sorted(out, key=lambda c: (c[1] or "", c[0]))


def _append(progress: str, record: dict[str, Any]) -> None:
    with open(progress, "a") as f:
        f.write(json.dumps(record, default=str) + "\n")


def run_one(sched: dict[str, Any], progress: str, watch: Any) -> dict[str, Any]:
    run = sched["run"]
    marker_dir = tempfile.mkdtemp(prefix="lepatch-chaos-")
    procs_dir = tempfile.mkdtemp(prefix="lepatch-chaos-procs-")
    chaos_specs = [
        {"dir": marker_dir, "procs": procs_dir, "sleep_ms": t["sleep_ms"], "fail_bytes": t["fail_bytes"]}
        for t in sched["tasks"]
    ]
    workloads = [
        harness.make_workload(t["task_id"], pad=t["pad"], fake={"chaos": spec})
        for t, spec in zip(sched["tasks"], chaos_specs, strict=True)
    ]
    for workload in workloads:
        harness.key_of(workload)  # so events and results name their task on every line
    events: list[list[Any]] = []
    faults: list[dict[str, Any]] = []
    obs: dict[str, Any] = {"run": run, "events": events, "faults": faults}

    def record_fault(fault: dict[str, Any]) -> None:
        faults.append(fault)
        _append(progress, {"run": run, "fault": fault})

    parallelism, poll = sched["parallelism"], sched["poll_ms"] / 1000

    def on_sigterm(signum: int, frame: Any) -> None:
        sys.exit(0)  # what the scheduler's handler does; its finally then calls executor.end()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    t0 = time.monotonic()
    watch.arm(sched["budget_s"] + 5, "dispatch/sync loop")
    executor = harness.new_executor(parallelism)
    task_processes = TaskProcesses(procs_dir, t0)
    obs["at_report"] = task_processes.at_report
    record_change_state(executor, events, t0, task_processes.on_terminal)
    injector = Injector(sched["faults"], marker_dir, t0, record_fault)
    split = sched.get("late_from", len(workloads))
    pending = list(reversed(workloads[:split]))
    late = list(reversed(workloads[split:]))
    late_at = t0 + sched.get("late_ms", 0) / 1000
    chunks = list(reversed(sched.get("chunks") or []))
    dispatched: list[str] = []
    obs["dispatched"] = dispatched
    try:
        # Inside the try: a SIGTERM due early (its time counts from t0) may land while it starts.
        injector.start()
        give_up = t0 + sched["budget_s"]
        while time.monotonic() < give_up:
            if late and time.monotonic() >= late_at:
                pending, late = late + pending, []
            if pending:
                if sched["dispatch"] == "one_batch":
                    size = len(pending)
                elif sched["dispatch"] == "chunks":
                    size = chunks.pop() if chunks else len(pending)
                else:
                    finished = len({e[0] for e in events if e[1] in TERMINAL})
                    size = max(0, parallelism - (len(dispatched) - finished))
                batch = [pending.pop() for _ in range(min(size, len(pending)))]
                if batch:
                    for workload in batch:
                        executor.queue_workload(workload, session=None)
                    dispatched.extend(w.ti.task_id for w in batch)
                    injector.in_batch = True
                    executor._process_workloads(batch)
                    injector.in_batch = False
            executor.sync()
            reported = {e[0] for e in events if e[1] in TERMINAL}
            if not pending and not late and reported >= set(dispatched):
                break
            time.sleep(poll)
    except SystemExit:
        obs["terminated"] = True
    except Exception:
        obs["error"] = traceback.format_exc(limit=6)[-2000:]
    finally:
        injector.phase = "end"
        injector.in_batch = False
        injector.stop.set()
    if injector.ident is not None:
        injector.join(timeout=5)
    obs["loop_s"] = round(time.monotonic() - t0, 3)
    # Keys the executor never took (still queued when SIGTERM interrupted the batch) are the
    # scheduler's to reschedule, not the executor's to report.
    obs["not_taken"] = sorted(harness.label(key) for key in harness.queued(executor))
    watch.arm(sched["end_bound_s"] + 3, "end()")
    t_end = time.monotonic()
    try:
        executor.end()
    except Exception:
        obs["end_error"] = traceback.format_exc(limit=6)[-2000:]
    except SystemExit:
        obs["end_error"] = "SystemExit during end() (a late SIGTERM)"
    obs["end_s"] = round(time.monotonic() - t_end, 3)
    # Keys end() gave back to their queue (taken, never sent to a worker: from patch 0009 on).
    obs["given_back"] = sorted(
        set(harness.label(key) for key in harness.queued(executor)) - set(obs["not_taken"])
    )
    # At once: a task process end() left behind may still end by itself any moment.
    obs["after_end"] = task_processes.states()
    watch.disarm()
    signal.signal(signal.SIGTERM, previous)
    obs["started"], obs["done"] = markers(marker_dir)
    obs["task_exits"] = task_processes.exits()
    return obs


def chaos_runs(schedules: list[dict[str, Any]], progress: str) -> int:
    """The scenario: play ``schedules`` in order, appending each observation to ``progress``."""
    _spawned_workers_import_this_file()
    install_chaos_runner()
    tokens: list[list[Any]] = []
    hook_result_unpickling(tokens)
    current: dict[str, Any] = {}
    bench_probe = _load("lepatch_bench_probe", HERE / "bench_probe.py")
    watch = bench_probe.Watch(lambda reason: _append(progress, {"run": current.get("run"), "hang": reason}))
    for sched in schedules:
        current["run"] = sched["run"]
        _append(progress, {"run": sched["run"], "started": True})
        tokens.clear()
        obs = run_one(sched, progress, watch)
        obs["tokens"] = list(tokens)
        _append(progress, {"run": sched["run"], "obs": obs})
    return len(schedules)


# --------------------------------------------------------------------------------------
# The probe process.
# --------------------------------------------------------------------------------------


def _read_progress(path: Path) -> dict[int, dict[str, Any]]:
    """Per run: {"obs": ...} when it finished, else {"hang": reason?, "faults": [...]}."""
    runs: dict[int, dict[str, Any]] = {}
    if not path.exists():
        return runs
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        entry = runs.setdefault(rec["run"], {"faults": []})
        if "fault" in rec:
            entry["faults"].append(rec["fault"])
        elif "obs" in rec:
            entry["obs"] = rec["obs"]
        elif "hang" in rec:
            entry["hang"] = rec["hang"]
    return runs


RUNS_PER_CHILD = 10


def probe(chunks: list[dict[str, Any]], stuck_after: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for chunk in chunks:
        schedules = chunk["schedules"]
        with tempfile.TemporaryDirectory(prefix="lepatch-chaos-probe-") as tmp:
            progress = Path(tmp, "progress.jsonl")
            remaining = list(schedules)
            while remaining:
                # The schedules travel on the child's command line: keep each child's share small.
                batch = remaining[:RUNS_PER_CHILD]
                deadline = 30 + sum(s["budget_s"] + s["end_bound_s"] + 30 for s in batch)
                try:
                    harness.run_scenario(
                        chaos_runs,
                        start_method=chunk["start_method"],
                        deadline=deadline,
                        stuck_after=stuck_after,
                        schedules=batch,
                        progress=str(progress),
                    )
                    failure = ""
                except harness.ScenarioError as exc:
                    failure = str(exc)
                runs = _read_progress(progress)
                for sched in remaining:
                    entry = runs.get(sched["run"])
                    if entry is None:
                        break
                    if "obs" in entry:
                        continue
                    # The run in progress when the child died: the watchdog's reason is the hang.
                    if "hang" not in entry:
                        lines = [ln.strip() for ln in failure.splitlines() if ln.strip()]
                        entry["hang"] = "hang: " + (" | ".join(lines[:4]) if lines else "the child died")
                    break
                out_runs = [
                    s
                    for s in remaining
                    if s["run"] in runs and ("obs" in runs[s["run"]] or "hang" in runs[s["run"]])
                ]
                if not out_runs and failure:
                    # Died before the first run started: report it on that run, then go on.
                    runs[remaining[0]["run"]] = {"faults": [], "hang": "error: " + failure.splitlines()[0]}
                    out_runs = [remaining[0]]
                done_ids = {s["run"] for s in out_runs}
                for sched in out_runs:
                    entry = runs[sched["run"]]
                    out.append(
                        entry["obs"]
                        if "obs" in entry
                        else {"run": sched["run"], "hang": entry["hang"], "faults": entry["faults"]}
                    )
                remaining = [s for s in remaining if s["run"] not in done_ids]
                progress.unlink(missing_ok=True)
    return out


def main(argv: list[str]) -> int:
    # SIGTERM from the driver (its bound ran out) unwinds through run_scenario, whose finally
    # kills the scenario's process group: nothing is left behind.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(1))
    request = json.loads(Path(argv[0]).read_text())
    runs = probe(request["chunks"], request.get("stuck_after", 1.5))
    print(json.dumps({"runs": runs}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
elif __name__ == "__mp_main__":
    # A spawned worker (see _spawned_workers_import_this_file): give it our runner.
    install_chaos_runner()

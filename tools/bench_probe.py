"""The measuring side of ``python -m tools bench``: run INSIDE a stage venv, never imported by the tools.

``python tools/bench_probe.py REQUEST.json`` runs the measurements the request lists and
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
               that took) and ms until the new workload runs (on a replacement worker).
``ppe``        the same no-op work through ``concurrent.futures.ProcessPoolExecutor``:
               ms until n results are back (``runs`` times), or tasks/s with
               ``parallelism`` in flight (``throughput`` in the spec).
``floor``      pickling n workloads and writing them to a pipe a reader process drains.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HARNESS_DIR = Path(__file__).resolve().parent.parent / "tests" / "executor"
if str(HARNESS_DIR) not in sys.path:
    sys.path.insert(0, str(HARNESS_DIR))

import harness  # noqa: E402

POLL = 0.001  # the scheduler-like loop: sync() then sleep 1 ms
SETTLE = 0.05  # let freshly forked workers reach their first read before timing


class Abandon(Exception):
    """A measurement left the executor in a state later measurements must not inherit."""


# --------------------------------------------------------------------------------------
# Inside the scenario process (airflow importable, fake runner installed by the harness).
# --------------------------------------------------------------------------------------


def _workloads(prefix: str, n: int) -> list[Any]:
    return [harness.make_workload(f"{prefix}_{i}") for i in range(n)]


def _terminal() -> set[Any]:
    from airflow.utils.state import TaskInstanceState

    return {TaskInstanceState.SUCCESS, TaskInstanceState.FAILED}


def _drain_events(executor: Any, terminal: set[Any]) -> int:
    """Pop the event buffer as the scheduler does; return how many events were terminal."""
    events = executor.get_event_buffer()
    return sum(1 for state, _ in events.values() if state in terminal)


def measure_dispatch(n: int, parallelism: int, runs: int, wait: float) -> dict[str, Any]:
    terminal = _terminal()
    batch = _workloads("d", n)
    dispatch_ms: list[float] = []
    results_ms: list[float] = []
    for _ in range(runs):
        executor = harness.new_executor(parallelism)
        time.sleep(SETTLE)
        for workload in batch:
            executor.queue_workload(workload, session=None)
        t0 = time.perf_counter()
        executor._process_workloads(batch)
        t1 = time.perf_counter()
        done = 0
        give_up = time.monotonic() + wait
        while done < n and time.monotonic() < give_up:
            executor.sync()
            done += _drain_events(executor, terminal)
            if done < n:
                time.sleep(POLL)
        t2 = time.perf_counter()
        if done < n:
            raise Abandon(f"hang: {n - done} of {n} results never arrived within {wait:.0f}s")
        executor.end()
        dispatch_ms.append((t1 - t0) * 1000)
        results_ms.append((t2 - t0) * 1000)
    return {
        "dispatch_ms": dispatch_ms,
        "results_ms": results_ms,
        "workload_bytes": len(pickle.dumps(batch[0])),
    }


def measure_throughput(n: int, parallelism: int, runs: int, wait: float) -> dict[str, Any]:
    terminal = _terminal()
    rates: list[float] = []
    for run in range(runs):
        pending = _workloads(f"t{run}", n)
        pending.reverse()
        executor = harness.new_executor(parallelism)
        time.sleep(SETTLE)
        dispatched = done = 0
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
        if done < n:
            raise Abandon(f"hang: {n - done} of {n} tasks unfinished after {wait:.0f}s")
        executor.end()
        rates.append(n / elapsed)
    return {"tasks_per_s": rates}


def measure_recovery(parallelism: int, runs: int, wait: float) -> dict[str, Any]:
    from airflow.utils.state import TaskInstanceState

    failed_ms: list[float | None] = []
    next_ms: list[float | None] = []
    syncs: list[int | None] = []
    for run in range(runs):
        started = tempfile.mkdtemp(prefix="lepatch-bench-started-")
        release = os.path.join(started, "release")
        busy = [
            harness.make_workload(f"busy{run}_{i}", fake={"started_dir": started, "wait_for": release})
            for i in range(parallelism)
        ]
        executor = harness.new_executor(parallelism)
        harness.dispatch(executor, busy)
        if not harness.wait_until(lambda: len(os.listdir(started)) == parallelism, timeout=30):
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
            executor.sync()
            count += 1
            now = time.perf_counter()
            event = executor.event_buffer.get(victim_key)
            if t_failed is None and event is not None and event[0] == TaskInstanceState.FAILED:
                t_failed, failed_syncs = now, count
            if t_next is None and any(name.startswith(f"next{run}.") for name in os.listdir(started)):
                t_next = now
            time.sleep(POLL)
        failed_ms.append(None if t_failed is None else (t_failed - t0) * 1000)
        next_ms.append(None if t_next is None else (t_next - t0) * 1000)
        syncs.append(None if t_failed is None else failed_syncs)
        Path(release).touch()
        if t_failed is None or t_next is None:
            # The executor lost track of a key or a slot; its end() cannot be trusted either.
            break
        executor.end()
    return {"failed_ms": failed_ms, "next_ms": next_ms, "syncs_to_failed": syncs, "wait_s": wait}


def measure_ppe(n: int, parallelism: int, runs: int, throughput: bool) -> dict[str, Any]:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    batch = _workloads("p", n)
    samples: list[float] = []
    for _ in range(runs):
        # ``bool(workload)`` is the no-op task: the workload is pickled to the worker and
        # unpickled there, a small result comes back, as with the executor.
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
    return {"tasks_per_s" if throughput else "results_ms": samples}


def _drain(reader: Any, n: int) -> None:
    for _ in range(n):
        reader.recv_bytes()


def measure_floor(n: int, runs: int) -> dict[str, Any]:
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    batch = _workloads("f", n)
    samples: list[float] = []
    for _ in range(runs):
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
    return {"dispatch_ms": samples}


MEASURES = {
    "dispatch": measure_dispatch,
    "throughput": measure_throughput,
    "recovery": measure_recovery,
    "ppe": measure_ppe,
    "floor": measure_floor,
}


def run_measurements(specs: list[dict[str, Any]], progress: str) -> int:
    """The scenario: run ``specs`` in order, appending each outcome to ``progress`` as it finishes."""
    for spec in specs:
        args = {k: v for k, v in spec.items() if k not in ("kind", "id")}
        with open(progress, "a") as f:
            f.write(json.dumps({"id": spec["id"], "started": True}) + "\n")
        try:
            outcome: dict[str, Any] = {"id": spec["id"], **MEASURES[spec["kind"]](**args)}
        except Abandon as exc:
            outcome = {"id": spec["id"], "outcome": str(exc)}
        with open(progress, "a") as f:
            f.write(json.dumps(outcome) + "\n")
        if "outcome" in outcome:
            # Leave the broken executor behind with the whole process group; the rest run fresh.
            raise Abandon(outcome["outcome"])
    return len(specs)


# --------------------------------------------------------------------------------------
# The probe process: runs the scenarios, keeps what each managed before it died.
# --------------------------------------------------------------------------------------


def _read_progress(path: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The finished measurements, and the ids of those started (in order)."""
    if not path.exists():
        return {}, []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["id"]: r for r in rows if not r.get("started")}, [r["id"] for r in rows if r.get("started")]


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
                finished, started = _read_progress(progress)
                done.update(finished)
                # The measurement that was running when the child died is the one to blame.
                current = next((i for i in reversed(started) if i not in done), None)
                if current is not None:
                    reason = _first_line(str(exc))
                    kind = "hang" if ("deadlocked" in reason or "deadline" in reason) else "error"
                    done[current] = {"id": current, "outcome": f"{kind}: {reason}"}
            done.update(_read_progress(progress)[0])
            remaining = [s for s in remaining if s["id"] not in done]
        return [done[s["id"]] for s in specs]


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text())
    results = probe(request["specs"], request.get("stuck_after", 1.5), request.get("deadline", 300.0))
    print(json.dumps({"results": results, "python": sys.version.split()[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

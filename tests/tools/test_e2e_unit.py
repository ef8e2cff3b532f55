"""Fast tests of the e2e session's pure parts: no Airflow, no database, no processes started.

The session itself (``nox -s e2e``) starts a real Airflow; here its pieces are driven with fakes:
the timeline text, the run watcher's polling and deadline logic, the verdicts, and the /proc
classification that picks which worker to kill.
"""

from __future__ import annotations

import argparse
import os
import threading
from datetime import datetime, timedelta, timezone

import pytest

from tools import e2e, e2e_procfs, e2e_timeline
from tools.e2e_watch import RunWatcher, TaskSnap, Transition, WatchResult
from tools.errors import ToolError

T0 = datetime(2026, 11, 30, 2, 0, 0, tzinfo=timezone.utc)


def iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


# -- /proc classification ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wchan", "kind"),
    [
        ("pipe_read", "pipe_read"),
        ("anon_pipe_read", "pipe_read"),  # kernels >= 6.x
        ("pipe_write", "pipe_write"),
        ("anon_pipe_write", "pipe_write"),
        ("futex_wait_queue_me", "futex"),
        ("futex_wait_queue", "futex"),
        ("futex_do_wait", "futex"),
        ("0", "running"),
        ("", "running"),
        ("do_sys_poll", "other"),
        ("ep_poll", "other"),
    ],
)
def test_classify_wchan(wchan: str, kind: str) -> None:
    assert e2e_procfs.classify_wchan(wchan) == kind


@pytest.mark.parametrize(
    ("title", "busy"),
    [
        ("airflow worker -- LocalExecutor: <idle>", None),
        ("airflow worker -- LocalExecutor [team_a]: <idle>", None),
        (
            "airflow worker -- LocalExecutor: 01a22a31-c6c4-704d-89b7-1cb8ab766638",
            "01a22a31-c6c4-704d-89b7-1cb8ab766638",
        ),
        ("airflow worker -- LocalExecutor [team_a]: abc", "abc"),
        ("airflow scheduler", None),
        ("airflow worker -- LocalExecutor:", None),
    ],
)
def test_worker_busy_with(title: str, busy: str | None) -> None:
    assert e2e_procfs.worker_busy_with(title) == busy


def _worker(
    pid: int, wchan: str, busy: str | None = None, children: tuple[int, ...] = ()
) -> e2e_procfs.Worker:
    title = f"airflow worker -- LocalExecutor: {busy or '<idle>'}"
    return e2e_procfs.Worker(pid, title, wchan, children)


def test_lock_holder_is_the_only_idle_pipe_reader() -> None:
    workers = [
        _worker(10, "futex_do_wait"),
        _worker(11, "anon_pipe_read"),
        _worker(12, "futex_do_wait"),
        # A busy worker's supervisor may sit in a pipe read of its own: not the queue's reader.
        _worker(13, "anon_pipe_read", busy="ti-1", children=(99,)),
    ]
    holder, shared = e2e_procfs.find_read_lock_holder(workers)
    assert (holder.pid, shared) == (11, True)


def test_a_queue_per_worker_has_no_lock_holder_but_a_reader_to_kill() -> None:
    workers = [_worker(10, "pipe_read"), _worker(11, "anon_pipe_read"), _worker(12, "pipe_read")]
    holder, shared = e2e_procfs.find_read_lock_holder(workers)
    assert (holder.pid, shared) == (10, False)


@pytest.mark.parametrize(
    "wchans",
    [
        ["futex_do_wait", "futex_do_wait"],  # nobody reads: the lock holder is gone already
        ["pipe_read", "futex_do_wait", "do_sys_poll"],  # one worker neither reads nor waits
        [],
    ],
)
def test_lock_holder_ambiguous_is_an_error_naming_the_wchans(wchans: list[str]) -> None:
    workers = [_worker(20 + i, w) for i, w in enumerate(wchans)]
    with pytest.raises(e2e_procfs.NoLockHolder, match="expected one idle worker in a pipe read"):
        e2e_procfs.find_read_lock_holder(workers)


def test_stat_of_this_process() -> None:
    st = e2e_procfs.stat(os.getpid())
    assert st.pid == os.getpid()
    assert st.ppid == os.getppid()
    assert st.state in "RS"
    assert st.sid == os.getsid(0)


def test_vanished_process_raises_procgone() -> None:
    with pytest.raises(e2e_procfs.ProcGone):
        e2e_procfs.cmdline(2**22 + 12345)


# -- the run watcher ------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class FakeApi:
    """Replays a list of (run_state, {task_id: (state, try)}) frames, one per poll."""

    def __init__(self, frames: list[object]) -> None:
        self.frames = frames
        self.i = 0

    def _frame(self) -> tuple[str, dict[str, tuple[str, int]]]:
        frame = self.frames[min(self.i, len(self.frames) - 1)]
        if isinstance(frame, Exception):
            raise frame
        return frame  # type: ignore[return-value]

    def run(self, dag_id: str, run_id: str) -> dict:
        try:
            return {"state": self._frame()[0]}
        except Exception:
            self.i += 1
            raise

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        _, tasks = self._frame()
        self.i += 1
        return [{"task_id": k, "id": f"id-{k}", "state": s, "try_number": n} for k, (s, n) in tasks.items()]

    def tries(self, dag_id: str, run_id: str, task_id: str) -> list[dict]:
        return []


def _watcher(frames: list[object], interval: float = 1.0) -> tuple[RunWatcher, FakeClock]:
    clock = FakeClock()
    w = RunWatcher(FakeApi(frames), "d", "r", interval=interval, clock=clock, sleep=clock.sleep)
    w.start_clock()
    return w, clock


def test_watch_returns_when_final_and_records_transitions() -> None:
    frames: list[object] = [
        ("queued", {"a": ("scheduled", 1), "b": ("scheduled", 1)}),
        ("running", {"a": ("running", 1), "b": ("queued", 1)}),
        ("running", {"a": ("running", 1), "b": ("running", 1)}),
        ("success", {"a": ("success", 1), "b": ("success", 1)}),
    ]
    w, _ = _watcher(frames)
    res = w.watch(deadline=60)
    assert res.final and res.run_state == "success"
    assert res.elapsed == 3.0
    assert [(tr.t, tr.task_id, tr.state) for tr in res.transitions if tr.task_id == "b"] == [
        (0.0, "b", "scheduled"),
        (1.0, "b", "queued"),
        (2.0, "b", "running"),
        (3.0, "b", "success"),
    ]
    assert res.last is not None and res.last.count() == {"success": 2}


def test_watch_gives_up_at_the_deadline_with_the_last_snapshot() -> None:
    w, _ = _watcher([("running", {"a": ("queued", 1), "b": ("success", 1)})], interval=0.5)
    res = w.watch(deadline=10)
    assert not res.final
    assert res.run_state == "running"
    assert 10 <= res.elapsed <= 10.5
    assert res.last is not None and res.last.tasks["a"].state == "queued"
    # Unchanged states are recorded once, not once per poll.
    assert len(res.transitions) == 2


def test_watch_counts_api_errors_and_keeps_polling() -> None:
    frames: list[object] = [ConnectionRefusedError(), OSError("reset"), ("success", {"a": ("success", 1)})]
    w, _ = _watcher(frames)
    res = w.watch(deadline=60)
    assert res.final and res.api_errors == 2


def test_watch_stops_when_asked() -> None:
    stop = threading.Event()
    stop.set()
    w, _ = _watcher([("running", {"a": ("running", 1)})])
    res = w.watch(deadline=60, stop=stop)
    assert not res.final and res.elapsed == 0.0


def test_a_retry_is_a_new_transition() -> None:
    frames: list[object] = [
        ("running", {"a": ("running", 1)}),
        ("running", {"a": ("up_for_retry", 1)}),
        ("running", {"a": ("queued", 2)}),
        ("success", {"a": ("success", 2)}),
    ]
    w, _ = _watcher(frames)
    res = w.watch(deadline=60)
    assert [(tr.try_number, tr.state) for tr in res.transitions] == [
        (1, "running"),
        (1, "up_for_retry"),
        (2, "queued"),
        (2, "success"),
    ]


# -- verdicts ---------------------------------------------------------------------------------------


def _tasks(n: int = 3, **override: tuple[str, int]) -> dict[str, TaskSnap]:
    out = {f"t{i}": TaskSnap(f"t{i}", f"id{i}", "success", 1) for i in range(n)}
    for k, (state, tries) in override.items():
        out[k] = TaskSnap(k, f"id-{k}", state, tries, pid=None)
    return out


def _result(final: bool, state: str) -> WatchResult:
    return WatchResult(final=final, run_state=state, elapsed=5.0, last=None, transitions=[], api_errors=0)


def test_clean_passes() -> None:
    assert e2e.judge("clean", _result(True, "success"), 120, _tasks(), {}, None, n_tasks=3) == []


def test_clean_with_a_retry_fails() -> None:
    out = e2e.judge("clean", _result(True, "success"), 120, _tasks(t1=("success", 2)), {}, None, n_tasks=3)
    assert out == ["tasks retried in a clean run: t1"]


def test_killed_queued_task_left_queued_fails_naming_it() -> None:
    kill = e2e.Kill(4.2, 1234, "t1", "id-t1", 1, "queued", "")
    tasks = _tasks(t1=("queued", 1))
    out = e2e.judge("kill-queued", _result(False, "running"), 90, tasks, {}, kill, n_tasks=3)
    assert out[0].startswith("run not final after 90 s (run state running); 2 success, 1 queued; not done: ")
    assert "t1 (killed) queued try 1, no pid" in out[0]
    assert "was neither failed nor re-dispatched (queued since the kill at +4.2 s)" in out[1]


def test_killed_task_retried_passes() -> None:
    kill = e2e.Kill(4.2, 1234, "t1", "id-t1", 1, "running", "")
    tries = {"t1": [{"try_number": 1, "state": "failed"}, {"try_number": 2, "state": "success"}]}
    out = e2e.judge(
        "kill-running", _result(True, "success"), 90, _tasks(t1=("success", 2)), tries, kill, n_tasks=3
    )
    assert out == []


def test_killed_task_failed_without_retry_passes_but_others_must_succeed() -> None:
    kill = e2e.Kill(4.2, 1234, "t1", "id-t1", 1, "running", "")
    tasks = _tasks(t1=("failed", 1), t2=("upstream_failed", 1))
    out = e2e.judge("kill-running", _result(True, "failed"), 90, tasks, {}, kill, n_tasks=3)
    assert out == ["tasks not successful: t2 upstream_failed try 1, no pid"]


def test_kill_scenario_without_a_kill_fails() -> None:
    out = e2e.judge("kill-queued", _result(True, "success"), 90, _tasks(), {}, None, n_tasks=3)
    assert out == ["the driver never killed a worker (see events)"]


def test_idle_reader_run_that_never_started_fails() -> None:
    tasks = _tasks(0, a=("queued", 1), b=("queued", 1))
    out = e2e.judge("kill-idle-reader", _result(False, "running"), 90, tasks, {}, None, n_tasks=2)
    assert out == [
        "run not final after 90 s (run state running); 2 queued; not done: a queued try 1, no pid, "
        "b queued try 1, no pid"
    ]


# -- timeline ------------------------------------------------------------------------------------------


def test_rows_from_api_one_row_per_try_live_record_wins() -> None:
    tis = [
        {
            "task_id": "b",
            "try_number": 1,
            "state": "success",
            "queued_when": iso(1),
            "start_date": iso(2),
            "end_date": iso(4),
        },
        {
            "task_id": "a",
            "try_number": 2,
            "state": "success",
            "queued_when": iso(10),
            "start_date": iso(11),
            "end_date": iso(12),
        },
    ]
    tries = {
        "a": [
            {
                "try_number": 1,
                "state": "failed",
                "queued_when": iso(1),
                "start_date": iso(2),
                "end_date": iso(9),
            },
            {"try_number": 2, "state": "running", "queued_when": iso(10), "start_date": iso(11)},
        ]
    }
    rows = e2e_timeline.rows_from_api(tis, tries, T0, marked=["a"])
    assert [(r.task_id, r.try_number, r.state, r.marked) for r in rows] == [
        ("a", 1, "failed", True),
        ("a", 2, "success", True),
        ("b", 1, "success", False),
    ]
    assert rows[1].end == 12.0 and rows[2].queued == 1.0


def test_bar_shapes() -> None:
    row = e2e_timeline.TryRow
    assert e2e_timeline.bar(row("a", 1, "success", 0, 2, 4), 10, 10) == "..###     "
    # never started: queued until the end of the watch
    assert e2e_timeline.bar(row("a", 1, "queued", 5, None, None), 10, 10) == "     ~~~~~"
    # still running at the end
    assert e2e_timeline.bar(row("a", 1, "running", 0, 8, None), 10, 10) == "........>>"
    # nothing known yet
    assert e2e_timeline.bar(row("a", 0, None, None, None, None), 10, 10) == " " * 10


def test_format_timeline_and_summary() -> None:
    row = e2e_timeline.TryRow
    rows = [
        row("bash_00", 1, "success", 0.5, 1.0, 3.0),
        row("python_01", 1, "queued", 0.5, None, None, marked=True),
    ]
    events = [(0.0, "trigger"), (2.0, "SIGKILL worker 42")]
    text = e2e_timeline.format_timeline(rows, events, span=10.0, width=20)
    lines = text.splitlines()
    assert lines[0] == "events (seconds from the trigger)"
    assert lines[1] == "     +0.00  trigger"
    assert lines[2] == "     +2.00  SIGKILL worker 42"
    header = next(ln for ln in lines if ln.startswith("task"))
    assert header.endswith("|0s             10.0s|")
    assert any(
        ln.startswith("python_01 *   1 queued") and ln.endswith("| ~~~~~~~~~~~~~~~~~~~|") for ln in lines
    )
    assert lines[-1].startswith("events") and lines[-1].endswith("|^   ^               |")
    assert e2e_timeline.summarize(rows) == "2 tasks: 1 queued, 1 success"


def test_summary_counts_latest_try_and_retries() -> None:
    row = e2e_timeline.TryRow
    rows = [row("a", 1, "failed", 0, 1, 2), row("a", 2, "success", 3, 4, 5), row("b", 1, "success", 0, 1, 2)]
    assert e2e_timeline.summarize(rows) == "2 tasks: 2 success (1 retried)"


def test_rel_accepts_z_suffix() -> None:
    assert e2e_timeline.rel("2026-11-30T02:00:01.500000Z", T0) == 1.5
    assert e2e_timeline.rel(None, T0) is None


# -- options ------------------------------------------------------------------------------------------------


def _parse(*argv: str) -> e2e.Options:
    p = argparse.ArgumentParser()
    e2e.add_arguments(p)
    return e2e.options_from(p.parse_args(list(argv)))


def test_defaults_are_the_full_series_on_the_primary_line() -> None:
    o = _parse()
    assert (o.line.name, o.stage, o.db, o.parallelism) == ("3.3", None, "sqlite", 8)
    assert o.scenarios == list(e2e.SCENARIOS)


def test_options_repeatable_scenarios_and_versions() -> None:
    o = _parse(
        "--scenario",
        "kill-queued",
        "--scenario",
        "clean",
        "--scenario",
        "kill-queued",
        "--line",
        "3.2.1",
        "--stage",
        "0",
        "--db",
        "postgres",
    )
    assert o.scenarios == ["kill-queued", "clean"]
    assert (o.line.name, o.stage, o.db) == ("3.2", 0, "postgres")


def test_bad_options_are_one_line_errors() -> None:
    with pytest.raises(ToolError, match=r"unknown release line '2\.9'"):
        _parse("--line", "2.9")
    with pytest.raises(ToolError, match="--stage must be >= 0"):
        _parse("--stage", "-1")


def test_transition_is_plain_data() -> None:
    assert Transition(1.0, "a", 1, "queued") == Transition(1.0, "a", 1, "queued")

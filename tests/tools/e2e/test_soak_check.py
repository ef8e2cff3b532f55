"""The soak's checker on recorded histories: each rule fails the history that breaks it (no stack)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tools.measure.e2e import soak_check
from tools.measure.e2e.soak_check import Incarnation, LeftAlive, TiRow, check

DAG = "lepatch_e2e_soak"
T0 = 1000.0
T_END = 1200.0


def rec(ev: str, run: str, task: str, try_number: int, pid: int, mono: float, **extra: Any) -> dict[str, Any]:
    return {
        "ev": ev,
        "dag_id": DAG,
        "run_id": run,
        "task_id": task,
        "map_index": -1,
        "try": try_number,
        "ti_id": f"uuid-{run}-{task}-{try_number}",
        "pid": pid,
        "pst": pid * 10,
        "mono": mono,
        "wall": mono + 1.7e9,
        **extra,
    }


def attempt(
    run: str, task: str, try_number: int, pid: int, start: float, end: float | None, marks: int = 0
) -> list[dict[str, Any]]:
    """A try's records: its start, ``marks`` marks every 0.5 s, and its end unless it was killed."""
    out = [rec("start", run, task, try_number, pid, start)]
    out += [rec("mark", run, task, try_number, pid, start + 0.5 * (i + 1)) for i in range(marks)]
    if end is not None:
        out.append(rec("end", run, task, try_number, pid, end))
    return out


def ti(run: str, task: str, state: str | None, try_number: int) -> TiRow:
    return TiRow(DAG, run, task, -1, state, try_number)


def clean_history() -> tuple[list[dict[str, Any]], list[TiRow], dict[str, str | None]]:
    """Two runs: a retry after a killed try 1 (which stopped marking before try 2 began), a flaky task."""
    records = [
        *attempt("soak-00000", "sleep_0", 1, 101, T0 + 1, None, marks=3),  # killed at ~T0+2.5
        *attempt("soak-00000", "sleep_0", 2, 102, T0 + 6, T0 + 9, marks=5),
        *attempt("soak-00000", "noop_0", 1, 103, T0 + 1, T0 + 1.1),
        *attempt("soak-00001", "flaky_0", 1, 104, T0 + 7, None),
        rec("end", "soak-00001", "flaky_0", 1, 104, T0 + 7.1, raised=True),
        *attempt("soak-00001", "flaky_0", 2, 105, T0 + 10, T0 + 10.2),
    ]
    tis = [
        ti("soak-00000", "sleep_0", "success", 2),
        ti("soak-00000", "noop_0", "success", 1),
        ti("soak-00001", "flaky_0", "success", 2),
    ]
    return records, tis, {"soak-00000": "success", "soak-00001": "success"}


def invariants(verdict: soak_check.Verdict) -> list[str]:
    return [v.invariant for v in verdict.violations]


def test_a_clean_history_passes() -> None:
    records, tis, runs = clean_history()
    inc = Incarnation(1, T0 - 20, T_END, "end of soak", [(T0 + i, T0 + i + 0.2) for i in range(0, 200, 2)])
    v = check(records, tis, runs, T0, T_END, incarnations=[inc])
    assert v.violations == []
    assert v.attempts == 5 and v.tis == 3 and v.states == {"success": 3}
    assert v.first() is None
    assert set(v.by_invariant().values()) == {0}


def test_an_overlap_fails_with_both_tries_as_evidence() -> None:
    records, tis, runs = clean_history()
    # try 1 of sleep_0 went on marking after its worker was killed: until T0+8, while try 2 ran from T0+6
    records += [rec("mark", "soak-00000", "sleep_0", 1, 101, T0 + 8.0)]
    v = check(records, tis, runs, T0, T_END)
    assert invariants(v) == ["overlap"]
    (o,) = v.violations
    assert o.what == "soak-00000/sleep_0"
    assert o.t == pytest.approx(6.0)
    assert "try 2 pid 102" in o.evidence and "try 1 pid 101" in o.evidence and ">= 2.00 s" in o.evidence


def test_touching_tries_do_not_overlap() -> None:
    # try 1 killed after its last mark at T0+2; try 2 starts that very instant
    records = [*attempt("r", "t", 1, 1, T0, None, marks=4), *attempt("r", "t", 2, 2, T0 + 2, T0 + 3)]
    v = check(records, [ti("r", "t", "success", 2)], {"r": "success"}, T0, T_END)
    assert v.violations == []


def test_a_duplicate_try_fails() -> None:
    records, tis, runs = clean_history()
    records += attempt("soak-00000", "noop_0", 1, 199, T0 + 30, T0 + 30.1)  # try 1 ran again, later
    v = check(records, tis, runs, T0, T_END)
    assert invariants(v) == ["duplicate-try"]
    assert "try 1 ran in 2 processes" in v.violations[0].evidence
    assert v.violations[0].t == pytest.approx(30.0)


def test_a_lost_try_fails_success_without_a_returned_attempt() -> None:
    records, tis, runs = clean_history()
    # noop_0 is success on try 1 in the database, but its only attempt never returned
    records = [r for r in records if not (r["task_id"] == "noop_0" and r["ev"] == "end")]
    v = check(records, tis, runs, T0, T_END)
    assert invariants(v) == ["lost-try"]
    assert "success on try 1, but no attempt of that try returned" in v.violations[0].evidence


def test_a_success_with_no_attempt_at_all_is_lost() -> None:
    records, tis, runs = clean_history()
    tis.append(ti("soak-00001", "noop_1", "success", 1))
    v = check(records, tis, runs, T0, T_END)
    assert invariants(v) == ["lost-try"]
    assert "attempts: none" in v.violations[0].evidence


def test_a_try_the_database_never_reached_is_lost() -> None:
    records, tis, runs = clean_history()
    records += attempt("soak-00000", "noop_0", 2, 198, T0 + 40, T0 + 40.1)
    v = check(records, tis, runs, T0, T_END)
    assert invariants(v) == ["lost-try", "rerun"]  # and try 1 had returned
    assert "the database's last try is 1" in v.violations[0].evidence


def test_a_raised_try_does_not_count_as_returned() -> None:
    records, tis, runs = clean_history()
    tis[2] = ti("soak-00001", "flaky_0", "success", 1)
    records = [r for r in records if not (r["task_id"] == "flaky_0" and r["try"] == 2)]
    v = check(records, tis, runs, T0, T_END)
    assert invariants(v) == ["lost-try"]


def test_not_terminal_task_instances_and_runs_fail() -> None:
    records, tis, runs = clean_history()
    tis.append(ti("soak-00002", "sleep_1", "running", 1))
    tis.append(ti("soak-00002", "noop_0", "queued", 1))
    runs["soak-00002"] = "running"
    runs["soak-00003"] = None  # triggered, never seen by the database
    records += attempt("soak-00002", "sleep_1", 1, 300, T0 + 50, None, marks=2)
    v = check(records, tis, runs, T0, T_END)
    assert invariants(v).count("terminal") == 4
    by_what = {x.what: x for x in v.violations}
    assert "running on try 1" in by_what["soak-00002/sleep_1"].evidence
    assert by_what["soak-00002/sleep_1"].t == pytest.approx(51.0)  # its last mark
    assert "no try ever started" in by_what["soak-00002/noop_0"].evidence
    assert by_what["soak-00002/noop_0"].t == pytest.approx(T_END - T0)
    assert "still None" in by_what["soak-00003"].evidence
    first = v.first()
    assert first is not None and first.invariant == "terminal"


def test_failed_and_upstream_failed_are_terminal() -> None:
    records = attempt("r", "t", 1, 1, T0, T0 + 1)
    tis = [ti("r", "t", "failed", 1), ti("r", "u", "upstream_failed", 0)]
    assert check(records, tis, {"r": "failed"}, T0, T_END).violations == []


def test_left_alive_is_listed_with_where_it_was_seen() -> None:
    records, tis, runs = clean_history()
    found = [LeftAlive(T0 + 20, 4242, "airflow task runner", "after scheduler 1 exited (SIGTERM)")]
    v = check(records, tis, runs, T0, T_END, left_alive=found)
    assert invariants(v) == ["left-alive"]
    assert v.violations[0].t == pytest.approx(20.0) and "4242" in v.violations[0].what


def test_recorded_processes_include_a_forked_child_until_its_own_end() -> None:
    records = [
        *attempt("r", "fork_0", 1, 7, T0, None),
        rec("child", "r", "fork_0", 1, 7, T0 + 0.1, child=8, child_pst=80, until=T0 + 2.1),
        rec("end", "r", "fork_0", 1, 7, T0 + 0.2),
    ]
    procs = soak_check.recorded_processes(soak_check.attempts(records), grace=1.0)
    assert [(p, st, gone) for p, st, gone, _ in procs] == [(7, 70, T0 + 0.2), (8, 80, T0 + 3.1)]


def test_a_blocked_scheduler_loop_fails_and_a_restart_does_not() -> None:
    loops = [(T0 + i, T0 + i + 0.3) for i in range(0, 60, 2)]
    # a gap of 45 s from T0+58.3 to T0+103.3
    loops += [(T0 + 103.3, T0 + 103.5), (T0 + 105, T0 + 105.2)]
    blocked = Incarnation(11, T0 - 15, T0 + 110, "SIGTERM", loops)
    # the next scheduler: 20 s of start-up (not judged), then loops until the end
    fine = Incarnation(
        12, T0 + 111, T_END, "end of soak", [(T0 + 131 + i, T0 + 131.2 + i) for i in range(0, 69)]
    )
    v = check([], [], {}, T0, T_END, incarnations=[blocked, fine], loop_bound=30)
    assert invariants(v) == ["loop-blocked"]
    (b,) = v.violations
    assert b.t == pytest.approx(58.3) and "for 45.0 s" in b.evidence and b.what == "scheduler 11"


def test_a_loop_that_never_came_back_counts_up_to_the_end() -> None:
    hung = Incarnation(13, T0, T_END, "end of soak", [(T0 + 10, T0 + 10.5), (T0 + 12, T0 + 12.5)])
    v = check([], [], {}, T0, T_END, incarnations=[hung], loop_bound=30)
    assert invariants(v) == ["loop-blocked"]
    assert "for 187.5 s" in v.violations[0].evidence


def test_observed_violations_join_in_time_order() -> None:
    records, tis, runs = clean_history()
    records += attempt("soak-00000", "noop_0", 1, 199, T0 + 30, T0 + 30.1)
    stop = soak_check.Violation("stop-bound", 12.0, "scheduler 5", "still alive 30 s after SIGTERM")
    v = check(records, tis, runs, T0, T_END, observed=[stop])
    assert invariants(v) == ["stop-bound", "duplicate-try"]
    assert v.by_invariant()["stop-bound"] == 1


def test_records_parse_skips_torn_lines(tmp_path: Path) -> None:
    good = rec("start", "r", "t", 1, 5, T0)
    p = tmp_path / "attempts.jsonl"
    p.write_text(
        json.dumps(good) + "\n" + '{"ev": "mark", "run_id"\n' + "[1, 2]\n" + json.dumps({"ev": "x"}) + "\n"
    )
    assert soak_check.read_records(p) == [good]
    assert soak_check.read_records(tmp_path / "none") == []


def test_read_loops_takes_the_scheduling_records(tmp_path: Path) -> None:
    p = tmp_path / "looptrace-1.txt"
    p.write_text("S 10.0 10.5 1.0 1.2 3\nH 10.5 10.6 1.2 1.3\nS 11.0 11.1 1.3 1.4 0\nS bad\n")
    assert soak_check.read_loops(p) == [(10.0, 10.5), (11.0, 11.1)]


def test_a_returned_try_run_again_without_a_fault_is_a_rerun() -> None:
    records = [*attempt("r", "t", 1, 1, T0, T0 + 1), *attempt("r", "t", 2, 2, T0 + 20, T0 + 21)]
    tis = [ti("r", "t", "success", 2)]
    v = check(records, tis, {"r": "success"}, T0, T_END)
    assert invariants(v) == ["rerun"]
    assert v.violations[0].t == pytest.approx(20.0)
    assert "try 1 pid 1" in v.violations[0].evidence and "try 2 pid 2" in v.violations[0].evidence
    # ... but not when the driver killed that try's worker or task process: its result may be lost
    excused = check(records, tis, {"r": "success"}, T0, T_END, hit={"uuid-r-t-1": "kill-worker at 1.2s"})
    assert excused.violations == []


def test_a_sigterm_to_a_scheduler_already_ending_its_executor_hits_the_tries_its_workers_held(
    tmp_path: Path,
) -> None:
    # Seed 7's soak (2026-12-08): the database went down, the scheduler's loop raised at T0+39.3 and its
    # executor's end() waited for five tries whose results could not be recorded yet; the soak's
    # restart-scheduler SIGTERM at T0+43.8 was then Airflow's "signal again": the workers were killed,
    # the tries ran again. Hit by that fault, as by a kill-worker: not a rerun.
    trace = tmp_path / "looptrace-1.txt"
    trace.write_text(f"O 1.0\nS {T0 + 38} {T0 + 38.2} 1.0 1.1 0\nX {T0 + 5} {T0 + 39.3} 0.5 1.2\nX bad\n")
    assert soak_check.read_loop_exits(trace) == [T0 + 39.3]
    assert soak_check.read_loop_exits(tmp_path / "missing.txt") == []
    records = [*attempt("r", "t", 1, 1, T0 + 37.4, T0 + 40.4), *attempt("r", "t", 2, 2, T0 + 50, T0 + 53)]
    tis = [ti("r", "t", "success", 2)]
    hit = soak_check.shutdown_hits(["uuid-r-t-1", ""], [T0 + 39.3], T0 + 43.8, T0)
    assert list(hit) == ["uuid-r-t-1"]
    assert "restart-scheduler at 43.8s" in hit["uuid-r-t-1"] and "39.3s" in hit["uuid-r-t-1"]
    assert check(records, tis, {"r": "success"}, T0, T_END, hit=hit).violations == []
    # A first SIGTERM (the loop ends because of it, after it) must let end() wait for the tries: a try
    # run again then is still a rerun.
    assert soak_check.shutdown_hits(["uuid-r-t-1"], [T0 + 43.9], T0 + 43.8, T0) == {}
    assert soak_check.shutdown_hits(["uuid-r-t-1"], [], T0 + 43.8, T0) == {}
    first = check(records, tis, {"r": "success"}, T0, T_END, hit={})
    assert invariants(first) == ["rerun"]

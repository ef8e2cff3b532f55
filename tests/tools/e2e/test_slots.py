"""Where a slot's time goes in a throughput run, from task-instance records (no Airflow)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tools.measure.e2e import slots

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)


def _ts(seconds: float | None) -> str | None:
    return None if seconds is None else (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def _ti(
    queued: float | None, start: float | None, end: float | None, ready: float | None = 0.0
) -> dict[str, Any]:
    return {
        "scheduled_when": _ts(ready),
        "queued_when": _ts(queued),
        "start_date": _ts(start),
        "end_date": _ts(end),
    }


def test_one_slot_handed_on_with_a_refill_gap_between_tasks() -> None:
    # One slot, two tasks ready from the start: the second is queued 1 s after the first ended.
    fig = slots.figures([_ti(0, 1, 3), _ti(4, 4.5, 6)], parallelism=1)
    assert fig is not None
    assert fig.window_s == 6
    assert fig.handed_over == pytest.approx(1.5 / 6)
    assert fig.running == pytest.approx(3.5 / 6)
    assert fig.refill_gap == pytest.approx(1 / 6)  # 3 -> 4: a free slot and a task waiting
    assert fig.idle == pytest.approx(0)
    assert fig.in_flight_max == 1
    assert fig.idle + fig.handed_over + fig.running + fig.refill_gap == pytest.approx(1)


def test_a_free_slot_with_nothing_waiting_is_idle() -> None:
    # Two slots, one task: the other slot is idle the whole run.
    fig = slots.figures([_ti(0, 1, 2)], parallelism=2)
    assert fig is not None
    assert fig.idle == pytest.approx(1)
    assert fig.refill_gap == 0
    assert fig.in_flight_mean == pytest.approx(1)


def test_a_task_not_yet_scheduled_does_not_wait_for_a_slot() -> None:
    # The second task becomes ready only at 3.5 (a dependency): 3 -> 3.5 is idle, 3.5 -> 4 a gap.
    fig = slots.figures([_ti(0, 1, 3), _ti(4, 4.5, 6, ready=3.5)], parallelism=1)
    assert fig is not None
    assert fig.idle == pytest.approx(0.5 / 6)
    assert fig.refill_gap == pytest.approx(0.5 / 6)


def test_an_end_and_a_queueing_at_the_same_instant_are_one_slot_handed_on() -> None:
    fig = slots.figures([_ti(0, 1, 2), _ti(2, 3, 4)], parallelism=1)
    assert fig is not None
    assert fig.in_flight_max == 1
    assert not fig.over_parallelism


def test_more_in_flight_than_parallelism_is_reported() -> None:
    # The unpatched release: three task instances queued at once with two slots.
    fig = slots.figures([_ti(0, 1, 3), _ti(0, 1, 3), _ti(0, 2, 4)], parallelism=2)
    assert fig is not None
    assert fig.in_flight_max == 3
    assert fig.over_parallelism
    assert "ABOVE parallelism" in fig.text()


def test_unfinished_and_unqueued_task_instances() -> None:
    # Never started: handed over until the window ends; never queued: left out.
    fig = slots.figures([_ti(0, 1, 4), _ti(1, None, None), _ti(None, None, None)], parallelism=2)
    assert fig is not None
    assert fig.window_s == 4
    assert fig.handed_over == pytest.approx((1 + 3) / 4)
    assert slots.figures([_ti(None, None, None)], parallelism=2) is None


def test_rounds_fold_into_one_row_with_the_highest_peak() -> None:
    a = slots.figures([_ti(0, 1, 3), _ti(4, 4.5, 6)], parallelism=1)
    b = slots.figures([_ti(0, 1, 3), _ti(0, 1, 3)], parallelism=1)
    assert a is not None and b is not None
    table = slots.compare([("stage 11", [a]), ("stage 12", [a, b]), ("stage 0", [])], "title")
    lines = table.splitlines()
    assert lines[0] == "title"
    assert "ABOVE" not in lines[2]
    assert lines[3].split()[:3] == ["stage", "12", "2"] and "ABOVE parallelism" in lines[3]
    assert "(no figures)" in lines[4]
    assert slots.SlotFigures(**a.as_json()) == slots.SlotFigures(**{**a.as_json()})


def test_a_task_failed_before_it_started_is_left_out_of_the_peak() -> None:
    # Its end is the scheduler's record of the executor's failure event, after the slot went on.
    failed = {**_ti(0, None, 2.5), "state": "failed"}
    fig = slots.figures([failed, _ti(2, 2.2, 4)], parallelism=1)
    assert fig is not None
    assert (fig.in_flight_max, fig.in_flight_max_all, fig.failed_unstarted) == (1, 2, 1)
    assert not fig.over_parallelism
    assert "1 failed unstarted, max 2 with them" in fig.text()


def test_the_refill_gap_is_split_by_what_the_scheduler_was_doing() -> None:
    # The gap 3 -> 4 s: the scheduler sleeps 2.5 -> 3.4, schedules 3.4 -> 3.9 (and 5 -> 5.5, outside it),
    # heartbeats 3.9 -> 3.95; the last 0.05 s is elsewhere in its loop.
    epoch = T0.timestamp()
    states = {
        "W": [(epoch + 2.5, epoch + 3.4)],
        "S": [(epoch + 3.4, epoch + 3.9), (epoch + 5, epoch + 5.5)],
        "H": [(epoch + 3.9, epoch + 3.95)],
    }
    fig = slots.figures([_ti(0, 1, 3), _ti(4, 4.5, 6)], parallelism=1, scheduler=states)
    assert fig is not None
    assert fig.gap_sleeping == pytest.approx(0.4 / 6)
    assert fig.gap_scheduling == pytest.approx(0.5 / 6)
    assert fig.gap_heartbeat == pytest.approx(0.05 / 6)
    assert fig.gap_elsewhere == pytest.approx(0.05 / 6)
    assert "sleeps 0.1" in fig.text()
    assert "0.1, 0.0, 0.1, 0.0" in slots.compare([("full", [fig])], "t")


def test_without_a_loop_trace_the_gap_is_not_split() -> None:
    fig = slots.figures([_ti(0, 1, 3), _ti(4, 4.5, 6)], parallelism=1)
    assert fig is not None and fig.gap_elsewhere is None
    assert "(no loop trace)" in slots.compare([("0", [fig])], "t")

"""The per-try timeline and its summary, from API records."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tools.measure.e2e import timeline

T0 = datetime(2026, 11, 30, 2, 0, 0, tzinfo=timezone.utc)


def iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


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
    rows = timeline.rows_from_api(tis, tries, T0, marked=["a"])
    assert [(r.task_id, r.try_number, r.state, r.marked) for r in rows] == [
        ("a", 1, "failed", True),
        ("a", 2, "success", True),
        ("b", 1, "success", False),
    ]
    assert rows[1].end == 12.0 and rows[2].queued == 1.0


def test_bar_shapes() -> None:
    row = timeline.TryRow
    assert timeline.bar(row("a", 1, "success", 0, 2, 4), 10, 10) == "..###     "
    # never started: queued until the end of the watch
    assert timeline.bar(row("a", 1, "queued", 5, None, None), 10, 10) == "     ~~~~~"
    # still running at the end
    assert timeline.bar(row("a", 1, "running", 0, 8, None), 10, 10) == "........>>"
    # nothing known yet
    assert timeline.bar(row("a", 0, None, None, None, None), 10, 10) == " " * 10


def test_format_timeline_and_summary() -> None:
    row = timeline.TryRow
    rows = [
        row("bash_00", 1, "success", 0.5, 1.0, 3.0),
        row("python_01", 1, "queued", 0.5, None, None, marked=True),
    ]
    events = [(0.0, "trigger"), (2.0, "SIGKILL worker 42")]
    text = timeline.format_timeline(rows, events, span=10.0, width=20)
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
    assert timeline.summarize(rows) == "2 tasks: 1 queued, 1 success"


def test_summary_counts_latest_try_and_retries() -> None:
    row = timeline.TryRow
    rows = [row("a", 1, "failed", 0, 1, 2), row("a", 2, "success", 3, 4, 5), row("b", 1, "success", 0, 1, 2)]
    assert timeline.summarize(rows) == "2 tasks: 2 success (1 retried)"


def test_rel_accepts_z_suffix() -> None:
    assert timeline.rel("2026-11-30T02:00:01.500000Z", T0) == 1.5
    assert timeline.rel(None, T0) is None

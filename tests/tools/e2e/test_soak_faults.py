"""The soak's fault schedule: drawn from the seed alone, the same on every replay (no stack)."""

from __future__ import annotations

import pytest

from tools.measure.e2e import soak_faults
from tools.measure.e2e.soak_faults import DEFAULT_RATES, KINDS, FaultRateError, parse_rates, schedule


def test_the_same_seed_gives_the_same_schedule() -> None:
    a = schedule(7, 600, DEFAULT_RATES)
    b = schedule(7, 600, dict(DEFAULT_RATES))
    assert a == b
    assert [f.as_json() for f in a] == [f.as_json() for f in b]


def test_another_seed_gives_another_schedule() -> None:
    assert schedule(7, 600, DEFAULT_RATES) != schedule(8, 600, DEFAULT_RATES)


def test_a_pinned_schedule_does_not_drift() -> None:
    # The first faults of seed 1 as drawn when the soak was written: a change to how the schedule
    # is drawn would silently give an old seed a new schedule, and replays would not replay.
    first = [(f.t, f.kind) for f in schedule(1, 600, DEFAULT_RATES)[:4]]
    assert first == PINNED_SEED_1


PINNED_SEED_1 = [(37.241, "kill-worker"), (45.441, "kill-task"), (51.932, "kill-task"), (73.829, "kill-task")]


def test_rates_are_met_within_poisson_noise_and_inside_the_window() -> None:
    faults = schedule(3, 3600, DEFAULT_RATES)
    counts = soak_faults.counts(faults)
    for kind, per_min in DEFAULT_RATES.items():
        if not per_min:
            assert counts[kind] == 0, kind
            continue
        expected = per_min * (3600 - soak_faults.WARMUP_S) / 60
        assert abs(counts[kind] - expected) < 4 * expected**0.5, (kind, counts[kind], expected)
    assert all(soak_faults.WARMUP_S < f.t < 3600 for f in faults)
    assert [f.t for f in faults] == sorted(f.t for f in faults)
    pauses = [f.pause_s for f in faults if f.kind == soak_faults.PAUSE_API]
    assert pauses and all(soak_faults.PAUSE_RANGE_S[0] <= p <= soak_faults.PAUSE_RANGE_S[1] for p in pauses)
    assert all(f.pause_s == 0 for f in faults if f.kind != soak_faults.PAUSE_API)


def test_one_kinds_rate_leaves_the_others_times_alone() -> None:
    base = schedule(5, 600, DEFAULT_RATES)
    more = schedule(5, 600, {**DEFAULT_RATES, soak_faults.KILL_TASK: 30.0})
    assert [f for f in base if f.kind != soak_faults.KILL_TASK] == [
        f for f in more if f.kind != soak_faults.KILL_TASK
    ]
    assert soak_faults.counts(more)[soak_faults.KILL_TASK] > soak_faults.counts(base)[soak_faults.KILL_TASK]


def test_a_zero_rate_schedules_none_of_that_kind() -> None:
    faults = schedule(5, 600, {**DEFAULT_RATES, soak_faults.RESTART_SCHEDULER: 0})
    assert soak_faults.counts(faults)[soak_faults.RESTART_SCHEDULER] == 0


def test_parse_rates_by_kind_and_as_a_total() -> None:
    assert parse_rates([]) == DEFAULT_RATES
    assert parse_rates(["kill-task=10"]) == {**DEFAULT_RATES, "kill-task": 10.0}
    total = parse_rates(["22"])
    assert sum(total.values()) == pytest.approx(22)
    assert total["kill-worker"] / total["restart-scheduler"] == pytest.approx(
        DEFAULT_RATES["kill-worker"] / DEFAULT_RATES["restart-scheduler"]
    )
    assert set(total) == set(KINDS)


@pytest.mark.parametrize(
    ("item", "says"), [("kill-all=3", "no fault kind"), ("x", "not a number"), ("-1", "at least 0")]
)
def test_parse_rates_refuses_in_one_line(item: str, says: str) -> None:
    with pytest.raises(FaultRateError, match=says):
        parse_rates([item])


def test_choose_is_stable_and_modular() -> None:
    assert soak_faults.choose(5, []) is None
    assert soak_faults.choose(0, [30, 10, 20]) == 10
    assert soak_faults.choose(4, [30, 10, 20]) == 20  # 4 % 3 = 1 -> the second by pid
    assert soak_faults.choose(4, [(30, "a"), (10, "b")], key=lambda x: x[0]) == (10, "b")


def test_a_database_restart_is_asked_for_by_name_and_leaves_the_others_alone() -> None:
    # At 0 by default: the documented soaks (a bare total over the four older kinds) replay as they were.
    assert DEFAULT_RATES[soak_faults.RESTART_DB] == 0
    assert soak_faults.counts(schedule(1, 600, DEFAULT_RATES))[soak_faults.RESTART_DB] == 0
    assert parse_rates(["22"])[soak_faults.RESTART_DB] == 0
    rates = parse_rates(["restart-db=1"])
    assert rates == {**DEFAULT_RATES, soak_faults.RESTART_DB: 1.0}
    with_db = schedule(1, 600, rates)
    restarts = [f for f in with_db if f.kind == soak_faults.RESTART_DB]
    assert [(f.t, f.pause_s) for f in restarts[:3]] == [(12.949, 7.93), (67.764, 8.14), (146.603, 2.52)]
    lo, hi = soak_faults.DB_DOWN_RANGE_S
    assert restarts and all(lo <= f.pause_s <= hi for f in restarts)
    assert [f for f in with_db if f.kind != soak_faults.RESTART_DB] == schedule(1, 600, DEFAULT_RATES)

"""``python -m tools soak``: its options, and the figures table from stage results (no stack)."""

from __future__ import annotations

import argparse
import signal
import time

import pytest

from tools.measure.e2e import procfs, soak, soak_faults
from tools.measure.e2e.soak_check import Incarnation, Verdict, Violation
from tools.shared.errors import ToolError


def _opts(*argv: str) -> soak.SoakOptions:
    p = argparse.ArgumentParser()
    soak.add_arguments(p)
    return soak.options_from(p.parse_args(list(argv)))


def test_defaults_compare_the_release_with_the_series_for_ten_minutes() -> None:
    o = _opts()
    assert o.stages == [0, None] and o.duration == 600 and o.parallelism == 16
    assert o.rates == soak_faults.DEFAULT_RATES
    assert _opts("--stage", "full").stages == [None]
    assert _opts("--stage", "3").stages == [3]
    assert _opts("--fault-rate", "pause-api=0").rates[soak_faults.PAUSE_API] == 0


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--fault-rate", "nap=1"], "no fault kind"),
        (["--duration", "5"], "--duration must be more than"),
        (["--stage", "x"], "neither a stage number"),
        (["--stage", "-1"], "--stage: stage must be >= 0, got -1"),  # parsed as the e2e's stages are
        (["--compare-stages", "0"], "at least two stages"),
        (["--parallelism", "1"], "at least 2"),
    ],
)
def test_bad_options_are_refused_in_one_line(argv: list[str], says: str) -> None:
    with pytest.raises(ToolError, match=says):
        _opts(*argv)


def test_the_figures_table_has_a_row_per_stage_with_faults_and_violations() -> None:
    o = _opts("--duration", "180", "--seed", "4")
    broken = soak.StageResult("stage 0", 0, "aa", runs_triggered=30)
    broken.faults = [
        {"kind": "kill-worker", "done": True},
        {"kind": "kill-worker", "done": True},
        {"kind": "pause-api", "done": True},
        {"kind": "kill-task", "done": False},
    ]
    broken.restarts = {"scheduler": {"fault": 2, "exited": 1}}
    broken.verdict = Verdict(
        [
            Violation("terminal", 95.0, "soak-00003/sleep_0", "running on try 1 at the end"),
            Violation("overlap", 40.5, "soak-00001/sleep_1", "both for >= 1.00 s"),
        ],
        attempts=290,
        tis=300,
        states={"success": 280, "failed": 2, "running": 18},
    )
    clean = soak.StageResult("full series", None, "bb", runs_triggered=30)
    clean.faults = [{"kind": "restart-scheduler", "done": True}]
    clean.verdict = Verdict([], attempts=310, tis=300, states={"success": 300})
    failed = soak.StageResult("stage 9", 9, "cc", error="stack not ready after 180 s")
    lines = soak.figures_table(o, [broken, clean, failed]).splitlines()
    assert "seed 4" in lines[0] and "180 s" in lines[0]
    head = lines[1].split()
    assert head[:6] == ["stage", "runs", "TIs", "success", "failed", "other"]
    row0 = lines[2].replace("stage 0", "stage-0").split()
    # runs, TIs, success, failed, other | kill-wk, kill-task, restart, pause, db, skipped, restarts | ...
    assert row0[1:7] == ["30", "300", "280", "2", "18", "|"]
    assert row0[7:14] == ["2", "0", "0", "1", "0", "1", "3"]
    assert row0[15:23] == ["1", "1", "0", "0", "0", "0", "0", "0"]
    assert lines[2].endswith("overlap at 40.5s")
    assert lines[3].endswith("| none")
    assert lines[4].endswith("error: stack not ready after 180 s")
    text = soak.stage_text(broken)
    assert "first: overlap at 40.5s" in text and "soak-00003/sleep_0" in text


class _FakePostgres:
    def __init__(self, alive: bool = True) -> None:
        self.downs: list[float] = []
        self.proc = self
        self._alive = alive
        self.pid = 100

    def alive(self) -> bool:
        return self._alive

    def restart(self, down_s: float) -> tuple[float, float]:
        self.downs.append(down_s)
        self.pid += 1
        return 0.4, 1.2


def _soak_with(pg: _FakePostgres) -> soak.StageSoak:
    # The fault plumbing only: a StageSoak without a stack (no __init__, which creates a database).
    s = object.__new__(soak.StageSoak)
    s.pg = pg  # type: ignore[assignment]
    s.result = soak.StageResult("full series", None, "aa")
    s.stack = argparse.Namespace(procs={"scheduler": argparse.Namespace(alive=lambda: True)})  # type: ignore[assignment]
    return s


def test_a_database_restart_fault_stops_postgres_for_its_down_time_and_starts_it_again() -> None:
    pg = _FakePostgres()
    s = _soak_with(pg)
    hit = s._apply(soak_faults.Fault(12.9, soak_faults.RESTART_DB, 0, 7.93))
    assert pg.downs == [7.93]
    assert hit == "PostgreSQL 100 stopped (fast) in 0.4 s, down 7.9 s, ready again in 1.2 s (pid 101)"
    assert s.result.restarts == {"postgres": {"fault": 1}}
    # A server that is not up (its restart failed) is no target: the fault waits, then is skipped.
    down = _FakePostgres(alive=False)
    assert _soak_with(down)._apply(soak_faults.Fault(20.0, soak_faults.RESTART_DB, 0, 3.0)) is None
    assert down.downs == []
    o = _opts("--fault-rate", "restart-db=0.5")
    assert o.rates[soak_faults.RESTART_DB] == 0.5
    assert "db" in soak.figures_table(o, []).splitlines()[1].split()


def _restartable(tmp_path, monkeypatch, exits: list[float]) -> tuple[soak.StageSoak, list[tuple[int, int]]]:
    """A StageSoak whose scheduler 500 runs workers 501 (busy with try uuid-a) and 502 (idle), its loop
    trace with ``exits`` (when its loop ended, as offsets from now); procfs faked, nothing signalled."""
    now = time.monotonic()
    (tmp_path / "looptrace-1.txt").write_text(
        "O 1.0\n" + "".join(f"X {now - 60:.4f} {now + e:.4f} 0.1 0.2\n" for e in exits)
    )
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(procfs, "all_stats", lambda: [])
    monkeypatch.setattr(procfs, "descendants", lambda pid, stats=None: [])
    monkeypatch.setattr(procfs, "send", lambda pid, sig: sent.append((pid, sig)))
    workers = [argparse.Namespace(pid=501, busy_with="uuid-a"), argparse.Namespace(pid=502, busy_with=None)]
    monkeypatch.setattr(procfs, "workers_of", lambda pid: workers)
    monkeypatch.setattr(procfs, "kill_pids", lambda pids, sig=None: None)
    old = argparse.Namespace(pid=500, popen=argparse.Namespace(wait=lambda timeout: 0), exit_code=lambda: 0)
    new = argparse.Namespace(pid=600, started=now)
    s = object.__new__(soak.StageSoak)
    s.opts = _opts()
    s.home = tmp_path
    s.records = tmp_path / "attempts.jsonl"
    s.result = soak.StageResult("full series", None, "aa")
    s.t0 = now - 43.8
    s.trace_n = 1
    s.hit, s.observed, s.left_alive = {}, [], []
    s.incarnations = [Incarnation(500, now - 40, 0.0, "end of soak")]
    s.stack = argparse.Namespace(procs={"scheduler": old}, env={}, restart=lambda name: new)  # type: ignore[assignment]
    return s, sent


def test_a_sigterm_to_a_scheduler_ending_its_executor_hits_the_tries_its_workers_held(tmp_path, monkeypatch):
    # Its loop had ended 4.5 s before the SIGTERM (the database went down): the SIGTERM is Airflow's
    # second signal, which ends the workers, so the try worker 501 held was hit (seed 7, 2026-12-08).
    s, sent = _restartable(tmp_path, monkeypatch, exits=[-4.5])
    said = s._restart_scheduler(sigterm=True)
    assert sent == [(500, signal.SIGTERM)]
    assert list(s.hit) == ["uuid-a"] and s.hit["uuid-a"].startswith("restart-scheduler at 43.8s")
    assert "stopped looping by itself: 1 running tries ended with it" in said
    assert said.endswith("started again as 600")


def test_a_first_sigterm_to_a_looping_scheduler_hits_no_try(tmp_path, monkeypatch):
    # The loop ends because of the SIGTERM (its record comes after it), or the trace has none: end()
    # must wait for the running tries, and one run again is a rerun.
    for exits in ([0.5], []):
        s, _ = _restartable(tmp_path, monkeypatch, exits=exits)
        said = s._restart_scheduler(sigterm=True)
        assert s.hit == {} and "stopped looping" not in said

"""The throughput scenario without Airflow: figures from API records, the stage comparison,
its options, its DAG and deadline, and the API's paging."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from e2e_options import e2e_options

from tools.measure.e2e import cli, driver, judge, throughput
from tools.measure.e2e.throughput import Figures, StageRow
from tools.measure.e2e.watch import RestApi, TaskSnap, WatchResult
from tools.shared.errors import ToolError

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)


def _ts(seconds: float, z: bool = True) -> str:
    s = (T0 + timedelta(seconds=seconds)).isoformat()
    return s.replace("+00:00", "Z") if z else s


def _ti(i: int, queued: float, start: float, end: float | None) -> dict[str, Any]:
    return {
        "task_id": f"noop_{i:04d}",
        "state": "success" if end is not None else "running",
        "try_number": 1,
        "scheduled_when": _ts(queued - 1.0),
        "queued_when": _ts(queued),
        "start_date": _ts(start, z=i % 2 == 0),  # both spellings the API may use
        "end_date": _ts(end) if end is not None else None,
    }


def _fig(tasks: int, wall: float, p95: float) -> Figures:
    return Figures(tasks, tasks, wall, tasks / wall, p95 / 2, p95, p95 * 1.2, wall + 1)


# -- figures ---------------------------------------------------------------------------------------


def test_percentile_interpolates_between_ranks() -> None:
    xs = [float(x) for x in range(1, 101)]  # 1..100
    assert throughput.percentile(xs, 50) == pytest.approx(50.5)
    assert throughput.percentile(xs, 95) == pytest.approx(95.05)
    assert throughput.percentile([3.0], 95) == 3.0
    assert throughput.percentile([], 50) is None
    assert throughput.percentile([5.0, 1.0], 0) == 1.0 and throughput.percentile([5.0, 1.0], 100) == 5.0


def test_figures_from_task_instances_and_the_run() -> None:
    # 10 tasks queued at 1.0 + i/10, each waits i/2 s, runs 0.5 s; the last one ends at 6.9 s.
    tis = [_ti(i, 1.0 + i / 10, 1.0 + i / 10 + i / 2, 1.5 + i / 10 + i / 2) for i in range(10)]
    run = {"start_date": _ts(0.5), "end_date": _ts(8.0)}
    f = throughput.figures(tis, run)
    assert (f.tasks, f.ended) == (10, 10)
    assert f.wall_s == pytest.approx(5.9)  # first queued at 1.0, last end 1.5 + 0.9 + 4.5 = 6.9
    assert f.tasks_per_s == pytest.approx(10 / 5.9)
    assert f.q2s_p50_s == pytest.approx(2.25)  # waits 0, 0.5, ..., 4.5
    assert f.q2s_p95_s == pytest.approx(4.275)
    assert f.q2s_max_s == pytest.approx(4.5)
    assert f.run_wall_s == pytest.approx(7.5)
    assert f.s2s_p50_s == pytest.approx(3.25) and f.s2s_p95_s == pytest.approx(5.275)  # scheduled 1 s earlier
    js = f.as_json()
    assert js["tasks"] == 10 and js["wall_s"] == 5.9
    assert "10/10 tasks in 5.9s (1.69 tasks/s); queued-to-start p50 2.25s, p95 4.28s" in f.text()
    assert "scheduled-to-start p50 3.25s" in f.text()


def test_figures_of_an_unfinished_or_empty_run() -> None:
    tis = [_ti(0, 1.0, 2.0, 3.0), _ti(1, 1.0, 2.5, None), {"task_id": "x", "queued_when": None}]
    f = throughput.figures(tis, {"start_date": _ts(0.0), "end_date": None})
    assert (f.tasks, f.ended, f.wall_s, f.run_wall_s) == (3, 1, 2.0, None)
    assert f.s2s_p50_s == pytest.approx(2.25)  # scheduled at 0.0, started at 2.0 and 2.5
    assert f.q2s_max_s == pytest.approx(1.5)
    empty = throughput.figures([], None)
    assert (empty.wall_s, empty.tasks_per_s, empty.q2s_p95_s) == (None, None, None)
    assert empty.text().startswith("0/0 tasks in - (- tasks/s)")


def _supervisor_log(
    tmp_path: Path, word: str, id_field: str, durations: tuple[float, ...], tail: str = ""
) -> Path:
    """A scheduler log with the supervisor's "<word> finished" line for task instances 0000-0, 0000-1, ..."""
    log = tmp_path / "scheduler.log"
    log.write_text(
        "".join(
            f"2026-12-01T12:00:0{i}Z [info     ] {word} finished              [supervisor] "
            f"duration={took} exit_code=0 final_state=success loc=supervisor.py:2658 "
            f"{id_field}=0000-{i}{tail}\n"
            for i, took in enumerate(durations)
        )
    )
    return log


def test_stalls_count_workers_busy_seconds_past_their_task(tmp_path: Path) -> None:
    # Three tasks ran 0.5 s each; the supervisor of the second returned 5.3 s after it started
    # (the exit-poll sleep), the others 0.2 s after their task ended.
    tis = [dict(_ti(i, 1.0, 2.0, 2.5), id=f"0000-{i}") for i in range(3)]
    log = _supervisor_log(tmp_path, "Workload", "workload_id", (0.7, 5.3, 0.7), " workload_type=ExecuteTask")
    with log.open("a") as out:
        out.write(
            "2026-12-01T12:00:09Z [info     ] Workload finished [supervisor] duration=9.0 "
            "workload_id=ffff-9\n"
        )
    assert throughput.stalls(tis, log) == 1  # an id the run does not have is not counted
    f = throughput.figures(tis, None, scheduler_log=log)
    assert f.stalls == 1 and "; supervisor stalls 1;" in f.text()
    assert throughput.stalls(tis, tmp_path / "missing.log") is None
    assert throughput.figures(tis, None).stalls is None


def test_stalls_follow_min_heartbeat_interval_and_the_older_wording(tmp_path: Path) -> None:
    # 3.1 and 3.2 log "Task finished ... task_instance_id="; with min_heartbeat_interval 1 the sleep
    # is 1 s: tasks of 0.1 s whose supervisors took 1.2 s and 0.3 s.
    tis = [dict(_ti(i, 1.0, 2.0, 2.1), id=f"0000-{i}") for i in range(2)]
    log = _supervisor_log(tmp_path, "Task", "task_instance_id", (1.2, 0.3))
    assert throughput.stalls(tis, log, min_heartbeat_interval=1) == 1
    assert throughput.stalls(tis, log) == 0  # at the default 5 s, 1.1 s past the end is no stall
    f = throughput.figures(tis, None, scheduler_log=log, min_heartbeat_interval=1)
    assert f.stalls == 1


# -- the comparison -----------------------------------------------------------------------------


def test_targets_of_issue_15() -> None:
    base = _fig(200, 42.7, 11.0)
    assert throughput.target_misses(_fig(200, 43.5, 1.5), base) == []  # 0.98x, p95 better
    slow = throughput.target_misses(_fig(200, 55.0, 1.5), base)
    assert slow == ["throughput 0.78x < 0.97x"]
    assert throughput.target_misses(_fig(200, 42.0, 12.0), base) == ["p95 12.00s > base 11.00s"]
    # The 30-task run: only the wall time counts, within 1.05x.
    small = _fig(30, 20.0, 3.0)
    assert throughput.target_misses(_fig(30, 21.0, 9.0), small) == []
    assert throughput.target_misses(_fig(30, 21.2, 1.0), small) == ["wall 1.06x > 1.05x"]


def test_compare_table_ratios_to_the_first_stage() -> None:
    rows = [
        StageRow("stage 0", True, _fig(200, 42.7, 11.0)),
        StageRow("stage 9", True, _fig(200, 54.4, 1.5)),
        StageRow("stage 3", False, None),
    ]
    lines = throughput.compare(rows, "throughput: title").splitlines()
    assert lines[0] == "throughput: title"
    assert lines[1].startswith("executor")
    assert "1.00x" in lines[2] and lines[2].endswith("(base)")
    assert lines[2].split()[:5] == ["stage", "0", "ok", "200", "42.7s"]
    s9 = lines[3]
    assert " 0.78x " in s9  # tasks/s ratio 42.7/54.4
    assert " 0.14x " in s9  # p95 ratio 1.5/11
    assert " 1.27x " in s9  # wall ratio
    assert s9.endswith("missed: throughput 0.78x < 0.97x")
    assert lines[4].startswith("stage 3") and "FAIL" in lines[4] and "(no figures)" in lines[4]
    assert "s>s p95" in lines[1] and "walls" not in s9


def test_median_of_rounds_and_their_walls_in_the_table() -> None:
    a, b, c = _fig(200, 40.0, 10.0), _fig(200, 50.0, 12.0), _fig(200, 44.0, 30.0)
    m = throughput.median_of([a, b, c])
    assert (m.tasks, m.wall_s, m.q2s_p95_s) == (200, 44.0, 12.0)
    two = throughput.median_of([a, Figures(200, 199, None, None, None, None, None, None)])
    assert (two.ended, two.wall_s) == (199, 40.0)  # missing values are left out
    rows = [StageRow("stage 0", True, m, (40.0, 50.0, 44.0)), StageRow("stage 9", True, a, (40.0,))]
    lines = throughput.compare(rows, "t").splitlines()
    assert lines[2].endswith("(base) (walls 40.0s, 50.0s, 44.0s)")
    assert "walls" not in lines[3]


def _opts(tmp_path: Path, **kw: Any) -> driver.Options:
    return e2e_options(**{"out": tmp_path, "tasks": 200, "compare": [0, 9], **kw})


def test_compare_tables_from_stage_reports(tmp_path: Path) -> None:
    def report(stage: int | None, fig: Figures | None, passed: bool = True) -> dict[str, Any]:
        extra = {"throughput": fig.as_json()} if fig else {}
        return {"stage": stage, "scenarios": [{"name": "throughput", "passed": passed, "extra": extra}]}

    reports = [report(0, _fig(200, 42.7, 11.0)), report(None, _fig(200, 54.4, 1.5))]
    tables = driver.compare_tables(_opts(tmp_path), reports)
    text = tables["throughput"]
    assert text.splitlines()[0].startswith(
        "throughput: 200 no-op tasks at parallelism 16, 3.3 (3.3.2), sqlite"
    )
    assert "full series" in text and "0.78x" in text
    # A scenario without figures (kill-running) gets no table.
    assert driver.compare_tables(_opts(tmp_path, scenarios=["kill-running"]), reports) == {}
    # Two rounds, interleaved: one row per stage, the medians, each round's wall time.
    rounds = [
        report(0, _fig(200, 40.0, 10.0)),
        report(9, _fig(200, 50.0, 1.0)),
        report(0, _fig(200, 44.0, 12.0), passed=False),
        report(9, _fig(200, 52.0, 2.0)),
    ]
    lines = driver.compare_tables(_opts(tmp_path, rounds=2), rounds)["throughput"].splitlines()
    assert lines[0].endswith("ratios to stage 0; medians of 2 rounds")
    assert lines[2].split()[:5] == ["stage", "0", "1/2", "200", "40.0s"]  # the failed round left out
    assert lines[3].split()[:5] == ["stage", "9", "2/2", "200", "51.0s"]
    assert lines[3].endswith("(walls 50.0s, 52.0s)")
    assert "(walls" not in lines[2]
    # Every round of a stage failed: a row without figures.
    dead = [report(0, _fig(200, 40.0, 10.0)), report(9, _fig(200, 9.0, 1.0), passed=False)]
    last = driver.compare_tables(_opts(tmp_path), dead)["throughput"].splitlines()[3]
    assert last.startswith("stage 9") and "FAIL" in last and "(no figures)" in last


# -- scenario plumbing ----------------------------------------------------------------------------


def test_throughput_dag_deadline_and_labels() -> None:
    spec = driver.SCENARIOS["throughput"]().dag(30)
    assert spec.file.is_file() and spec.file.name == "lepatch_e2e_throughput.py"
    assert (spec.dag_id, spec.n_tasks) == ("lepatch_e2e_throughput", 30)
    assert "throughput" in driver.SCENARIOS and "throughput" not in driver.DEFAULT_SCENARIOS
    assert driver.SCENARIOS["throughput"]().deadline(120.0, 200) == 260.0
    assert driver.SCENARIOS["throughput"]().deadline(120.0, 30) == 120.0
    assert driver.stage_label(0) == "stage 0" and driver.stage_label(None) == "full series"


def test_kill_queued_runs_the_no_op_dag_when_the_main_one_is_a_single_wave() -> None:
    assert driver.SCENARIOS["kill-queued"]().dag(parallelism=8) == driver.MAIN_DAG
    wide = driver.SCENARIOS["kill-queued"]().dag(parallelism=32)
    assert (wide.dag_id, wide.n_tasks) == ("lepatch_e2e_throughput", 128)
    assert driver.SCENARIOS["kill-running"]().dag(parallelism=32) == driver.MAIN_DAG


def test_the_dag_file_reads_its_task_count_from_the_driver_env() -> None:
    text = driver.THROUGHPUT_DAG_FILE.read_text()
    assert driver.TP_TASKS_ENV in text and f'DAG_ID = "{driver.THROUGHPUT_DAG_ID}"' in text


def test_judge_throughput_wants_success_on_first_tries() -> None:
    tasks = {f"noop_{i:04d}": TaskSnap(f"noop_{i:04d}", f"id{i}", "success", 1) for i in range(3)}
    watch = WatchResult(True, "success", 10.0, None, [], 0)
    assert judge.judge("throughput", watch, 260, tasks, {}, None, n_tasks=3) == []
    assert judge.judge("throughput", watch, 260, tasks, {}, None, n_tasks=4) == [
        "expected 4 task instances, the API lists 3"
    ]
    failed = WatchResult(True, "failed", 10.0, None, [], 0)
    tasks["noop_0001"] = TaskSnap("noop_0001", "id1", "failed", 1)
    out = judge.judge("throughput", failed, 260, tasks, {}, None, n_tasks=3)
    assert out == [
        "tasks not successful: noop_0001 failed try 1, no pid",
        "run ended failed, expected success",
    ]


def _parse(*argv: str) -> driver.Options:
    return cli.parse_options(list(argv))


def test_cli_tasks_and_compare_stages() -> None:
    o = _parse("--scenario", "throughput", "--tasks", "30", "--parallelism", "8", "--compare-stages", "0,9")
    assert (o.scenarios, o.tasks, o.parallelism, o.compare, o.stage) == (["throughput"], 30, 8, [0, 9], None)
    assert _parse().compare == [] and _parse().tasks == 200 and _parse().rounds == 1
    assert _parse("--compare-stages", "0,full", "--rounds", "2").rounds == 2
    assert cli.parse_stages("0, full,3") == [0, None, 3]
    assert _parse().min_heartbeat_interval is None
    assert _parse("--min-heartbeat-interval", "1").min_heartbeat_interval == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--compare-stages", "0"], "needs at least two stages"),
        (["--compare-stages", "0,x"], "'x' is neither a stage number nor 'full'"),
        (["--compare-stages", "0,-1"], "stage must be >= 0"),
        (["--compare-stages", "0,9,0"], "0 given twice"),
        (["--compare-stages", "0,9", "--stage", "3"], "exclude each other"),
        (["--tasks", "0"], "--tasks must be at least 1"),
        (["--rounds", "2"], "more than 1 only with --compare-stages"),
        (["--compare-stages", "0,9", "--rounds", "0"], "--rounds must be at least 1"),
        (["--min-heartbeat-interval", "0"], "--min-heartbeat-interval must be at least 1"),
    ],
)
def test_cli_bad_compare_options(argv: list[str], message: str) -> None:
    with pytest.raises(ToolError, match=message):
        _parse(*argv)


# -- paging -----------------------------------------------------------------------------------------


class _PagedApi(RestApi):
    """The api-server's paging: at most ``cap`` rows per page whatever ``limit`` says."""

    def __init__(self, rows: int, cap: int):
        super().__init__("http://api")
        self.rows, self.cap = rows, cap
        self.paths: list[str] = []

    def get(self, path: str, timeout: float | None = None) -> dict[str, Any]:
        self.paths.append(path)
        offset = int(path.rsplit("offset=", 1)[1])
        page = [{"task_id": f"t{i}"} for i in range(offset, min(self.rows, offset + self.cap))]
        return {"task_instances": page, "total_entries": self.rows}


def test_task_instances_reads_every_page() -> None:
    api = _PagedApi(rows=230, cap=100)
    tis = api.task_instances("d", "r 1")
    assert [d["task_id"] for d in tis] == [f"t{i}" for i in range(230)]
    assert len(api.paths) == 3 and api.paths[0].startswith("/api/v2/dags/d/dagRuns/r%201/taskInstances?")
    one = _PagedApi(rows=30, cap=1000)
    assert len(one.task_instances("d", "r")) == 30 and len(one.paths) == 1
    assert _PagedApi(rows=0, cap=100).task_instances("d", "r") == []


def test_sqlite_busy_timeout_goes_into_the_url(tmp_path: Path) -> None:
    from tools.measure.e2e.stack import AirflowStack, StackConfig

    def url(**kw: Any) -> str:
        cfg = StackConfig(venv=tmp_path / "venv", home=tmp_path / "home", dag_file=tmp_path / "d.py", **kw)
        return AirflowStack(cfg, print).env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]

    assert url(db_url=None) == f"sqlite:///{tmp_path / 'home' / 'airflow.db'}"
    assert url(db_url=None, sqlite_busy_timeout=60.0).endswith("airflow.db?timeout=60")
    assert (
        url(db_url="postgresql+psycopg2://a@h/db", sqlite_busy_timeout=60.0) == "postgresql+psycopg2://a@h/db"
    )
    assert driver.TP_SQLITE_BUSY_TIMEOUT >= 30 and driver.TP_QUEUED_TIMEOUT >= 300


def test_db_pool_size_is_set_only_when_asked(tmp_path: Path) -> None:
    from tools.measure.e2e.stack import AirflowStack, StackConfig

    def env(**kw: Any) -> dict[str, str]:
        cfg = StackConfig(
            venv=tmp_path / "v", home=tmp_path / "h", dag_file=tmp_path / "d.py", db_url=None, **kw
        )
        return AirflowStack(cfg, print).env

    assert "AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_SIZE" not in env()  # Airflow's own default elsewhere
    assert env(db_pool_size=24)["AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_SIZE"] == "24"
    # Enough for every supervisor of a throughput run plus the driver's own polling.
    assert driver.POOL_HEADROOM >= 4

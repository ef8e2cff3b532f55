"""The scale scenario: the jobs' records, the verdict, the table, its plumbing in the driver (no stack)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tools.measure.e2e import cli, driver, procfs, scale
from tools.measure.e2e.scale import AliveAtRetry, JobTry

DAG = Path(driver.SCALE_DAG_FILE)


def _job(task: str, n: int, start: float, last: float, ended: bool = True, pid: int = 0) -> JobTry:
    return JobTry(task, n, pid or 1000 + n, 5, start, last, ended)


def test_a_jobs_file_gives_its_try_pid_starttime_and_life() -> None:
    text = "s 100.5 4711 9876\nm 100.5\nm 101.5\ntorn li\nm 10"
    job = scale.parse_job("job_0007.2.4711", text + "\n")
    assert job == JobTry("job_0007", 2, 4711, 9876, 100.5, 101.5, False)
    assert scale.parse_job("job_0007.2.4711", "s 1,5 1 2\ne 3,25\n") == JobTry(
        "job_0007", 2, 4711, 2, 1.5, 3.25, True
    )
    assert scale.parse_job("notes.txt", "s 1 2 3") is None
    assert scale.parse_job("job_0001.1.5", "") is None
    assert scale.parse_name("job_0001.12.345") == ("job_0001", 12, 345)


def test_the_bash_job_records_what_the_reader_reads(tmp_path: Path) -> None:
    # The DAG's command itself, with what Jinja would fill in: bash writes, scale.py reads.
    source = DAG.read_text()
    command = source.split('COMMAND = """\\\n', 1)[1].split('"""', 1)[0]
    command = command.replace("{{ ti.task_id }}", "job_0003").replace("{{ ti.try_number }}", "2")
    command = command.replace("LINES", "6")
    env = {**os.environ, driver.SCALE_DIR_ENV: str(tmp_path), "LC_ALL": "C"}
    out = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "job_0003 try 2 line 5 of 6"  # a line every 0.2 s
    (job,) = scale.read_jobs(tmp_path)
    assert (job.task_id, job.try_number, job.ended) == ("job_0003", 2, True)
    assert job.pst > 0 and job.start is not None and 1.0 <= job.last - job.start < 5.0


def test_the_durations_are_seeded_and_within_5_to_20_seconds() -> None:
    text = DAG.read_text().split("with DAG(", 1)[0]  # the helpers only: no Airflow needed
    text = text.replace("from airflow.providers.standard.operators.bash import BashOperator\n", "")
    text = text.replace("from airflow.sdk import DAG\n", "")
    ns: dict[str, object] = {"__name__": "scale_dag_helpers"}
    exec(compile(text, str(DAG), "exec"), ns)  # our own file, without its Airflow imports
    lines_of = ns["lines_of"]
    a = lines_of(500)  # type: ignore[operator]
    assert a == lines_of(500) and a != lines_of(500, 2)  # type: ignore[operator]
    assert min(a) >= 25 and max(a) <= 100 and len(set(a)) > 50


def test_kills_are_spread_over_the_run() -> None:
    assert scale.kill_thresholds(500, 10) == [46, 91, 137, 182, 228, 273, 319, 364, 410, 455]
    assert scale.kill_thresholds(60, 3) == [15, 30, 45]
    assert scale.kill_thresholds(5, 0) == []


def test_overlap_is_an_earlier_try_recording_after_a_later_one_started() -> None:
    clean = [_job("a", 1, 0.0, 5.0, ended=False), _job("a", 2, 6.0, 20.0), _job("b", 1, 0.0, 9.0)]
    assert scale.overlaps(clean) == []
    dirty = [_job("a", 1, 0.0, 12.5), _job("a", 2, 6.0, 20.0), _job("a", 3, 21.0, 30.0)]
    (v,) = scale.overlaps(dirty)
    assert v.check == "overlap" and v.task_id == "a"
    assert "try 1 pid 1001 [0.0s, ended 12.5s] still recording 6.5 s after try 2 pid 1002" in v.evidence


def test_the_verdict_counts_each_check() -> None:
    states = {"a": "success", "b": "running", "c": "failed"}
    jobs = [_job("a", 1, 0.0, 12.5), _job("a", 2, 6.0, 20.0), _job("c", 1, 0.0, 3.0)]
    alive = [AliveAtRetry(7.0, "a", 1, 1001, 2, 6.0)]
    v = scale.judge(states, 4, False, jobs, alive, ["job a try 1 pid 1001 (bash)"], kills=2)
    assert v.counts == {
        "not-terminal": 3,
        "overlap": 1,
        "alive-after-retry": 1,
        "left": 1,
        "no-job": 1,  # b: nothing ran, so nothing could have overlapped
        "kills": 0,
    }
    assert v.states == {"failed": 1, "running": 1, "success": 1}
    assert (v.tis, v.jobs, v.retried, v.kills, v.passed) == (3, 3, 1, 2, False)
    fails = v.failures()
    assert fails[0].startswith("not-terminal: 3 (b: running at the end;")
    assert (
        fails[2] == "alive-after-retry: 1 (a: try 1's job pid 1001 alive 1.0 s after try 2 started (at 6.0s))"
    )
    short = scale.judge({"a": "success"}, 1, True, [_job("a", 1, 0.0, 3.0)], [], [], kills=8, kills_asked=10)
    assert short.counts["kills"] == 1 and short.failures() == ["kills: 1 (-: 8 of 10 worker kills landed)"]
    ok = scale.judge({"a": "success"}, 1, True, [_job("a", 1, 0.0, 3.0)], [], [], kills=0)
    assert ok.passed and ok.failures() == [] and ok.as_json()["violations_total"] == 0


def test_the_table_has_a_row_per_stage() -> None:
    bad = scale.judge({"a": "running"}, 1, False, [], [], [], kills=10).as_json()
    good = scale.judge({"a": "success"}, 1, True, [_job("a", 1, 0.0, 3.0)], [], [], kills=10).as_json()
    lines = scale.table(
        "scale: title", [("stage 0", bad, None), ("full series", good, 612.4), ("x", None, None)]
    )
    assert lines.splitlines()[0] == "scale: title"
    head = lines.splitlines()[1].split()
    assert head[:9] == ["stage", "TIs", "success", "failed", "other", "jobs", "retried", "kills", "run"]
    assert head[10:16] == ["not-term", "overlap", "alive", "left", "no-job", "kills<"]
    assert lines.splitlines()[2].split()[-9:] == ["|", "2", "0", "0", "0", "1", "0", "|", "FAIL"]
    assert lines.splitlines()[2].endswith("| FAIL") and lines.splitlines()[3].endswith("| PASS")
    assert "612s" in lines.splitlines()[3] and "no verdict" in lines.splitlines()[4]


def test_the_watch_sees_an_earlier_try_alive_when_its_retry_starts(tmp_path: Path) -> None:
    job = subprocess.Popen(["sleep", "30"])
    try:
        pst = procfs.stat(job.pid).starttime
        (tmp_path / f"job_0001.1.{job.pid}").write_text(f"s 100.0 {job.pid} {pst}\nm 101.0\n")
        w = driver.ScaleWatch(tmp_path, 100.0)
        assert w.poll() == [] and w.started == {"job_0001"}
        (tmp_path / "job_0001.2.99").write_text("s 104.0 99 1\n")
        (found,) = w.poll()
        assert (found.task_id, found.try_number, found.pid, found.retry, found.retry_start) == (
            "job_0001",
            1,
            job.pid,
            2,
            104.0,
        )
        assert w.poll() == []  # each file is read once
    finally:
        job.kill()
        job.wait()
    (tmp_path / "job_0002.1.98").write_text(f"s 100.0 98 {pst + 1}\n")
    (tmp_path / "job_0002.2.97").write_text("s 109.0 97 1\n")
    time.sleep(0.05)
    assert w.poll() == []  # a gone (or pid-reused) process is not the job


def test_the_scenario_is_wired_into_the_driver_and_the_command_line(tmp_path: Path) -> None:
    assert "scale" in driver.SCENARIOS and "scale" not in driver.DEFAULT_SCENARIOS
    assert driver.SCENARIOS["scale"].during is driver.kill_scale
    dag = driver.SCENARIOS["scale"]().dag(500, 64)
    assert (dag.dag_id, dag.n_tasks) == (driver.SCALE_DAG_ID, 500)
    assert driver.SCENARIOS["scale"]().deadline(120, 500) == driver.SCALE_DEADLINE_BASE + 1000
    argv = ["--line", "3.3", "--db", "postgres", "--scenario", "scale", "--tasks", "60", "--kills", "3"]
    opts = cli.parse_options(argv)
    assert (opts.scenarios, opts.tasks, opts.kills) == (["scale"], 60, 3)
    env = driver.scenario_env(opts, "scale", driver.SCENARIOS["scale"]().dag(60), tmp_path)
    assert env[driver.SCALE_TASKS_ENV] == "60"
    assert env[driver.SCALE_DIR_ENV] == str(tmp_path / driver.SCALE_JOBS_DIR)
    assert cli.parse_options([]).kills == driver.SCALE_DEFAULT_KILLS


def test_kills_below_zero_are_refused() -> None:
    from tools.shared.errors import ToolError

    with pytest.raises(ToolError, match="--kills must be at least 0"):
        cli.parse_options(["--kills", "-1"])


def test_compare_stages_ends_with_one_scale_table_of_every_stage() -> None:
    opts = cli.parse_options(["--scenario", "scale", "--tasks", "2", "--compare-stages", "0,full"])
    bad = scale.judge({"a": "running", "b": "success"}, 2, False, [], [], [], kills=10).as_json()
    jobs = [_job("a", 1, 0.0, 3.0), _job("b", 1, 0.0, 3.0)]
    good = scale.judge({"a": "success", "b": "success"}, 2, True, jobs, [], [], kills=10).as_json()

    def report(stage: int | None, verdict: dict[str, object], run_s: float | None) -> dict[str, object]:
        sc = {"name": "scale", "passed": False, "extra": {"scale": verdict}, "timings": {"run_s": run_s}}
        return {"stage": stage, "scenarios": [sc]}

    tables = driver.compare_tables(opts, [report(0, bad, None), report(None, good, 301.0)])
    lines = tables["scale"].splitlines()
    assert lines[0].startswith("scale: 2 BashOperator jobs at parallelism 8, 10 worker kills, 3.3")
    assert lines[2].startswith("stage 0") and lines[2].endswith("FAIL")
    assert lines[3].startswith("full series") and "301s" in lines[3] and lines[3].endswith("PASS")

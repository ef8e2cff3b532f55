"""Issue 52's counts per round without Airflow: the api-server's access log (recorded lines in),
task instances left running with no process, the driver's round counts and the per-round table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from e2e_options import e2e_options

from tools.measure.e2e import apistall, driver, procfs, uipoll
from tools.measure.e2e.apistall import Access, RoundCounts
from tools.measure.e2e.stack import API_SERVERS
from tools.measure.e2e.throughput import Figures
from tools.measure.e2e.uipoll import PollRecord

TI_A = "01a24e55-2ae9-78b5-a67f-8196dd680385"
TI_B = "01a24e55-2aed-74ca-80ef-88d4b4761322"
TI_C = "01a24e55-2aec-725d-a377-da351ec828bc"


def _line(method: str, path: str, status: int, us: int, t: str = "02:29:26.130774") -> str:
    """An access-log line as 3.3.2's api-server writes it (keys sorted, console renderer)."""
    return (
        f"2026-12-07T{t}Z [info     ] request finished               [http.access] "
        f"client_addr=127.0.0.1:52986 duration_us={us} loc=http_access_log.py:130 method={method} "
        f"path={path} query= status_code={status}\n"
    )


def _stalled_log() -> str:
    """A round like issue 52's worst: starts held ~31 s, one repeated three times, one 500."""
    run = "/execution/task-instances/{}/run"
    return (
        "2026-12-07T02:28:40.0Z [info     ] Uvicorn running on http://127.0.0.1:54505\n"
        + _line("GET", "/api/v2/dags/lepatch_e2e_throughput", 200, 144314)
        + _line("PATCH", run.format(TI_A), 200, 31_200_000)
        + _line("PATCH", run.format(TI_A), 409, 40_000)  # the client's retry: a duplicate
        + _line("PATCH", run.format(TI_A), 409, 38_000)
        + _line("PATCH", run.format(TI_B), 500, 30_700_000)
        + _line("PATCH", run.format(TI_B), 200, 120_000)
        + _line("PATCH", run.format(TI_C), 200, 4_999_999)
        + _line("GET", f"/execution/task-instances/{TI_C}/run", 405, 1000)  # not a start
        + _line("GET", "/api/v2/dags/lepatch_e2e_throughput/dagRuns/e2e-throughput", 500, 31_000_000)
        + "2026-12-07T02:29:26.0Z [info     ] Task instance state updated    [airflow.api_fastapi] "
        "new_state=success\n"
        + '{"event": "request finished", "method": "PUT", "path": "/execution/task-instances/x/heartbeat", '
        '"status_code": 204, "duration_us": 5000000}\n'
    )


def test_an_access_line_is_parsed_in_either_rendering() -> None:
    got = apistall.parse_access(_line("PATCH", f"/execution/task-instances/{TI_A}/run", 409, 40_000))
    assert got == Access("PATCH", f"/execution/task-instances/{TI_A}/run", 409, 0.04)
    js = json.dumps(
        {"event": "request finished", "method": "GET", "path": "/ui/x", "status_code": 200, "duration_us": 7}
    )
    assert apistall.parse_access(js) == Access("GET", "/ui/x", 200, 7e-6)
    assert apistall.parse_access("2026-12-07T02:29:26Z [info     ] Task instance state updated") is None
    assert apistall.parse_access('{"event": "other", "method": "GET"}') is None
    assert apistall.parse_access("request finished [http.access] method=GET path=/x") is None  # no status
    assert apistall.parse_access('{"event": "request finished"') is None  # a torn line


def test_api_figures_count_slow_requests_and_task_starts_sent_again() -> None:
    f = apistall.api_figures(apistall.access_records(_stalled_log()))
    assert f.requests == 10
    assert f.slow == 4  # 31.2, 30.7, 31.0 and the 5.0 s heartbeat; not 4.999999
    assert (f.longest_s, f.longest_path) == (31.2, f"/execution/task-instances/{TI_A}/run")
    assert f.server_errors == 2
    assert (f.starts, f.starts_retried, f.start_repeats) == (6, 2, 3)
    assert f.as_json()["longest_s"] == 31.2


def test_api_log_figures_from_the_log_file(tmp_path: Path) -> None:
    log = tmp_path / "api-server.log"
    log.write_text(_stalled_log())
    f = apistall.api_log_figures(log)
    assert f is not None and f.starts_retried == 2
    assert apistall.api_log_figures(tmp_path / "missing.log") is None
    empty = apistall.api_figures([])
    assert (empty.requests, empty.longest_s, empty.starts_retried) == (0, None, 0)


def test_running_task_instances_no_process_names() -> None:
    tis = [
        {"id": TI_A, "state": "running"},  # its task process is there
        {"id": TI_B, "state": "running"},  # only its LocalExecutor worker: still handled
        {"id": TI_C, "state": "running"},  # nothing: left running
        {"id": "01a24e55-0000-0000-0000-000000000000", "state": "success"},
        {"state": "running"},  # no id: nothing to look for
    ]
    titles = [
        "/v/bin/python /v/bin/airflow scheduler",
        f"airflow worker -- {TI_A}",
        f"airflow worker -- LocalExecutor: {TI_B}",
        "airflow worker -- LocalExecutor: <idle>",
    ]
    assert apistall.running_without_process(tis, titles) == [TI_C]
    assert apistall.running_without_process(tis, [*titles, f"airflow worker -- {TI_C}"]) == []


# -- the driver's part ------------------------------------------------------------------------------


class _FakeApi:
    def __init__(self, *answers: list[dict[str, Any]]):
        self.answers = list(answers)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return self.answers.pop(0)


class _FakeRun:
    def __init__(self, api: _FakeApi | None = None, extra: dict[str, Any] | None = None):
        self.api = api
        self.dag = driver.DagSpec(Path("d.py"), "lepatch_e2e_throughput", 3)
        self.run_id = "e2e-throughput"
        self.extra: dict[str, Any] = extra or {}
        self.events: list[str] = []

    def event(self, text: str, t: float | None = None) -> None:
        self.events.append(text)


def test_left_running_needs_two_looks(monkeypatch: Any) -> None:
    monkeypatch.setattr(driver, "LEFT_RUNNING_RECHECK_S", 0.0)
    monkeypatch.setattr(procfs, "titles", lambda: ["airflow worker -- LocalExecutor: <idle>"])
    first = [{"id": TI_A, "state": "running"}, {"id": TI_B, "state": "running"}]
    # The second look: TI_B has ended meanwhile (it was between its end and its title going away).
    again = [{"id": TI_A, "state": "running"}, {"id": TI_B, "state": "success"}]
    run = _FakeRun(_FakeApi(again))
    assert driver._left_running(cast(driver.Run, run), first) == [TI_A]
    assert run.events == [f"1 task instance(s) running with no process: {TI_A}"]
    quiet = _FakeRun(_FakeApi())  # nothing running: no second look at all
    assert driver._left_running(cast(driver.Run, quiet), [{"id": TI_A, "state": "success"}]) == []


def test_a_rounds_counts_come_from_its_logs_its_figures_and_the_poller(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "api-server.log").write_text(_stalled_log())
    uipoll.write_records(
        tmp_path / uipoll.RECORDS_FILE,
        [
            PollRecord(3.0, "getDagRun", 0.1, 200),
            PollRecord(6.0, "getDagRun", 31.3, 500, "QueuePool limit of size 5"),
            PollRecord(6.0, "getGridRuns", 60.0, None, "timed out"),
        ],
    )
    poller = uipoll.UiPoller("http://127.0.0.1:1", "d", "r", lambda: 0.0)
    poller.token_source = "cookie"
    sched = tmp_path / "logs" / "scheduler.log"
    sched.write_text(
        f"2026-12-07T02:31:09.7Z [warning  ] {apistall.CLIENT_RETRY_TEXT}, this is the 1st time calling it.\n"
        * 3
    )
    run = _FakeRun(extra={"throughput": {"tasks_per_s": 0.59, "failed": 2, "pool_timeouts": 1}, "load": 7.5})
    driver._api_stall(
        cast(driver.Run, run), tmp_path, poller, [TI_C], sched, driver.read_api_logs(tmp_path / "logs")
    )
    stall = run.extra["api_stall"]
    assert stall["counts"] == {
        "tasks_per_s": 0.59,
        "api_slow": 4,
        "api_longest_s": 31.2,
        "poll_longest_s": 60.0,
        "poll_errors": 2,
        "pool_timeouts": 1,
        "starts_retried": 2,
        "failed": 2,
        "left_running": 1,
        "load": 7.5,
    }
    assert stall["left_running"] == [TI_C] and stall["poll"]["pool_timeouts"] == 1
    assert stall["client_retries"] == 3
    assert run.extra["api_stall_summary"].startswith(
        "api-server: 4 requests of 5 s or more, longest 31.2 s "
        f"(/execution/task-instances/{TI_A}/run); task starts retried 2 (3 repeats; the client's retry "
        "lines, any call, 3); "
        "left running with no process 1; UI poller: 3 requests"
    )
    json.dumps(run.extra)  # the report can hold it
    # No poller, no log, no look at the processes: unknown, not zero.
    bare = _FakeRun()
    none = driver.read_api_logs(tmp_path / "none")
    driver._api_stall(cast(driver.Run, bare), tmp_path / "none", None, None, tmp_path / "none.log", none)
    counts = bare.extra["api_stall"]["counts"]
    assert counts["api_slow"] is None and counts["left_running"] is None and counts["poll_errors"] is None
    assert bare.extra["api_stall"]["client_retries"] is None
    assert bare.extra["api_stall_summary"] == "api-server: no log; left running with no process -"


def _counts(tps: float, longest: float, retried: int = 0, left: int = 0) -> RoundCounts:
    return RoundCounts(tps, int(longest >= 5), longest, longest + 0.2, 0, 0, retried, retried, left, load=3.5)


def test_the_rounds_table_puts_the_stages_side_by_side() -> None:
    text = apistall.rounds_table(
        [
            ("stage 0", [_counts(6.02, 5.2), _counts(6.43, 3.9)]),
            ("full series", [_counts(5.97, 4.4), replace_passed(_counts(0.59, 31.2, 2, 1))]),
            ("stage 9", [None]),  # its second round never ran, its first has no counts
        ],
        "title",
    )
    lines = text.splitlines()
    assert lines[0] == "title"
    width = apistall._STAGE_WIDTH - 3
    assert lines[1].split(" | ") == [
        "round ",
        f"{'stage 0':<{width}}",
        f"{'full series':<{width}}",
        "stage 9",
    ]
    assert lines[2].split(" | ")[1] == "  run tasks/s  load  >5s longest   poll 5xx t/o retried failed left"
    row1 = lines[3].split(" | ")
    assert row1[0] == "1     " and row1[1].split() == [
        "ok",
        "6.02",
        "3.5",
        "1",
        "5.2s",
        "5.4s",
        "0",
        "0",
        "0",
        "0",
        "0",
    ]
    assert len(row1) == 3  # stage 9's blank cell is not printed at the end of a row
    row2 = lines[4].split(" | ")
    assert row2[2].split() == ["FAIL", "0.59", "3.5", "1", "31.2s", "31.4s", "0", "0", "2", "2", "1"]
    assert lines[5].startswith("run: the scenario's verdict") and all(len(ln) <= 110 for ln in lines[5:])
    assert RoundCounts.from_json({**_counts(1.0, 1.0).as_json(), "new_field": 1}) == _counts(1.0, 1.0)


def replace_passed(c: RoundCounts) -> RoundCounts:
    return RoundCounts(**{**c.as_json(), "passed": False})


def test_the_counts_json_leaves_the_verdict_to_the_report() -> None:
    c = _counts(1.0, 1.0)
    assert "passed" not in c.as_json() and RoundCounts.from_json(c.as_json()) == c


def test_compare_tables_add_the_per_round_table() -> None:
    def report(stage: int | None, counts: RoundCounts | None, passed: bool) -> dict[str, Any]:
        fig = Figures(60, 60, 10.0, 6.0, 0.5, 1.0, 1.2, 11.0)
        extra: dict[str, Any] = {"throughput": fig.as_json()}
        if counts is not None:
            extra["api_stall"] = {"counts": counts.as_json()}
        return {"stage": stage, "scenarios": [{"name": "throughput", "passed": passed, "extra": extra}]}

    opts = e2e_options(db="postgres", compare=[0, None], rounds=2, tasks=60)
    reports = [
        report(0, _counts(6.0, 3.0), True),
        report(None, _counts(6.1, 2.0), True),
        report(0, _counts(5.0, 4.0), True),
        report(None, _counts(0.6, 31.2, 2, 1), False),  # a failed round: its counts are the point
    ]
    tables = driver.compare_tables(opts, reports)
    lines = tables["throughput api"].splitlines()
    assert lines[0].startswith(
        "throughput: the api-server under a UI's run page polled every 3 s (4 endpoints), per round; "
        "60 tasks at parallelism 16"
    )
    assert lines[0].endswith("postgres, db pool 5 + 10, timeout 30 s (Airflow's)")
    assert "stage 0" in lines[1] and "full series" in lines[1]
    assert lines[4].split(" | ")[2].split()[:5] == ["FAIL", "0.60", "3.5", "1", "31.2s"]
    no_poll = driver.compare_tables(opts, [report(0, None, True), report(None, None, True)])
    assert "throughput api" not in no_poll and "throughput" in no_poll


def test_split_api_servers_logs_are_counted_together(tmp_path: Path) -> None:
    """With --split-api the task starts are in the execution api-server's log, the UI's in the other."""
    lines = _stalled_log().splitlines(keepends=True)
    core, execution = tmp_path / "api-server.log", tmp_path / "execution-api.log"
    core.write_text("".join(line for line in lines if "/execution/" not in line))
    execution.write_text("".join(line for line in lines if "/execution/" in line))
    together = apistall.api_log_figures(core, execution)
    assert together == apistall.api_figures(apistall.access_records(_stalled_log()))
    assert apistall.api_log_figures(core, tmp_path / "missing.log") == apistall.api_log_figures(core)
    # The same figures from the texts the driver reads once per round.
    logs = driver.read_api_logs(tmp_path)
    assert list(logs) == list(API_SERVERS) and apistall.api_text_figures(*logs.values()) == together
    assert apistall.api_text_figures(None, None) is None

"""The e2e stack's database pool (``--db-pool``) and the pool timeouts counted from the logs,
without Airflow: options, the stack's environment, the log counting, the figures and the table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e_options import e2e_options

from tools.measure.e2e import cli, driver, stack, throughput
from tools.measure.e2e.stack import AirflowStack, StackConfig
from tools.measure.e2e.throughput import Figures, StageRow
from tools.shared.errors import ToolError

# SQLAlchemy 2.0's text (sqlalchemy/pool/impl.py, QueuePool._do_get) at Airflow's pool settings.
TIMEOUT = (
    "sqlalchemy.exc.TimeoutError: QueuePool limit of size 5 overflow 10 reached, connection timed out, "
    "timeout 30.00 (Background on this error at: https://sqlalche.me/e/20/3o7r)"
)
BANNER = " ____    |__( )_________  __/__  /________      __\nRunning the API server with uvicorn:\n"


def _tb(*last: str) -> str:
    """A plain traceback (Airflow's console renderer outside dev mode) ending in ``last``."""
    return (
        "Traceback (most recent call last):\n"
        '  File "/v/lib/python3.11/site-packages/sqlalchemy/pool/impl.py", line 167, in _do_get\n'
        "    raise exc.TimeoutError(\n" + "".join(f"{line}\n" for line in last)
    )


def _handled(t: str) -> str:
    return (
        f"2026-12-06T03:17:{t}Z [error    ] Handle died with an error      "
        "[airflow.api_fastapi.execution_api.app] correlation_id=01a2 loc=app.py:323\n" + _tb(TIMEOUT)
    )


def _asgi(t: str, *last: str) -> str:
    # uvicorn's message ends in a newline, so the logger's name goes onto the next line.
    return (
        f"2026-12-06T03:17:{t}Z [error    ] Exception in ASGI application\n"
        " [uvicorn.error] loc=h11_impl.py:410\n" + _tb(*(last or (TIMEOUT,)))
    )


def _access(t: str, status: int) -> str:
    return (
        f"2026-12-06T03:17:{t}Z [info     ] request finished               [http.access] "
        f"method=PATCH path=/execution/task-instances/01a2/run status_code={status}\n"
    )


# -- counting -------------------------------------------------------------------------------------


def test_a_requests_timeout_counts_once_though_the_api_server_logs_it_twice(tmp_path: Path) -> None:
    log = tmp_path / "api-server.log"
    log.write_text(
        BANNER
        + _access("03.1", 200)
        # Two task starts time out together: the execution API logs each, then uvicorn each.
        + _handled("33.10")
        + _handled("33.11")
        + _asgi("33.12")
        + _asgi(
            "33.13",
            TIMEOUT,
            "",
            "During handling of the above exception, another exception occurred:",
            "",
            TIMEOUT,  # the same timeout again in a chained traceback: still one record
        )
        + _access("33.14", 500)
        # A public API request (no handler of its own): uvicorn's record only.
        + _asgi("40.00")
        # Another error with a traceback is not a pool timeout.
        + _asgi("41.00", "ValueError: bad")
        + _access("42.0", 200)
    )
    assert throughput.pool_timeouts(log) == 3


def test_pool_timeouts_without_uvicorns_record_or_outside_a_request(tmp_path: Path) -> None:
    log = tmp_path / "api-server.log"
    log.write_text(_handled("33.10") + _handled("33.11") + _access("33.12", 500))
    assert throughput.pool_timeouts(log) == 2  # the handler's records alone still count
    sched = tmp_path / "scheduler.log"
    sched.write_text(
        "2026-12-06T03:17:33.1Z [error    ] Exception when executing SchedulerJob._run_scheduler_loop\n"
        + _tb(TIMEOUT)
        + "2026-12-06T03:17:40.0Z [info     ] Loop took 0.1 s\n"
        + f"2026-12-06T03:17:50.0Z [warning  ] Retrying: {TIMEOUT}\n"  # the text in the line itself
    )
    assert throughput.pool_timeouts(sched) == 2
    quiet = tmp_path / "dag-processor.log"
    quiet.write_text(BANNER + _access("01.0", 200) + _asgi("02.0", "ValueError: bad"))
    assert throughput.pool_timeouts(quiet) == 0
    assert throughput.pool_timeouts(tmp_path / "missing.log") is None
    # JSON logs: one record a line.
    js = tmp_path / "json.log"
    js.write_text(
        '{"timestamp": "2026-12-06T03:17:33Z", "event": "Handle died with an error", '
        f'"exception": "{TIMEOUT}"}}\n'
        '{"timestamp": "2026-12-06T03:17:33Z", "event": "Exception in ASGI application\\n", '
        f'"exception": "{TIMEOUT}"}}\n' * 2
    )
    assert throughput.pool_timeouts(js) == 2


def test_a_public_api_requests_timeout_logged_without_its_message_counts(tmp_path: Path) -> None:
    # 3.3.2's database-error handler logs the frames alone (2026-12-07, the driver's GET of the task
    # instances, answered 500 after 30.4 s): no "QueuePool limit" anywhere in the log.
    record = (
        "2026-12-07T02:40:33.761869Z [error    ] Error with id 2eT69wgi, statement: hidden\n"
        '  File "/v/lib/python3.11/site-packages/sqlalchemy/pool/base.py", line 728, in checkout\n'
        "    rec = pool._do_get()\n"
        "          ^^^^^^^^^^^^^^\n"
        '  File "/v/lib/python3.11/site-packages/sqlalchemy/pool/impl.py", line 165, in _do_get\n'
        "    raise exc.TimeoutError(\n"
        " [airflow.api_fastapi.common.exceptions] loc=exceptions.py:80\n"
    )
    log = tmp_path / "api-server.log"
    log.write_text(_access("03.1", 200) + record + _access("34.1", 500) + record.replace("2eT69", "xY"))
    assert throughput.pool_timeouts(log) == 2
    # Another error's frames are not a pool timeout.
    log.write_text(record.replace("raise exc.TimeoutError(", "raise exc.InvalidRequestError("))
    assert throughput.pool_timeouts(log) == 0


def test_every_components_pool_timeouts_api_server_first(tmp_path: Path) -> None:
    (tmp_path / "scheduler.log").write_text(_access("01.0", 200))
    (tmp_path / "api-server.log").write_text(_handled("33.1") + _asgi("33.2"))
    (tmp_path / "dag-processor.log").write_text("")
    (tmp_path / "notes.txt").write_text(TIMEOUT)  # not a component's log
    got = driver.component_pool_timeouts(tmp_path)
    assert list(got.items()) == [("api-server", 1), ("dag-processor", 0), ("scheduler", 0)]
    # --split-api's execution api-server: right after the api-server, as stack.API_SERVERS lists them.
    (tmp_path / f"{stack.EXECUTION_API}.log").write_text(_handled("35.1"))
    got = driver.component_pool_timeouts(tmp_path)
    assert list(got) == [*stack.API_SERVERS, "dag-processor", "scheduler"]
    assert got[stack.EXECUTION_API] == 1
    # A log the round already read (driver.read_api_logs) is counted from that text, not read again.
    texts = driver.read_api_logs(tmp_path)
    (tmp_path / "api-server.log").write_text("")
    assert driver.component_pool_timeouts(tmp_path, texts) == got
    assert driver.component_pool_timeouts(tmp_path / "none") == {}


# -- figures and the table ------------------------------------------------------------------------


def _ti(i: int, state: str) -> dict[str, Any]:
    return {
        "task_id": f"noop_{i:04d}",
        "state": state,
        "queued_when": "2026-12-06T03:17:00Z",
        "start_date": "2026-12-06T03:17:01Z" if state != "queued" else None,
        "end_date": f"2026-12-06T03:17:{2 + i:02d}Z" if state != "queued" else None,
    }


def test_figures_count_failed_tasks_and_the_api_servers_pool_timeouts(tmp_path: Path) -> None:
    log = tmp_path / "api-server.log"
    log.write_text(_handled("33.10") + _asgi("33.12") + _handled("34.00") + _asgi("34.01"))
    tis = [_ti(0, "success"), _ti(1, "failed"), _ti(2, "failed"), _ti(3, "queued")]
    f = throughput.figures(tis, None, api_log_text=throughput.read_log(log))
    assert (f.tasks, f.ended, f.failed, f.pool_timeouts) == (4, 3, 2, 2)
    assert f.text().endswith("; failed 2; api-server pool timeouts 2")
    assert f.as_json()["failed"] == 2 and f.as_json()["pool_timeouts"] == 2
    bare = throughput.figures(tis[:1], None)  # no log given: unknown, not zero
    assert (bare.failed, bare.pool_timeouts) == (0, None)
    assert bare.text().endswith("; failed 0; api-server pool timeouts -")
    # A report written before these fields still loads.
    old = {k: v for k, v in f.as_json().items() if k not in ("failed", "pool_timeouts")}
    assert Figures(**old).pool_timeouts is None


def _fig(wall: float, failed: int = 0, pool: int | None = 0) -> Figures:
    return Figures(200, 200, wall, 200 / wall, 1.0, 2.0, 3.0, wall + 1, failed=failed, pool_timeouts=pool)


def test_the_table_shows_each_rounds_failed_tasks_and_pool_timeouts() -> None:
    rows = [
        StageRow("stage 0", False, _fig(40.0), (40.0,), 2, 1, failed=(0, 4), pool_timeouts=(0, 7)),
        StageRow("full series", True, _fig(38.0), (38.0, 39.0), 2, 2, failed=(0, 0), pool_timeouts=(0, 0)),
        StageRow("stage 3", False, None, (), 2, 0, failed=(2, None), pool_timeouts=(5, None)),
        StageRow("stage 4", False, None),
    ]
    lines = throughput.compare(rows, "t").splitlines()
    assert lines[1].endswith("stalls   failed pool t/o  targets (issue 15)")
    assert "      0,4      0,7  (base)" in lines[2]
    assert "      0,0      0,0  met" in lines[3]
    assert lines[4].endswith("(no figures) failed 2,-, pool timeouts 5,-")
    assert lines[5].endswith("(no figures)")  # nothing known: nothing added
    # One run, no rounds: the figures' own counts.
    one = throughput.compare([StageRow("stage 0", True, _fig(40.0, 1, 3))], "t").splitlines()[2]
    assert "        1        3  (base)" in one


def _opts(**kw: Any) -> driver.Options:
    return e2e_options(**{"db": "postgres", "compare": [0, None], **kw})


def test_compare_tables_take_failed_tasks_and_pool_timeouts_from_every_round() -> None:
    def report(stage: int | None, fig: Figures | None, passed: bool) -> dict[str, Any]:
        extra = {"throughput": fig.as_json()} if fig else {}
        return {"stage": stage, "scenarios": [{"name": "throughput", "passed": passed, "extra": extra}]}

    reports = [
        report(0, _fig(40.0), True),
        report(None, _fig(38.0), True),
        report(0, _fig(60.0, failed=2, pool=9), False),  # failed: left out of the medians, not here
        report(None, None, False),  # the stack died: no figures at all
    ]
    text = driver.compare_tables(_opts(rounds=2, db_pool="airflow"), reports)["throughput"]
    lines = text.splitlines()
    assert "postgres, db pool 5 + 10, timeout 30 s (Airflow's)" in lines[0]
    assert lines[2].split()[:5] == ["stage", "0", "1/2", "200", "40.0s"]
    assert "      0,2      0,9  (base)" in lines[2]
    assert "      0,-      0,-  met" in lines[3]


# -- --db-pool ------------------------------------------------------------------------------------


def _parse(*argv: str) -> driver.Options:
    return cli.parse_options(list(argv))


def test_db_pool_defaults_to_each_scenarios_and_takes_airflow_or_a_size() -> None:
    assert _parse().db_pool is None
    assert _parse("--db-pool", "airflow").db_pool == "airflow"
    assert _parse("--db-pool", "Airflow").db_pool == "airflow"
    assert _parse("--db-pool", "headroom").db_pool == "headroom"
    assert _parse("--db-pool", "012").db_pool == "12"


def test_the_ui_poller_is_on_unless_turned_off() -> None:
    assert _parse().ui_poll is True
    assert _parse("--no-ui-poll").ui_poll is False


@pytest.mark.parametrize("value", ["0", "-3", "big", "", "5+10", "2.5"])
def test_a_bad_db_pool_is_a_one_line_error(value: str) -> None:
    with pytest.raises(ToolError) as err:
        _parse("--db-pool", value)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("--db-pool wants headroom (parallelism + 8), airflow")
    assert message.endswith(f"or a pool size of at least 1, not {value!r}")


def _env(opts: driver.Options, tmp_path: Path, scenario: str = "clean") -> dict[str, str]:
    cfg = StackConfig(
        venv=tmp_path / "v",
        home=tmp_path / "h",
        dag_file=tmp_path / "d.py",
        db_url=None,
        db_pool_size=driver.db_pool_size(opts, scenario),
        extra_env=driver.scenario_env(opts, scenario, driver.MAIN_DAG, tmp_path / "h"),
    )
    return AirflowStack(cfg, print).env


def test_what_each_db_pool_puts_into_the_stacks_environment(tmp_path: Path) -> None:
    size = driver.POOL_SIZE_ENV
    # No --db-pool: throughput runs at Airflow's own pool, the kill scenarios with the headroom.
    assert size not in _env(_opts(), tmp_path, "throughput")
    assert _env(_opts(), tmp_path)[size] == "24"  # clean: 16 + 8
    assert _env(_opts(db_pool="headroom"), tmp_path, "throughput")[size] == "24"
    assert size not in _env(_opts(db_pool="airflow"), tmp_path)  # Airflow's own 5
    assert driver.MAX_OVERFLOW_ENV not in _env(_opts(db_pool="airflow"), tmp_path)
    assert _env(_opts(db_pool="7"), tmp_path)[size] == "7"
    # --airflow-env is applied last and wins, also over --db-pool airflow.
    over = _opts(db_pool="airflow", airflow_env={size: "3"})
    assert _env(over, tmp_path)[size] == "3"


def test_pool_settings_say_what_the_components_get() -> None:
    assert driver.pool_settings(_opts(db_pool="headroom")) == {
        "db_pool": "headroom",
        "pool_size": 24,
        "max_overflow": 10,
        "pool_timeout_s": 30.0,
    }
    assert driver.pool_settings(_opts())["pool_size"] == 5  # throughput's default
    assert driver.pool_settings(_opts(), "clean")["pool_size"] == 24
    assert driver.pool_settings(_opts(db_pool="airflow"), "clean")["pool_size"] == 5
    assert driver.pool_text(_opts(db_pool="airflow")) == "db pool 5 + 10, timeout 30 s (Airflow's)"
    assert driver.pool_text(_opts()) == "db pool 5 + 10, timeout 30 s (Airflow's)"
    assert driver.pool_text(_opts(parallelism=8, db_pool="headroom")) == "db pool 16 + 10, timeout 30 s"
    # A session of scenarios with different pools names each one's.
    mixed = _opts(parallelism=8, scenarios=["clean", "throughput"])
    assert driver.pool_text(mixed) == (
        "clean: db pool 16 + 10, timeout 30 s; throughput: db pool 5 + 10, timeout 30 s (Airflow's)"
    )
    assert driver.pool_text(mixed, "clean") == "db pool 16 + 10, timeout 30 s"
    assert driver.scenario_db_pool(mixed) == "headroom"
    assert driver.scenario_db_pool(_opts(scenarios=["clean", "kill-queued"])) == "headroom"
    env = {
        driver.POOL_SIZE_ENV: "9",
        driver.MAX_OVERFLOW_ENV: "0",
        driver.ENGINE_ARGS_ENV: '{"pool_timeout": 5}',
    }
    assert driver.pool_text(_opts(airflow_env=env, db_pool="headroom")) == "db pool 9 + 0, timeout 5 s"
    odd = {driver.POOL_SIZE_ENV: "many", driver.ENGINE_ARGS_ENV: "[1]"}
    assert driver.pool_text(_opts(airflow_env=odd, db_pool="headroom")) == "db pool 24 + 10, timeout 30 s"

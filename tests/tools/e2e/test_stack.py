"""AirflowStack's process handling, with stand-in commands instead of Airflow components."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tools.measure.e2e import procfs
from tools.measure.e2e.stack import (
    EXECUTION_API,
    AirflowStack,
    Postgres,
    Process,
    StackConfig,
    StackError,
    find_pg_bindir,
)


def _stack(tmp_path: Path) -> AirflowStack:
    cfg = StackConfig(venv=tmp_path, home=tmp_path, dag_file=tmp_path / "dag.py", db_url=None)
    return AirflowStack(cfg, say=lambda _: None)


def test_restart_starts_the_component_again_and_stop_sweeps_both_sessions(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    # Each run leaves a process behind in its own session, as a scheduler killed mid-shutdown would.
    first = Process("scheduler", ["sh", "-c", "sleep 60 & exit 0"], tmp_path / "logs" / "scheduler.log")
    first.start(stack.env, tmp_path)
    stack.procs["scheduler"] = first
    assert first.popen is not None and first.popen.wait(10) == 0
    second = stack.restart("scheduler")
    assert stack.procs["scheduler"] is second and second.pid != first.pid
    assert stack.scheduler_pid == second.pid and stack.retired == [first]
    assert second.popen is not None and second.popen.wait(10) == 0
    left = procfs.session_members([first.pid, second.pid])
    assert len(left) == 2
    out = stack.stop(timeout=5)
    assert sorted(out["leftover_pids_killed"]["pids"]) == sorted(left)
    assert procfs.session_members([first.pid, second.pid]) == []


def test_restart_refuses_a_component_that_still_runs(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    proc = Process("scheduler", ["sleep", "60"], tmp_path / "logs" / "scheduler.log")
    proc.start(stack.env, tmp_path)
    stack.procs["scheduler"] = proc
    try:
        with pytest.raises(StackError, match=f"cannot restart scheduler: pid {proc.pid} is still running"):
            stack.restart("scheduler")
    finally:
        stack.stop(timeout=5)
    assert not proc.alive()


def test_split_api_runs_the_execution_api_in_an_api_server_of_its_own(tmp_path: Path) -> None:
    cfg = StackConfig(venv=tmp_path, home=tmp_path, dag_file=tmp_path / "dag.py", db_url=None, split_api=True)
    stack = AirflowStack(cfg, say=lambda _: None)
    argvs = stack.argvs()
    airflow = str(tmp_path / "bin" / "airflow")
    assert argvs["api-server"] == [airflow, "api-server", "--apps", "core"]
    assert argvs[EXECUTION_API] == [
        airflow,
        "api-server",
        "--apps",
        "execution",
        "--port",
        str(stack.execution_port),
    ]
    assert stack.execution_port != stack.api_port
    # Task processes reach the execution API there; the UI and REST stay on the api-server's port.
    assert (
        stack.env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]
        == f"http://127.0.0.1:{stack.execution_port}/execution/"
    )
    assert stack.env["AIRFLOW__API__PORT"] == str(stack.api_port)

    one = AirflowStack(
        StackConfig(venv=tmp_path, home=tmp_path, dag_file=tmp_path / "d.py", db_url=None), print
    )
    assert set(one.argvs()) == {"api-server", "scheduler", "dag-processor"}
    assert one.env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == f"{one.api}/execution/"


@pytest.mark.skipif(find_pg_bindir() is None, reason="needs Debian's PostgreSQL server binaries")
def test_postgres_restart_stops_the_server_and_serves_the_same_data_again() -> None:
    # The soak's restart-db fault: every connection closed, the server down, then back on its port.
    pg = Postgres(say=lambda _: None)
    try:
        pg.start()
        url = pg.new_database()
        dbname = url.rsplit("/", 1)[1]
        psql = [str(pg.bindir / "psql"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "airflow", "-d", dbname]
        subprocess.run([*psql, "-c", "create table t (n int); insert into t values (7)"], check=True)
        before = pg.proc.pid
        stopped, ready = pg.restart(0.5)
        assert pg.proc.pid != before and pg.proc.alive() and not procfs.alive([before])
        assert stopped < 20 and ready < 30
        got = subprocess.run(
            [*psql, "-At", "-c", "select n from t"], capture_output=True, text=True, check=True
        )
        assert got.stdout.strip() == "7"
    finally:
        pg.stop()
    assert not pg.root.exists()

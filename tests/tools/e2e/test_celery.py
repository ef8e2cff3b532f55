"""``--executor celery`` without Redis, PostgreSQL or Airflow: options, the Redis lifecycle, the
worker process groups (stand-in process trees), the SIGCHLD evidence and the lingering count."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tools.engine import fetch
from tools.measure.e2e import celery, cli, driver, lock, procfs
from tools.measure.e2e.celery import CeleryStack, ProcessGroup, Redis
from tools.measure.e2e.stack import StackConfig, StackError, free_port
from tools.shared import pins
from tools.shared.errors import ToolError
from tools.shared.layout import Layout

# -- options -------------------------------------------------------------------------------------


def test_celery_defaults_to_postgres_and_the_throughput_scenario() -> None:
    o = cli.parse_options(["--executor", "celery"])
    assert (o.executor, o.db, o.scenarios, o.stage, o.reap_sigchld) == (
        "celery",
        "postgres",
        ["throughput"],
        None,
        False,
    )
    assert cli.parse_options([]).db == "sqlite"


def test_celery_compares_the_unpatched_and_the_fixed_supervisor_in_rounds() -> None:
    o = cli.parse_options(
        [
            "--executor",
            "celery",
            "--compare-stages",
            "0,full",
            "--rounds",
            "3",
            "--tasks",
            "200",
            "--parallelism",
            "16",
        ]
    )
    assert (o.compare, o.rounds, o.tasks, o.parallelism) == ([0, None], 3, 200, 16)
    assert [driver.stage_label(s, "celery") for s in o.compare] == ["unpatched", "fixed"]
    assert driver.stage_label(None) == "full series"


def test_reap_sigchld_is_a_celery_option() -> None:
    assert cli.parse_options(["--executor", "celery", "--celery-reap-sigchld"]).reap_sigchld
    with pytest.raises(ToolError, match="--celery-reap-sigchld needs --executor celery"):
        cli.parse_options(["--celery-reap-sigchld"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--db", "sqlite"], "needs --db postgres"),
        (["--scenario", "kill-queued"], "runs throughput only .* not kill-queued"),
        (["--stage", "9"], "stage 9 means nothing there"),
        (["--compare-stages", "0,9"], "stage 9 means nothing there"),
        (["--supervisor", "full"], "no --supervisor"),
    ],
)
def test_celery_refuses_what_it_cannot_run_in_one_line(argv: list[str], message: str) -> None:
    with pytest.raises(ToolError, match=message) as info:
        cli.parse_options(["--executor", "celery", *argv])
    assert "\n" not in str(info.value)


def test_e2e_lock_celery_writes_its_own_file_with_the_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = pins.get_line("3.3")
    monkeypatch.setattr(fetch, "ensure_wheel", lambda line, layout: Path("unused.whl"))
    monkeypatch.setattr(lock, "oldest_python", lambda wheel: "3.10")
    monkeypatch.setattr(
        lock, "release_cutoff", lambda line, simple, core=None: datetime(2026, 9, 17, tzinfo=timezone.utc)
    )
    asked: list[str] = []

    def fake_compile(requirements: list[str], *args: str, **kw: str) -> str:
        asked.append("\n".join(requirements))
        return f"apache-airflow=={line.version}\napache-airflow-providers-celery==3.24.0\ncelery==5.6.3\n"

    target = lock.lock_line(line, Layout(root=tmp_path), lambda name: {}, fake_compile, celery=True)
    assert target == tmp_path / "constraints" / "e2e-celery-3.3.txt"
    assert asked[0].startswith(f"apache-airflow[postgres,celery]=={line.version}\n")
    assert "with CeleryExecutor" in target.read_text().splitlines()[0]

    def no_provider(*args: object, **kw: str) -> str:
        return f"apache-airflow=={line.version}\n"

    with pytest.raises(ToolError, match="did not pin apache-airflow-providers-celery"):
        lock.lock_line(line, Layout(root=tmp_path), lambda name: {}, no_provider, celery=True)


# -- Redis ---------------------------------------------------------------------------------------


def test_a_missing_redis_server_is_one_line_naming_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(celery, "find_redis_server", lambda: None)
    with pytest.raises(StackError, match=r"redis-server not found .*: apt-get install redis-server$") as info:
        Redis(say=lambda _: None)
    assert "\n" not in str(info.value)
    with pytest.raises(StackError, match="apt-get install redis-server"):
        Redis(say=lambda _: None, binary="/nonexistent/redis-server")


def test_the_config_is_loopback_only_without_persistence(tmp_path: Path) -> None:
    text = celery.redis_config(6399, tmp_path)
    for want in (
        "port 6399",
        "bind 127.0.0.1",
        "daemonize no",
        f"dir {tmp_path}",
        'save ""',
        "appendonly no",
    ):
        assert want in text.splitlines()


def test_nothing_answers_ping_on_a_free_port() -> None:
    assert not celery.redis_ping(free_port(), timeout=0.2)


@pytest.mark.skipif(celery.find_redis_server() is None, reason="redis-server is not installed")
def test_redis_starts_on_a_free_port_answers_and_is_gone_after_stop() -> None:
    with Redis(say=lambda _: None) as redis:
        assert redis.url == f"redis://127.0.0.1:{redis.port}/0"
        assert celery.redis_ping(redis.port)
        pid, root = redis.proc.pid, redis.root
        assert redis.config.read_text().startswith(f"port {redis.port}\n")
    assert not redis.proc.alive() and not celery.redis_ping(redis.port, timeout=0.2)
    assert procfs.session_members([pid]) == [] and not root.exists()


# -- worker process groups ------------------------------------------------------------------------

# A stand-in worker: ignores SIGTERM (as a warm shutdown waiting for a lingering task does), forks
# a pool child, which forks a task process in a process group of its own (task-sdk 1.3's setpgid);
# every one of them writes its pid to the file named by argv[1] and sleeps.
STAND_IN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
def mark():
    with open(sys.argv[1], "a") as f:
        f.write(f"{os.getpid()}\\n")
if os.fork() == 0:
    if os.fork() == 0:
        os.setpgid(0, 0)
    mark()
    time.sleep(300)
    os._exit(0)
mark()
time.sleep(300)
"""


def _pids_from(path: Path, n: int, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file():
            pids = [int(x) for x in path.read_text().split()]
            if len(pids) >= n:
                return pids
        time.sleep(0.05)
    raise AssertionError(f"the stand-in did not start {n} processes")


def _start_stand_in(group: ProcessGroup, tmp_path: Path, n: int) -> list[int]:
    marks = tmp_path / f"pids-{n}.txt"
    group.start(
        f"celery-worker-{n}",
        [sys.executable, "-c", STAND_IN, str(marks)],
        tmp_path / f"worker-{n}.log",
        dict(os.environ),
        tmp_path,
    )
    return _pids_from(marks, 3)


def test_stop_leaves_nothing_of_the_worker_trees_running(tmp_path: Path) -> None:
    group = ProcessGroup()
    pids = _start_stand_in(group, tmp_path, 1) + _start_stand_in(group, tmp_path, 2)
    assert sorted(group.members()) == sorted(pids)
    out = group.stop(timeout=1.0)
    assert procfs.alive(pids) == [] and group.members() == []
    assert out["celery-worker-1"]["graceful"] is False  # SIGTERM ignored: SIGKILLed after the bound
    assert sorted(out["leftover_pids_killed"]["pids"]) == sorted(set(pids) - {p.pid for p in group.procs})


def test_a_keyboard_interrupt_leaves_nothing_running(tmp_path: Path) -> None:
    pids: list[int] = []
    with pytest.raises(KeyboardInterrupt), ProcessGroup() as group:
        pids += _start_stand_in(group, tmp_path, 1)
        raise KeyboardInterrupt
    assert len(pids) == 3 and procfs.alive(pids) == []
    assert procfs.session_members(group.sids) == []


def test_a_celery_stack_waits_for_its_worker_and_stop_ends_the_worker_tree(tmp_path: Path) -> None:
    stack = _celery_stack(tmp_path)
    pids = _start_stand_in(stack.workers, tmp_path, 1)
    assert stack._not_ready("dag") == "celery-worker-1 ready"
    with open(stack.workers.procs[0].log, "a") as f:
        f.write("2026-12-05T23:36:30Z [info     ] lepatch1@vm ready.   [celery.apps.worker]\n")
    assert stack._not_ready("dag") == "api-server"  # the worker is ready; no api-server here
    out = stack.stop(timeout=1)
    assert procfs.alive(pids) == [] and out["celery-worker-1"]["graceful"] is False


# -- the stack's configuration ----------------------------------------------------------------------


def _celery_stack(tmp_path: Path, reap: bool = False) -> CeleryStack:
    cfg = StackConfig(
        venv=tmp_path,
        home=tmp_path,
        dag_file=tmp_path / "dag.py",
        db_url="postgresql+psycopg2://airflow@127.0.0.1:5999/airflow_1",
        parallelism=16,
    )
    return CeleryStack(cfg, lambda _: None, "redis://127.0.0.1:6399/0", reap_sigchld=reap)


def test_the_stack_runs_celery_executor_with_redis_and_the_database_as_result_backend(tmp_path: Path) -> None:
    env = _celery_stack(tmp_path).env
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CELERY__BROKER_URL"] == "redis://127.0.0.1:6399/0"
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"] == "db+postgresql://airflow@127.0.0.1:5999/airflow_1"
    assert env["AIRFLOW__CELERY__WORKER_CONCURRENCY"] == "16"


def test_the_stack_refuses_sqlite(tmp_path: Path) -> None:
    cfg = StackConfig(venv=tmp_path, home=tmp_path, dag_file=tmp_path / "d.py", db_url=None)
    with pytest.raises(StackError, match="--db postgres"):
        CeleryStack(cfg, lambda _: None, "redis://x")


def test_the_reap_hook_goes_to_the_worker_alone(tmp_path: Path) -> None:
    stack = _celery_stack(tmp_path, reap=True)
    env = stack.worker_env()
    assert env["AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS"] == "lepatch_celery_reap.CELERY_CONFIG"
    hook = Path(env["PYTHONPATH"]) / "lepatch_celery_reap.py"
    assert "os.waitpid(-1, os.WNOHANG)" in hook.read_text()
    compile(hook.read_text(), str(hook), "exec")
    assert "AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS" not in stack.env
    assert "AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS" not in _celery_stack(tmp_path / "plain").worker_env()


# -- SIGCHLD and lingering supervisors ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "want"),
    [
        ("signal.signal(signal.SIGCHLD, lambda *a: None)", "caught"),
        ("signal.signal(signal.SIGCHLD, signal.SIG_IGN)", "ignored"),
        ("pass", "default"),
    ],
)
def test_signal_disposition_reads_proc_status(code: str, want: str) -> None:
    p = subprocess.Popen(
        [sys.executable, "-c", f"import signal, sys, time\n{code}\nprint(flush=True)\ntime.sleep(30)"],
        stdout=subprocess.PIPE,
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == b"\n"
        assert procfs.signal_disposition(p.pid) == want
        assert celery.sigchld_report(os.getpid())["main"] in ("caught", "ignored", "default")
    finally:
        p.kill()
        p.wait()
    with pytest.raises(procfs.ProcGone):
        procfs.signal_disposition(p.pid)
    assert int(signal.SIGCHLD) == 17  # the bit /proc/PID/status shows it at


def test_lingering_are_the_ended_tasks_whose_supervisor_has_not_returned(tmp_path: Path) -> None:
    log = tmp_path / "celery-worker-1.log"
    log.write_text(
        "2026-12-05T23:39:41Z [info     ] Workload finished              [supervisor] duration=0.7 "
        "exit_code=0 final_state=success loc=supervisor.py:2658 workload_id=aaaa-1 "
        "workload_type=ExecuteTask\n"
        "2026-12-05T23:39:42Z [info     ] Task finished duration=0.7 task_instance_id=bbbb-2\n"
    )
    assert celery.finished_ids(log) == {"aaaa-1", "bbbb-2"}
    assert celery.lingering(["aaaa-1", "bbbb-2", "cccc-3"], log) == ["cccc-3"]
    assert celery.lingering(["x"], tmp_path / "missing.log") == ["x"]
    reaped = tmp_path / "reaped.txt"
    reaped.write_text("100 reaped 101 status 0\n100 reaped 102 status 0\n")
    assert celery.count_reaped(reaped) == 2 and celery.count_reaped(tmp_path / "none") == 0


def test_outcomes_count_how_the_celery_tasks_and_supervisors_ended(tmp_path: Path) -> None:
    log = tmp_path / "celery-worker-1.log"
    log.write_text(
        "[info] Task execute_workload[0a-1] succeeded in 0.9s: None\n"
        "[error] Task execute_workload[0a-2] raised unexpected: ServerResponseError()\n"
        "[warning] Task success overtime reached; terminating process. Modify `task_success_overtime` ...\n"
        "[warning] Process was reaped elsewhere; its exit status is unknown pid=12\n"
    )
    assert celery.outcomes(log) == {
        "celery_succeeded": 1,
        "celery_raised": 1,
        "success_overtime_kills": 1,
        "reaped_elsewhere_warnings": 1,
    }
    assert celery.outcomes(tmp_path / "none.log")["celery_succeeded"] == 0

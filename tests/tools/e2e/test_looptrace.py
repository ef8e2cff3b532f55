"""``--trace-loops``: the hook records the scheduler's loops from inside it, and the driver sums them up.

The hook is exercised in a real interpreter against a stand-in ``airflow`` package with the two
methods it wraps, loaded the way the e2e venv loads it (a ``.pth`` file in a site directory).
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tools.measure.e2e import looptrace, looptrace_hook, soak_check

FAKE_AIRFLOW = {
    "airflow/__init__.py": "",
    "airflow/jobs/__init__.py": "",
    "airflow/jobs/scheduler_job_runner.py": """
        import time

        class SchedulerJobRunner:
            n = 0

            def _do_scheduling(self, session=None):
                return self.n

            def _run_scheduler_loop(self):
                if self.n:
                    raise RuntimeError("the database went away")
    """,
    "airflow/executors/__init__.py": "",
    "airflow/executors/base_executor.py": """
        import time

        class BaseExecutor:
            def heartbeat(self):
                time.sleep(0.05)
    """,
}

# Two loops (one queues 3), two heartbeats; then a forked child (a worker) calls both and exits.
DRIVE = """
import os, site, sys
site.addsitedir(sys.argv[2])
sys.path.insert(0, sys.argv[3])
from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
from airflow.executors.base_executor import BaseExecutor
import airflow.jobs.scheduler_job_runner as module
# Wrapped or not, the method keeps its name and the module its source (tracebacks read it).
assert SchedulerJobRunner._do_scheduling.__name__ == "_do_scheduling"
assert "class SchedulerJobRunner" in module.__loader__.get_source(module.__name__)
runner, executor = SchedulerJobRunner(), BaseExecutor()
for n in (0, 3):
    runner.n = n
    assert runner._do_scheduling() == n
    executor.heartbeat()
    module.time.sleep(0.01)  # the loop's idle sleep, as the scheduler calls it
assert module.time.monotonic() > 0  # the rest of the module's time is time's
pid = os.fork()
if pid == 0:
    runner._do_scheduling()
    executor.heartbeat()
    os._exit(0)
os.waitpid(pid, 0)
"""


@pytest.fixture
def fake_airflow(tmp_path: Path) -> Path:
    root = tmp_path / "fake"
    for rel, body in FAKE_AIRFLOW.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(body))
    return root


def _drive(tmp_path: Path, fake: Path, role: str, trace: Path | None) -> None:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    looptrace.install(site)
    env = {"PATH": "/usr/bin:/bin"}
    if trace is not None:
        env[looptrace.ENV] = str(trace)
    subprocess.run([sys.executable, "-c", DRIVE, role, str(site), str(fake)], env=env, check=True, timeout=60)


def test_hook_records_each_loop_and_heartbeat_of_the_scheduler_only(tmp_path, fake_airflow):
    trace = tmp_path / "trace.txt"
    _drive(tmp_path, fake_airflow, "scheduler", trace)
    lines = trace.read_text().splitlines()
    # The forked child's calls are not recorded: the clock, then two loops, heartbeats and idle sleeps.
    assert [ln.split()[0] for ln in lines] == ["O", "S", "H", "W", "S", "H", "W"]
    assert [ln.split()[-1] for ln in lines if ln.startswith("S")] == ["0", "3"]
    got = looptrace.summarise(trace, 0.0, math.inf)
    assert got is not None
    assert (got.loops, got.busy_loops, got.queued) == (2, 1, 3)
    assert 0.1 <= got.heartbeat_s < 1.0
    assert 0.05 <= got.heartbeat_max_s <= got.heartbeat_s
    # A sleeping heartbeat uses next to no CPU: wall time there is time the scheduler was held up.
    assert got.heartbeat_cpu_s < got.heartbeat_s / 2
    # On the database's clock: the calls happened within the last minute.
    states = looptrace.scheduler_states(trace)
    assert [len(states[kind]) for kind in "SHW"] == [2, 2, 2]
    assert all(time.time() - 60 < start <= end <= time.time() for start, end in states["W"])


def test_scheduler_states_need_the_clock_line(tmp_path):
    trace = tmp_path / "trace.txt"
    trace.write_text("S 10.0 10.5 2.0 2.2 4\n")
    assert looptrace.scheduler_states(trace) == {}
    trace.write_text("O 1000.0\nW 12.0 13.0 2.5 2.5\nS 10.0 10.5 2.0 2.2 4\nH 10.5 11.0 2.2 2.3\n")
    assert looptrace.scheduler_states(trace) == {
        "S": [(1010.0, 1010.5)],
        "H": [(1010.5, 1011.0)],
        "W": [(1012.0, 1013.0)],
    }


def test_hook_is_inert_in_other_processes_and_without_a_trace_file(tmp_path, fake_airflow):
    trace = tmp_path / "trace.txt"
    _drive(tmp_path, fake_airflow, "api-server", trace)
    _drive(tmp_path, fake_airflow, "scheduler", None)
    assert not trace.exists()
    assert not looptrace_hook.install(["airflow", "scheduler"], {})
    assert not looptrace_hook.install(["airflow", "dag-processor"], {looptrace.ENV: str(trace)})
    assert not trace.exists()


def test_install_then_uninstall_leaves_the_site_as_it_was(tmp_path, fake_airflow):
    site = tmp_path / "site"
    (site / "__pycache__").mkdir(parents=True)
    (site / "other.pth").write_text("")
    before = sorted(p.name for p in site.rglob("*"))
    looptrace.install(site)
    assert (site / "lepatch_looptrace.pth").read_text().startswith("import lepatch_looptrace;")
    (site / "__pycache__" / "lepatch_looptrace.cpython-311.pyc").write_bytes(b"")
    looptrace.uninstall(site)
    looptrace.uninstall(site)  # twice: nothing left to remove is fine
    assert sorted(p.name for p in site.rglob("*")) == before


def test_summarise_counts_only_calls_that_started_in_the_window(tmp_path):
    trace = tmp_path / "trace.txt"
    trace.write_text(
        "S 5.0 5.2 1.0 1.1 16\n"  # before the trigger
        "S 10.0 10.5 2.0 2.2 4\n"
        "H 10.5 13.5 2.2 2.25\n"  # a heartbeat that blocked 3 s
        "S 13.5 13.6 2.25 2.3 0\n"
        "H 13.6 13.7 2.3 2.31\n"
        "garbage line\n"
        "S 30.0 30.1 3.0 3.1 2\n"  # after the run
    )
    got = looptrace.summarise(trace, 10.0, 20.0)
    assert got is not None
    assert (got.loops, got.busy_loops, got.queued) == (2, 1, 4)
    assert got.scheduling_cpu_s == pytest.approx(0.25)
    assert got.heartbeat_s == pytest.approx(3.1)
    assert got.heartbeat_max_s == pytest.approx(3.0)
    assert got.heartbeat_cpu_s == pytest.approx(0.06)
    assert "31% of the run" in got.text() and "4.0 queued per busy loop" in got.text()
    assert looptrace.summarise(trace, 40.0, 50.0) is None
    assert looptrace.summarise(tmp_path / "missing.txt", 0.0, 1.0) is None


def test_compare_gives_each_stage_its_medians(tmp_path):
    def trace(loops: int, hb: float) -> looptrace.LoopTrace:
        return looptrace.LoopTrace(loops, loops // 2, 200, 0.1 * loops, hb, hb / 2, 0.01, 40.0)

    text = looptrace.compare(
        [
            ("stage 0", [(trace(30, 18.0), 7.0), (trace(28, 16.0), 6.8), (trace(32, 20.0), 7.2)]),
            ("full series", [(trace(64, 0.2), 10.3)]),
            ("stage 5", []),
        ],
        "title",
    )
    rows = {ln.split("  ")[0].strip(): ln for ln in text.splitlines()[2:]}
    assert rows["stage 0"].split()[2:5] == ["3", "30", "15"]
    assert "7.0s" in rows["stage 0"] and "18.00s" in rows["stage 0"] and "45%" in rows["stage 0"]
    assert rows["full series"].split()[2:4] == ["1", "64"]
    assert "(no trace)" in rows["stage 5"]


# The loop ends twice: once returning, once raising; then a forked child's loop ends (not recorded).
DRIVE_EXITS = """
import os, site, sys
site.addsitedir(sys.argv[2])
sys.path.insert(0, sys.argv[3])
from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
assert SchedulerJobRunner._run_scheduler_loop.__name__ == "_run_scheduler_loop"
runner = SchedulerJobRunner()
runner._run_scheduler_loop()
runner.n = 1
try:
    runner._run_scheduler_loop()
except RuntimeError:
    pass
else:
    raise AssertionError("the wrapper swallowed the exception")
pid = os.fork()
if pid == 0:
    runner.n = 0
    runner._run_scheduler_loop()
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_hook_records_when_the_scheduler_loop_ends_returned_or_raised(tmp_path, fake_airflow):
    # The soak tells a SIGTERM to a scheduler already ending its executor (its loop over: "signal
    # again") from a first one by this record (soak_check.shutdown_hits).
    site = tmp_path / "site"
    site.mkdir()
    looptrace.install(site)
    trace = tmp_path / "trace.txt"
    env = {"PATH": "/usr/bin:/bin", looptrace.ENV: str(trace)}
    argv = [sys.executable, "-c", DRIVE_EXITS, "scheduler", str(site), str(fake_airflow)]
    before = time.monotonic()
    subprocess.run(argv, env=env, check=True, timeout=60)
    lines = trace.read_text().splitlines()
    assert [ln.split()[0] for ln in lines] == ["O", "X", "X"]
    ends = soak_check.read_loop_exits(trace)
    assert len(ends) == 2 and before <= ends[0] <= ends[1] <= time.monotonic()

"""Processes: wchan classes, worker titles, the idle worker holding the read lock, live processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tools.measure.e2e import procfs


@pytest.mark.parametrize(
    ("wchan", "kind"),
    [
        ("pipe_read", "pipe_read"),
        ("anon_pipe_read", "pipe_read"),  # kernels >= 6.x
        ("pipe_write", "pipe_write"),
        ("anon_pipe_write", "pipe_write"),
        ("futex_wait_queue_me", "futex"),
        ("futex_wait_queue", "futex"),
        ("futex_do_wait", "futex"),
        ("0", "running"),
        ("", "running"),
        ("do_sys_poll", "other"),
        ("ep_poll", "other"),
    ],
)
def test_classify_wchan(wchan: str, kind: str) -> None:
    assert procfs.classify_wchan(wchan) == kind


@pytest.mark.parametrize(
    ("title", "busy"),
    [
        ("airflow worker -- LocalExecutor: <idle>", None),
        ("airflow worker -- LocalExecutor [team_a]: <idle>", None),
        (
            "airflow worker -- LocalExecutor: 01a22a31-c6c4-704d-89b7-1cb8ab766638",
            "01a22a31-c6c4-704d-89b7-1cb8ab766638",
        ),
        ("airflow worker -- LocalExecutor [team_a]: abc", "abc"),
        ("airflow scheduler", None),
        ("airflow worker -- LocalExecutor:", None),
    ],
)
def test_worker_busy_with(title: str, busy: str | None) -> None:
    assert procfs.worker_busy_with(title) == busy


def _worker(pid: int, wchan: str, busy: str | None = None, children: tuple[int, ...] = ()) -> procfs.Worker:
    title = f"airflow worker -- LocalExecutor: {busy or '<idle>'}"
    return procfs.Worker(pid, title, wchan, children)


def test_lock_holder_is_the_only_idle_pipe_reader() -> None:
    workers = [
        _worker(10, "futex_do_wait"),
        _worker(11, "anon_pipe_read"),
        _worker(12, "futex_do_wait"),
        # A busy worker's supervisor may sit in a pipe read of its own: not the queue's reader.
        _worker(13, "anon_pipe_read", busy="ti-1", children=(99,)),
    ]
    holder, shared = procfs.find_read_lock_holder(workers)
    assert (holder.pid, shared) == (11, True)


def test_a_queue_per_worker_has_no_lock_holder_but_a_reader_to_kill() -> None:
    workers = [_worker(10, "pipe_read"), _worker(11, "anon_pipe_read"), _worker(12, "pipe_read")]
    holder, shared = procfs.find_read_lock_holder(workers)
    assert (holder.pid, shared) == (10, False)


@pytest.mark.parametrize(
    "wchans",
    [
        ["futex_do_wait", "futex_do_wait"],  # nobody reads: the lock holder is gone already
        ["pipe_read", "futex_do_wait", "do_sys_poll"],  # one worker neither reads nor waits
        [],
    ],
)
def test_lock_holder_ambiguous_is_an_error_naming_the_wchans(wchans: list[str]) -> None:
    workers = [_worker(20 + i, w) for i, w in enumerate(wchans)]
    with pytest.raises(procfs.NoLockHolder, match="expected one idle worker in a pipe read"):
        procfs.find_read_lock_holder(workers)


def test_stat_of_this_process() -> None:
    st = procfs.stat(os.getpid())
    assert st.pid == os.getpid()
    assert st.ppid == os.getppid()
    assert st.state in "RS"
    assert st.sid == os.getsid(0)
    assert procfs.ancestors(os.getpid())[:1] == [os.getppid()] and procfs.ancestors(2**22 + 12345) == []
    assert procfs.cmdline(os.getpid()) in procfs.titles()
    assert procfs.thread_wchans(os.getpid()) and procfs.thread_wchans(2**22 + 12345) == []


def test_vanished_process_raises_procgone() -> None:
    with pytest.raises(procfs.ProcGone):
        procfs.cmdline(2**22 + 12345)
    assert procfs.or_gone(procfs.wchan, 2**22 + 12345) == procfs.title_of(2**22 + 12345) == "gone"
    assert procfs.title_of(os.getpid()) not in ("", "gone")


def test_alive_as_tells_a_process_from_one_that_reused_its_pid() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        st = procfs.stat(child.pid).starttime
        assert procfs.alive_as(child.pid, st) and procfs.alive_as(child.pid, 0)  # 0: the pid alone
        assert not procfs.alive_as(child.pid, st + 1) and procfs.state(child.pid, st + 1) == "gone"
        child.kill()
        while procfs.state(child.pid) != "Z":  # killed, not yet waited for
            time.sleep(0.01)
        assert not procfs.alive_as(child.pid, st) and procfs.alive([child.pid, os.getpid()]) == [os.getpid()]
    finally:
        child.kill()
        child.wait()
    assert procfs.state(child.pid, st) == "gone" and not procfs.alive_as(child.pid, st)


def test_descendants_walks_the_whole_tree_below_a_pid() -> None:
    stats = [
        procfs.Stat(10, "S", 1, 10),  # the scheduler
        procfs.Stat(11, "S", 10, 11),  # a worker (its own session)
        procfs.Stat(12, "S", 11, 11),  # its task process
        procfs.Stat(13, "Z", 12, 11),  # what that started, exited
        procfs.Stat(14, "S", 10, 10),  # another worker
        procfs.Stat(20, "S", 1, 20),  # unrelated
    ]
    assert sorted(procfs.descendants(10, stats)) == [11, 12, 13, 14]
    assert procfs.descendants(14, stats) == []
    assert os.getpid() not in procfs.descendants(os.getpid())


def test_cpu_times_of_this_process_grow_with_work_and_count_reaped_children() -> None:
    def me() -> procfs.Cpu:
        return next(c for c in procfs.cpu_all() if c.pid == os.getpid())

    before = me()
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    busy = me()
    assert busy.own >= before.own + 0.1 and (busy.pid, busy.created) == (before.pid, before.created)
    spin = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)
    assert me().reaped >= busy.reaped + 0.2  # the reaped child's time

"""The session runner both ``nox -s e2e`` and ``nox -s soak`` go through, driven with workloads of
its own (no venv, no stack): the stages' order and homes, the servers' shielded stop, the signals."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tools.measure.e2e import cli, driver, session, soak


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    # A process started in the background by a script inherits SIGINT ignored: set what is tested.
    launched_with = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, launched_with)


def test_a_cleanup_is_shielded_from_ctrl_c_and_sigterm(sigint_raises: None) -> None:
    before = signal.getsignal(signal.SIGINT)
    with session.shielded():
        os.kill(os.getpid(), signal.SIGINT)  # ignored: no KeyboardInterrupt in the middle of a stop
        os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) == before
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the handler runs at the latest here


class _Venv:
    python = path = Path("/nonexistent")

    def ensure(self) -> None:
        pass


class _Work:
    """A workload that records what the runner hands it; ``act`` runs in each stage."""

    def __init__(self, out: Path, stages: list[int | None], rounds: int = 1, **needs: bool):
        self.out, self.planned, self.rounds = out, stages, rounds
        self.needs = session.Needs(**needs)
        self.seen: list[tuple[session.Stage, object]] = []
        self.finished: list[Any] = []
        self.act: Callable[[], None] = lambda: None

    def stages(self, workdir: Path) -> list[session.Stage]:
        return session.plan(workdir, self.planned, driver.stage_label, self.rounds)

    def venv(self, say: Callable[[str], None]) -> Any:
        return _Venv()

    def begin(self, say: Callable[[str], None]) -> None:
        say("begin")

    def run_stage(self, st: session.Stage, shared: session.Shared, say: Callable[[str], None]) -> str:
        self.seen.append((st, shared.pg))
        self.act()
        return st.label

    def finish(
        self, shared: session.Shared, results: list[str], secs: float, say: Callable[[str], None]
    ) -> int:
        self.finished = [shared.workdir.parent, results]
        return 7


def test_the_stages_run_interleaved_each_round_in_a_home_of_its_own(tmp_path: Path) -> None:
    said: list[str] = []
    work = _Work(tmp_path, [0, None], rounds=2)
    assert session.run(work, said.append) == 7  # the workload's own status
    assert [(st.stage, st.round, st.home.name) for st, _ in work.seen] == [
        (0, 1, "stage-0-round1"),
        (None, 1, "full-series-round1"),
        (0, 2, "stage-0-round2"),
        (None, 2, "full-series-round2"),
    ]
    assert work.finished == [tmp_path, ["stage 0", "full series"] * 2]
    assert said[0] == "begin" and "\n#### round 2 of 2: full series" in said


def test_the_e2e_and_the_soak_keep_their_own_homes_and_say_what_they_need(tmp_path: Path) -> None:
    # One e2e stage runs in the session's directory itself; the soak nests even one stage.
    assert [s.home for s in driver.E2e(cli.parse_options([])).stages(tmp_path)] == [tmp_path]
    argv = ["--compare-stages", "0,full", "--rounds", "2", "--executor", "celery"]
    e2e = driver.E2e(cli.parse_options(argv))
    assert [s.home.name for s in e2e.stages(tmp_path)][:2] == ["unpatched-round1", "fixed-round1"]
    assert e2e.needs == session.Needs(postgres=True, redis=True, trace_loops=True)
    assert driver.E2e(cli.parse_options([])).needs == session.Needs()
    import argparse

    p = argparse.ArgumentParser()
    soak.add_arguments(p)
    one = soak.Soak(soak.options_from(p.parse_args(["--stage", "full"])))
    assert [s.home for s in one.stages(tmp_path)] == [tmp_path / "full-series"]
    assert one.needs == session.Needs(postgres=True, trace_loops=True)


class _Server:
    """A server whose stop gets a Ctrl-C, as a second Ctrl-C during the cleanup would send."""

    stops: ClassVar[list[str]] = []

    def __init__(self, say: Callable[[str], None]) -> None:
        self.bindir, self.port, self.root = Path("/usr/lib/postgresql/16/bin"), 5432, Path("/tmp/pg")

    def start(self) -> None:
        pass

    def stop(self) -> dict[str, Any]:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)  # where a handler would raise, if one were installed
        self.stops.append("stopped")
        return {"leftover_pids_killed": {"pids": [41, 42]}}


def test_a_sigterm_interrupts_the_session_and_its_servers_stop_shielded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sigint_raises: None
) -> None:
    monkeypatch.setattr(session, "Postgres", _Server)
    _Server.stops = []
    work = _Work(tmp_path, [0, None], postgres=True)
    work.act = lambda: os.kill(os.getpid(), signal.SIGTERM)
    before = signal.getsignal(signal.SIGTERM)
    said: list[str] = []
    assert session.run(work, said.append) == 130
    assert len(work.seen) == 1 and isinstance(work.seen[0][1], _Server)  # the first stage had it
    assert work.finished == []  # no report of an interrupted session
    assert _Server.stops == ["stopped"]  # the Ctrl-C during the stop did not cut it short
    assert said[1] == "postgres 16 on 127.0.0.1:5432, data in /tmp/pg"
    assert signal.getsignal(signal.SIGTERM) == before
    # A stage's stack stops the same way, and what the stop had to kill is said.
    assert session.stop(_Server(said.append), said.append) == {"leftover_pids_killed": {"pids": [41, 42]}}  # type: ignore[arg-type]
    assert said[-1] == "  killed leftover processes: [41, 42]" and _Server.stops == ["stopped"] * 2


def test_the_scenarios_say_what_they_need() -> None:
    assert list(driver.SCENARIOS)[5:] == ["kill-orphan", "throughput", "queued-timeout", "scale"]
    assert driver.DEFAULT_SCENARIOS == (
        "clean",
        "kill-running",
        "kill-queued",
        "kill-idle-reader",
        "sigterm-running",
    )
    assert {"throughput"} == driver.AIRFLOW_POOL_SCENARIOS
    assert [n for n, s in driver.SCENARIOS.items() if not s.judged] == ["scale"]
    assert [n for n, s in driver.SCENARIOS.items() if s.poll_interval] == ["throughput", "scale"]
    assert driver.SCENARIOS["kill-queued"].during is driver.kill_queued
    assert driver.SCENARIOS["clean"].during is driver.Scenario.during

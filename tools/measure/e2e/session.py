"""The one session runner of ``nox -s e2e`` and ``nox -s soak``.

A session is a :class:`Workload` (the e2e's scenarios, or the soak) run once per stage: ``run()``
makes the session's directory (``<out>/<stamp>``), sets up the line's venv, records the scheduler's
loops if the workload asks for it (the hook installed for the session), starts the servers it needs
once for every stage (PostgreSQL, Redis), then hands each stage in turn (``--compare-stages``, times
``--rounds``, interleaved: 0,9,0,9) a home of its own, and last lets the workload write its report.

A SIGTERM (nox's on Ctrl-C, a kill) is a KeyboardInterrupt for the whole session, so that every
``finally`` stops what was started; those stops (the servers here, each stage's stack in
``stop()``) are :func:`shielded`: a second Ctrl-C or SIGTERM cannot cut them short.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tools.engine import venvs
from tools.measure.e2e import looptrace
from tools.measure.e2e.celery import Redis
from tools.measure.e2e.stack import AirflowStack, Postgres
from tools.shared.layout import DEFAULT as LAYOUT

if TYPE_CHECKING:
    from tools.measure.e2e.venv import AirflowVenv

R = TypeVar("R")


@dataclass(frozen=True)
class Needs:
    """What a workload needs beside its stacks, started once for all its stages."""

    postgres: bool = False
    redis: bool = False
    trace_loops: bool = False  # the loop trace hook in the venv (tools.measure.e2e.looptrace)


@dataclass
class Shared:
    """What every stage of one session gets: where it writes, the venv, the servers."""

    workdir: Path
    stamp: str
    venv: AirflowVenv
    pg: Postgres | None = None
    redis: Redis | None = None


@dataclass(frozen=True)
class Stage:
    """One stage's turn: the executor stage (None: the full series), its label, round and home."""

    stage: int | None
    label: str
    round: int
    home: Path


class Workload(Protocol[R]):
    """The e2e's scenarios or the soak, as the runner drives them."""

    out: Path
    needs: Needs

    def stages(self, workdir: Path) -> list[Stage]: ...

    def venv(self, say: Callable[[str], None]) -> AirflowVenv: ...

    def begin(self, say: Callable[[str], None]) -> None: ...

    def run_stage(self, stage: Stage, shared: Shared, say: Callable[[str], None]) -> R: ...

    def finish(
        self, shared: Shared, results: list[R], session_s: float, say: Callable[[str], None]
    ) -> int: ...


def plan(
    workdir: Path,
    stages: Sequence[int | None],
    label: Callable[[int | None], str],
    rounds: int = 1,
    nest_single: bool = True,
) -> list[Stage]:
    """Each stage ``rounds`` times, interleaved, each in ``<workdir>/<label>`` (``-roundN`` with more
    than one round; ``workdir`` itself for a single stage unless ``nest_single``)."""
    out = []
    for n in range(1, rounds + 1):
        for stage in stages:
            name = label(stage)
            home = workdir if len(stages) == 1 and not nest_single else workdir / name.replace(" ", "-")
            if rounds > 1:
                home = home.with_name(f"{home.name}-round{n}")
            out.append(Stage(stage, name, n, home))
    return out


def run(work: Workload[Any], say: Callable[[str], None] = print) -> int:
    """The session: its directory, venv, servers and stages, then the workload's report; 130 when
    interrupted (Ctrl-C, or a SIGTERM: nox's on Ctrl-C, a kill), once everything it started is stopped."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    workdir = work.out / stamp
    workdir.mkdir(parents=True, exist_ok=True)
    old = signal.signal(signal.SIGTERM, _interrupt)  # so that every `finally` below runs
    try:
        work.begin(say)
        venv = work.venv(say)
        venv.ensure()
        shared = Shared(workdir, stamp, venv)
        site = venvs.purelib(venv.python) if work.needs.trace_loops else None
        stages = work.stages(workdir)
        results: list[Any] = []
        t_session = time.monotonic()
        try:
            if site is not None:
                looptrace.install(site)
            if work.needs.postgres:
                pg = shared.pg = Postgres(say)
                pg.start()
                say(f"postgres {pg.bindir.parent.name} on 127.0.0.1:{pg.port}, data in {pg.root}")
            if work.needs.redis:
                redis = shared.redis = Redis(say)
                redis.start()
                say(f"redis-server ({redis.binary}) on 127.0.0.1:{redis.port}, config {redis.config}")
            rounds = max(s.round for s in stages) if stages else 1
            for st in stages:
                if rounds > 1:
                    say(f"\n#### round {st.round} of {rounds}: {st.label}")
                results.append(work.run_stage(st, shared, say))
        finally:
            with shielded():
                if shared.redis is not None:
                    shared.redis.stop()
                if shared.pg is not None:
                    shared.pg.stop()
                if site is not None:
                    looptrace.uninstall(site)
        return work.finish(shared, results, round(time.monotonic() - t_session, 1), say)
    except KeyboardInterrupt:
        print("interrupted; every started process was stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)


def launch(stack: AirflowStack, dag_id: str, timeout: float = 120.0) -> tuple[float, float]:
    """Start a stage's stack and wait until it is ready for ``dag_id``: (db migrate s, ready s)."""
    t_launch = time.monotonic()
    stack.launch()
    migrate = round((stack.launched_at or t_launch) - t_launch, 2)
    return migrate, round(stack.wait_ready(dag_id, timeout), 2)


def stop(stack: AirflowStack, say: Callable[[str], None]) -> dict[str, Any]:
    """Stop a stage's stack, shielded; how each component ended, and what the stop had to kill."""
    with shielded():
        info = stack.stop()
    if info.get("leftover_pids_killed"):
        say(f"  killed leftover processes: {info['leftover_pids_killed']['pids']}")
    return info


def write_report(path: Path, report: Any, also: Path | None = None) -> str:
    """The report as JSON at ``path`` (and the same at ``also``, the latest one's fixed name); the
    line that says where."""
    text = json.dumps(report, indent=2, default=str) + "\n"
    path.write_text(text)
    if also is not None:
        also.write_text(text)
    return f"report: {LAYOUT.rel(path)}" + (f" (also {LAYOUT.rel(also)})" if also else "")


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Let a cleanup finish: neither Ctrl-C nor SIGTERM interrupts it (they are ignored meanwhile)."""
    before = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")

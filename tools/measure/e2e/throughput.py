"""The ``throughput`` scenario's figures and the table that compares them across stages (pure).

From the task instances the REST API lists at the end of a run (``queued_when``,
``start_date``, ``end_date``) and the run itself:

wall
    first task instance queued -> last task instance ended, in seconds: what the scheduler and
    the executor spent getting the tasks through (the trigger and the dag run's own creation,
    the same for every stage, are left out).
tasks/s
    task instances that ended, divided by ``wall``.
queued-to-start p50 / p95
    per task instance, ``start_date - queued_when``: how long a queued task waited for a worker
    to start it (linear-interpolated percentiles).
scheduled-to-start p50 / p95
    per task instance, ``start_date - scheduled_when``: the whole wait, including the time a
    stage keeps a task ``scheduled`` before it queues it (None where the API has no
    ``scheduled_when``).
run wall
    the dag run's ``start_date -> end_date``, for reference (it adds up to one scheduler loop).
stalls
    task instances whose worker was still busy ``STALL_FRACTION`` of ``[workers]
    min_heartbeat_interval`` or more after the task ended: the supervisor's ``Workload finished``
    (3.3 on) or ``Task finished`` (3.1, 3.2) line with its ``duration=`` (the scheduler's log)
    against the task instance's ``end_date - start_date``. task-sdk's supervisor polls for its task
    process's exit after the last socket closes and, when the process is not reaped yet (it is
    still closing the descriptors it inherited), sleeps in ``select`` on no descriptor at all for
    that interval (5 s by default). The executor cannot give that worker anything meanwhile,
    whatever its stage: a run with many stalls is slower for a reason outside the executor, so read
    the walls with this column.
failed
    task instances the API lists as ``failed`` (the throughput DAG has ``retries=0``).
api-server pool timeouts
    requests the api-server failed because its SQLAlchemy pool had no connection for them within
    ``pool_timeout`` (SQLAlchemy's ``QueuePool limit of size N overflow M reached, connection timed
    out, timeout T``), counted from its log by ``count_pool_timeouts``: a task supervisor whose start
    (``PATCH .../run``) waits there gives up after ``[workers] execution_api_timeout`` (5 s) and
    retries, and the start fails when the request that did get through finds the task no longer
    queued. The e2e stack's pool (``--db-pool``, :mod:`tools.measure.e2e.driver`) decides whether
    this happens at all; it is not the executor's doing.

The table's ``q>s`` columns are queued-to-start, ``s>s`` scheduled-to-start.
The table's ``failed`` and ``pool t/o`` columns give each round's count, every round (a failed
round's too: those are the rounds that have them), where the other columns hold the medians of
the passed rounds.
``median_of`` folds several rounds of one stage into one row (field-wise medians).
``compare`` puts one row per stage next to the first stage's (normally stage 0, the unpatched
base) as ratios, and ``target_misses`` checks issue 15's targets: with >= ``LARGE_RUN`` tasks,
throughput >= ``MIN_THROUGHPUT_RATIO`` x and queued-to-start p95 no worse than the base; with
fewer (the 30-task run), wall time within ``MAX_WALL_RATIO`` x of the base.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

MIN_THROUGHPUT_RATIO = 0.97
MAX_WALL_RATIO = 1.05
LARGE_RUN = 100  # from this many tasks on, the throughput and p95 targets apply
# A worker busy this share of min_heartbeat_interval longer than its task ran is in the supervisor's
# exit-poll sleep; what the supervisor does around a task otherwise takes a tenth of a second or so.
STALL_FRACTION = 0.6
DEFAULT_MIN_HEARTBEAT_INTERVAL = 5.0  # Airflow's [workers] min_heartbeat_interval
# task-sdk 1.1 and 1.2 (Airflow 3.1, 3.2) say "Task finished ... task_instance_id=", 1.3 on
# "Workload finished ... workload_id=".
_FINISHED = re.compile(
    r"(?:Task|Workload) finished.*?duration=([0-9.]+).*?(?:task_instance_id|workload_id)=([0-9a-f-]+)"
)
# SQLAlchemy's QueuePool (sqlalchemy/pool/impl.py, 2.0): "QueuePool limit of size %d overflow %d
# reached, connection timed out, timeout %0.2f"; the async engine's pool raises the same text.
POOL_TIMEOUT_TEXT = "QueuePool limit of size"
# The public API's database-error handler (airflow.api_fastapi.common.exceptions, 3.3: "Error with id
# ..., statement: ...") logs the traceback's frames only, without the message: there a timeout is a
# traceback whose last frame is the pool's _do_get raising it (nothing after it but the logger's name).
POOL_TIMEOUT_FRAME = re.compile(r"in _do_get\n +raise exc\.TimeoutError\(\n(?: *\^+\n)?(?= \[|\Z)")
# A log record starts with its timestamp (Airflow's console format) or is one JSON object; the lines
# after it up to the next record (a traceback) belong to it.
_RECORD_START = re.compile(r'^(?:\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d|\{")', re.MULTILINE)
# uvicorn logs every exception a request raised once, with this event; the execution API's own
# handler logs it once before that (``Handle died with an error``) and re-raises it to uvicorn.
ASGI_ERROR = "Exception in ASGI application"
EXECUTION_API_ERROR = "Handle died with an error"


def parse_ts(ts: str | None) -> datetime | None:
    """An API timestamp (``...Z`` or ``...+00:00``), or None."""
    if not ts:
        return None
    # Python 3.10's fromisoformat does not take the API's "Z" suffix.
    return datetime.fromisoformat(ts[:-1] + "+00:00" if ts.endswith("Z") else ts)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) with linear interpolation between ranks; None if empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Figures:
    tasks: int  # task instances the API listed
    ended: int  # of those, with an end_date
    wall_s: float | None
    tasks_per_s: float | None
    q2s_p50_s: float | None
    q2s_p95_s: float | None
    q2s_max_s: float | None
    run_wall_s: float | None
    s2s_p50_s: float | None = None
    s2s_p95_s: float | None = None
    stalls: float | None = None  # a count; a float only as the median of several rounds
    failed: float | None = None  # task instances in state failed (a count, as stalls)
    pool_timeouts: float | None = None  # the api-server's pool timeouts (a count; None: no log)

    def as_json(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    def text(self) -> str:
        return (
            f"{self.ended}/{self.tasks} tasks in {_f(self.wall_s, 's')} "
            f"({_f(self.tasks_per_s, '', 2)} tasks/s); "
            f"queued-to-start p50 {_f(self.q2s_p50_s, 's', 2)}, p95 {_f(self.q2s_p95_s, 's', 2)}, "
            f"max {_f(self.q2s_max_s, 's', 2)}; scheduled-to-start p50 {_f(self.s2s_p50_s, 's', 2)}, "
            f"p95 {_f(self.s2s_p95_s, 's', 2)}; run start->end {_f(self.run_wall_s, 's')}; "
            f"supervisor stalls {_f(self.stalls, '', 0)}; failed {_f(self.failed, '', 0)}; "
            f"api-server pool timeouts {_f(self.pool_timeouts, '', 0)}"
        )


def _f(v: float | None, unit: str, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}{unit}"


def stalls(
    tis: Iterable[dict[str, Any]], scheduler_log: Path, min_heartbeat_interval: float | None = None
) -> int | None:
    """How many task instances kept their worker in the supervisor's exit-poll sleep (None: no log)."""
    interval = DEFAULT_MIN_HEARTBEAT_INTERVAL if min_heartbeat_interval is None else min_heartbeat_interval
    threshold = STALL_FRACTION * interval
    try:
        text = scheduler_log.read_text(errors="replace")
    except OSError:
        return None
    ran: dict[str, float] = {}
    for d in tis:
        start, end = parse_ts(d.get("start_date")), parse_ts(d.get("end_date"))
        if d.get("id") and start is not None and end is not None:
            ran[str(d["id"])] = (end - start).total_seconds()
    count = 0
    for match in _FINISHED.finditer(text):
        took, ti_id = float(match.group(1)), match.group(2)
        if ti_id in ran and took - ran[ti_id] >= threshold:
            count += 1
    return count


def _records(text: str) -> list[str]:
    """A log's records: each timestamped (or JSON) line with the lines that follow it."""
    starts = [m.start() for m in _RECORD_START.finditer(text)]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    return [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]


def read_log(log: Path) -> str | None:
    """A component's log, read once for every count taken from it (None: no log)."""
    try:
        return log.read_text(errors="replace")
    except OSError:
        return None


def pool_timeouts(log: Path) -> int | None:
    """``count_pool_timeouts`` of a component's log (None: no log)."""
    text = read_log(log)
    return None if text is None else count_pool_timeouts(text)


def count_pool_timeouts(text: str) -> int:
    """How many times a component failed to get a database connection within ``pool_timeout``,
    from its log's ``text``.

    Each log record (a line and its traceback) that carries SQLAlchemy's message, or ends in the
    frame that raises it with no message (``POOL_TIMEOUT_FRAME``), is one timeout, except that a
    request's timeout is logged twice by the api-server: uvicorn's ``Exception in ASGI
    application`` for every request that raised, and before it the execution API's ``Handle died
    with an error``. Of those two kinds the larger count is taken (each is at most one per
    request), and records of any other kind are added.
    """
    if POOL_TIMEOUT_TEXT not in text and not POOL_TIMEOUT_FRAME.search(text):
        return 0
    asgi = handled = other = 0
    for record in _records(text):
        if POOL_TIMEOUT_TEXT not in record and not POOL_TIMEOUT_FRAME.search(record):
            continue
        head = record.split("\n", 1)[0]
        if ASGI_ERROR in head:
            asgi += 1
        elif EXECUTION_API_ERROR in head:
            handled += 1
        else:
            other += 1
    return max(asgi, handled) + other


def figures(
    tis: Iterable[dict[str, Any]],
    run: dict[str, Any] | None = None,
    scheduler_log: Path | None = None,
    min_heartbeat_interval: float | None = None,
    api_log_text: str | None = None,
) -> Figures:
    """The figures of one run from the API's task-instance records (and the run record); the
    stalls from ``scheduler_log`` and the pool timeouts from ``api_log_text`` (the api-server's
    log, as ``read_log`` gives it: None, no log)."""
    tis = list(tis)
    queued = [q for q in (parse_ts(d.get("queued_when")) for d in tis) if q is not None]
    ends = [e for e in (parse_ts(d.get("end_date")) for d in tis) if e is not None]
    waits: list[float] = []
    whole: list[float] = []
    for d in tis:
        sch, q, s = (parse_ts(d.get(k)) for k in ("scheduled_when", "queued_when", "start_date"))
        if q is not None and s is not None:
            waits.append((s - q).total_seconds())
        if sch is not None and s is not None:
            whole.append((s - sch).total_seconds())
    wall = (max(ends) - min(queued)).total_seconds() if queued and ends else None
    run_start = parse_ts((run or {}).get("start_date"))
    run_end = parse_ts((run or {}).get("end_date"))
    return Figures(
        tasks=len(tis),
        ended=len(ends),
        wall_s=wall,
        tasks_per_s=len(ends) / wall if wall else None,
        q2s_p50_s=percentile(waits, 50),
        q2s_p95_s=percentile(waits, 95),
        q2s_max_s=max(waits) if waits else None,
        run_wall_s=(run_end - run_start).total_seconds() if run_start and run_end else None,
        s2s_p50_s=percentile(whole, 50),
        s2s_p95_s=percentile(whole, 95),
        stalls=None if scheduler_log is None else stalls(tis, scheduler_log, min_heartbeat_interval),
        failed=sum(1 for d in tis if d.get("state") == "failed"),
        pool_timeouts=None if api_log_text is None else count_pool_timeouts(api_log_text),
    )


# -- several stages, one table --------------------------------------------------------------------


@dataclass(frozen=True)
class StageRow:
    """One stage's throughput run, as the comparison needs it."""

    label: str  # "stage 0", "stage 9", "full series"
    passed: bool  # every run of the stage passed
    fig: Figures | None  # one run's figures, or the median over its passed rounds; None: none
    walls: tuple[float | None, ...] = ()  # each passed round's wall time
    runs: int = 1  # rounds run
    runs_ok: int | None = None  # rounds passed (None: as ``passed`` says)
    # Each round's failed tasks and api-server pool timeouts, every round (None: no figures)
    failed: tuple[float | None, ...] = ()
    pool_timeouts: tuple[float | None, ...] = ()


def _median(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def median_of(figs: Sequence[Figures]) -> Figures:
    """Field by field, the median of several runs' figures (missing values left out)."""
    return Figures(
        tasks=int(statistics.median_low([f.tasks for f in figs])),
        ended=int(statistics.median_low([f.ended for f in figs])),
        **{k: _median([getattr(f, k) for f in figs]) for k in _FLOAT_FIELDS},
    )


_FLOAT_FIELDS = tuple(k for k in Figures.__dataclass_fields__ if k not in ("tasks", "ended"))


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def target_misses(fig: Figures, base: Figures) -> list[str]:
    """Which of issue 15's targets ``fig`` misses against ``base``; empty when it meets them."""
    misses: list[str] = []
    if fig.tasks >= LARGE_RUN:
        tp = ratio(fig.tasks_per_s, base.tasks_per_s)
        if tp is None or tp < MIN_THROUGHPUT_RATIO:
            misses.append(f"throughput {_r(tp)} < {MIN_THROUGHPUT_RATIO:.2f}x")
        if fig.q2s_p95_s is None or base.q2s_p95_s is None or fig.q2s_p95_s > base.q2s_p95_s:
            misses.append(f"p95 {_f(fig.q2s_p95_s, 's', 2)} > base {_f(base.q2s_p95_s, 's', 2)}")
    else:
        wr = ratio(fig.wall_s, base.wall_s)
        if wr is None or wr > MAX_WALL_RATIO:
            misses.append(f"wall {_r(wr)} > {MAX_WALL_RATIO:.2f}x")
    return misses


def _r(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _per_round(values: tuple[float | None, ...], single: float | None) -> str:
    """Each round's count, comma-separated (``single``: the one run's, when the row has no rounds)."""
    return ",".join(_f(v, "", 0) for v in (values or (single,)))


def compare(rows: Sequence[StageRow], title: str) -> str:
    """The comparison table: the first row is the base every ratio is taken against. With
    several rounds each row holds the medians of the passed rounds, each round's failed tasks and
    pool timeouts (every round), and ends with each passed round's wall time."""
    head = (
        f"{'executor':<14}{'result':<7}{'tasks':>7}{'wall':>8}{'tasks/s':>9}{'x base':>8}"
        f"{'q>s p50':>9}{'q>s p95':>9}{'p95 x':>7}{'s>s p95':>9}{'wall x':>8}{'stalls':>7}"
        f"{'failed':>9}{'pool t/o':>9}  targets (issue 15)"
    )
    out = [title, head]
    base = rows[0].fig if rows else None
    for i, r in enumerate(rows):
        f = r.fig
        result = "ok" if r.passed else "FAIL"
        if r.runs > 1 and r.runs_ok is not None:
            result = f"{r.runs_ok}/{r.runs}"
        failed = _per_round(r.failed, f.failed if f else None)
        pool = _per_round(r.pool_timeouts, f.pool_timeouts if f else None)
        if f is None:
            known = any(v is not None for v in (*r.failed, *r.pool_timeouts))
            out.append(
                f"{r.label:<14}{result:<7}{'-':>7}  (no figures)"
                + (f" failed {failed}, pool timeouts {pool}" if known else "")
            )
            continue
        if i == 0 or base is None:
            verdict = "(base)"
        else:
            misses = target_misses(f, base)
            verdict = "met" if not misses else "missed: " + "; ".join(misses)
        out.append(
            f"{r.label:<14}{result:<7}{f.ended:>7}{_f(f.wall_s, 's'):>8}{_f(f.tasks_per_s, '', 2):>9}"
            f"{_r(ratio(f.tasks_per_s, base.tasks_per_s if base else None)):>8}"
            f"{_f(f.q2s_p50_s, 's', 2):>9}{_f(f.q2s_p95_s, 's', 2):>9}"
            f"{_r(ratio(f.q2s_p95_s, base.q2s_p95_s if base else None)):>7}{_f(f.s2s_p95_s, 's', 2):>9}"
            f"{_r(ratio(f.wall_s, base.wall_s if base else None)):>8}{_f(f.stalls, '', 0):>7}"
            f"{failed:>9}{pool:>9}  {verdict}"
            + (f" (walls {', '.join(_f(w, 's') for w in r.walls)})" if len(r.walls) > 1 else "")
        )
    return "\n".join(out)
